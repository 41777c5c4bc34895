"""The targets the overhead rows are held to (a missed one is bold in BENCHMARKS.md), and which
overhead files can be read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.pages.markdown import Result, table_rows

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
