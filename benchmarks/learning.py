"""Learning benchmark: the tutorials over several seeds, with rlloss and with TorchRL's losses.

Every task of ``benchmarks/learning_tasks.py`` is run as a subprocess per library and seed, then
summarized into one JSON and one figure per task (what is run, where its outputs go, how they
are summarized: :mod:`benchmarks.learning_runs`).

Run from the repository root::

    python benchmarks/learning.py                          # every task, 3 seeds, both libraries
    python benchmarks/learning.py --smoke                  # a minute: tiny budgets, 1 seed
    python benchmarks/learning.py --tasks sac_pendulum --seeds 0 1 2 3 4 --jobs 2
    python benchmarks/learning.py --total-frames-scale 0.05 --results-dir /tmp/learning
    python benchmarks/learning.py --summarize-only
    python benchmarks/learning.py --rnd-runs /tmp/rndq --out docs/figures/ppo_rnd_sparse.png
    python benchmarks/learning.py --rnd-runs /tmp/rnd2 --rnd-title "Deep Sea 20" \
        --out docs/figures/ppo_rnd_deepsea.png

``--rnd-runs``: the figure and per-seed table of ``tutorials/ppo_rnd_sparse.py`` (PPO alone
beside PPO + RND, with rlloss and with TorchRL's classes) from its runs' output folders,
``<library>-<rnd|no-rnd>-<seed>`` (each with the tutorial's ``returns.csv``), each beside its
standard output ``<folder>.log``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import learning_runs  # noqa: E402
from benchmarks.learning_curves import RND_MODES, draw_rnd_figure, rnd_summary  # noqa: E402
from benchmarks.learning_tasks import TASKS  # noqa: E402
from benchmarks.records import machine_info  # noqa: E402

DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "learning"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "learning.json"
SMOKE_TASKS = ("ppo_cartpole", "td3_pendulum")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tasks",
        nargs="+",
        choices=list(TASKS),
        default=None,
        metavar="TASK",
        help=f"default: all (with --summarize-only: all found on disk); {', '.join(TASKS)}",
    )
    p.add_argument(
        "--seeds", nargs="+", type=int, default=None, help="default 0 1 2 (0 with --smoke)"
    )
    p.add_argument(
        "--libraries",
        nargs="+",
        choices=learning_runs.LIBRARIES,
        default=list(learning_runs.LIBRARIES),
    )
    p.add_argument(
        "--total-frames-scale",
        type=float,
        default=1.0,
        help="multiplies every task's frame budget, e.g. 0.05 for a quick look",
    )
    p.add_argument("--jobs", type=int, default=1, help="parallel subprocesses")
    p.add_argument("--device", default="cpu", help="passed to the tutorials")
    p.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="run dirs <results-dir>/<task>/<library>/seed<k>/ (default benchmarks/results/learning)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="summary JSON, the figures next to it (default benchmarks/results/learning.json)",
    )
    p.add_argument(
        "--summarize-only",
        action="store_true",
        help="rebuild the JSON and figures from the run dirs on disk, run nothing",
    )
    p.add_argument("--rnd-runs", type=Path, help="ppo_rnd_sparse's runs: draw --out from them")
    p.add_argument("--rnd-title", default="sparse MountainCar-v0", help="--rnd-runs' panels")
    p.add_argument(
        "--smoke",
        action="store_true",
        help=f"{learning_runs.SMOKE_FRAMES} frames, seed 0, tasks {' '.join(SMOKE_TASKS)} (unless given)",
    )
    cfg = p.parse_args(argv)
    if cfg.rnd_runs is not None and cfg.out is None:
        p.error("--rnd-runs draws a figure: give its path with --out FIGURE.png")
    smoke_dir = Path(tempfile.gettempdir()) / "rlloss-learning-smoke"
    if cfg.results_dir is None:
        cfg.results_dir = smoke_dir if cfg.smoke else DEFAULT_RESULTS_DIR
    if cfg.out is None:
        cfg.out = smoke_dir / "learning.json" if cfg.smoke else DEFAULT_OUT
    cfg.results_dir, cfg.out = cfg.results_dir.resolve(), cfg.out.resolve()
    if cfg.tasks is None:
        cfg.tasks = (
            list(SMOKE_TASKS)
            if cfg.smoke
            else [t for t in TASKS if not cfg.summarize_only or (cfg.results_dir / t).is_dir()]
        )
    if cfg.seeds is None and not cfg.summarize_only:
        cfg.seeds = [0] if cfg.smoke else [0, 1, 2]
    return cfg


def everything_on_disk(cfg: argparse.Namespace) -> argparse.Namespace:
    """``cfg`` summarising every task and seed found in the results dir (as ``--summarize-only``
    does), so that running some tasks or seeds does not drop the others from the summary."""
    tasks = [t for t in TASKS if (cfg.results_dir / t).is_dir()]
    return argparse.Namespace(**{**vars(cfg), "tasks": tasks, "seeds": None})


def rnd_figure(cfg: argparse.Namespace) -> int:
    """``--rnd-runs``: print one row per run of ``ppo_rnd_sparse.py`` and draw the figure."""
    runs = {}
    for library, mode, seed in itertools.product(learning_runs.LIBRARIES, RND_MODES, cfg.seeds):
        run = cfg.rnd_runs / f"{library}-{mode}-{seed}"
        if (run / "returns.csv").exists():
            runs[library, mode, seed] = learning_runs.read_returns(run / "returns.csv")
            summary = rnd_summary(runs[library, mode, seed], run.with_suffix(".log"))
            print(f"{library:8s} {RND_MODES[mode]:10s} seed {seed}: {summary}")
    draw_rnd_figure(runs, cfg.out, cfg.rnd_title)
    print(f"wrote {cfg.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.rnd_runs is not None:
        return rnd_figure(cfg)
    shown = learning_runs.display_path
    if cfg.summarize_only:
        machine = learning_runs.run_machine(cfg.results_dir, cfg.tasks) or machine_info()
    else:
        machine = machine_info()
        swaps = {name: learning_runs.torchrl_swap(TASKS[name]) for name in cfg.tasks}
        learning_runs.prepare_tasks(cfg.tasks)
        runs = learning_runs.plan_runs(cfg, swaps)
        print(f"{len(runs)} runs, {cfg.jobs} at a time, into {shown(str(cfg.results_dir))}")
        learning_runs.execute_all(runs, cfg.jobs, machine)
        cfg = everything_on_disk(cfg)  # the summary keeps the tasks and seeds not run now
    result = learning_runs.write_summary(cfg, machine)
    learning_runs.print_summary(result)
    print(f"wrote {shown(str(cfg.out))}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
