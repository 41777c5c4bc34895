"""Write ``BENCHMARKS.md`` from the JSON results in ``benchmarks/results/``: its prose is
``benchmarks/page.md``, its tables are written here, and its last section, the missed targets
explained, is ``benchmarks/misses.md`` (written by hand).

    python benchmarks/report.py                                  # -> BENCHMARKS.md
    python benchmarks/report.py --results-dir /tmp/res --out /tmp/BENCHMARKS.md

Inputs, each optional (a missing file is a note, never an error): ``overhead*.json``
(``overhead.py``: the timed ratios, held to ``TARGETS``; a file in the older format, rows
without ``mode`` / ``level``, is skipped with a note), ``instructions*.json`` (``instructions.py``:
counts beside the timed ratios), ``compile*.json``
(``compile_report.py``) and ``learning*.json`` (``tools/tutorial_runs.py``). The page
summarises CPU rows; files with rows from another device are named in a note.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
DEFAULT_OUT = REPO_ROOT / "BENCHMARKS.md"
MISSES = REPO_ROOT / "benchmarks" / "misses.md"  # BENCHMARKS.md's last section, by hand
PAGE = REPO_ROOT / "benchmarks" / "page.md"  # its prose, around the tables written here
KINDS = ("overhead", "compile", "learning")
CELL_CHARS = 160  # longer table cells (error messages, break reasons) are cut
HEADLINE_LEVEL = "backward"  # zero_grad + forward + backward: the loss's whole share of a step
HAND_INSTRUCTIONS = "instructions-hand-written.json"  # benchmarks/instructions.py --hand-written
SMALL_BATCH_MAX = 1024  # batch sizes up to this are "small" for the eager target


# Result files
@dataclass
class Result:
    """One JSON file of the results dir."""

    kind: str
    path: Path
    data: Any
    error: str | None = None


def load_results(results_dir: Path) -> list[Result]:
    """Every ``<kind>*.json`` of the results dir, by kind then name; unreadable files carry
    their error."""
    results = []
    for kind in KINDS:
        for path in sorted(results_dir.glob(f"{kind}*.json")):
            try:
                results.append(Result(kind, path, json.loads(path.read_text())))
            except (OSError, ValueError) as err:
                results.append(Result(kind, path, None, f"could not be read: {err}"))
    return results


def date_of(result: Result) -> str:
    """The date of the file's ``machine`` block ('?' without one)."""
    data = result.data
    machine = data.get("machine") or {} if isinstance(data, dict) else {}
    return machine.get("date", "?")


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


def on_cpu(row: dict) -> bool:
    """Whether a row was measured on the CPU (``cuda:0`` is not)."""
    return str(row.get("device", "cpu")).split(":")[0] == "cpu"


def problem_of(result: Result) -> str | None:
    """Why a file cannot be shown (unreadable; an overhead file without rows or in the older
    format), or None."""
    if result.error or result.kind != "overhead":
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


def overhead_rows(results: list[Result], keep: Callable[[dict], bool]) -> list[tuple[dict, str]]:
    """The CPU rows at the headline level that ``keep`` accepts, from the readable overhead
    files, each with its file's date, oldest file first."""
    return [
        (row, date_of(result))
        for result in sorted(results, key=date_of)
        if result.kind == "overhead" and not problem_of(result)
        for row in table_rows(result.data)
        if row["level"] == HEADLINE_LEVEL and on_cpu(row) and keep(row)
    ]


def read_json(path: Path, notes: list[str]) -> dict | None:
    """A JSON file (``None`` without it; a note if it cannot be read)."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        notes.append(f"{path.name}: could not be read: {err}")
        return None


def load_counts(results_dir: Path, notes: list[str]) -> dict[str, dict]:
    """The entries of every keyed instruction file (``"<case>, B=<batch>"`` -> counts) of the
    headline level, each with its file's name; the newest entry of a key wins."""
    found = []
    for path in sorted(results_dir.glob("instructions*.json")):
        data = read_json(path, notes) or {}
        if "machine" not in data or data.get("level") != HEADLINE_LEVEL:
            continue  # the older files: one batch size per file, no date
        date = data["machine"].get("date", "?")
        found += [
            {"date": date, **entry, "key": key, "file": path.name}
            for key, entry in data["cases"].items()
        ]
    return {e["key"]: e for e in sorted(found, key=lambda e: e.get("date", ""))}


# Cells and the table writer
def cell(x: Any) -> str:
    """A value as a table cell: floats to four figures, no pipes or newlines, long text cut."""
    if x is None:
        return "-"
    text = number(x) if isinstance(x, float) else " ".join(str(x).split()).replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 3] + "..."


def number(x: float) -> str:
    """A float with about four significant figures."""
    if not math.isfinite(x):
        return str(x)
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"
    return f"{x:.3e}"


def table(header: list[str], rows: Iterable[list[Any]], sources: Iterable[str]) -> list[str]:
    """A GitHub markdown table, then the line naming its source files."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + ["", f"From {', '.join(sources)}.", ""]


def source(name: str, date: str, extra: str = "") -> str:
    """A source file as the tables name it: its name and day."""
    return f"`{name}` ({date[:10]}{extra})"


# Targets: a bound on the median of one ratio, for the rows it applies to (bold where missed)
HAND_PPO = ("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "A2CLoss")
HAND_CUSTOM_CRITIC = tuple(
    f"{name}-custom-critic" for name in ("DDPGLoss", "TD3Loss", "SACLoss", "REDQLoss", "TQCLoss")
)


def eager(small: bool | None = None) -> Callable[[dict], bool]:
    """Eager rows (at most ``SMALL_BATCH_MAX`` samples with ``small``, more with ``not small``)."""
    return lambda r: r["mode"] == "eager" and small in (None, r["batch_size"] <= SMALL_BATCH_MAX)


def hand_row(cases: tuple[str, ...], batch_size: int) -> Callable[[dict], bool]:
    """The eager rows of ``cases`` at ``batch_size`` (the hand-written comparison, issue 39)."""
    return lambda r: r["mode"] == "eager" and r["case"] in cases and r["batch_size"] == batch_size


# (ratio, bound, at_most: ratio <= bound (else >=), the rows it applies to)
TARGETS = (
    ("rlloss/plain", 1.10, True, eager(small=True)),
    ("rlloss/plain", 1.02, True, eager(small=False)),
    ("torchrl/rlloss", 1.5, False, eager()),
    ("rlloss/plain", 1.05, True, lambda r: r["mode"] == "compiled"),
    ("rlloss-min/hand-min", 1.15, True, hand_row(HAND_PPO, 64)),  # diagnostics off
    ("rlloss/hand", 1.25, True, hand_row(HAND_PPO, 64)),  # diagnostics on
    ("rlloss/hand", 1.15, True, hand_row(("DQNLoss",), 64)),  # no switch
    ("rlloss/hand", 1.10, True, hand_row(HAND_CUSTOM_CRITIC, 256)),
)


def missed(row: dict, ratio: str) -> bool:
    """Whether a target on ``ratio`` that applies to ``row`` is missed."""
    value = row.get("ratios", {}).get(ratio, {}).get("median")
    return value is not None and any(
        name == ratio and applies(row) and (value > bound if at_most else value < bound)
        for name, bound, at_most, applies in TARGETS
    )


# Overhead
def smallest_batch_rows(results: list[Result], mode: str) -> dict[str, tuple[dict, str]]:
    """Per case, its row of ``mode`` at its smallest batch size with plain timed, from the
    newest file that has one; cases in order of first appearance in the files."""
    found = [
        (row, result)
        for result in results
        if result.kind == "overhead" and not problem_of(result)
        for row in table_rows(result.data)
        if row["mode"] == mode
        and row["level"] == HEADLINE_LEVEL
        and on_cpu(row)
        and "plain" in row.get("methods", {})  # not a run of other methods only
    ]
    newest_first = sorted(found, key=lambda item: date_of(item[1]), reverse=True)
    chosen = {}
    for case in dict.fromkeys(row["case"] for row, _ in found):
        row, result = min(  # the first of equal batch sizes: the newest
            (item for item in newest_first if item[0]["case"] == case),
            key=lambda item: item[0]["batch_size"],
        )
        cpu_time = ", CPU time" if row.get("clock") == "cpu" else ""
        chosen[case] = (row, source(result.path.name, date_of(result), cpu_time))
    return chosen


def ratio_text(row: dict | None, ratio: str, batch_size: int | None = None) -> str:
    """A row's median ``ratio``, bold where it misses its target, with its batch size where it
    is not its neighbours'; FAILED for a row that failed its gate, why where it has none."""
    if row is None:
        return "-"
    if row.get("status", "ok") != "ok":
        return "FAILED"
    value = row.get("ratios", {}).get(ratio, {}).get("median")
    if value is None:
        for name in ratio.split("/"):
            method = row.get("methods", {}).get(name, {})
            if str(method.get("reason", "")).startswith("does not compile"):
                return f"{name} does not compile"
            if method.get("status") == "skipped":
                return f"{name} skipped"
        return "-"
    text = f"**{value:.3f}**" if missed(row, ratio) else f"{value:.3f}"
    return text if batch_size in (None, row["batch_size"]) else f"{text} (B={row['batch_size']})"


def time_text(row: dict | None, method: str) -> str:
    """A method's median time of the step, in microseconds."""
    time_us = (row or {}).get("methods", {}).get(method, {}).get("time_us")
    return "-" if not time_us else f"{time_us['median']:.0f}"


def overhead_table(results: list[Result], counts: dict) -> list[str]:
    """One row per loss: eager and compiled ratios to plain torch and TorchRL's to rlloss, and
    the instruction-count ratios where ``counts`` (``"<case>, B=<batch>"`` -> an entry of a
    keyed instruction file) has them."""
    by_mode = {mode: smallest_batch_rows(results, mode) for mode in ("eager", "compiled")}
    if not any(by_mode.values()):
        return ["No overhead results in the results dir.", ""]
    rows, sources = [], [s for chosen in by_mode.values() for _, s in chosen.values()]
    for case in dict.fromkeys([*by_mode["eager"], *by_mode["compiled"]]):
        eager_row, compiled_row = (by_mode[m].get(case, (None,))[0] for m in by_mode)
        batch_size = (eager_row or compiled_row)["batch_size"]
        count = counts.get(f"{case}, B={batch_size}")
        if count and {"rlloss/plain", "torchrl/rlloss"} & set(count.get("ratios", {})):
            sources.append(source(count["file"], count["date"]))
        rows.append(
            [
                case,
                batch_size,
                time_text(eager_row, "rlloss"),
                ratio_text(eager_row, "rlloss/plain"),
                ratio_text(eager_row, "torchrl/rlloss"),
                ratio_text(compiled_row, "rlloss/plain", batch_size),
                ratio_text(compiled_row, "torchrl/rlloss", batch_size),
                *(counted_text(count, r) for r in ("rlloss/plain", "torchrl/rlloss")),
            ]
        )
    header = ["loss", "batch", "eager: rlloss µs"]
    header += [
        f"{m}: {r}" for m in ("eager", "compiled") for r in ("rlloss / plain", "TorchRL / rlloss")
    ]
    header += ["instructions: rlloss / plain", "instructions: TorchRL / rlloss"]
    return table(header, rows, dict.fromkeys(sources))


def counted_text(count: dict | None, ratio: str) -> str:
    """An instruction-count ratio ('-' where it was not counted)."""
    value = (count or {}).get("ratios", {}).get(ratio)
    return "-" if value is None else f"{value:.3f}"


# Against the hand-written step
def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs``, linearly interpolated."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread_text(row: dict, ratio: str) -> str:
    """``median (p25-p75) [fastest tenth x]`` of a paired ratio, the median bold where it misses
    its target; the fastest tenth is the ratio of the two methods' 10th percentiles of their
    blocks (load only ever adds time: the least inflated figure)."""
    r = row.get("ratios", {}).get(ratio)
    if r is None:
        return "-"
    median = f"**{r['median']:.3f}**" if missed(row, ratio) else f"{r['median']:.3f}"
    methods = row.get("methods", {})
    num, den = (methods.get(name, {}).get("samples_us") for name in ratio.split("/"))
    fastest = (
        f" [fastest tenth {quantile(num, 0.1) / quantile(den, 0.1):.3f}]" if num and den else ""
    )
    return f"{median} ({r['p25']:.3f}-{r['p75']:.3f}){fastest}"


def hand_table(results: list[Result], instructions: dict | None) -> list[str]:
    """One row per (case, batch size) timed against the hand-written step (its newest row): the
    paired time ratios with their spread, diagnostics on and off, and the instruction counts."""
    found = {
        (row["case"], row["batch_size"]): (row, date)
        for row, date in overhead_rows(
            results, lambda r: r["mode"] == "eager" and "rlloss/hand" in r.get("ratios", {})
        )
    }
    if not found:
        return ["No overhead results with the hand-written methods in the results dir.", ""]
    counts = (instructions or {}).get("cases", {})
    body = []
    for (case, batch_size), (row, _) in found.items():
        count = counts.get(f"{case}, B={batch_size}", {}).get("ratios", {})
        off = "rlloss-min/hand-min" in row["ratios"]
        body.append(
            [
                case,
                batch_size,
                time_text(row, "hand"),
                time_text(row, "rlloss"),
                spread_text(row, "rlloss/hand"),
                spread_text(row, "rlloss-min/hand-min") if off else "no switch",
                spread_text(row, "rlloss/hand-min"),
                *(
                    f"{count[k]:.3f}" if k in count else "-"
                    for k in ("rlloss/hand", "rlloss-min/hand-min", "rlloss/hand-min")
                ),
            ]
        )
    header = ["loss", "batch", "hand µs", "rlloss µs", "rlloss / hand (diagnostics on)"]
    header += ["rlloss-min / hand-min (off)", "rlloss / hand-min", "instructions: on"]
    header += ["instructions: off", "instructions: rlloss / hand-min"]
    sources = [
        source(r.path.name, date_of(r))
        for r in sorted(results, key=date_of)
        if any(row is found_row for found_row, _ in found.values() for row in table_rows(r.data))
    ]
    if instructions is not None:
        sources.append(
            source(HAND_INSTRUCTIONS, (instructions.get("machine") or {}).get("date", "?"))
        )
    return table(header, body, dict.fromkeys(sources))


# torch.compile and learning
def compile_cells(row: dict | None) -> list[str]:
    """One library's figures: fullgraph, graphs / breaks, recompiles, cold and warm seconds."""
    if row is None:
        return ["-"] * 4
    if row.get("explain_error"):
        return [f"error: {str(row['explain_error'])[:60]}", "-", "-", "-"]
    fullgraph = "yes" if row.get("fullgraph_ok") else "**no**"
    graphs = f"{row.get('graph_count')} / {row.get('graph_break_count')}"
    cold, warm = row.get("cold_s"), row.get("warm_s")
    seconds = "-" if cold is None else f"{cold:.1f} / {warm:.2f}" if warm else f"{cold:.1f} / -"
    recompiles = row.get("recompiles")
    return [fullgraph, graphs, "-" if recompiles is None else str(recompiles), seconds]


def compile_table(results: list[Result]) -> list[str]:
    """One row per loss, rlloss's figures beside TorchRL's, from the newest file with each (rows
    with a case and a library: ``compiled_update.json``'s updates per second are not here)."""
    found: dict[str, dict[str, dict]] = {}
    sources = []
    for result in sorted(results, key=date_of):
        rows = [r for r in table_rows(result.data) if "case" in r and "library" in r]
        if result.kind == "compile" and rows:
            sources.append(source(result.path.name, date_of(result)))
            for row in rows:
                found.setdefault(row["case"], {})[row["library"]] = row
    if not found:
        return ["No compile results in the results dir.", ""]
    rows = [
        [case, *(c for lib in ("rlloss", "torchrl") for c in compile_cells(libs.get(lib)))]
        for case, libs in found.items()
    ]
    columns = ("fullgraph", "graphs / breaks", "recompiles", "cold / warm s")
    header = ["loss"] + [f"{lib}: {column}" for lib in ("rlloss", "TorchRL") for column in columns]
    return table(header, rows, sources)


def learning_cells(lib: dict | None) -> list[str]:
    """A library's final return (mean over finished seeds), seeds on target with the verdict,
    and mean wall time; n/a or the failure where there is none."""
    if lib is None:
        return ["-", "-", "-"]
    if lib.get("status") == "n/a":
        return [f"n/a: {lib.get('reason')}", "-", "-"]
    mean, wall = lib.get("final_return_mean"), lib.get("wall_time_s_mean")
    target = lib.get("target_met")
    verdict = "undecided" if target is None else "met" if target else "**missed**"
    seeds = f"{lib.get('seeds_met')}/{lib.get('seeds_run')}, {verdict}"
    if lib.get("status", "ok") != "ok":
        seeds += f"; {lib['status'].upper()}: {str(lib.get('error'))[:60]}"
    return ["-" if mean is None else f"{mean:.1f}", seeds, "-" if wall is None else f"{wall:.0f}"]


def learning_table(results: list[Result]) -> list[str]:
    """One row per tutorial: its target, and each library's final return, seeds on target and
    wall time."""
    tasks: dict[str, dict] = {}
    sources = []
    for result in results:
        if result.kind == "learning" and isinstance(result.data, dict):
            tasks.update(result.data.get("tasks", {}))
            sources.append(source(result.path.name, date_of(result)))
    if not tasks:
        return ["No learning results in the results dir.", ""]
    rows = [
        [name, task.get("target")]
        + [c for lib in ("rlloss", "torchrl") for c in learning_cells(task["libraries"].get(lib))]
        for name, task in tasks.items()
    ]
    header = ["tutorial", "target", "rlloss return", "seeds on target", "s"]
    header += ["TorchRL return", "seeds on target", "s"]
    return table(header, rows, sources)


# The page
def render(results_dir: Path) -> tuple[str, list[str]]:
    """BENCHMARKS.md's text, and the notes worth printing (unreadable or skipped files, missing
    kinds)."""
    results = load_results(results_dir)
    notes = [f"{r.path.name}: {problem_of(r)}" for r in results if problem_of(r)]
    notes += [f"no {k}*.json in {results_dir}" for k in KINDS if all(r.kind != k for r in results)]
    instructions = read_json(results_dir / HAND_INSTRUCTIONS, notes)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    inside = results_dir.is_relative_to(REPO_ROOT)
    shown = results_dir.relative_to(REPO_ROOT).as_posix() if inside else results_dir
    off_cpu = [r.path.name for r in results if not all(map(on_cpu, table_rows(r.data)))]
    page = PAGE.read_text().format(
        generated=f"Generated {now} by `python benchmarks/report.py` from the JSON files in "
        f"`{shown}/` ({len(results)} used here). Do not edit by hand: re-run the benchmarks, "
        "then that command.",
        overhead="\n".join(overhead_table(results, load_counts(results_dir, notes))),
        hand="\n".join(hand_table(results, instructions)),
        compile="\n".join(compile_table(results)),
        learning="\n".join(learning_table(results)),
    )
    if off_cpu:
        page += f"Rows measured on a GPU, not summarised here: {', '.join(off_cpu)}.\n"
    misses = MISSES.read_text() if MISSES.exists() else "## Missed targets, explained\n\n-\n"
    return page.rstrip() + "\n\n" + misses, notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    text, notes = render(args.results_dir.resolve())
    args.out.write_text(text)
    print(f"wrote {args.out}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
