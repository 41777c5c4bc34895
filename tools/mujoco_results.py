"""Summarise the MuJoCo tutorials' runs for the Results page (docs/results.md).

Each run folder (``--out`` of ``tutorials/{ppo,sac,td3}_mujoco.py``) holds ``summary.json`` and
``eval_returns.csv``. This script keeps the summaries, with each run's evaluation curve, in one
file (``benchmarks/results/mujoco/runs.json``: the raw per-episode CSVs stay with the runs) and
draws one figure per algorithm and task: rlloss's seeds as solid lines, TorchRL's dashed, the
published CleanRL return as a horizontal line.

    python tools/mujoco_results.py RUN_DIR [RUN_DIR ...]   # add or replace these runs
    python tools/mujoco_results.py                          # redraw from runs.json
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "mujoco" / "runs.json"
FIGURES = ROOT / "docs" / "figures"
# CleanRL's published mean return over 3 seeds at 1M steps (docs/benchmark/*.md, tag pr-424,
# MuJoCo v4 environments; rlloss's tutorials run v5)
CLEANRL = {
    ("PPO", "HalfCheetah"): 1442.64, ("PPO", "Walker2d"): 2287.95, ("PPO", "Hopper"): 2382.86,
    ("SAC", "HalfCheetah"): 9634.89, ("SAC", "Hopper"): 2310.46,
    ("TD3", "HalfCheetah"): 9583.22, ("TD3", "Hopper"): 3134.61,
}


def read_run(folder: Path) -> dict:
    """A run's summary with its evaluation curve (``[[frames, mean return], ...]``)."""
    summary = json.loads((folder / "summary.json").read_text())
    with open(folder / "eval_returns.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    summary["evaluations"] = [[int(frames), float(ret)] for frames, ret in rows]
    return summary


def run_key(run: dict) -> tuple:
    return run["algorithm"], run["env_id"], run["losses"], run.get("variant", ""), run["seed"]


def draw(runs: list[dict]) -> list[Path]:
    """One figure per (algorithm, task)."""
    written = []
    for algorithm, env_id in sorted({(r["algorithm"], r["env_id"]) for r in runs}):
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for run in sorted((r for r in runs if (r["algorithm"], r["env_id"]) == (algorithm,
                                                                                env_id)),
                          key=run_key):
            frames = [f for f, _ in run["evaluations"]] + [run["frames"]]
            returns = [r for _, r in run["evaluations"]] + [run["final_eval_return"]]
            style = "-" if run["losses"] == "rlloss" else "--"
            variant = f", {run['variant']}" if run.get("variant") else ""
            ax.plot(frames, returns, style if not variant else "-.",
                    label=f"{run['losses']}{variant}, seed {run['seed']}")
        anchor = CLEANRL.get((algorithm, env_id.split("-")[0]))
        if anchor is not None:
            ax.axhline(anchor, color="gray", linestyle=":", label="CleanRL (v4, 3 seeds)")
        ax.set(xlabel="environment steps", ylabel="evaluation return (10 episodes)",
               title=f"{algorithm} on {env_id}")
        ax.legend()
        path = FIGURES / f"results_{algorithm.lower()}_{env_id.split('-')[0].lower()}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        written.append(path)
    return written


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
    for run in sorted(runs, key=run_key):
        best = max([r for _, r in run["evaluations"]] + [run["final_eval_return"]])
        losses = run["losses"] + (f" ({run['variant']})" if run.get("variant") else "")
        print(f"| {run['algorithm']} | {run['env_id']} | {losses} | {run['seed']} | "
              f"{run['final_eval_return']:.1f} | {best:.1f} | {run['wall_time_s'] / 60:.1f} | "
              f"{run.get('gradient_steps_per_s', run.get('updates_per_s')):.0f} |")


if __name__ == "__main__":
    main()
