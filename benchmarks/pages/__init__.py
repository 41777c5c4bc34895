"""BENCHMARKS.md, rendered from the JSON results (``benchmarks/report.py`` writes it).

Inputs, each optional (a missing file is a note, never an error):

* ``overhead*.json`` -- ``benchmarks/overhead.py``: per case, batch size, mode (eager /
  compiled) and level the time of each method and the paired ratios, checked against the targets
  (:mod:`benchmarks.pages.targets`). A file in the older format (rows without ``mode`` /
  ``level``) is skipped with a note.
* ``instructions*.json`` -- ``benchmarks/instructions.py --dumped`` / ``--hand-written``: the
  instructions per step, shown beside the timed ratios.
* ``compile*.json`` -- ``benchmarks/compile_report.py``: graphs, breaks, recompiles per loss.
* ``learning*.json`` -- ``benchmarks/learning.py``: per tutorial and library the returns.
* ``benchmarks/misses.md`` -- written by hand: why each missed target is missed; copied as
  BENCHMARKS.md's last section.

The JSON files hold every figure (every batch size, level and method, the profiles of
``benchmarks/profile_overhead.py``); BENCHMARKS.md summarises them on CPU rows. Rows measured on
another device are counted in a note (their files are named there).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.pages.compile import compile_table
from benchmarks.pages.headline import HAND_INSTRUCTIONS, HEADLINE_LEVEL, hand_table, overhead_table
from benchmarks.pages.learning import learning_table
from benchmarks.pages.markdown import (
    KINDS,
    REPO_ROOT,
    Result,
    generated_line,
    load_results,
    on_cpu,
    table_rows,
)
from benchmarks.pages.targets import format_problem

MISSES = REPO_ROOT / "benchmarks" / "misses.md"  # BENCHMARKS.md's last section, by hand

OVERHEAD_TEXT = (
    f"One `{HEADLINE_LEVEL}` step (zero_grad + forward + backward) at each loss's small batch, "
    "CPU, 1 thread; medians of paired per-round time ratios (wall time; the process's CPU time "
    "where a source below says so). rlloss / plain: over the same math written by hand in plain "
    "torch (target <= 1.10 eager, <= 1.05 compiled). TorchRL / rlloss: TorchRL's loss over "
    "rlloss's (target >= 1.5 eager). **Bold**: the target is missed; -: no such loss in TorchRL. "
    "Instructions: callgrind's count per step of the same step, eager (load-independent: the "
    "robust figure on a busy machine), where counted (`benchmarks/instructions.py --dumped`). "
    "Every batch size, level and method: the `overhead*.json` files."
)
HAND_TEXT = (
    "The same `backward` step against the loss written by hand in one file, CleanRL-style "
    "(`benchmarks/cases/handwritten.py`: formula log-probs, no distribution objects, no "
    "TensorDict, the off-policy critics the user's own `nn.Module` called as "
    "`critic(obs, action)`), eager, CPU, 1 thread. `hand` also computes the diagnostics rlloss "
    "returns, `hand-min` the losses only; `rlloss-min` is rlloss with `diagnostics=False` (the "
    "PPO family: DQN and the off-policy losses have no switch). Times: medians per step "
    "(microseconds); time ratios: median (p25-p75) of paired per-round ratios, and in brackets "
    "the ratio of the two methods' 10th percentiles of their blocks (on a loaded machine the "
    "least inflated); instructions: callgrind's count per step (load-independent, the robust "
    "figure). Targets: the PPO family at 64 <= 1.15 off and <= 1.25 on, DQN at 64 <= 1.15, the "
    "custom-critic losses at 256 <= 1.10; **bold**: missed."
)
COMPILE_TEXT = (
    "`torch.compile` of each loss on one batch of 64 (`benchmarks/compile_report.py`): whether "
    "`fullgraph=True` compiles, the graphs and graph breaks `torch._dynamo.explain` finds, the "
    "recompilations over 20 fresh batches, and the first (cold) and cached (warm) compile times."
)
LEARNING_TEXT = (
    "Each tutorial with rlloss and with the TorchRL loss swapped in by its import: final return "
    "(mean over seeds), seeds on target (met when at least 2 are), mean wall time in seconds; "
    "the curves are in the tutorials' pages (`benchmarks/results/learning_<tutorial>.png`)."
)


def problem_of(result: Result) -> str | None:
    """Why a file cannot be shown, or None."""
    return format_problem(result) if result.kind == "overhead" else result.error


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


def device_note(results: list[Result]) -> list[str]:
    """A line naming the files with rows measured off the CPU (not summarised here)."""
    files = [
        r.path.name
        for r in results
        if any(not on_cpu(str(row.get("device", "cpu"))) for row in table_rows(r.data))
    ]
    if not files:
        return []
    return [f"Rows measured on a GPU, not summarised here: {', '.join(files)}.", ""]


def render(results_dir: Path) -> tuple[str, list[str]]:
    """BENCHMARKS.md's text, and the notes worth printing (unreadable or skipped files, missing
    kinds)."""
    results = load_results(results_dir)
    notes = [f"{r.path.name}: {problem_of(r)}" for r in results if problem_of(r)]
    notes += [f"no {k}*.json in {results_dir}" for k in KINDS if all(r.kind != k for r in results)]
    instructions = read_json(results_dir / HAND_INSTRUCTIONS, notes)
    lines = [
        "# Benchmarks",
        "",
        generated_line(results_dir, len(results)),
        "",
        "Why each missed target (bold) is missed: [the last section](#missed-targets-explained).",
        "",
        "## Overhead per update",
        "",
        OVERHEAD_TEXT,
        "",
        *overhead_table(results, load_counts(results_dir, notes)),
        "## Against a hand-written step",
        "",
        HAND_TEXT,
        "",
        *hand_table(results, instructions),
        "## torch.compile",
        "",
        COMPILE_TEXT,
        "",
        *compile_table(results),
        "## Learning",
        "",
        LEARNING_TEXT,
        "",
        *learning_table(results),
        *device_note(results),
    ]
    misses = MISSES.read_text() if MISSES.exists() else "## Missed targets, explained\n\n-\n"
    return "\n".join(lines).rstrip() + "\n\n" + misses, notes
