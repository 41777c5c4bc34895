"""The overhead pages: per case, batch size and level the time of every method, the paired
ratios and the targets they are held to; one page for eager rows, one for compiled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import LEVELS, METHODS, MODES
from benchmarks.pages.markdown import (
    Result,
    cell,
    command_of,
    markdown_table,
    number,
    rel,
    table_rows,
    verdict,
)

SMALL_BATCH_MAX = 1024  # batch sizes up to this are "small" for the eager target


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


# The hand-written comparison's targets (issue 39): eager, its cases at these batch sizes.
HAND_PPO = ("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "A2CLoss")
HAND_CUSTOM_CRITIC = tuple(
    f"{name}-custom-critic" for name in ("DDPGLoss", "TD3Loss", "SACLoss", "REDQLoss", "TQCLoss")
)


def hand_row(cases: tuple[str, ...], batch_size: int) -> Callable[[dict], bool]:
    """Whether a row is an eager one of ``cases`` at ``batch_size``."""
    return lambda r: r["mode"] == "eager" and r["case"] in cases and r["batch_size"] == batch_size


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
        "rlloss-min/plain-min",
        1.10,
        True,
        lambda r: r["mode"] == "eager" and is_small(r),
        f"eager, batch <= {SMALL_BATCH_MAX}, diagnostics off: rlloss <= 1.10x plain losses-only",
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
    Target(
        "rlloss-min/hand-min",
        1.15,
        True,
        hand_row(HAND_PPO, 64),
        "PPO family at 64, diagnostics off: rlloss <= 1.15x the hand-written step",
    ),
    Target(
        "rlloss/hand",
        1.25,
        True,
        hand_row(HAND_PPO, 64),
        "PPO family at 64, diagnostics on: rlloss <= 1.25x the hand-written step with them",
    ),
    Target(
        "rlloss/hand",
        1.15,
        True,
        hand_row(("DQNLoss",), 64),
        "DQN at 64 (no diagnostics switch; both compute the TD error): rlloss <= 1.15x hand",
    ),
    Target(
        "rlloss/hand",
        1.10,
        True,
        hand_row(HAND_CUSTOM_CRITIC, 256),
        "off-policy with the user's critic at 256 (both compute the diagnostics): rlloss <= "
        "1.10x hand",
    ),
)


def missed(row: dict, ratio: str) -> bool:
    """Whether a target on ``ratio`` that applies to ``row`` is missed."""
    return any(t.ratio == ratio and t.check(row) is False for t in OVERHEAD_TARGETS)


def format_problem(result: Result) -> str | None:
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


def has_mode(result: Result, mode: str) -> bool:
    """Whether the file has rows measured in ``mode``, or cannot be read (then every overhead
    page says so)."""
    return bool(format_problem(result)) or any(
        r.get("mode") == mode for r in table_rows(result.data)
    )


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


HAND_RATIOS = ("rlloss/hand", "rlloss-min/hand-min", "rlloss/hand-min")


def case_table(rows: list[dict]) -> list[str]:
    """One case's rows: times of every method, the ratios and the targets (the hand-written
    methods' columns where the case has them)."""
    hand = any("rlloss/hand" in row.get("ratios", {}) for row in rows)
    methods = [m for m in METHODS if hand or not m.startswith("hand")]
    header = [
        "batch",
        "mode",
        "level",
        *(f"{m} µs" for m in methods),
        "rlloss/plain",
        "target",
        "torchrl/rlloss",
        "target",
        "rlloss/plain-min",
        "rlloss-min/plain-min",
        "target",
        *(f"{name}{suffix}" for name in HAND_RATIOS[:2] for suffix in ("", " target")),
        *HAND_RATIOS[2:],
    ]
    if not hand:
        header = header[: -len(HAND_RATIOS) - 2]
    body = []
    for row in rows:
        mode = (
            row["mode"] if row.get("status", "ok") == "ok" else f"{row['mode']} ({row['status']})"
        )
        times = row.get("methods", {})
        body.append(
            [
                row["batch_size"],
                mode,
                row["level"],
                *(time_cell(times.get(m)) for m in methods),
                ratio_cell(row, "rlloss/plain"),
                target_cell(row, "rlloss/plain"),
                ratio_cell(row, "torchrl/rlloss"),
                target_cell(row, "torchrl/rlloss"),
                ratio_cell(row, "rlloss/plain-min"),
                ratio_cell(row, "rlloss-min/plain-min"),
                target_cell(row, "rlloss-min/plain-min"),
                *(
                    text
                    for name in HAND_RATIOS[:2]
                    for text in (ratio_cell(row, name), target_cell(row, name))
                ),
                ratio_cell(row, HAND_RATIOS[2]),
            ][: len(header)]
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
    met, missed_lines = 0, []
    for row in rows:
        for target in OVERHEAD_TARGETS:
            ok = target.check(row)
            if ok:
                met += 1
            elif ok is False:
                value = row["ratios"][target.ratio]["median"]
                missed_lines.append(
                    f"{row['case']} B={row['batch_size']} {row['mode']} {row['level']}: "
                    f"{target.ratio} = {value:.3f} ({target.text})"
                )
    return met, missed_lines


def overhead_order(row: dict) -> tuple:
    """Eager before compiled, then batch size, then forward / backward / update."""
    mode = MODES.index(row["mode"]) if row["mode"] in MODES else len(MODES)
    level = LEVELS.index(row["level"]) if row["level"] in LEVELS else len(LEVELS)
    return mode, row["batch_size"], level


def overhead_section(result: Result, device: str, out: Path, mode: str) -> list[str]:
    """The overhead tables of one file's ``mode`` rows on one device, case by case."""
    lines = [f"### Overhead on {device} (`{rel(result.path, out)}`)", ""]
    problem = format_problem(result)
    if problem:
        return lines + [f"Skipped: `{result.path.name}` cannot be shown: {problem}.", ""]
    rows = [
        r
        for r in table_rows(result.data)
        if str(r.get("device", "cpu")) == device and r["mode"] == mode
    ]
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
    met, missed_lines = target_tally(rows)
    lines += [
        f"Targets met: {met} of {met + len(missed_lines)} checks."
        + ("" if data.get("ok", True) else " Some rows FAILED the equality gate."),
        "",
    ]
    if missed_lines:
        lines += ["Missed:", "", *(f"- {m}" for m in missed_lines), ""]
    for case in dict.fromkeys(r["case"] for r in rows):
        case_rows = sorted((r for r in rows if r["case"] == case), key=overhead_order)
        lines += [f"#### {case}", ""]
        if case_rows[0].get("description"):
            lines += [f"_{case_rows[0]['description']}_", ""]
        lines += case_table(case_rows)
        notes = method_notes(case_rows)
        if notes:
            lines += ["Not timed:", "", *notes, ""]
    return lines
