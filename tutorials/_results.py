"""What every tutorial writes at the end: ``returns.csv``, the learning curve, and the last lines
``wall_time=...`` and ``final_return=<mean return of the last 10 finished episodes>``."""

import csv
import time
from pathlib import Path

import numpy as np


def write_csv(path: Path, header: list[str], rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def plot_returns(ax, episodes, window: int = 20) -> None:
    """Episode returns (dots) and their running mean on ``ax``; ``episodes`` holds
    ``(frames, episode_return)`` rows."""
    if not len(episodes):
        return
    x, y = np.array(episodes, dtype=float).reshape(-1, 2).T
    window = max(1, min(window, len(y)))
    ax.plot(x, y, ".", alpha=0.3, label="episode return")
    ax.plot(x[window - 1:], np.convolve(y, np.ones(window) / window, "valid"),
            label=f"running mean ({window} episodes)")
    ax.legend()


def report(start_time: float, episodes) -> None:
    """Print the wall time and, last, the mean return of the last 10 finished episodes."""
    recent = [episode_return for _, episode_return in episodes[-10:]]
    print(f"wall_time={time.perf_counter() - start_time:.1f}s")
    print(f"final_return={np.mean(recent) if recent else float('nan'):.1f}")
