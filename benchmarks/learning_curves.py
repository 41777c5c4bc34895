"""The learning curves: per library the mean and min-max spread over seeds of the running mean
of the last episode returns, on a common frame grid, with the task's target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from benchmarks.learning_tasks import Task

CURVE_WINDOW = 10  # episodes in the running mean of the learning curves
CURVE_POINTS = 200  # points of the common frame grid
LINE_STYLES = {"rlloss": "-", "torchrl": "--"}  # dashed on top: identical curves stay visible


def running_mean(returns: np.ndarray, window: int = CURVE_WINDOW) -> np.ndarray:
    """The mean of the last ``window`` episode returns at each episode (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], returns]))
    ends = np.arange(1, len(returns) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def on_grid(episodes: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A seed's running-mean curve interpolated onto ``grid`` (nan before its first finished
    episode, its last value after its last one)."""
    if not len(episodes):
        return np.full_like(grid, np.nan)
    frames, curve = episodes[:, 0], running_mean(episodes[:, 1])
    return np.interp(grid, frames, curve, left=np.nan, right=curve[-1])


def seed_band(runs: list[np.ndarray], grid: np.ndarray) -> tuple[np.ndarray, ...]:
    """Mean, min and max over seeds of the curves on ``grid``, where at least one seed has a
    value (nan elsewhere)."""
    curves = np.stack([on_grid(episodes, grid) for episodes in runs])
    valid = ~np.isnan(curves).all(axis=0)
    mean, low, high = (np.full_like(grid, np.nan) for _ in range(3))
    mean[valid] = np.nanmean(curves[:, valid], axis=0)
    low[valid] = np.nanmin(curves[:, valid], axis=0)
    high[valid] = np.nanmax(curves[:, valid], axis=0)
    return mean, low, high


def draw_learning_curves(
    path: Path, name: str, task: Task, curves: dict[str, list[np.ndarray]], total_frames: int | None
) -> None:
    """One PNG: per library the mean and min-max spread over seeds, and the target."""
    last = max((c[-1, 0] for runs in curves.values() for c in runs if len(c)), default=1.0)
    grid = np.linspace(0.0, float(total_frames or last), CURVE_POINTS)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    for library, runs in curves.items():
        mean, low, high = seed_band(runs, grid)
        seeds = f"{len(runs)} seed" + ("s" if len(runs) > 1 else "")
        (line,) = ax.plot(
            grid,
            mean,
            linestyle=LINE_STYLES.get(library, "-"),
            label=f"{library} (mean over {seeds})",
        )
        ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.axhline(task.target, color="black", linestyle=":", label=f"target {task.target:g}")
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episode return, running mean of {CURVE_WINDOW}")
    extra = " ".join(task.extra_args)
    ax.set_title(
        f"{name}: tutorials/{task.script} {extra}".strip() + " (band: min-max over seeds)",
        fontsize=9,
    )
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
