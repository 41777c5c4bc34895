"""What the tables share: the result files, their rows, table cells and tables."""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("overhead", "compile", "learning")
CELL_CHARS = 160  # longer table cells (error messages, break reasons) are cut


# --------------------------------------------------------------------------- #
# Loading
# --------------------------------------------------------------------------- #
@dataclass
class Result:
    """One JSON file of ``benchmarks/results/``."""

    kind: str
    path: Path
    data: Any
    error: str | None = None


def load_results(results_dir: Path) -> list[Result]:
    """Every ``<kind>*.json`` of the results dir, sorted by kind then name; unreadable files
    carry their error."""
    results = []
    for kind in KINDS:
        for path in sorted(results_dir.glob(f"{kind}*.json")):
            try:
                results.append(Result(kind, path, json.loads(path.read_text())))
            except (OSError, ValueError) as err:
                results.append(Result(kind, path, None, f"could not be read: {err}"))
    return results


def machine_of(result: Result) -> dict[str, Any]:
    """The file's ``machine`` block ({} if none)."""
    data = result.data
    return data.get("machine") or {} if isinstance(data, dict) else {}


def table_rows(data: Any) -> list[dict]:
    """The rows of a results file: ``results``, ``rows``, or the first list of dicts in it."""
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if not isinstance(data, dict):
        return []
    for key in ("results", "rows"):
        if isinstance(data.get(key), list):
            return [r for r in data[key] if isinstance(r, dict)]
    for value in data.values():
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            return value
    return []


def on_cpu(device: str) -> bool:
    """Whether ``device`` is the CPU (``cuda:0`` is not)."""
    return device.split(":")[0] == "cpu"


# --------------------------------------------------------------------------- #
# Cells and tables
# --------------------------------------------------------------------------- #
def cell(x: Any) -> str:
    """A value as a table cell: no pipes or newlines, long text cut."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return number(x)
    if isinstance(x, list | tuple):
        if not x:
            return "-"
        x = "; ".join(number(v) if isinstance(v, float) else str(v) for v in x)
    elif isinstance(x, dict):
        x = json.dumps(x, separators=(",", ":"))
    text = " ".join(str(x).split()).replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 3] + "..."


def number(x: float) -> str:
    """A float with about four significant figures."""
    if not math.isfinite(x):
        return str(x)
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"
    return f"{x:.3e}"


def markdown_table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def verdict(ok: bool | None) -> str:
    """met / **missed** / -."""
    return "-" if ok is None else ("met" if ok else "**missed**")


def shown(path: Path) -> str:
    """``path`` relative to the repository root when inside it, else absolute."""
    return path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)


def generated_line(results_dir: Path, count: int) -> str:
    """When and from what a page was generated."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return (
        f"Generated {now} by `python benchmarks/report.py` from the JSON files in "
        f"`{shown(results_dir)}/` ({count} used here). Do not edit by hand: re-run the "
        "benchmarks, then that command."
    )
