"""Write ``BENCHMARKS.md`` from the JSON results in ``benchmarks/results/``.

One command, run from anywhere::

    python benchmarks/report.py                                  # -> BENCHMARKS.md
    python benchmarks/report.py --results-dir /tmp/res --out /tmp/BENCHMARKS.md

Inputs, each optional (a missing file is a note in the report, never an error):

* ``overhead*.json`` -- ``benchmarks/overhead.py``: per case, batch size, mode (eager /
  compiled) and level (forward / backward / update) the time of each method and the paired
  ratios. Each row is checked against the targets (``OVERHEAD_TARGETS``). A file in the older
  format (rows without ``mode`` / ``level``) is skipped with a note.
* ``profile*.json`` -- ``benchmarks/profile_overhead.py``: per case, mode, level and method,
  the step's time split by where it is spent (torch ops, tensordict, rlloss's Python, dynamo's
  guards...).
  ``benchmarks/missed_targets.md``, written by hand, follows it: why each missed target is
  missed, read off those profiles.
* ``compile*.json`` -- ``benchmarks/compile_report.py``: one row per (case, library); whatever
  keys the rows have become the columns of the table.
* ``learning*.json`` -- ``benchmarks/learning.py``: per task and library the per-seed returns,
  whether the target was met, and the learning-curve figures (embedded by relative path).

Every file's ``machine`` block gives the date, machine, versions and the command that produced
it. Rows measured on a device other than ``cpu`` get their own sections under "GPU", marked
with the device; that section says so when no GPU figures exist yet.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
DEFAULT_OUT = REPO_ROOT / "BENCHMARKS.md"
KINDS = ("overhead", "profile", "compile", "learning")
MODES = ("eager", "compiled")
LEVELS = ("forward", "backward", "update")
OVERHEAD_METHODS = ("plain", "plain-min", "rlloss", "torchrl")
SMALL_BATCH_MAX = 1024  # batch sizes up to this are "small" for the eager target
CELL_CHARS = 160  # longer table cells (error messages, break reasons) are cut


@dataclass(frozen=True)
class Target:
    """A bound on the median of one ratio, for the rows it applies to."""

    ratio: str
    bound: float
    at_most: bool  # True: ratio <= bound; False: ratio >= bound
    applies: Callable[[dict], bool]
    text: str

    def check(self, row: dict) -> bool | None:
        """Met, missed, or None where the row has no such ratio or the target does not apply."""
        value = row.get("ratios", {}).get(self.ratio, {}).get("median")
        if value is None or not self.applies(row):
            return None
        return value <= self.bound if self.at_most else value >= self.bound


def is_small(row: dict) -> bool:
    """A batch of at most ``SMALL_BATCH_MAX`` samples."""
    return row["batch_size"] <= SMALL_BATCH_MAX


OVERHEAD_TARGETS = (
    Target(
        "rlloss/plain",
        1.10,
        True,
        lambda r: r["mode"] == "eager" and is_small(r),
        f"eager, batch <= {SMALL_BATCH_MAX}: rlloss <= 1.10x plain",
    ),
    Target(
        "rlloss/plain",
        1.02,
        True,
        lambda r: r["mode"] == "eager" and not is_small(r),
        f"eager, batch > {SMALL_BATCH_MAX}: rlloss <= 1.02x plain",
    ),
    Target(
        "torchrl/rlloss",
        1.5,
        False,
        lambda r: r["mode"] == "eager",
        "eager: TorchRL >= 1.5x the time of rlloss",
    ),
    Target(
        "rlloss/plain",
        1.05,
        True,
        lambda r: r["mode"] == "compiled",
        "compiled: rlloss <= 1.05x compiled plain",
    ),
)


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


def device_kind(device: str) -> str:
    """``cpu`` or the device type (``cuda:0`` -> ``cuda``)."""
    return device.split(":")[0]


# --------------------------------------------------------------------------- #
# Markdown helpers
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
    """``path`` relative to the directory of the report, with forward slashes."""
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


# --------------------------------------------------------------------------- #
# Header: inputs and machines
# --------------------------------------------------------------------------- #
def header_section(results: list[Result], results_dir: Path, out: Path) -> list[str]:
    """Title, generation date and the command that wrote the report."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return [
        "# Benchmarks",
        "",
        f"Generated {now} by `python benchmarks/report.py` from the JSON files in "
        f"`{shown(results_dir)}/` ({len(results)} found). Do not edit by hand: re-run the "
        "benchmarks below, then that command.",
        "",
    ]


def inputs_section(results: list[Result], out: Path) -> list[str]:
    """One row per input file (kind, devices, date), then the exact command behind each."""
    lines = ["## Inputs and the commands that produced them", ""]
    if not results:
        return lines + ["No JSON results found.", ""]
    rows = [
        [
            f"`{rel(r.path, out)}`",
            r.kind,
            ", ".join(devices_of(r)) if r.data else "-",
            machine_of(r).get("date"),
            overhead_format_problem(r) if r.kind == "overhead" else r.error,
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


# --------------------------------------------------------------------------- #
# Overhead
# --------------------------------------------------------------------------- #
def overhead_format_problem(result: Result) -> str | None:
    """Why an overhead file cannot be rendered (old format, unreadable), or None."""
    if result.error:
        return result.error
    rows = table_rows(result.data)
    if not rows:
        return "it has no result rows"
    if any("mode" not in r or "level" not in r for r in rows):
        return (
            "it is in the older format (rows without `mode` / `level`); regenerate it with "
            "`python benchmarks/overhead.py`"
        )
    return None


def time_cell(method: dict | None) -> str:
    """``median (p25-p75)`` in microseconds, or the method's status."""
    if not method:
        return "-"
    t = method.get("time_us")
    if method.get("status") != "ok" or not t:
        return method.get("status", "-")
    return f"{number(t['median'])} ({number(t['p25'])}-{number(t['p75'])})"


def ratio_cell(row: dict, name: str) -> str:
    """``median (p25-p75)`` of a paired ratio, or '-'."""
    r = row.get("ratios", {}).get(name)
    if not r:
        return "-"
    return f"{r['median']:.3f} ({r['p25']:.3f}-{r['p75']:.3f})"


def target_cell(row: dict, ratio: str) -> str:
    """The verdicts of the targets on ``ratio`` that apply to the row, with their bounds."""
    parts = []
    for target in OVERHEAD_TARGETS:
        ok = target.check(row) if target.ratio == ratio else None
        if ok is not None:
            sign = "<=" if target.at_most else ">="
            parts.append(f"{sign} {target.bound:g}: {verdict(ok)}")
    return "; ".join(parts) or "-"


def overhead_case_table(rows: list[dict]) -> list[str]:
    """One case's rows: times of every method, the ratios and the targets."""
    header = [
        "batch",
        "mode",
        "level",
        *(f"{m} µs" for m in OVERHEAD_METHODS),
        "rlloss/plain",
        "target",
        "torchrl/rlloss",
        "target",
        "rlloss/plain-min",
    ]
    body = []
    for row in rows:
        mode = (
            row["mode"] if row.get("status", "ok") == "ok" else f"{row['mode']} ({row['status']})"
        )
        methods = row.get("methods", {})
        body.append(
            [
                row["batch_size"],
                mode,
                row["level"],
                *(time_cell(methods.get(m)) for m in OVERHEAD_METHODS),
                ratio_cell(row, "rlloss/plain"),
                target_cell(row, "rlloss/plain"),
                ratio_cell(row, "torchrl/rlloss"),
                target_cell(row, "torchrl/rlloss"),
                ratio_cell(row, "rlloss/plain-min"),
            ]
        )
    return markdown_table(header, body)


def method_notes(rows: list[dict]) -> list[str]:
    """One line per method that was not timed in a case, with its reason."""
    notes = {}
    for row in rows:
        for name, method in row.get("methods", {}).items():
            if method.get("status") not in ("ok", None) and method.get("reason"):
                notes[(name, row["mode"])] = method["reason"]
    return [f"- {name} ({mode}): {cell(reason)}" for (name, mode), reason in notes.items()]


def target_tally(rows: list[dict]) -> tuple[int, list[str]]:
    """How many target checks the rows pass, and a line per missed one."""
    met, missed = 0, []
    for row in rows:
        for target in OVERHEAD_TARGETS:
            ok = target.check(row)
            if ok:
                met += 1
            elif ok is False:
                value = row["ratios"][target.ratio]["median"]
                missed.append(
                    f"{row['case']} B={row['batch_size']} {row['mode']} {row['level']}: "
                    f"{target.ratio} = {value:.3f} ({target.text})"
                )
    return met, missed


def overhead_order(row: dict) -> tuple:
    """Eager before compiled, then batch size, then forward / backward / update."""
    mode = MODES.index(row["mode"]) if row["mode"] in MODES else len(MODES)
    level = LEVELS.index(row["level"]) if row["level"] in LEVELS else len(LEVELS)
    return mode, row["batch_size"], level


def overhead_section(result: Result, device: str, out: Path) -> list[str]:
    """The overhead tables of one file's rows on one device, case by case."""
    lines = [f"### Overhead on {device} (`{rel(result.path, out)}`)", ""]
    problem = overhead_format_problem(result)
    if problem:
        return lines + [f"Skipped: `{result.path.name}` cannot be shown: {problem}.", ""]
    rows = [r for r in table_rows(result.data) if str(r.get("device", "cpu")) == device]
    data = result.data
    lines += [f"Command: `{command_of(result)}`", ""]
    if data.get("method"):
        lines += [f"Method: {data['method']}.", ""]
    lines += [
        "Times are the median (p25-p75) in microseconds per step; ratios are medians (p25-p75) "
        "of paired per-round ratios. Targets (on the median):",
        "",
    ]
    lines += [f"- {t.text}" for t in OVERHEAD_TARGETS] + [""]
    met, missed = target_tally(rows)
    lines += [
        f"Targets met: {met} of {met + len(missed)} checks."
        + ("" if data.get("ok", True) else " Some rows FAILED the equality gate."),
        "",
    ]
    if missed:
        lines += ["Missed:", "", *(f"- {m}" for m in missed), ""]
    for case in dict.fromkeys(r["case"] for r in rows):
        case_rows = sorted((r for r in rows if r["case"] == case), key=overhead_order)
        lines += [f"#### {case}", ""]
        if case_rows[0].get("description"):
            lines += [f"_{case_rows[0]['description']}_", ""]
        lines += overhead_case_table(case_rows)
        notes = method_notes(case_rows)
        if notes:
            lines += ["Not timed:", "", *notes, ""]
    return lines


# --------------------------------------------------------------------------- #
# Profiles of the overhead (eager and compiled)
# --------------------------------------------------------------------------- #
MISSED_TARGETS_NOTE = REPO_ROOT / "benchmarks" / "missed_targets.md"


def profile_table(rows: list[dict]) -> list[str]:
    """Categories down, methods across, and each method's difference from plain."""
    methods = [r["method"] for r in rows]
    by_method = {r["method"]: r for r in rows}
    categories = [
        c for c in rows[0]["categories_us"] if any(r["categories_us"].get(c) for r in rows)
    ]
    header = ["where (us per step)", *methods]
    others = [m for m in methods if m != "plain"] if "plain" in by_method else []
    header += [f"{m} - plain" for m in others]

    def line(label: str, get: Callable[[dict], float | None]) -> list[Any]:
        values = [get(by_method[m]) for m in methods]
        plain = get(by_method["plain"]) if others else None
        diffs = [
            None if plain is None or v is None else v - plain
            for v in map(get, (by_method[m] for m in others))
        ]
        return [
            label,
            *("-" if v is None else f"{v:.1f}" for v in values),
            *("-" if d is None else f"{d:+.1f}" for d in diffs),
        ]

    body = [line(c, lambda r, c=c: r["categories_us"].get(c, 0.0)) for c in categories]
    body.append(line("**total under the profiler**", lambda r: r["profiled_us"]))
    body.append(line("**wall, unprofiled**", lambda r: r["wall_us"]))
    body.append(line("torch calls from Python per step", lambda r: r.get("torch_calls")))
    return markdown_table(header, body)


def profile_section(result: Result, device: str, out: Path) -> list[str]:
    """One table per (case, batch size, mode, level)."""
    lines = [f"### Profiles on {device} (`{rel(result.path, out)}`)", ""]
    if result.error:
        return lines + [f"Skipped: `{result.path.name}` {result.error}.", ""]
    rows = table_rows(result.data)
    lines += [f"Command: `{command_of(result)}`", ""]
    lines += method_lines(result.data if isinstance(result.data, dict) else {})

    def group_of(row: dict) -> tuple:
        return row["case"], row["batch_size"], row.get("mode", "eager"), row["level"]

    for case, batch_size, mode, level in dict.fromkeys(group_of(r) for r in rows):
        group = [r for r in rows if group_of(r) == (case, batch_size, mode, level)]
        lines += [f"#### {case}, B={batch_size}, {mode}, {level}", "", *profile_table(group), ""]
    return lines


# --------------------------------------------------------------------------- #
# Compile
# --------------------------------------------------------------------------- #
def flatten(row: dict) -> dict[str, Any]:
    """A row with nested dicts flattened one level (``a.b``)."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def generic_table(rows: list[dict]) -> list[str]:
    """Every key of the rows as a column, in order of first appearance; keys with one value in
    every row are stated once above the table instead."""
    flat = [flatten(r) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    constant = [c for c in columns if len(rows) > 1 and len({cell(r.get(c)) for r in flat}) == 1]
    lines = [f"Every row: {', '.join(f'{c} = {cell(flat[0].get(c))}' for c in constant)}.", ""]
    columns = [c for c in columns if c not in constant]
    return (lines if constant else []) + markdown_table(
        columns, ([r.get(c) for c in columns] for r in flat)
    )


def compile_section(result: Result, device: str, out: Path) -> list[str]:
    """The compile table of one file's rows on one device, one table per case when the rows
    name their case."""
    lines = [f"### torch.compile on {device} (`{rel(result.path, out)}`)", ""]
    if result.error:
        return lines + [f"Skipped: `{result.path.name}` {result.error}.", ""]
    rows = [r for r in table_rows(result.data) if str(r.get("device", "cpu")) == device]
    lines += [f"Command: `{command_of(result)}`", ""]
    data = result.data if isinstance(result.data, dict) else {}
    lines += method_lines(data)
    if not rows:
        return lines + ["No rows.", ""]
    rows = [{k: v for k, v in r.items() if k != "device"} for r in rows]
    if not all("case" in r for r in rows):
        return lines + generic_table(rows)
    for case in dict.fromkeys(r["case"] for r in rows):
        case_rows = [{k: v for k, v in r.items() if k != "case"} for r in rows if r["case"] == case]
        lines += [f"#### {case} (compile)", ""]
        description = case_rows[0].get("description")
        if description and all(r.get("description") == description for r in case_rows):
            case_rows = [{k: v for k, v in r.items() if k != "description"} for r in case_rows]
            lines += [f"_{description}_", ""]
        lines += generic_table(case_rows)
    return lines


# --------------------------------------------------------------------------- #
# Learning
# --------------------------------------------------------------------------- #
def library_cell(lib: dict) -> str:
    """A task's result for one library: met/missed on k/n seeds, the runs that did not finish
    with the first error, or n/a and why."""
    if lib.get("status") == "n/a":
        return f"n/a: {lib.get('reason')}"
    seeds = lib.get("seeds", [])
    unfinished = [r for r in seeds if r.get("status") != "ok"]
    parts = []
    if len(unfinished) < len(seeds) and lib.get("target_met") is None:
        parts.append(
            f"undecided ({lib.get('seeds_met')}/{len(seeds)} seeds on target, too few run)"
        )
    elif len(unfinished) < len(seeds):
        parts.append(
            f"{verdict(lib.get('target_met'))} ({lib.get('seeds_met')}/{len(seeds)} seeds)"
        )
    if unfinished:
        status = lib.get("status", "failed").upper()
        parts.append(f"{status} ({len(unfinished)}/{len(seeds)} seeds): {lib.get('error')}")
    return "; ".join(parts)


def learning_overview(tasks: dict[str, dict], libraries: list[str]) -> list[str]:
    """One row per task: the run, its target and reference, and each library's verdict."""
    rows = []
    for name, task in tasks.items():
        run = " ".join([task.get("script", "?"), *task.get("extra_args", [])])
        libs = task.get("libraries", {})
        rows.append(
            [
                name,
                f"`{run}`",
                task.get("total_frames"),
                task.get("target"),
                *(library_cell(libs[lib]) if lib in libs else "-" for lib in libraries),
                task.get("reference"),
            ]
        )
    return markdown_table(
        ["task", "tutorial", "frames", "target", *libraries, "published reference"], rows
    )


def learning_seed_table(task: dict, target: float | None) -> list[str]:
    """One row per library and seed: returns, wall time, frames, target met."""
    rows = []
    for library, lib in task.get("libraries", {}).items():
        for run in lib.get("seeds", []):
            final = run.get("final_return")
            met = None if final is None or target is None else final >= target
            status = run.get("status")
            rows.append(
                [
                    library,
                    run.get("seed"),
                    final,
                    run.get("train_return"),
                    run.get("eval_return"),
                    run.get("wall_time_s"),
                    "-"
                    if not run.get("load_1min")
                    else "{:.1f} / {:.1f}".format(*run["load_1min"]),
                    run.get("total_frames"),
                    verdict(met) if status == "ok" else f"{status}: {run.get('error')}",
                ]
            )
    return markdown_table(
        [
            "library",
            "seed",
            "final_return",
            "train_return",
            "eval_return",
            "wall time s",
            "load before / after",
            "frames",
            "target met",
        ],
        rows,
    )


def swap_notes(task: dict) -> list[str]:
    """How the TorchRL variant of a task was made (its import rewrite)."""
    swap = task.get("libraries", {}).get("torchrl", {}).get("swap")
    if not swap:
        return []
    lines = [f"TorchRL variant: `{old}` -> `{new}`" for old, new in swap.get("imports", [])]
    if swap.get("kept"):
        lines.append(f"still imported from rlloss: {', '.join(f'`{k}`' for k in swap['kept'])}")
    return [*lines, ""]


def learning_section(result: Result, device: str, out: Path) -> list[str]:
    """The overview and per-task tables and figures of one learning file."""
    lines = [f"### Learning on {device} (`{rel(result.path, out)}`)", ""]
    if result.error or not isinstance(result.data, dict):
        return lines + [f"Skipped: `{result.path.name}` {result.error or 'has no tasks'}.", ""]
    data = result.data
    summarized = data.get("command")
    lines += [
        f"Runs made by `{command_of(result)}`"
        + (
            f", summarized by `{summarized}`"
            if summarized and summarized != command_of(result)
            else ""
        )
        + ".",
        "",
    ]
    lines += method_lines(data)
    lines += [f"References: {data['references']}.", ""] if data.get("references") else []
    tasks = data.get("tasks", {})
    libraries = list(dict.fromkeys(lib for t in tasks.values() for lib in t.get("libraries", {})))
    lines += learning_overview(tasks, libraries)
    for name, task in tasks.items():
        lines += [f"#### {name}", ""]
        lines += swap_notes(task)
        lines += learning_seed_table(task, task.get("target"))
        if task.get("figure"):
            figure = result.path.parent / task["figure"]
            lines += (
                [f"![{name} learning curves]({rel(figure, out)})", ""]
                if figure.exists()
                else [f"(figure `{task['figure']}` not found next to `{result.path.name}`)", ""]
            )
    return lines


# --------------------------------------------------------------------------- #
# Assembly
# --------------------------------------------------------------------------- #
SECTIONS = {
    "overhead": overhead_section,
    "profile": profile_section,
    "compile": compile_section,
    "learning": learning_section,
}
TITLES = {
    "overhead": "Overhead per update",
    "profile": "Where the overhead goes",
    "compile": "torch.compile",
    "learning": "Learning",
}


def kind_sections(results: list[Result], kind: str, on_gpu: bool, out: Path) -> list[str]:
    """The sections of one kind of file, for cpu devices or for the others."""
    lines = []
    for result in (r for r in results if r.kind == kind):
        devices = devices_of(result) if result.data is not None else ["cpu"]
        for device in devices:
            if (device_kind(device) != "cpu") == on_gpu:
                lines += SECTIONS[kind](result, device, out)
    return lines


def cpu_sections(results: list[Result], out: Path) -> list[str]:
    """One top-level section per kind, with the cpu figures of every file of that kind."""
    lines = []
    for kind in KINDS:
        body = kind_sections(results, kind, on_gpu=False, out=out)
        if kind == "profile" and MISSED_TARGETS_NOTE.exists():  # after every profile table
            body += [MISSED_TARGETS_NOTE.read_text().strip(), ""]
        missing = f"No `{kind}*.json` in the results dir; this section is skipped."
        lines += [f"## {TITLES[kind]}", "", *(body or [missing, ""])]
    return lines


def gpu_section(results: list[Result], out: Path) -> list[str]:
    """Every figure measured on a non-cpu device, or a note that none exists yet."""
    body = [line for kind in KINDS for line in kind_sections(results, kind, on_gpu=True, out=out)]
    if not body:
        body = [
            "No GPU figures exist yet: every JSON in the results dir was measured on cpu. "
            "Running a benchmark with `--device cuda` (written to e.g. `overhead-cuda.json`) and "
            "then this script adds its sections here.",
            "",
        ]
    return ["## GPU", "", *body]


def render(results_dir: Path, out: Path) -> tuple[str, list[str]]:
    """The whole report and the notes worth printing (skipped files)."""
    results = load_results(results_dir)
    notes = [
        f"{r.path.name}: {overhead_format_problem(r)}"
        for r in results
        if r.kind == "overhead" and overhead_format_problem(r)
    ]
    notes += [f"{r.path.name}: {r.error}" for r in results if r.error and r.kind != "overhead"]
    notes += [
        f"no {kind}*.json in {results_dir}"
        for kind in KINDS
        if not any(r.kind == kind for r in results)
    ]
    lines = [
        *header_section(results, results_dir, out),
        *inputs_section(results, out),
        *machines_section(results),
        *cpu_sections(results, out),
        *gpu_section(results, out),
    ]
    return "\n".join(lines).rstrip() + "\n", notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    text, notes = render(args.results_dir.resolve(), args.out.resolve())
    args.out.write_text(text)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
