"""Collect run.py's per-run JSON files into one small JSON and print the README's table.

    python tools/benchmarl/summarise.py RAW_DIR [RAW_DIR ...] --out tools/benchmarl/results/runs.json

Per run it keeps the arguments that vary, the outcome, the wall time, the per-iteration mean
episode rewards and the first iteration's loss terms (equal between the libraries where the run
is deterministic); the table gives the final and best mean episode reward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEPT_ARGS = ("lib", "algo", "task", "seed", "frames", "frames_per_batch", "n_envs",
             "minibatch_iters", "minibatch_size", "optimizer_steps", "train_batch_size", "lr",
             "task_option", "init_random_frames", "memory_size", "anneal_frames", "algo_option")


def compact(record: dict) -> dict:
    rows = record["rows"]
    # task_option and the later arguments: newer runs only (absent from older records)
    run = {k: record["args"][k] for k in KEPT_ARGS if k in record["args"]}
    run.update(outcome=record["outcome"], wall_s=record["wall_s"])
    run["rewards"] = [r["reward"] for r in rows]
    run["first_iter_losses"] = {k: v for k, v in (rows[0] if rows else {}).items() if "loss" in k}
    if record["outcome"] == "crash":  # "running": stopped by a time limit, rows kept
        run["error"] = record["traceback"].strip().splitlines()[-1]
    return run


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """``old``'s runs, those with a new run of the same arguments replaced by it, then the rest."""

    def ident(run):
        return json.dumps({k: run.get(k) for k in KEPT_ARGS}, sort_keys=True)

    fresh = {ident(r): r for r in new}
    kept = [fresh.pop(ident(r), r) for r in old]
    return kept + list(fresh.values())


def table(runs: list[dict]) -> str:
    lines = ["| algorithm | task | lib | frames | iters | final reward | best reward | wall s | outcome |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        rewards = r["rewards"] or [float("nan")]
        lines.append(
            f"| {r['algo']} | {r['task']} | {r['lib']} | {r['frames']} | {len(r['rewards'])} "
            f"| {rewards[-1]:.3f} | {max(rewards):.3f} | {r['wall_s']} | {r['outcome']} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("raw", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--merge", action="store_true", help="keep --out's runs; replace equal ones")
    args = p.parse_args()
    files = sorted(f for d in args.raw for f in Path(d).glob("*.json"))
    runs = [compact(json.loads(f.read_text())) for f in files]
    order = ["mappo", "ippo", "qmix", "vdn", "iql", "masac", "isac", "maddpg", "iddpg"]
    runs.sort(key=lambda r: (r["frames"] > 10000, order.index(r["algo"]), r["frames"], r["lib"] != "torchrl"))
    if args.merge and Path(args.out).exists():  # --out's order kept, new runs after it
        runs = merged(json.loads(Path(args.out).read_text()), runs)
    Path(args.out).write_text(json.dumps(runs, indent=0))
    print(table(runs))


if __name__ == "__main__":
    main()
