"""BENCHMARKS.md: one screen of headline tables, each loss's overhead at its small batch and each
tutorial's learning result with both libraries, and the links to the full tables."""

from __future__ import annotations

from benchmarks.pages.markdown import (
    Result,
    devices_of,
    machine_of,
    markdown_table,
    on_cpu,
    table_rows,
    verdict,
)
from benchmarks.pages.overhead import format_problem, missed

HEADLINE_LEVEL = "backward"  # zero_grad + forward + backward: the loss's whole share of a step
ERROR_CHARS = 60


# --------------------------------------------------------------------------- #
# Overhead
# --------------------------------------------------------------------------- #
def smallest_batch_rows(results: list[Result], mode: str) -> dict[str, tuple[dict, Result]]:
    """Per case, its CPU row of ``mode`` at the headline level and its smallest batch size, from
    the newest file that has one; cases in order of first appearance."""
    found = [
        (row, result)
        for result in results
        if result.kind == "overhead" and not format_problem(result)
        for row in table_rows(result.data)
        if row["mode"] == mode
        and row["level"] == HEADLINE_LEVEL
        and on_cpu(str(row.get("device", "cpu")))
    ]
    cases = list(dict.fromkeys(row["case"] for row, _ in found))
    newest_first = sorted(found, key=lambda item: machine_of(item[1]).get("date", ""), reverse=True)
    return {
        case: min(  # the first of equal batch sizes: the newest
            (item for item in newest_first if item[0]["case"] == case),
            key=lambda item: item[0]["batch_size"],
        )
        for case in cases
    }


def ratio_text(row: dict | None, ratio: str, batch_size: int | None = None) -> str:
    """A row's median ``ratio``, in bold where it misses its target; its batch size where it is
    not the row's neighbours'; FAILED for a row that failed its gate, '-' where there is none."""
    if row is None:
        return "-"
    if row.get("status", "ok") != "ok":
        return "FAILED"
    value = row.get("ratios", {}).get(ratio, {}).get("median")
    if value is None:
        return untimed_text(row, ratio)
    text = f"**{value:.3f}**" if missed(row, ratio) else f"{value:.3f}"
    return text if batch_size in (None, row["batch_size"]) else f"{text} (B={row['batch_size']})"


def untimed_text(row: dict, ratio: str) -> str:
    """Why a row has no ``ratio``: one of its methods did not compile or was skipped; '-' where
    the library has no such loss."""
    for name in ratio.split("/"):
        method = row.get("methods", {}).get(name, {})
        if str(method.get("reason", "")).startswith("does not compile"):
            return f"{name} does not compile"
        if method.get("status") == "skipped":
            return f"{name} skipped"
    return "-"


def rlloss_time(row: dict) -> str:
    """rlloss's median time of the step, in microseconds."""
    time_us = row.get("methods", {}).get("rlloss", {}).get("time_us")
    return "-" if not time_us else f"{time_us['median']:.0f}"


def overhead_table(results: list[Result]) -> list[str]:
    """One row per loss: eager and compiled ratios to plain torch and TorchRL's to rlloss."""
    eager = smallest_batch_rows(results, "eager")
    compiled = smallest_batch_rows(results, "compiled")
    if not eager and not compiled:
        return ["No overhead results in the results dir.", ""]
    rows = []
    for case in dict.fromkeys([*eager, *compiled]):
        eager_row = eager.get(case, (None, None))[0]
        compiled_row = compiled.get(case, (None, None))[0]
        batch_size = (eager_row or compiled_row)["batch_size"]
        rows.append(
            [
                case,
                batch_size,
                rlloss_time(eager_row) if eager_row else "-",
                ratio_text(eager_row, "rlloss/plain"),
                ratio_text(eager_row, "torchrl/rlloss"),
                ratio_text(compiled_row, "rlloss/plain", batch_size),
                ratio_text(compiled_row, "torchrl/rlloss", batch_size),
            ]
        )
    header = [
        "loss",
        "batch",
        "eager: rlloss µs",
        "eager: rlloss / plain",
        "eager: TorchRL / rlloss",
        "compiled: rlloss / plain",
        "compiled: TorchRL / rlloss",
    ]
    sources = {
        r.path.name: machine_of(r).get("date", "?")[:10]
        for _, r in [*eager.values(), *compiled.values()]
    }
    return markdown_table(header, rows) + [
        "From " + ", ".join(f"`{name}` ({date})" for name, date in sources.items()) + ".",
        "",
    ]


# --------------------------------------------------------------------------- #
# Learning
# --------------------------------------------------------------------------- #
def learning_cells(lib: dict | None) -> list[str]:
    """A library's final return (mean over finished seeds), seeds on target with the verdict,
    and mean wall time; n/a or the failure where there is none."""
    if lib is None:
        return ["-", "-", "-"]
    if lib.get("status") == "n/a":
        return [f"n/a: {lib.get('reason')}", "-", "-"]
    mean, wall = lib.get("final_return_mean"), lib.get("wall_time_s_mean")
    seeds = f"{lib.get('seeds_met')}/{lib.get('seeds_run')}"
    target = lib.get("target_met")
    seeds += f", {verdict(target)}" if target is not None else ", undecided"
    if lib.get("status", "ok") != "ok":
        seeds += f"; {lib['status'].upper()}: {str(lib.get('error'))[:ERROR_CHARS]}"
    return [
        "-" if mean is None else f"{mean:.1f}",
        seeds,
        "-" if wall is None else f"{wall:.0f}",
    ]


def learning_table(results: list[Result]) -> list[str]:
    """One row per tutorial: its target, and each library's final return, seeds on target and
    wall time."""
    tasks: dict[str, dict] = {}
    sources = []
    for result in results:
        if result.kind == "learning" and isinstance(result.data, dict):
            tasks.update(result.data.get("tasks", {}))
            sources.append(f"`{result.path.name}` ({machine_of(result).get('date', '?')[:10]})")
    if not tasks:
        return ["No learning results in the results dir.", ""]
    rows = [
        [
            name,
            task.get("target"),
            *learning_cells(task.get("libraries", {}).get("rlloss")),
            *learning_cells(task.get("libraries", {}).get("torchrl")),
        ]
        for name, task in tasks.items()
    ]
    header = [
        "tutorial",
        "target",
        "rlloss return",
        "seeds on target",
        "s",
        "TorchRL return",
        "seeds on target",
        "s",
    ]
    return markdown_table(header, rows) + [f"From {', '.join(sources)}.", ""]


# --------------------------------------------------------------------------- #
# The page
# --------------------------------------------------------------------------- #
def headline(results: list[Result], generated: str, links: list[tuple[str, str]]) -> str:
    """BENCHMARKS.md: the two headline tables and the links (title, relative path) to the
    full tables."""
    gpu = any(not on_cpu(d) for r in results if r.data is not None for d in devices_of(r))
    lines = [
        "# Benchmarks",
        "",
        generated,
        "",
        "Full tables: " + " · ".join(f"[{title}]({path})" for title, path in links) + ".",
        "",
        "## Overhead per update",
        "",
        f"One `{HEADLINE_LEVEL}` step (zero_grad + forward + backward) at each loss's small batch, "
        "CPU, 1 thread; medians of paired per-round time ratios. rlloss / plain: over the same "
        "math written by hand in plain torch (target <= 1.10 eager, <= 1.05 compiled). "
        "TorchRL / rlloss: TorchRL's loss over rlloss's (target >= 1.5 eager). **Bold**: the "
        "target is missed; -: no such loss in TorchRL.",
        "",
        *overhead_table(results),
        "## Learning",
        "",
        "Each tutorial with rlloss and with the TorchRL loss swapped in by its import: final "
        "return (mean over seeds), seeds on target (met when at least 2 are), mean wall time in "
        "seconds.",
        "",
        *learning_table(results),
    ]
    if gpu:
        lines += ["GPU figures: the GPU section of each linked page.", ""]
    return "\n".join(lines).rstrip() + "\n"
