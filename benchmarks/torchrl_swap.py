"""The TorchRL swap: a tutorial's ``from rlloss import X, Y`` statements rewritten to import
``X, Y`` from TorchRL (``torchrl.objectives``, or ``torchrl.objectives.value`` for the value
estimators, where TorchRL keeps ``GAE``, or ``torchrl.objectives.llm`` for the language-model
losses, ``GRPOLoss``, ``SFTLoss``...), nothing else changed. That one-import swap is
rlloss's drop-in claim."""

from __future__ import annotations

import ast
import importlib
from typing import Any

# Where TorchRL keeps a name rlloss exports at its top level, in the order searched.
TORCHRL_MODULES = ("torchrl.objectives", "torchrl.objectives.value", "torchrl.objectives.llm")


def rlloss_imports(source: str) -> list[ast.ImportFrom]:
    """The ``from rlloss import ...`` statements of a script (``rlloss.<submodule>`` excluded)."""
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module == "rlloss" and node.level == 0
    ]


def torchrl_home(name: str) -> str | None:
    """The first module of ``TORCHRL_MODULES`` that has ``name``; None if TorchRL has none."""
    for module in TORCHRL_MODULES:
        if hasattr(importlib.import_module(module), name):
            return module
    return None


def torchrl_import_line(node: ast.ImportFrom) -> tuple[str | None, list[str]]:
    """The TorchRL import statement(s) replacing ``node``, on one line (padded with blank lines
    where ``node`` spans several, so that the swapped script's line numbers are the tutorial's),
    and the names TorchRL lacks (then no line)."""
    homes = {alias.name: torchrl_home(alias.name) for alias in node.names}
    missing = [name for name, home in homes.items() if home is None]
    if missing:
        return None, missing
    by_module: dict[str, list[str]] = {}
    for alias in node.names:
        spelled = alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
        by_module.setdefault(homes[alias.name], []).append(spelled)
    line = "; ".join(
        f"from {module} import {', '.join(names)}" for module, names in by_module.items()
    )
    return line, []


def swap_to_torchrl(source: str) -> dict[str, Any]:
    """Rewrite every ``from rlloss import ...`` of ``source`` into TorchRL's imports.

    Returns ``{"ok": True, "source", "imports": [(old, new)...], "literal_swap_ok", "kept"}`` or
    ``{"ok": False, "reason"}`` when TorchRL lacks a name. ``literal_swap_ok`` says whether the
    plain ``from torchrl.objectives import <same names>`` would have worked; ``kept`` lists the
    other rlloss imports (``rlloss.functional``...) the script still uses."""
    nodes = rlloss_imports(source)
    if not nodes:
        return {"ok": False, "reason": "the script has no 'from rlloss import' statement"}
    lines = source.splitlines(keepends=True)
    imports, missing = [], []
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        new, lacking = torchrl_import_line(node)
        missing.extend(lacking)
        if new is None:
            continue
        old = "".join(lines[node.lineno - 1 : node.end_lineno])
        indent = old[: len(old) - len(old.lstrip())]
        blank = ["\n"] * (node.end_lineno - node.lineno)  # keeps the line numbers
        lines[node.lineno - 1 : node.end_lineno] = [
            f"{indent}{new}  # swapped by benchmarks/learning.py\n",
            *blank,
        ]
        imports.append([old.strip(), new])
    if missing:
        return {"ok": False, "reason": f"TorchRL has no {', '.join(sorted(missing))}"}
    swapped = "".join(lines)
    kept = sorted(
        {
            ast.unparse(node)
            for node in ast.walk(ast.parse(swapped))
            if isinstance(node, ast.ImportFrom | ast.Import) and "rlloss" in ast.unparse(node)
        }
    )
    literal_ok = all(
        line.startswith("from torchrl.objectives import") and ";" not in line for _, line in imports
    )
    return {
        "ok": True,
        "source": swapped,
        "imports": imports[::-1],
        "literal_swap_ok": literal_ok,
        "kept": kept,
    }
