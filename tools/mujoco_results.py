"""Summarise the MuJoCo tutorials' runs for the Results page (docs/results.md).

Each run folder (``--out`` of ``tutorials/{ppo,sac,td3}_mujoco.py``) holds ``summary.json``,
``returns.csv`` and ``eval_returns.csv``; a run of CleanRL's own script
(``tools/cleanrl_reference.py``, ``"losses": "cleanrl"``) has no evaluation: its rows show its
training return only, and the figures leave it out. This script keeps the summaries, with each
run's evaluation curve, in one file (``benchmarks/results/mujoco/runs.json``: the raw per-episode
CSVs stay with the runs) and draws one figure per algorithm and task: rlloss's seeds as solid
lines, TorchRL's dashed, a variant's (``summary["variant"]``: compiled, a swapped start)
dash-dot, the published CleanRL return as a horizontal line, and writes the tables of
``docs/results.md`` (between its ``<!-- results:ALGO -->`` and ``<!-- /results:ALGO -->`` markers).

    python tools/mujoco_results.py RUN_DIR [RUN_DIR ...]   # add or replace these runs
    python tools/mujoco_results.py                          # redraw from runs.json
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path

from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "mujoco" / "runs.json"
FIGURES = ROOT / "docs" / "figures"
PAGE = ROOT / "docs" / "results.md"
TRAIN_EPISODES = 10  # the training return: the mean over the last 10 training episodes
# CleanRL's published mean return over 3 seeds at 1M steps (docs/benchmark/*.md, tag pr-424,
# MuJoCo v4 environments; rlloss's tutorials run v5)
CLEANRL = {
    ("PPO", "HalfCheetah"): 1442.64, ("PPO", "Walker2d"): 2287.95, ("PPO", "Hopper"): 2382.86,
    ("SAC", "HalfCheetah"): 9634.89, ("SAC", "Hopper"): 2310.46,
    ("TD3", "HalfCheetah"): 9583.22, ("TD3", "Hopper"): 3134.61,
}
# CleanRL's mean training return over 3 seeds at 300k steps, read off its published learning
# curves (docs/rl-algorithms/{sac,td3}/{HalfCheetah,Hopper}-v2.png, commit 714e786d, MuJoCo v2)
# by pixel at full resolution, calibrated on the gridlines and step ticks: about +-50 for
# HalfCheetah, +-15 for Hopper. No number at 300k is published for v4.
CLEANRL_300K = {
    ("SAC", "HalfCheetah"): 7935, ("SAC", "Hopper"): 2332,
    ("TD3", "HalfCheetah"): 7007, ("TD3", "Hopper"): 1405,
}


def cleanrl_anchors(algorithm: str, env_id: str) -> tuple[float | None, float | None]:
    """CleanRL's published returns for a task: at 1M steps (v4) and at 300k (v2 curve)."""
    key = algorithm, env_id.split("-")[0]
    return CLEANRL.get(key), CLEANRL_300K.get(key)


def read_run(folder: Path) -> dict:
    """A run's summary with its evaluation curve (``[[frames, mean return], ...]``)."""
    summary = json.loads((folder / "summary.json").read_text())
    rows = []
    if (folder / "eval_returns.csv").exists():  # none from CleanRL's scripts
        with open(folder / "eval_returns.csv", newline="") as f:
            rows = list(csv.reader(f))[1:]
    summary["evaluations"] = [[int(frames), float(ret)] for frames, ret in rows]
    with open(folder / "returns.csv", newline="") as f:
        episodes = [float(ret) for _, ret in list(csv.reader(f))[1:]]
    summary["final_train_return"] = statistics.fmean(episodes[-TRAIN_EPISODES:])
    return summary


def label(run: dict) -> str:
    """The run's library, with its variant in brackets (``rlloss (compiled)``)."""
    return run["losses"] + (f" ({run['variant']})" if run.get("variant") else "")


def run_key(run: dict) -> tuple:
    return run["algorithm"], run["env_id"], run["losses"], run.get("variant", ""), run["seed"]


def draw(runs: list[dict]) -> list[Path]:
    """One figure per (algorithm, task)."""
    written = []
    runs = [run for run in runs if evaluated(run)]
    for algorithm, env_id in sorted({(r["algorithm"], r["env_id"]) for r in runs}):
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for run in sorted((r for r in runs if (r["algorithm"], r["env_id"]) == (algorithm,
                                                                                env_id)),
                          key=run_key):
            frames = [f for f, _ in run["evaluations"]] + [run["frames"]]
            returns = [r for _, r in run["evaluations"]] + [run["final_eval_return"]]
            style = "-." if run.get("variant") else "-" if run["losses"] == "rlloss" else "--"
            ax.plot(frames, returns, style, label=f"{label(run)}, seed {run['seed']}")
        anchor, early = cleanrl_anchors(algorithm, env_id)
        if anchor is not None:
            ax.axhline(anchor, color="gray", linestyle=":", label="CleanRL at 1M (v4, 3 seeds)")
        if early is not None:
            ax.axhline(early, color="black", linestyle=(0, (1, 3)),
                       label="CleanRL at 300k (v2 curve, 3 seeds)")
        ax.set(xlabel="environment steps", ylabel="evaluation return (10 episodes)",
               title=f"{algorithm} on {env_id}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small")  # beside the axes
        path = FIGURES / f"results_{algorithm.lower()}_{env_id.split('-')[0].lower()}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        written.append(path)
    return written


def evaluated(run: dict) -> bool:
    """Whether the run evaluated its final policy (CleanRL's scripts do not)."""
    return run["final_eval_return"] is not None


def best_return(run: dict) -> float | None:
    if not evaluated(run):
        return None
    return max([r for _, r in run["evaluations"]] + [run["final_eval_return"]])


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_row(run: dict) -> str:
    rate = run.get("gradient_steps_per_s", run.get("updates_per_s"))
    cpu = run["cpu_time_s"] / 60 if "cpu_time_s" in run else None
    subnormals = run.get("subnormals", "kept" if evaluated(run) else "-")  # flag came later
    return (f"| {run['env_id']} | {label(run)} | {run['seed']} | "
            f"{number(run['final_eval_return'])} | {number(best_return(run))} | "
            f"{number(run.get('final_train_return'))} | {run['wall_time_s'] / 60:.1f} | "
            f"{number(cpu)} | {number(rate, 0)} | {subnormals} |")


def spread(values: list[float]) -> str:
    """``mean ± standard deviation`` (``mean`` alone for one value)."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def summary_rows(runs: list[dict], algorithm: str) -> list[str]:
    """Per task and library: the final evaluation and training returns over the seeds run, and
    CleanRL's published returns."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["env_id"], label(run)), []).append(run)
    rows = []
    for (env_id, losses), group in sorted(groups.items()):
        anchor, early = cleanrl_anchors(algorithm, env_id)
        seeds = ", ".join(str(run["seed"]) for run in sorted(group, key=lambda r: r["seed"]))
        train = [run["final_train_return"] for run in group if "final_train_return" in run]
        finals = [run["final_eval_return"] for run in group if evaluated(run)]
        rows.append(f"| {env_id} | {losses} | {seeds} | "
                    f"{spread(finals) if finals else '-'} | "
                    f"{spread(train) if train else '-'} | "
                    f"{f'{anchor:.1f}' if anchor is not None else '-'} |"
                    + (f" {early:.0f} |" if early is not None else ""))
    return rows


def tables(runs: list[dict], algorithm: str) -> str:
    mine = sorted((r for r in runs if r["algorithm"] == algorithm), key=run_key)
    if not mine:
        return "No run has finished yet."
    figures = sorted({r["env_id"].split("-")[0] for r in mine})
    lines = [f"![{algorithm} on {task}](figures/results_{algorithm.lower()}_{task.lower()}.png)"
             for task in figures]
    early = any(key[0] == algorithm for key in CLEANRL_300K)
    lines += ["", "| task | losses | seeds | final eval return | final train return | "
              "CleanRL (v4, 1M steps) |" + (" CleanRL (v2 curve, 300k steps) |" if early else ""),
              "|---|---|---|---|---|---|" + ("---|" if early else "")]
    lines += summary_rows(mine, algorithm)
    lines += ["", "| task | losses | seed | final eval return | best eval return | "
              "final train return | wall time (min) | CPU time (min) | updates / CPU s | "
              "subnormals |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [run_row(run) for run in mine]
    return "\n".join(lines)


def write_page(runs: list[dict]) -> None:
    """Replace each ``<!-- results:ALGO -->`` ... ``<!-- /results:ALGO -->`` block of the page."""
    text = PAGE.read_text()
    for algorithm in ("PPO", "SAC", "TD3"):
        start, end = f"<!-- results:{algorithm} -->", f"<!-- /results:{algorithm} -->"
        pattern = re.compile(rf"({start}\n).*?({end})", re.S)
        block = tables(runs, algorithm)
        text = pattern.sub(lambda m, block=block: m.group(1) + block + "\n" + m.group(2), text)
    PAGE.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders to add or replace")
    args = parser.parse_args()
    kept = json.loads(RUNS.read_text()) if RUNS.exists() else []
    new = [read_run(folder) for folder in args.runs]
    replaced = {run_key(run) for run in new}
    runs = [run for run in kept if run_key(run) not in replaced] + new
    RUNS.parent.mkdir(parents=True, exist_ok=True)
    RUNS.write_text(json.dumps(sorted(runs, key=run_key), indent=1) + "\n")
    for path in draw(runs):
        print(path.relative_to(ROOT))
    write_page(runs)
    for run in sorted(runs, key=run_key):
        print(f"| {run['algorithm']} " + run_row(run))


if __name__ == "__main__":
    main()
