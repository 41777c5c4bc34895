"""The learning table: per tutorial, its target and each library's final return, seeds on
target and wall time (``learning*.json``, written by ``benchmarks/learning.py``)."""

from __future__ import annotations

from benchmarks.pages.markdown import Result, machine_of, markdown_table, verdict

ERROR_CHARS = 60


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
