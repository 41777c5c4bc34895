"""What every page shares: the result files, table cells and tables, and the sections that say
where a page's figures come from (inputs, commands, machines)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("overhead", "profile", "compile", "learning")
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


def command_of(result: Result) -> str | None:
    """The command that produced the file: its ``machine.command``, else a top-level one."""
    data = result.data if isinstance(result.data, dict) else {}
    return machine_of(result).get("command") or data.get("command")


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


def devices_of(result: Result) -> list[str]:
    """The devices a file's figures were measured on (``cpu`` when it does not say)."""
    data = result.data if isinstance(result.data, dict) else {}
    found = {str(r["device"]) for r in table_rows(result.data) if r.get("device")}
    if not found:
        config = data.get("config") or {}
        found = {str(config.get("device") or data.get("device") or "cpu")}
    return sorted(found, key=lambda d: (d != "cpu", d))


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


def shown(path: Path) -> str:
    """``path`` relative to the repository root when inside it, else absolute."""
    return path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)


def rel(path: Path, out: Path) -> str:
    """``path`` relative to the directory of the page ``out``, with forward slashes."""
    return Path(os.path.relpath(path, out.parent)).as_posix()


def method_lines(data: dict) -> list[str]:
    """A file's ``method`` text: one line when it is one paragraph, else verbatim in a folded
    block (none if absent)."""
    text = str(data.get("method") or "").strip()
    if not text:
        return []
    if "\n\n" not in text:
        return [f"Method: {' '.join(text.split()).rstrip('.')}.", ""]
    return ["<details><summary>Method</summary>", "", "```text", text, "```", "", "</details>", ""]


def verdict(ok: bool | None) -> str:
    """met / **missed** / -."""
    return "-" if ok is None else ("met" if ok else "**missed**")


def generated_line(results_dir: Path, count: int) -> str:
    """When and from what a page was generated."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return (
        f"Generated {now} by `python benchmarks/report.py` from the JSON files in "
        f"`{shown(results_dir)}/` ({count} used here). Do not edit by hand: re-run the "
        "benchmarks, then that command."
    )


# --------------------------------------------------------------------------- #
# Inputs and machines
# --------------------------------------------------------------------------- #
def inputs_section(
    results: list[Result], out: Path, problem: Callable[[Result], str | None]
) -> list[str]:
    """One row per input file (kind, devices, date, problem), then the exact command behind
    each."""
    lines = ["## Inputs and the commands that produced them", ""]
    if not results:
        return lines + ["No JSON results found.", ""]
    rows = [
        [
            f"`{rel(r.path, out)}`",
            r.kind,
            ", ".join(devices_of(r)) if r.data else "-",
            machine_of(r).get("date"),
            problem(r),
        ]
        for r in results
    ]
    lines += markdown_table(["file", "kind", "device", "date", "problem"], rows)
    for r in results:
        data = r.data if isinstance(r.data, dict) else {}
        lines.append(f"- `{r.path.name}`: `{command_of(r) or 'command not recorded'}`")
        if data.get("command") and data["command"] != command_of(r):
            lines.append(f"  (then summarized by `{data['command']}`)")
    return lines + [""]


def machines_section(results: list[Result]) -> list[str]:
    """One row per input file: CPU, platform and library versions from its machine block."""
    rows = []
    for r in results:
        m = machine_of(r)
        git = m.get("git") or {}
        commit = (git.get("commit") or "")[:10] + (" (dirty)" if git.get("dirty") else "")
        cores = m.get("affinity_cpus") or m.get("cpu_count")
        gpu = m.get("gpu") or m.get("cuda_device") or m.get("device_name")
        rows.append(
            [
                r.path.name,
                m.get("cpu_model"),
                cores,
                gpu,
                m.get("platform"),
                m.get("python"),
                m.get("torch"),
                m.get("tensordict"),
                m.get("torchrl"),
                commit or None,
            ]
        )
    if not rows:
        return []
    header = [
        "file",
        "CPU",
        "cores",
        "GPU",
        "platform",
        "python",
        "torch",
        "tensordict",
        "torchrl",
        "git",
    ]
    return ["## Machines and library versions", "", *markdown_table(header, rows)]
