"""How ``tools/tutorial_runs.py`` runs one tutorial: the TorchRL swap of its script, the
subprocess, and the ``name=value`` lines it prints, read back.

The swap: a tutorial's ``from rlloss import X, Y`` statements rewritten to import ``X, Y`` from
TorchRL (``torchrl.objectives``, or ``torchrl.objectives.value`` for the value estimators, where
TorchRL keeps ``GAE``, or ``torchrl.objectives.llm`` for the language-model losses,
``GRPOLoss``, ``SFTLoss``...), nothing else changed. That one-import swap is rlloss's drop-in
claim.

A run: ``python <script> [--seed K] <args> --out <run dir>`` from the repository root, with the
tutorials' directory (for ``_helpers``) and the working tree's ``rlloss`` first on the path, one
CPU thread (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` 1 unless set: the environment reaches every
run), a quiet progress bar and no display; its standard output and error are kept in the run
dir as ``stdout.txt`` and ``stderr.txt``.
"""

from __future__ import annotations

import ast
import importlib
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TUTORIALS_DIR = REPO_ROOT / "tutorials"
LIBRARIES = ("rlloss", "torchrl")
# Where TorchRL keeps a name rlloss exports at its top level, in the order searched.
TORCHRL_MODULES = ("torchrl.objectives", "torchrl.objectives.value", "torchrl.objectives.llm")
PRINTED_NAME = re.compile(r"[\w\[\].-]+")  # final_return, return_at_target[-144.1]...


# The TorchRL swap
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
            f"{indent}{new}  # swapped by tools/tutorial_runs.py\n",
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


def script_for(path: Path, library: str, work: Path) -> Path:
    """The tutorial at ``path``, or for ``torchrl`` its swapped copy written into ``work`` as
    ``torchrl_<name>``; ``ValueError`` naming the tutorial where TorchRL lacks a name."""
    if library == "rlloss":
        return path
    swap = swap_to_torchrl(path.read_text())
    if not swap["ok"]:
        raise ValueError(f"{path.stem}: no TorchRL swap: {swap['reason']}")
    work.mkdir(parents=True, exist_ok=True)
    swapped = work / f"torchrl_{path.name}"
    swapped.write_text(swap["source"])
    return swapped


# The subprocess
def child_env() -> dict[str, str]:
    """The subprocess environment: the tutorials dir (for ``_helpers``) and the working tree's
    ``rlloss`` first on the path, one thread each, a quiet progress bar and no display."""
    env = dict(os.environ)
    path = [str(TUTORIALS_DIR), str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(
        path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    for name, value in (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1")):
        env.setdefault(name, value)
    env.setdefault("TQDM_MININTERVAL", "10")
    env.setdefault("MPLBACKEND", "Agg")
    return env


def display_path(part: str) -> str:
    """A command-line part with the repository root made relative and the interpreter as
    ``python``."""
    if part == sys.executable:
        return "python"
    return part.replace(str(REPO_ROOT) + os.sep, "")


@dataclass(frozen=True)
class Finished:
    """A finished tutorial run: its command, exit status, wall time and standard output."""

    command: list[str]
    returncode: int
    wall_s: float
    stdout: str

    @property
    def printed(self) -> dict[str, str] | None:
        """Its ``printed_values``; None if the run failed."""
        return None if self.returncode != 0 else printed_values(self.stdout)


def run_tutorial(script: Path, args: tuple[str, ...], run_dir: Path, seed: int | None = None):
    """Run ``script [--seed seed] args --out run_dir`` (``child_env``), keeping its standard
    output and error in ``run_dir/stdout.txt`` and ``stderr.txt``; a ``Finished``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    seeded = () if seed is None else ("--seed", str(seed))
    command = [sys.executable, str(script), *seeded, *map(str, args), "--out", str(run_dir)]
    start = time.perf_counter()
    with open(run_dir / "stdout.txt", "w") as out, open(run_dir / "stderr.txt", "w") as err:
        proc = subprocess.run(command, cwd=REPO_ROOT, env=child_env(), stdout=out, stderr=err)
    wall_s = time.perf_counter() - start
    stdout = (run_dir / "stdout.txt").read_text(errors="replace")
    return Finished(command, proc.returncode, wall_s, stdout)


def printed_values(stdout: str) -> dict[str, str]:
    """The last value of each ``name=value`` line a run printed: the value's first word, a
    trailing ``s`` of seconds dropped (``wall_time=12.5s``: ``"12.5"``)."""
    printed = {}
    for line in stdout.splitlines():
        name, equals, value = line.partition("=")
        if equals and value.split() and PRINTED_NAME.fullmatch(name):
            printed[name] = value.split()[0].rstrip("s")
    return printed


def as_number(printed: str | None) -> float:
    """A printed value as a float (NaN if missing or not a number, e.g. ``none``)."""
    try:
        return float(printed)
    except (TypeError, ValueError):
        return math.nan
