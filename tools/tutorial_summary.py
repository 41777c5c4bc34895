"""The learning runs' summary (``tools/tutorial_learning.py``): each run dir read back (its
status, the returns the tutorial printed, wall time, the last error line of a failed run), per
task and library the seeds on target, and the figures: per task the mean and min-max spread
over seeds of the running mean of the last episode returns on a common frame grid, with its
target; ``tutorials/ppo_rnd_sparse.py``'s figure, PPO alone beside PPO + RND (``--rnd-runs``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

MIN_SEEDS_MET = 2  # a task's target is met when final_return >= target on this many seeds
TRACEBACK = "Traceback (most recent call last):"
RESULT_LINE = re.compile(r"^(final_return|train_return|eval_return|wall_time)=(\S+?)s?\s*$")
CURVE_WINDOW = 10  # episodes in the running mean of the learning curves
CURVE_POINTS = 200  # points of the common frame grid
LINE_STYLES = {"rlloss": "-", "torchrl": "--"}  # dashed on top: identical curves stay visible
RND_MODES = {"no-rnd": "PPO", "rnd": "PPO + RND"}  # ppo_rnd_sparse's folders <lib>-<mode>-<seed>
RND_WINDOW = 50  # episodes in the running mean of the RND figure
FAILED = 0.0  # the sparse return of an episode that never reaches the flag (1 if it does)


# The runs read back
def run_dir_of(results_dir: Path, task: str, library: str, seed: int) -> Path:
    """``<results dir>/<task>/<library>/seed<seed>``."""
    return results_dir / task / library / f"seed{seed}"


def parse_result_lines(stdout: str) -> dict[str, float | None]:
    """The last ``final_return=``, ``train_return=``, ``eval_return=`` and ``wall_time=`` values
    printed (``wall_time`` in seconds); None for those not printed, nan as None."""
    values: dict[str, float | None] = dict.fromkeys(
        ("final_return", "train_return", "eval_return", "wall_time")
    )
    for line in stdout.splitlines():
        match = RESULT_LINE.match(line.strip())
        if match:
            values[match.group(1)] = finite_or_none(float(match.group(2)))
    return values


def finite_or_none(x: float) -> float | None:
    """``x``, or None where it is nan or infinite (JSON has neither)."""
    return x if math.isfinite(x) else None


def last_error_line(stderr: str) -> str | None:
    """The exception line of the last Python traceback in a stderr (the first unindented line
    after it), else its last non-empty line; progress-bar carriage returns split lines too."""
    lines = [line.rstrip() for line in re.split(r"[\r\n]+", stderr) if line.strip()]
    starts = [i for i, line in enumerate(lines) if TRACEBACK in line]
    if starts:
        after = [line for line in lines[starts[-1] + 1 :] if not line[0].isspace()]
        if after:
            return after[0]
    return lines[-1].strip() if lines else None


def read_returns(path: Path) -> np.ndarray:
    """``returns.csv`` as an array of ``(frames, episode_return)`` rows; empty if absent."""
    if not path.exists():
        return np.zeros((0, 2))
    with open(path, newline="") as f:
        rows = [(float(r["frames"]), float(r["episode_return"])) for r in csv.DictReader(f)]
    return np.array(rows, dtype=float).reshape(-1, 2)


def read_text(path: Path) -> str:
    """A file's text, or '' if it does not exist."""
    return path.read_text(errors="replace") if path.exists() else ""


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """One run's results from its directory: status, the printed returns, wall time, episodes,
    and the last error line of a failed run."""
    record = json.loads(read_text(run_dir / "run.json") or "{}")
    values = parse_result_lines(read_text(run_dir / "stdout.txt"))
    episodes = read_returns(run_dir / "returns.csv")
    stderr = read_text(run_dir / "stderr.txt")
    status = run_status(record.get("returncode"), read_text(run_dir / "stdout.txt"), stderr)
    wall_time = values.pop("wall_time")
    summary = {
        "seed": int(run_dir.name.removeprefix("seed")),
        "status": status,
        **values,
        "wall_time_s": wall_time,
        "episodes": len(episodes),
        "last_episode_frames": int(episodes[-1, 0]) if len(episodes) else None,
        "total_frames": record.get("total_frames"),
        "load_1min": record.get("load_1min"),
        "command": " ".join(record["command"]) if "command" in record else None,
    }
    if status != "ok":
        summary["returncode"] = record.get("returncode")
        summary["error"] = last_error_line(stderr)
    return summary


def run_status(returncode: int | None, stdout: str, stderr: str) -> str:
    """``failed`` (non-zero exit, or a traceback where no exit status was recorded), ``ok``
    (``final_return`` printed) or ``incomplete`` (still running, or killed)."""
    if returncode not in (None, 0):
        return "failed"
    if "final_return=" in stdout:
        return "ok"
    return "failed" if TRACEBACK in stderr else "incomplete"


def seed_dirs(results_dir: Path, task: str, library: str, seeds: list[int] | None) -> list[Path]:
    """The run dirs of a task and library: the given seeds, or every ``seed*`` dir on disk."""
    base = results_dir / task / library
    if seeds is not None:
        return [
            run_dir_of(results_dir, task, library, s)
            for s in seeds
            if run_dir_of(results_dir, task, library, s).exists()
        ]
    found = [d for d in base.glob("seed*") if d.is_dir() and d.name[4:].isdigit()]
    return sorted(found, key=lambda d: int(d.name[4:]))


def seeds_verdict(met: int, run: int) -> bool | None:
    """Whether ``met`` of ``run`` seeds on target meet the target; ``None`` (undecided) while
    fewer seeds were run than the verdict needs and too few of them met it."""
    if met >= MIN_SEEDS_MET:
        return True
    return None if run < MIN_SEEDS_MET else False


def summarize_library(runs: list[dict], target: float) -> dict[str, Any]:
    """Per-library summary: per-seed runs, seeds on target, mean final return and wall time."""
    finals = [
        r["final_return"] for r in runs if r["status"] == "ok" and r["final_return"] is not None
    ]
    walls = [r["wall_time_s"] for r in runs if r["wall_time_s"] is not None]
    met = sum(f >= target for f in finals)
    failed = [r for r in runs if r["status"] != "ok"]
    status = "ok" if not failed else min(r["status"] for r in failed)  # "failed" < "incomplete"
    return {
        "status": status,
        "error": failed[0].get("error") if failed else None,
        "seeds": runs,
        "seeds_met": met,
        "seeds_run": len(runs),
        "target_met": seeds_verdict(met, len(runs)),
        "final_return_mean": float(np.mean(finals)) if finals else None,
        "wall_time_s_mean": float(np.mean(walls)) if walls else None,
    }


def summarize_task(
    name: str, task: Any, cfg: argparse.Namespace, swap: dict[str, Any], figure_dir: Path
) -> dict[str, Any]:
    """A task's entry of the JSON: its definition, per library the summary (or why there is
    none), and its figure (drawn here)."""
    entry: dict[str, Any] = {
        "script": f"tutorials/{task.script}",
        "extra_args": list(task.extra_args),
        "budget_frames": task.total_frames,
        "target": task.target,
        "reference": task.reference,
        "libraries": {},
    }
    curves = {}
    for library in cfg.libraries:
        if library == "torchrl" and not swap["ok"]:
            entry["libraries"][library] = {"status": "n/a", "reason": swap["reason"]}
            continue
        dirs = seed_dirs(cfg.results_dir, name, library, cfg.seeds)
        if not dirs:
            continue
        runs = [summarize_run(d) for d in dirs]
        entry["libraries"][library] = summarize_library(runs, task.target)
        if library == "torchrl":
            entry["libraries"][library]["swap"] = {
                k: swap[k] for k in ("imports", "literal_swap_ok", "kept")
            }
        episodes = [read_returns(d / "returns.csv") for d in dirs]
        if any(len(e) for e in episodes):  # seeds that finished no episode draw nothing
            curves[library] = [e for e in episodes if len(e)]
    frames = [
        r["total_frames"]
        for lib in entry["libraries"].values()
        for r in lib.get("seeds", [])
        if r.get("total_frames")
    ]
    entry["total_frames"] = max(frames) if frames else None
    if curves:
        path = figure_dir / f"learning_{name}.png"
        draw_learning_curves(path, name, task, curves, entry["total_frames"])
        entry["figure"] = path.name
    return entry


def run_machine(results_dir: Path, tasks: list[str]) -> dict[str, Any] | None:
    """The machine block recorded by the first run found on disk (for ``--summarize-only``)."""
    for name in tasks:
        for record in sorted((results_dir / name).glob("*/seed*/run.json")):
            machine = json.loads(record.read_text()).get("machine")
            if machine:
                return machine
    return None


def json_ready(x: Any) -> Any:
    """Paths as strings and tuples as lists, recursively."""
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_ready(v) for v in x]
    return str(x) if isinstance(x, Path) else x


def print_summary(result: dict[str, Any]) -> None:
    """One line per task and library."""
    for name, task in result["tasks"].items():
        for library, lib in task["libraries"].items():
            if lib["status"] == "n/a":
                print(f"{name:16s} {library:8s} n/a: {lib['reason']}")
                continue
            finals = ", ".join(fmt(r["final_return"]) for r in lib["seeds"])
            verdict = {True: "met", False: "missed", None: "undecided, too few seeds"}[
                lib["target_met"]
            ]
            error = f"  FAILED: {lib['error']}" if lib["status"] == "failed" else ""
            print(
                f"{name:16s} {library:8s} final_return [{finals}] target {task['target']:g} "
                f"reached on {lib['seeds_met']}/{lib['seeds_run']} seeds: {verdict} "
                f"(needs {MIN_SEEDS_MET}){error}"
            )


def fmt(x: float | None) -> str:
    """A return with one decimal, '-' for None."""
    return "-" if x is None else f"{x:.1f}"


# The figures
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
    path: Path, name: str, task: Any, curves: dict[str, list[np.ndarray]], total_frames: int | None
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
