"""The learning page: per tutorial and library the verdict on its target, the per-seed returns
and wall times, how the TorchRL variant was made, and the learning curves."""

from __future__ import annotations

from pathlib import Path

from benchmarks.pages.markdown import Result, command_of, markdown_table, method_lines, rel, verdict


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
