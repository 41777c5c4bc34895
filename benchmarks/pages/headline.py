"""The overhead tables of BENCHMARKS.md: each loss's overhead at its small batch (against plain
torch and TorchRL, eager and compiled, timed and counted), and the comparison with the
hand-written steps."""

from __future__ import annotations

from benchmarks.pages.markdown import Result, machine_of, markdown_table, on_cpu, table_rows
from benchmarks.pages.targets import format_problem, missed

HEADLINE_LEVEL = "backward"  # zero_grad + forward + backward: the loss's whole share of a step
HAND_INSTRUCTIONS = "instructions-hand-written.json"  # benchmarks/instructions.py --hand-written


# --------------------------------------------------------------------------- #
# Overhead
# --------------------------------------------------------------------------- #
def smallest_batch_rows(results: list[Result], mode: str) -> dict[str, tuple[dict, Result]]:
    """Per case, its CPU row of ``mode`` at the headline level and its smallest batch size, from
    the newest file that has one with plain timed; cases in order of first appearance."""
    found = [
        (row, result)
        for result in results
        if result.kind == "overhead" and not format_problem(result)
        for row in table_rows(result.data)
        if row["mode"] == mode
        and row["level"] == HEADLINE_LEVEL
        and on_cpu(str(row.get("device", "cpu")))
        and "plain" in row.get("methods", {})  # not a run of other methods only
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


def counted_text(counts: dict, case: str, batch_size: int, ratio: str) -> str:
    """The instruction-count ``ratio`` of ``case`` at ``batch_size`` ('-' where it was not
    counted)."""
    value = counts.get(f"{case}, B={batch_size}", {}).get("ratios", {}).get(ratio)
    return "-" if value is None else f"{value:.3f}"


def overhead_table(results: list[Result], counts: dict | None = None) -> list[str]:
    """One row per loss: eager and compiled ratios to plain torch and TorchRL's to rlloss, and
    the instruction-count ratios where ``counts`` (``"<case>, B=<batch>"`` -> an entry of a
    keyed instruction file, with its ``file`` and ``date``) has them."""
    counts = counts or {}
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
                time_text(eager_row, "rlloss") if eager_row else "-",
                ratio_text(eager_row, "rlloss/plain"),
                ratio_text(eager_row, "torchrl/rlloss"),
                ratio_text(compiled_row, "rlloss/plain", batch_size),
                ratio_text(compiled_row, "torchrl/rlloss", batch_size),
                counted_text(counts, case, batch_size, "rlloss/plain"),
                counted_text(counts, case, batch_size, "torchrl/rlloss"),
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
        "instructions: rlloss / plain",
        "instructions: TorchRL / rlloss",
    ]
    sources = {
        r.path.name: machine_of(r).get("date", "?")[:10]
        + (", CPU time" if row.get("clock") == "cpu" else "")
        for row, r in [*eager.values(), *compiled.values()]
    }
    sources.update(
        (entry["file"], entry["date"][:10])
        for case, batch_size, *cells in rows
        if cells[-2:] != ["-", "-"] and (entry := counts[f"{case}, B={batch_size}"])
    )
    return markdown_table(header, rows) + [
        "From " + ", ".join(f"`{name}` ({date})" for name, date in sources.items()) + ".",
        "",
    ]


# --------------------------------------------------------------------------- #
# Against the hand-written step
# --------------------------------------------------------------------------- #
def hand_rows(results: list[Result]) -> dict[tuple[str, int], tuple[dict, Result]]:
    """Per (case, batch size), its eager CPU row at the headline level that has the hand-written
    methods, from the newest file that has one."""
    found = {}
    for result in sorted(results, key=lambda r: machine_of(r).get("date", "")):
        if result.kind != "overhead" or format_problem(result):
            continue
        for row in table_rows(result.data):
            if (
                row["mode"] == "eager"
                and row["level"] == HEADLINE_LEVEL
                and on_cpu(str(row.get("device", "cpu")))
                and "rlloss/hand" in row.get("ratios", {})
            ):
                found[(row["case"], row["batch_size"])] = (row, result)
    return found


def fastest_ratio(row: dict, ratio: str) -> float | None:
    """The ratio of the two methods' 10th percentiles of their timed blocks: load only ever adds
    time, so the fastest blocks are the least inflated (a single fastest block can be a
    timer's glitch)."""
    methods = row.get("methods", {})
    num, den = (methods.get(name, {}).get("samples_us") for name in ratio.split("/"))
    if not num or not den:
        return None
    return quantile(num, 0.1) / quantile(den, 0.1)


def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs``, linearly interpolated."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread_text(row: dict, ratio: str) -> str:
    """``median (p25-p75) [fastest tenth x]`` of a paired ratio, the median in bold where it
    misses its target."""
    r = row.get("ratios", {}).get(ratio)
    if r is None:
        return "-"
    median = f"**{r['median']:.3f}**" if missed(row, ratio) else f"{r['median']:.3f}"
    fastest = fastest_ratio(row, ratio)
    fastest_text = "" if fastest is None else f" [fastest tenth {fastest:.3f}]"
    return f"{median} ({r['p25']:.3f}-{r['p75']:.3f}){fastest_text}"


def hand_table(results: list[Result], instructions: dict | None) -> list[str]:
    """One row per (case, batch size) timed against the hand-written step: the paired time
    ratios with their spread, diagnostics on and off, and the instruction-count ratios."""
    rows = hand_rows(results)
    if not rows:
        return ["No overhead results with the hand-written methods in the results dir.", ""]
    counts = (instructions or {}).get("cases", {})
    body = []
    for (case, batch_size), (row, _) in rows.items():
        count = counts.get(f"{case}, B={batch_size}", {}).get("ratios", {})
        off = "rlloss-min/hand-min" if "rlloss-min/hand-min" in row["ratios"] else None
        body.append(
            [
                case,
                batch_size,
                time_text(row, "hand"),
                time_text(row, "rlloss"),
                spread_text(row, "rlloss/hand"),
                spread_text(row, off) if off else "no switch",
                spread_text(row, "rlloss/hand-min"),
                *(
                    f"{count[k]:.3f}" if k in count else "-"
                    for k in ("rlloss/hand", "rlloss-min/hand-min", "rlloss/hand-min")
                ),
            ]
        )
    header = [
        "loss",
        "batch",
        "hand µs",
        "rlloss µs",
        "rlloss / hand (diagnostics on)",
        "rlloss-min / hand-min (off)",
        "rlloss / hand-min",
        "instructions: on",
        "instructions: off",
        "instructions: rlloss / hand-min",
    ]
    sources = {r.path.name: machine_of(r).get("date", "?")[:10] for _, r in rows.values()}
    if instructions is not None:
        sources[HAND_INSTRUCTIONS] = (instructions.get("machine") or {}).get("date", "?")[:10]
    return markdown_table(header, body) + [
        "From " + ", ".join(f"`{name}` ({date})" for name, date in sources.items()) + ".",
        "",
    ]


def time_text(row: dict, method: str) -> str:
    """A method's median time of the step, in microseconds."""
    time_us = row.get("methods", {}).get(method, {}).get("time_us")
    return "-" if not time_us else f"{time_us['median']:.0f}"
