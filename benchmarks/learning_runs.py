"""The learning benchmark: the tutorials over seeds, with rlloss and with TorchRL's losses.

What is run
-----------
Every *task* is one tutorial in ``tutorials/`` with its extra arguments, a frame budget, a
target on the final return and a published reference (see ``TASKS``). Each (task, library,
seed) is one subprocess::

    python tutorials/<script> --seed K --total-frames F --device D --out <run dir> [extra args]

* ``rlloss``  -- the tutorial as it is.
* ``torchrl`` -- the same script with the TorchRL loss swapped in: every ``from rlloss import
  X, Y`` statement is rewritten to import ``X, Y`` from TorchRL (``torchrl.objectives``, or
  ``torchrl.objectives.value`` for the value estimators, where TorchRL keeps ``GAE``), and
  nothing else changes. That one-import swap is rlloss's drop-in claim. The rewritten script is
  saved in the run directory. Tasks whose names TorchRL does not have (``RPOLoss``, the MPO
  losses...) are recorded as ``n/a``; a swapped script that fails is recorded with the last line
  of its error, and the benchmark goes on.

Each run directory ``<results dir>/<task>/<library>/seed<K>/`` holds ``returns.csv`` (written by
the tutorial: one row ``frames, episode_return`` per finished episode), ``stdout.txt``,
``stderr.txt`` and ``run.json`` (the command, its exit status and wall time). The tutorials
print ``wall_time=``, ``train_return=``, ``eval_return=`` (those that evaluate their final
policy) and last ``final_return=`` (see ``tutorials/_helpers.py``); these are collected.

Summary
-------
``benchmarks/results/learning.json`` (``--out``): the machine, the command, and per task and
library the per-seed returns and wall times, and whether ``final_return >= target`` held on at
least 2 seeds. One figure per task next to it, ``learning_<task>.png``: per library the mean
and the min-max spread over seeds of the running mean of the last 10 episode returns, put on a
common frame grid, with the target as a dotted line. ``--summarize-only`` rebuilds both from the
run directories already on disk (runs made elsewhere in the same layout included). The run
directories are not committed (``.gitignore``): ``benchmarks/results/`` keeps the summary and the
figures, and the runs behind a committed summary are in git history.

Every subprocess gets ``OMP_NUM_THREADS=1`` (unless set already): with ``--jobs`` > 1 the runs
share the cores without oversubscribing them. The exit status is 1 when an rlloss run failed; a
failed TorchRL swap is a finding, recorded, not an error. ``--smoke`` writes under the system's
temporary directory unless ``--results-dir`` / ``--out`` are given, so it never replaces the
recorded results.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO_ROOT
from benchmarks.learning_curves import draw_learning_curves
from benchmarks.learning_tasks import TASKS, Task
from benchmarks.torchrl_swap import swap_to_torchrl

TUTORIALS_DIR = REPO_ROOT / "tutorials"
LIBRARIES = ("rlloss", "torchrl")
MIN_SEEDS_MET = 2  # a task's target is met when final_return >= target on this many seeds
SMOKE_FRAMES = 2048
TRACEBACK = "Traceback (most recent call last):"
RESULT_LINE = re.compile(r"^(final_return|train_return|eval_return|wall_time)=(\S+?)s?\s*$")


def torchrl_swap(task: Task) -> dict[str, Any]:
    """The TorchRL swap of a task's tutorial (see ``swap_to_torchrl``)."""
    return swap_to_torchrl((TUTORIALS_DIR / task.script).read_text())


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #
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


def run_dir_of(results_dir: Path, task: str, library: str, seed: int) -> Path:
    """``<results dir>/<task>/<library>/seed<seed>``."""
    return results_dir / task / library / f"seed{seed}"


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
                script = TUTORIALS_DIR / task.script
                if library == "torchrl":
                    run_dir.mkdir(parents=True, exist_ok=True)
                    script = run_dir / f"torchrl_{task.script}"
                    script.write_text(swaps[name]["source"])
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


def run_command(run: Run) -> list[str]:
    """The tutorial's command line for one run."""
    task = TASKS[run.task]
    return [
        sys.executable,
        str(run.script),
        "--seed",
        str(run.seed),
        "--total-frames",
        str(run.total_frames),
        "--device",
        run.device,
        "--out",
        str(run.run_dir),
        *task.extra_args,
    ]


def child_env() -> dict[str, str]:
    """The subprocess environment: the tutorials dir (for ``_helpers``) and the working tree's
    ``rlloss`` first on the path, one thread each, and a quiet progress bar."""
    env = dict(os.environ)
    path = [str(TUTORIALS_DIR), str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(
        path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TQDM_MININTERVAL", "10")
    return env


def execute(run: Run, machine: dict[str, Any]) -> dict[str, Any]:
    """Run one tutorial, keep its outputs in the run dir, write ``run.json`` and return it."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run.run_dir.iterdir():  # a previous run's outputs must not pass for this one's
        if stale.is_file() and stale != run.script:
            stale.unlink()
    command = run_command(run)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(run.run_dir / "stdout.txt", "w") as out, open(run.run_dir / "stderr.txt", "w") as err:
        proc = subprocess.run(command, cwd=REPO_ROOT, env=child_env(), stdout=out, stderr=err)
    record = {
        "task": run.task,
        "library": run.library,
        "seed": run.seed,
        "total_frames": run.total_frames,
        "device": run.device,
        "command": [display_path(part) for part in command],
        "returncode": proc.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        # the 1-minute load average before and after: wall times compare only at equal loads
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine": machine,
    }
    (run.run_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def display_path(part: str) -> str:
    """A command-line part with the repository root made relative and the interpreter as
    ``python``."""
    if part == sys.executable:
        return "python"
    return part.replace(str(REPO_ROOT) + os.sep, "")


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


# --------------------------------------------------------------------------- #
# Collecting
# --------------------------------------------------------------------------- #
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
    name: str, cfg: argparse.Namespace, swap: dict[str, Any], figure_dir: Path
) -> dict[str, Any]:
    """A task's entry of the JSON: its definition, per library the summary (or why there is
    none), and its figure (drawn here)."""
    task = TASKS[name]
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


# --------------------------------------------------------------------------- #
# Machine, JSON
# --------------------------------------------------------------------------- #
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


def write_summary(cfg: argparse.Namespace, machine: dict[str, Any]) -> dict[str, Any]:
    """Summarize the run dirs of the selected tasks into ``cfg.out`` and the figures."""
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    tasks = {}
    for name in cfg.tasks:
        entry = summarize_task(name, cfg, torchrl_swap(TASKS[name]), cfg.out.parent)
        if entry["libraries"]:
            tasks[name] = entry
    # A failed TorchRL swap is a finding, recorded in the JSON; only rlloss runs must finish.
    ok = all(t["libraries"].get("rlloss", {}).get("status", "ok") == "ok" for t in tasks.values())
    config = {k: v for k, v in vars(cfg).items() if k != "out"}
    config["results_dir"] = display_path(str(cfg.results_dir))
    config["subprocess_env"] = {k: child_env()[k] for k in ("OMP_NUM_THREADS", "TQDM_MININTERVAL")}
    result = {
        "machine": machine,
        "command": " ".join(["python", *(display_path(a) for a in sys.argv)]),
        "config": config,
        "references": "rl-baselines3-zoo: its benchmark.md (one training run per algorithm and env, "
        "mean and std of the return of the deterministic policy over its evaluation "
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
