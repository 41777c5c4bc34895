"""The profile page: per case, batch size, mode and level, where a step's time goes for each
method, and each method's difference from plain."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.pages.markdown import (
    Result,
    command_of,
    markdown_table,
    method_lines,
    rel,
    table_rows,
)


def baselines(methods: list[str]) -> list[tuple[str, str]]:
    """(method, baseline) pairs to difference: every method against plain where plain was
    profiled, else rlloss against the hand-written step (diagnostics on and off)."""
    if "plain" in methods:
        return [(m, "plain") for m in methods if m != "plain"]
    pairs = [("rlloss", "hand"), ("rlloss-min", "hand-min")]
    return [(m, base) for m, base in pairs if m in methods and base in methods]


def profile_table(rows: list[dict]) -> list[str]:
    """Categories down, methods across, and each method's difference from its baseline."""
    methods = [r["method"] for r in rows]
    by_method = {r["method"]: r for r in rows}
    categories = [
        c for c in rows[0]["categories_us"] if any(r["categories_us"].get(c) for r in rows)
    ]
    pairs = baselines(methods)
    header = ["where (us per step)", *methods, *(f"{m} - {base}" for m, base in pairs)]

    def line(label: str, get: Callable[[dict], float | None]) -> list[Any]:
        values = [get(by_method[m]) for m in methods]
        diffs = []
        for m, base in pairs:
            v, b = get(by_method[m]), get(by_method[base])
            diffs.append(None if v is None or b is None else v - b)
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
        lines += top_functions(group)
    return lines


def top_functions(rows: list[dict]) -> list[str]:
    """The Python functions (tensordict, torchrl, rlloss, torch's) with the most self time of
    each row's method that records them."""
    lines = []
    for row in rows:
        if row.get("top_functions") and not row["method"].startswith(("plain", "hand")):
            body = [
                [name, where, f"{us:.1f}", f"{calls:g}"]
                for name, where, us, calls in row["top_functions"]
            ]
            header = [f"{row['method']}: function", "where", "self us per step", "calls per step"]
            lines += markdown_table(header, body)
    return lines
