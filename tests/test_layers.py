"""The package's layers: what may import what (the table of docs/ARCHITECTURE.md, read from that
page: the page and this test cannot disagree), and no import loop.

Read from the source with ``ast`` (imports at any depth, so a lazy import inside a function
counts too), then one fresh interpreter per module imports that module first.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlloss"
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _layer_table() -> list[tuple[str, list[str], set[str]]]:
    """``(layer, modules, may import)`` for each row of docs/ARCHITECTURE.md's layer table."""
    rows = []
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("layer", "---"):
            continue
        rows.append((cells[0], _names(cells[1]), set(_names(cells[3]))))
    assert rows, f"no layer table in {ARCHITECTURE}"
    return rows


LAYERS = _layer_table()
LOSSES = next(modules for layer, modules, _ in LAYERS if layer == "losses")


def _modules() -> dict[str, Path]:
    """Dotted name below ``rlloss`` (a package: its ``__init__``) -> file; the root excluded."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = [p for p in path.relative_to(PACKAGE).with_suffix("").parts if p != "__init__"]
        if parts:
            found[".".join(parts)] = path
    return found


def _covers(name: str, module: str) -> bool:
    return module == name or module.startswith(f"{name}.")


def _row_of(module: str) -> tuple[str, list[str], set[str]] | None:
    """The row naming ``module`` most precisely (the longest name covering it)."""
    matches = [(len(n), row) for row in LAYERS for n in row[1] if _covers(n, module)]
    return max(matches, key=lambda m: m[0])[1] if matches else None


def _rlloss_imports(path: Path) -> set[str]:
    """The rlloss modules ``path`` imports, dotted below ``rlloss`` (``from rlloss import
    functional`` -> ``functional``; ``from rlloss.offpolicy.base import X`` -> ``offpolicy.base``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlloss"):
            assert node.level == 0, f"{path}: relative import"
            below = node.module.removeprefix("rlloss").lstrip(".")
            names |= {alias.name for alias in node.names} if not below else {below}
        elif isinstance(node, ast.Import):
            names |= {
                a.name.removeprefix("rlloss.") for a in node.names if a.name.startswith("rlloss.")
            }
    return names


def test_every_module_has_a_row():
    assert not [m for m in _modules() if _row_of(m) is None]
    listed = [n for _, modules, _ in LAYERS for n in modules]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert not [n for n in listed if n not in _modules()], "a listed module does not exist"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_module_imports_only_what_its_row_allows(module):
    layer, _, allowed = _row_of(module)
    imported = _rlloss_imports(_modules()[module])
    above = sorted(m for m in imported if not any(_covers(a, m) for a in allowed))
    assert not above, f"rlloss.{module} ({layer}) imports {above}, which its row does not allow"


def test_no_loss_imports_another_loss():
    for loss in LOSSES:
        others = {m for m in _rlloss_imports(_modules()[loss]) if m in LOSSES} - {loss}
        assert not others, f"rlloss.{loss} imports the losses {sorted(others)}"


def test_the_imports_have_no_loop():
    """The real module graph (each module -> the rlloss modules it names) is acyclic."""
    graph = {
        m: {i for i in _rlloss_imports(p) if i in _modules()} - {m} for m, p in _modules().items()
    }
    while graph:
        leaves = [m for m, deps in graph.items() if not deps & set(graph)]
        assert leaves, f"loop among {sorted(graph)}"
        for leaf in leaves:
            del graph[leaf]


def test_each_module_imports_first_in_a_fresh_interpreter():
    """Import every module with nothing of rlloss loaded (one process runs them in turn, each
    after purging rlloss from ``sys.modules``). ``import rlloss.x`` runs the package's
    ``__init__`` first, so this checks the real start-up path of each entry point."""
    names = ["rlloss." + m for m in sorted(_modules())]
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
