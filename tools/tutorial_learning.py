"""The learning runs of ``tools/tutorial_runs.py``: the tutorials over several seeds, with
rlloss and with TorchRL's losses, summarised in ``benchmarks/results/learning.json`` and its
figures.

Every task of ``TASKS`` (a tutorial, its extra arguments, a frame budget, a target on the final
return and a published reference) runs as one subprocess per library and seed
(``tools/tutorial_process.py``)::

    python tutorials/<script> --seed K --total-frames F --device D --out <run dir> [extra args]

``rlloss`` runs the tutorial as it is; ``torchrl`` the same script with its ``from rlloss import``
lines importing the same names from TorchRL (a task whose names TorchRL lacks is ``n/a``, a
failed swap is recorded, not an error). Each run dir ``<results dir>/<task>/<library>/seed<K>/``
keeps ``returns.csv``, ``stdout.txt``, ``stderr.txt`` and ``run.json``; the summary
(``benchmarks/results/learning.json`` by default) holds per task and library the per-seed
returns and wall times and whether ``final_return >= target`` held on at least 2 seeds, with one
figure per task beside it (``learning_<task>.png``: per library the mean and min-max over seeds
of the running mean of 10 episode returns; ``tools/tutorial_summary.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_process import (
    LIBRARIES,
    REPO_ROOT,
    TUTORIALS_DIR,
    child_env,
    display_path,
    run_tutorial,
    script_for,
    swap_to_torchrl,
)
from tutorial_summary import (
    MIN_SEEDS_MET,
    RND_MODES,
    draw_rnd_figure,
    fmt,
    json_ready,
    last_error_line,
    print_summary,
    read_returns,
    rnd_summary,
    run_dir_of,
    summarize_run,
    summarize_task,
)

DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "learning"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "learning.json"
SMOKE_TASKS = ("ppo_cartpole", "td3_pendulum")
SMOKE_FRAMES = 2048
# the options recorded in the summary's ``config``
CONFIG_RECORDED = ("tasks", "seeds", "libraries", "total_frames_scale", "jobs", "device")
CONFIG_RECORDED += ("results_dir", "summarize_only", "smoke")


# The tasks
@dataclass(frozen=True)
class Task:
    """One tutorial run: its script, extra arguments, frame budget, target and reference;
    ``prepare``: a tutorial command (script and arguments, run from the repository root) that
    must have run once before the task's runs, skipped when the path ``prepared`` exists (the
    offline tasks' dataset)."""

    script: str
    extra_args: tuple[str, ...]
    total_frames: int
    target: float
    reference: str
    prepare: tuple[str, ...] = ()
    prepared: str | None = None


RL_ZOO = "rl-baselines3-zoo"  # benchmark.md: one training run each, deterministic evaluation
CARTPOLE, PENDULUM = 475.0, -200.0  # the targets on the final return
ZOO_PPO = f"{RL_ZOO} PPO: 500.0 +- 0.0 at 100k"
ZOO_A2C = f"{RL_ZOO} A2C: 500.0 +- 0.0 at 500k"
ZOO_DQN = f"{RL_ZOO} DQN: 500.0 +- 0.0 at 50k"
ZOO_SAC = f"{RL_ZOO} SAC: -157.0 +- 88.7 at 20k"
# The offline tasks learn from one dataset (tutorials/offline_dataset.py, seed 0: SAC after
# 3,000 steps, 50,000 transitions, mean return -839.2 +- 110.1); their target is to beat its
# mean (and behaviour cloning, the bc_offline task, on the same data).
OFFLINE_DIR = "runs/pendulum_offline"
OFFLINE_DATASET_MEAN = -839.2
OFFLINE = {
    "prepare": ("offline_dataset.py", "--seed", "0", "--out", OFFLINE_DIR),
    "prepared": f"{OFFLINE_DIR}/dataset",
}
OFFLINE_REFERENCE = (
    "the dataset's mean return -839.2 +- 110.1; behaviour cloning (bc_offline) -797.6, -812.0, "
    "-851.8 on seeds 0-2 (benchmarks/results/offline.json)"
)
TASKS: dict[str, Task] = {
    "ppo_cartpole": Task("ppo_cartpole.py", (), 100_000, CARTPOLE, ZOO_PPO),
    "klpen_cartpole": Task(
        "klpen_cartpole.py",
        (),
        150_000,
        CARTPOLE,
        f"none for KLPEN; {RL_ZOO} clipped PPO: 500.0 +- 0.0 at 100k",
    ),
    "torchrl_pipeline": Task("torchrl_pipeline.py", (), 100_000, CARTPOLE, ZOO_PPO),
    "recurrent_ppo_cartpole": Task(
        "recurrent_ppo_cartpole.py",
        (),
        150_000,
        CARTPOLE,
        "not looked up for RecurrentPPO on "
        "CartPoleNoVel-v1 (rl-baselines3-zoo's ppo_lstm.yml trains it for 100k)",
    ),
    "recurrent_ppo_cartpole_no_rnn": Task(
        "recurrent_ppo_cartpole.py",
        ("--no-rnn",),
        150_000,
        CARTPOLE,
        "the feed-forward baseline of recurrent_ppo_cartpole: not expected to reach the target",
    ),
    "rpo_pendulum": Task(
        "rpo_pendulum.py",
        (),
        300_000,
        -250.0,
        f"none for RPO; {RL_ZOO} PPO: -172.2 +- 104.2 at 100k",
    ),
    "a2c_cartpole": Task("a2c_cartpole.py", (), 500_000, CARTPOLE, ZOO_A2C),
    "reinforce_cartpole": Task(
        "reinforce_cartpole.py", (), 500_000, CARTPOLE, f"none for REINFORCE; {ZOO_A2C}"
    ),
    "dqn_cartpole": Task("dqn_cartpole.py", (), 100_000, CARTPOLE, ZOO_DQN),
    "c51_cartpole": Task("c51_cartpole.py", (), 50_000, CARTPOLE, f"none for C51; {ZOO_DQN}"),
    "sac_pendulum": Task("sac_pendulum.py", (), 20_000, PENDULUM, ZOO_SAC),
    "redq_pendulum": Task("redq_pendulum.py", (), 20_000, PENDULUM, f"none for REDQ; {ZOO_SAC}"),
    "tqc_pendulum": Task(
        "tqc_pendulum.py", (), 20_000, PENDULUM, f"not looked up for TQC; {ZOO_SAC}"
    ),
    "crossq_pendulum": Task(
        "crossq_pendulum.py", (), 20_000, PENDULUM, f"none for CrossQ; {ZOO_SAC}"
    ),
    "td3_pendulum": Task(
        "td3_pendulum.py", (), 20_000, PENDULUM, f"{RL_ZOO} TD3: -151.9 +- 90.2 at 20k"
    ),
    "ddpg_pendulum": Task(
        "td3_pendulum.py", ("--ddpg",), 20_000, PENDULUM, f"{RL_ZOO} DDPG: -152.1 +- 94.3 at 20k"
    ),
    "mpo_pendulum": Task(
        "mpo_pendulum.py", (), 30_000, PENDULUM, "none found for MPO on Pendulum-v1"
    ),
    "mpo_cartpole": Task(
        "mpo_cartpole.py", (), 100_000, CARTPOLE, "none found for categorical MPO on CartPole-v1"
    ),
    **{
        name: Task(
            f"{name}.py",
            ("--dataset", OFFLINE["prepared"]),
            20_000,  # gradient steps: an offline learner collects no frames
            OFFLINE_DATASET_MEAN,
            OFFLINE_REFERENCE,
            **OFFLINE,
        )
        for name in ("iql_offline", "cql_offline", "td3bc_offline", "bc_offline")
    },
}


# The runs
def torchrl_swap(task: Task) -> dict[str, Any]:
    """The TorchRL swap of a task's tutorial (see ``swap_to_torchrl``)."""
    return swap_to_torchrl((TUTORIALS_DIR / task.script).read_text())


@dataclass(frozen=True)
class Run:
    """One (task, library, seed) subprocess."""

    task: str
    library: str
    seed: int
    total_frames: int
    device: str
    run_dir: Path
    script: Path


def plan_runs(cfg: argparse.Namespace, swaps: dict[str, dict]) -> list[Run]:
    """Every run of the selected tasks, libraries and seeds; writes each swapped script."""
    runs = []
    for name in cfg.tasks:
        task = TASKS[name]
        frames = scaled_frames(task, cfg)
        for library in cfg.libraries:
            if library == "torchrl" and not swaps[name]["ok"]:
                continue
            for seed in cfg.seeds:
                run_dir = run_dir_of(cfg.results_dir, name, library, seed)
                script = script_for(TUTORIALS_DIR / task.script, library, run_dir)
                runs.append(Run(name, library, seed, frames, cfg.device, run_dir, script))
    return runs


def prepare_tasks(names: list[str]) -> None:
    """Run each task's ``prepare`` command once (the offline tasks' dataset), unless the path
    it writes (``prepared``) already exists; stop with its error if it fails."""
    done = set()
    for name in names:
        task = TASKS[name]
        if not task.prepare or task.prepare in done:
            continue
        done.add(task.prepare)
        if (REPO_ROOT / task.prepared).exists():
            continue
        command = [sys.executable, str(TUTORIALS_DIR / task.prepare[0]), *task.prepare[1:]]
        shown = " ".join(display_path(part) for part in command)
        print(f"{name}: preparing ({shown})", flush=True)
        proc = subprocess.run(
            command, cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True
        )
        if proc.returncode != 0 or not (REPO_ROOT / task.prepared).exists():
            why = last_error_line(proc.stderr) or f"it did not write {task.prepared}"
            raise SystemExit(f"{name}: the preparation `{shown}` failed: {why}")


def scaled_frames(task: Task, cfg: argparse.Namespace) -> int:
    """The task's budget times ``--total-frames-scale`` (``SMOKE_FRAMES`` with ``--smoke``)."""
    if cfg.smoke:
        return SMOKE_FRAMES
    return max(1, round(task.total_frames * cfg.total_frames_scale))


def execute(run: Run, machine: dict[str, Any]) -> dict[str, Any]:
    """Run one tutorial into its run dir (a previous run's outputs removed first), write
    ``run.json`` and return it."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run.run_dir.iterdir():  # a previous run's outputs must not pass for this one's
        if stale.is_file() and stale != run.script:
            stale.unlink()
    args = ("--total-frames", run.total_frames, "--device", run.device, *TASKS[run.task].extra_args)
    load_before = os.getloadavg()[0]
    finished = run_tutorial(run.script, args, run.run_dir, run.seed)
    record = {
        "task": run.task,
        "library": run.library,
        "seed": run.seed,
        "total_frames": run.total_frames,
        "device": run.device,
        "command": [display_path(part) for part in finished.command],
        "returncode": finished.returncode,
        "wall_s": round(finished.wall_s, 1),
        # the 1-minute load average before and after: wall times compare only at equal loads
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine": machine,
    }
    (run.run_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def execute_all(runs: list[Run], jobs: int, machine: dict[str, Any]) -> None:
    """Run everything, ``jobs`` subprocesses at a time, printing one line per finished run."""
    finished = itertools.count(1)  # next() on it is atomic: safe from the worker threads

    def one(run: Run) -> None:
        record = execute(run, machine)
        summary = summarize_run(run.run_dir)
        done = next(finished)
        result = (
            f"final_return={fmt(summary['final_return'])}"
            if summary["status"] == "ok"
            else f"{summary['status']}: {summary.get('error')}"
        )
        print(
            f"[{done}/{len(runs)}] {run.task} {run.library} seed{run.seed}: {result} "
            f"({record['wall_s']:.0f} s)",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, runs))


def write_summary(cfg: argparse.Namespace, machine: dict[str, Any]) -> dict[str, Any]:
    """Summarize the run dirs of the selected tasks into ``cfg.out`` and the figures."""
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    tasks = {}
    for name in cfg.tasks:
        entry = summarize_task(name, TASKS[name], cfg, torchrl_swap(TASKS[name]), cfg.out.parent)
        if entry["libraries"]:
            tasks[name] = entry
    # A failed TorchRL swap is a finding, recorded in the JSON; only rlloss runs must finish.
    ok = all(t["libraries"].get("rlloss", {}).get("status", "ok") == "ok" for t in tasks.values())
    config = {k: v for k, v in vars(cfg).items() if k in CONFIG_RECORDED}
    config["results_dir"] = display_path(str(cfg.results_dir))
    config["subprocess_env"] = {k: child_env()[k] for k in ("OMP_NUM_THREADS", "TQDM_MININTERVAL")}
    result = {
        "machine": machine,
        "command": " ".join(["python", *(display_path(a) for a in sys.argv)]),
        "config": config,
        "references": "rl-baselines3-zoo: its benchmark.md (one training run per algorithm and "
        "env, mean and std of the return of the deterministic policy over its evaluation "
        "episodes, training budget as stated)",
        "method": (
            f"each tutorial run as a subprocess per seed; final_return is the tutorial's "
            f"(evaluation mean where it evaluates, else mean of the last 10 training "
            f"episodes); a target is met when final_return >= target on at least "
            f"{MIN_SEEDS_MET} seeds; torchrl = the same script with its 'from rlloss import' "
            f"lines importing the same names from TorchRL; wall times compare only between "
            f"runs made at the same machine load (the 1-minute load average before and after "
            f"each run is recorded where known)"
        ),
        "ok": ok,
        "tasks": tasks,
    }
    cfg.out.write_text(json.dumps(json_ready(result), indent=2) + "\n")
    return result


def everything_on_disk(cfg: argparse.Namespace) -> argparse.Namespace:
    """``cfg`` summarising every task and seed found in the results dir (as ``--summarize-only``
    does), so that running some tasks or seeds does not drop the others from the summary."""
    tasks = [t for t in TASKS if (cfg.results_dir / t).is_dir()]
    return argparse.Namespace(**{**vars(cfg), "tasks": tasks, "seeds": None})


def rnd_figure(cfg: argparse.Namespace) -> int:
    """``--rnd-runs``: print one row per run of ``ppo_rnd_sparse.py`` and draw the figure."""
    runs = {}
    for library, mode, seed in itertools.product(LIBRARIES, RND_MODES, cfg.seeds):
        run = cfg.rnd_runs / f"{library}-{mode}-{seed}"
        if (run / "returns.csv").exists():
            runs[library, mode, seed] = read_returns(run / "returns.csv")
            summary = rnd_summary(runs[library, mode, seed], run.with_suffix(".log"))
            print(f"{library:8s} {RND_MODES[mode]:10s} seed {seed}: {summary}")
    draw_rnd_figure(runs, cfg.out, cfg.rnd_title)
    print(f"wrote {cfg.out}")
    return 0


def learning_runs(cfg: argparse.Namespace, machine: dict[str, Any]) -> int:
    """Run the selected tasks (none with ``--summarize-only``), summarise every task on disk
    into ``cfg.out`` and its figures, print the summary; 1 if an rlloss run failed."""
    if not cfg.summarize_only:
        swaps = {name: torchrl_swap(TASKS[name]) for name in cfg.tasks}
        prepare_tasks(cfg.tasks)
        runs = plan_runs(cfg, swaps)
        print(f"{len(runs)} runs, {cfg.jobs} at a time, into {display_path(str(cfg.results_dir))}")
        execute_all(runs, cfg.jobs, machine)
        cfg = everything_on_disk(cfg)  # the summary keeps the tasks and seeds not run now
    result = write_summary(cfg, machine)
    print_summary(result)
    print(f"wrote {display_path(str(cfg.out))}")
    return 0 if result["ok"] else 1
