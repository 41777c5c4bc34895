"""Run CleanRL's own SAC or TD3 script, unmodified, and write its run the way the MuJoCo
tutorials write theirs: the same-budget reference for the Results page (issue 50).

CleanRL publishes its MuJoCo returns at 1M steps (v4 tasks) and learning curves on v2 tasks;
the tutorials run 300k steps. This runs CleanRL's script itself at the tutorials' budget, on a
task version its pinned gymnasium has, so the anchor is measured rather than read off a figure.
CleanRL is not a dependency of rlloss: its script comes from a checkout of its repository (its
``cleanrl_utils`` beside it), and it runs under a Python that has what it pins (gymnasium 0.29.1,
numpy < 2, mujoco, tyro, tensorboard), e.g.::

    python -m venv cleanrl-venv && cleanrl-venv/bin/pip install torch==2.13.0 \\
        gymnasium==0.29.1 mujoco==2.3.7 "numpy<2" "imageio<3" tyro tensorboard
    python tools/cleanrl_reference.py --script CLEANRL/cleanrl/sac_continuous_action.py \\
        --python cleanrl-venv/bin/python --source vwxyzjn/cleanrl@fe8d8a03 \\
        --env-id Hopper-v4 --seed 0 --out runs/cleanrl_sac_hopper_s0

The script runs on one CPU thread with ``--env-id``, ``--seed``, ``--total-timesteps`` and
``--no-cuda`` (everything else CleanRL's defaults), in ``--out`` (its tensorboard ``runs/``
folder lands there), its output kept in ``OUT/stdout.txt``. Its printed training episodes
(``global_step=G, episodic_return=[R]``) become ``OUT/returns.csv`` (``frames = G + 1``), and
``OUT/summary.json`` says what was run: ``"losses": "cleanrl"``, the training return of the last
10 episodes, wall and CPU time, the versions the script ran with. CleanRL's scripts do not
evaluate a deterministic policy: ``final_eval_return`` is null and there is no
``eval_returns.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import time
from pathlib import Path

EPISODE = re.compile(r"^global_step=(\d+), episodic_return=\[?([-+0-9.eE]+)\]?")
ALGORITHMS = {"sac_continuous_action": "SAC", "td3_continuous_action": "TD3"}
TRAIN_EPISODES = 10  # as tools/mujoco_results.py: the mean over the last 10 training episodes
VERSIONS = """
import json, platform, importlib.metadata as m
def version(package):
    try:
        return m.version(package)
    except m.PackageNotFoundError:
        return None
packages = ("torch", "gymnasium", "mujoco", "numpy")
print(json.dumps({"python": platform.python_version(), **{p: version(p) for p in packages}}))
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, required=True,
                        help="CleanRL's sac_continuous_action.py or td3_continuous_action.py")
    parser.add_argument("--python", default="python",
                        help="the interpreter with CleanRL's pinned packages")
    parser.add_argument("--source", required=True,
                        help="where the script is from, recorded in the summary "
                             "(e.g. vwxyzjn/cleanrl@fe8d8a03)")
    parser.add_argument("--env-id", default="Hopper-v4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-frames", type=int, default=300_000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.script.stem not in ALGORITHMS:
        parser.error(f"--script {args.script}: expected one of CleanRL's "
                     f"{sorted(name + '.py' for name in ALGORITHMS)}")
    if not (args.script.parent.parent / "cleanrl_utils").is_dir():
        parser.error(f"--script {args.script}: no cleanrl_utils/ beside its folder; point at "
                     "the script inside a checkout of CleanRL's repository")
    return args


def episodes_of(lines) -> list[tuple[int, float]]:
    """``(frames, episode return)`` of each training episode CleanRL's script printed."""
    found = (EPISODE.match(line) for line in lines)
    return [(int(m.group(1)) + 1, float(m.group(2))) for m in found if m]


def summary_of(args: argparse.Namespace, episodes, wall_s: float, cpu_s: float,
               versions: dict) -> dict:
    train = [ret for _, ret in episodes[-TRAIN_EPISODES:]]
    return {
        "algorithm": ALGORITHMS[args.script.stem], "env_id": args.env_id, "losses": "cleanrl",
        "variant": "", "seed": args.seed, "frames": args.total_frames,
        "final_train_return": statistics.fmean(train) if train else float("nan"),
        "final_eval_return": None, "episodes": len(episodes),
        "wall_time_s": wall_s, "cpu_time_s": cpu_s, "source": args.source,
        "script": args.script.name, "versions": versions,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    script = args.script.resolve()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": str(script.parent.parent)}
    command = [args.python, str(script), "--env-id", args.env_id, "--seed", str(args.seed),
               "--total-timesteps", str(args.total_frames), "--no-cuda"]
    start = time.perf_counter()
    with open(args.out / "stdout.txt", "w") as log:
        status = subprocess.run(command, cwd=args.out, env=env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
    wall_s = time.perf_counter() - start
    cpu_s = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    if status != 0:
        raise SystemExit(f"CleanRL's script exited with status {status}: see "
                         f"{args.out / 'stdout.txt'}")
    episodes = episodes_of((args.out / "stdout.txt").read_text().splitlines())
    with open(args.out / "returns.csv", "w") as f:
        f.write("frames,episode_return\n")
        f.writelines(f"{frames},{ret}\n" for frames, ret in episodes)
    versions = json.loads(subprocess.run([args.python, "-c", VERSIONS], capture_output=True,
                                         text=True, check=True, env=env).stdout)
    summary = summary_of(args, episodes, wall_s, cpu_s, versions)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"final_train_return={summary['final_train_return']}")


if __name__ == "__main__":
    main()
