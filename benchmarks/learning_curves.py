"""The learning benchmark's figures: per task and library the mean and min-max spread over seeds
of the running mean of the last episode returns, on a common frame grid, with the task's target;
and ``tutorials/ppo_rnd_sparse.py``'s figure and per-seed table, PPO alone beside PPO + RND
(``python benchmarks/learning.py --rnd-runs DIR --out FIGURE.png``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from benchmarks.learning_tasks import Task

CURVE_WINDOW = 10  # episodes in the running mean of the learning curves
CURVE_POINTS = 200  # points of the common frame grid
LINE_STYLES = {"rlloss": "-", "torchrl": "--"}  # dashed on top: identical curves stay visible
RND_MODES = {
    "no-rnd": "PPO",
    "rnd": "PPO + RND",
}  # ppo_rnd_sparse's run folders, <lib>-<mode>-<seed>
RND_WINDOW = 50  # episodes in the running mean of the RND figure
FAILED = 0.0  # the sparse return of an episode that never reaches the flag (1 if it does)


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


def rnd_summary(episodes: np.ndarray, log: Path) -> dict:
    """One ``ppo_rnd_sparse`` run's row: the mean return of its last 10 episodes (the tutorial's
    ``final_return``), the first step at which an episode reached the flag (a positive return),
    the share of the last 100 episodes that did, and the wall time from its log (``<run>.log``,
    the run's standard output)."""
    reached = episodes[episodes[:, 1] > FAILED]
    wall = re.findall(r"wall_time=([\d.]+)s", log.read_text()) if log.exists() else []
    return {
        "final": float(episodes[-10:, 1].mean()),
        "first_flag": int(reached[0, 0]) if len(reached) else None,
        "share_last_100": float((episodes[-100:, 1] > FAILED).mean()),
        "wall_s": float(wall[-1]) if wall else None,
    }


def draw_rnd_figure(runs: dict[tuple[str, str, int], np.ndarray], out: Path, title: str) -> None:
    """One panel per library: every seed's running mean of the share of episodes rewarded, PPO +
    RND solid, PPO alone dashed (``runs``: (library, mode, seed) -> its episodes)."""
    fig = Figure(figsize=(11, 4))
    for i, library in enumerate(LINE_STYLES):
        ax = fig.add_subplot(1, 2, i + 1)
        for (lib, mode, seed), episodes in runs.items():
            if lib == library and len(episodes):
                style = "-" if mode == "rnd" else "--"
                curve = running_mean(episodes[:, 1], RND_WINDOW)
                label = f"{RND_MODES[mode]}, seed {seed}"
                ax.plot(episodes[:, 0], curve, style, color=f"C{seed}", label=label)
        ax.set(
            title=f"{title}, {library}",
            xlabel="environment steps",
            ylabel=f"share rewarded (running mean of {RND_WINDOW} episodes)",
            ylim=(-0.05, 1.05),
        )
        ax.xaxis.set_major_formatter(EngFormatter())
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
