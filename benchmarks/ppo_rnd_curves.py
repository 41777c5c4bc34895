"""The figure and per-seed table of ``tutorials/ppo_rnd_sparse.py``: PPO alone beside PPO + RND,
with rlloss and with TorchRL's classes swapped in, from the runs' output folders.

    python benchmarks/ppo_rnd_curves.py --runs /tmp/rndq --out docs/figures/ppo_rnd_sparse.png
    python benchmarks/ppo_rnd_curves.py --runs /tmp/rnd2 --task "Deep Sea 20" \
        --out docs/figures/ppo_rnd_deepsea.png

``--runs`` holds one folder per run, ``<library>-<rnd|no-rnd>-<seed>`` (``library``: rlloss or
torchrl), each with the tutorial's ``returns.csv``, and beside it ``<folder>.log``, the run's
standard output (its ``wall_time=`` line). Prints one row per run: the mean return of the last
10 episodes (the tutorial's ``final_return``), the first step at which an episode reached the
flag (a positive return: 1 on MountainCar, 0.99 on Deep Sea, where the others are 0 or a
small negative cost), the share of the last 100 episodes that did, and the wall time.
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

LIBRARIES = ("rlloss", "torchrl")
MODES = {"no-rnd": "PPO", "rnd": "PPO + RND"}
FAILED = 0.0  # the sparse return of an episode that never reaches the flag (1 if it does)


def episodes(run: Path) -> np.ndarray:
    """``[n, 2]``: (frames, return) of every finished episode of ``run``."""
    with open(run / "returns.csv") as f:
        rows = list(csv.reader(f))[1:]
    return np.array(rows, dtype=float).reshape(-1, 2)


def summary(run: Path) -> dict:
    """The table's figures for one run."""
    data = episodes(run)
    reached = data[data[:, 1] > FAILED]
    log = run.with_suffix(".log")
    wall = re.findall(r"wall_time=([\d.]+)s", log.read_text()) if log.exists() else []
    return {
        "final": float(data[-10:, 1].mean()),
        "first_flag": int(reached[0, 0]) if len(reached) else None,
        "share_last_100": float((data[-100:, 1] > FAILED).mean()),
        "wall_s": float(wall[-1]) if wall else None,
    }


def running_mean(data: np.ndarray, window: int = 50) -> tuple[np.ndarray, np.ndarray]:
    kernel = np.ones(window) / window
    return data[window - 1 :, 0], np.convolve(data[:, 1], kernel, "valid")


def plot(runs: Path, seeds: list[int], out: Path, task: str) -> None:
    """One panel per library: every seed's running mean, PPO + RND solid, PPO dashed."""
    fig = Figure(figsize=(11, 4))
    for i, library in enumerate(LIBRARIES):
        ax = fig.add_subplot(1, 2, i + 1)
        for mode, label in MODES.items():
            for seed in seeds:
                run = runs / f"{library}-{mode}-{seed}"
                if not (run / "returns.csv").exists():
                    continue
                style = "-" if mode == "rnd" else "--"
                ax.plot(
                    *running_mean(episodes(run)),
                    style,
                    color=f"C{seed}",
                    label=f"{label}, seed {seed}",
                )
        ax.set(
            title=f"{task}, {library}",
            xlabel="environment steps",
            ylabel="share rewarded (running mean of 50 episodes)",
            ylim=(-0.05, 1.05),
        )
        ax.xaxis.set_major_formatter(EngFormatter())
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task", default="sparse MountainCar-v0", help="the panels' title")
    args = parser.parse_args()
    for library in LIBRARIES:
        for mode, label in MODES.items():
            for seed in args.seeds:
                run = args.runs / f"{library}-{mode}-{seed}"
                if (run / "returns.csv").exists():
                    print(f"{library:8s} {label:10s} seed {seed}: {summary(run)}")
    plot(args.runs, args.seeds, args.out, args.task)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
