"""The package's layers (docs/ARCHITECTURE.md): what may import what, and no import loop.

Read from the source with ``ast`` (imports at any depth, so a lazy import inside a function
counts too), then one fresh interpreter per module imports that module first.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlloss"
LOSSES = {"ppo", "a2c", "dqn", "ddpg", "td3", "sac", "mpo", "iql"}
# module -> the rlloss modules it may import (the layers, bottom up); a package name stands for
# everything in it.
ALLOWED = {
    "_checks": set(),
    "_compat": set(),
    "_keywords": set(),  # TorchRL's constructor keywords: the table and the function applying it
    "_dispatch": {"_checks", "_compat"},
    "functional": {"_checks", "functional"},
    "_networks": {"_checks", "_compat"},
    "sequences": set(),  # chunk_sequences, the recurrent modules of a network
    "distributed": {"functional"},
    "normalizers": {"_checks", "distributed", "functional"},
    "addons": {"_checks", "_networks", "functional"},
    "estimators": {
        "_checks",
        "_compat",
        "_dispatch",
        "_keywords",
        "_networks",
        "functional",
        "normalizers",
        "sequences",
    },
    "schedulers": {"_checks", "distributed"},
    "data": {"_compat"},
    "updaters": {"_checks", "_compat"},
    "update": {"_compat"},  # compile_update: any loss module, optimizer, updater and buffer
    "common": {"_checks", "_compat", "_dispatch", "addons", "estimators", "functional"},
    "offpolicy": {
        "_checks",
        "_compat",
        "_keywords",
        "_networks",
        "common",
        "estimators",
        "functional",
    },
    "onpolicy": {
        "_checks",
        "_compat",
        "_keywords",
        "_networks",
        "addons",
        "common",
        "distributed",
        "estimators",
        "functional",
        "normalizers",
    },
    **{
        loss: {
            "_checks",
            "_compat",
            "_keywords",
            "_networks",
            "addons",
            "common",
            "distributed",
            "offpolicy",
            "onpolicy",
            "functional",
        }
        for loss in LOSSES
    },
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in relative.parts if p != "__init__"]
        found[".".join(["rlloss", *parts])] = path
    return found


def _rlloss_imports(path: Path, module: str) -> set[str]:
    """The ``rlloss`` modules that ``path`` imports, as their first component below ``rlloss``
    (``rlloss.functional.q`` -> ``functional``)."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            if base == "rlloss":
                names |= {alias.name for alias in node.names}
            elif base.startswith("rlloss."):
                names.add(base.split(".")[1])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("rlloss.")}
    return names


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_module_imports_only_its_lower_layers(module):
    targets = {
        name: path
        for name, path in _modules().items()
        if name == f"rlloss.{module}" or name.startswith(f"rlloss.{module}.")
    }
    assert targets, f"no module rlloss.{module}"
    for name, path in targets.items():
        imported = _rlloss_imports(path, name) - {module}
        assert imported <= ALLOWED[module], (
            f"{name} imports {sorted(imported - ALLOWED[module])}, above its layer"
        )


def test_every_module_has_a_layer():
    top_level = {name.split(".")[1] for name in _modules() if name.count(".") >= 1}
    assert top_level - {"__init__"} <= set(ALLOWED), sorted(top_level - set(ALLOWED))


def test_no_loss_imports_another_loss():
    for loss in LOSSES:
        path = PACKAGE / f"{loss}.py"
        assert not _rlloss_imports(path, f"rlloss.{loss}") & (LOSSES - {loss})


def test_the_layers_have_no_loop():
    """The allowed imports form a DAG, so the modules that respect them (above) cannot import
    each other in a loop, whatever the order of first import."""
    remaining = {module: set(allowed) - {module} for module, allowed in ALLOWED.items()}
    while remaining:
        leaves = [module for module, allowed in remaining.items() if not allowed & set(remaining)]
        assert leaves, f"loop among {sorted(remaining)}"
        for leaf in leaves:
            del remaining[leaf]


def test_each_module_imports_first_in_a_fresh_interpreter():
    """Import every module with nothing of rlloss loaded (one process runs them in turn, each
    after purging rlloss from ``sys.modules``). ``import rlloss.x`` runs the package's
    ``__init__`` first, so this checks the real start-up path of each entry point."""
    names = sorted(_modules())
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'rlloss' or m.startswith('rlloss.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
