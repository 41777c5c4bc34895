"""Run the tutorials over seeds, with rlloss's losses and with TorchRL's swapped in.

One runner, two uses of the same runs (a subprocess per tutorial, library and seed, TorchRL's
classes swapped in by rewriting the script's ``from rlloss import`` lines, what the script
prints read back: ``tools/tutorial_process.py``):

- the learning runs (the default; ``tools/tutorial_learning.py``): the tasks of ``TASKS`` at
  their frame budgets, summarised in ``benchmarks/results/learning.json`` with one figure per
  task (``learning_<task>.png``; the learning table of ``BENCHMARKS.md``), exit status 1 when an
  rlloss run failed; ``--rnd-runs``: the figure and per-seed table of
  ``tutorials/ppo_rnd_sparse.py`` (PPO alone beside PPO + RND, both libraries) from its runs'
  folders ``<library>-<rnd|no-rnd>-<seed>`` (each with the tutorial's ``returns.csv``, beside its
  standard output ``<folder>.log``);
- the ``[figures]`` check (``--figures``; ``tools/tutorial_figures.py``): every documented
  per-seed figure of the tutorials' docstrings rerun and compared, exit status 1 when one
  differs by more than its rounding or a run fails; ``--list`` prints the lines only.

Run from the repository root::

    python tools/tutorial_runs.py                          # every task, 3 seeds, both libraries
    python tools/tutorial_runs.py --smoke                  # a minute: tiny budgets, 1 seed
    python tools/tutorial_runs.py --tasks sac_pendulum --seeds 0 1 2 3 4 --jobs 2
    python tools/tutorial_runs.py --total-frames-scale 0.05 --results-dir /tmp/learning
    python tools/tutorial_runs.py --summarize-only         # rebuild from the run dirs on disk
    python tools/tutorial_runs.py --rnd-runs /tmp/rndq --out docs/figures/ppo_rnd_sparse.png
    python tools/tutorial_runs.py --rnd-runs /tmp/rnd2 --rnd-title "Deep Sea 20" \\
        --out docs/figures/ppo_rnd_deepsea.png
    python tools/tutorial_runs.py --list                   # the documented [figures] lines
    python tools/tutorial_runs.py --figures --tutorials dqn_cartpole --jobs 2
    python tools/tutorial_runs.py --figures --tutorials dqn_cartpole --libraries torchrl --seeds 3

``--smoke`` writes under the temporary directory unless ``--results-dir`` / ``--out`` are given;
``--figures`` runs in a temporary directory unless ``--results-dir`` is given.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tutorial_figures import check_figures
from tutorial_learning import (
    DEFAULT_OUT,
    DEFAULT_RESULTS_DIR,
    SMOKE_FRAMES,
    SMOKE_TASKS,
    TASKS,
    learning_runs,
    rnd_figure,
)
from tutorial_process import LIBRARIES, REPO_ROOT
from tutorial_summary import run_machine

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.records import machine_info  # noqa: E402

# The options of one use only, with their default (None: not given).
LEARNING_OPTIONS = ("tasks", "total_frames_scale", "device", "out", "summarize_only")
LEARNING_OPTIONS += ("rnd_runs", "rnd_title", "smoke")
FIGURES_OPTIONS = ("tutorials", "tolerance")


def parser() -> argparse.ArgumentParser:
    """The command line of both uses (``parse_args`` checks which options go together)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--figures", action="store_true", help="the [figures] check (see above)")
    p.add_argument("--list", action="store_true", help="print the documented figures only")
    p.add_argument(
        "--tasks",
        nargs="+",
        choices=list(TASKS),
        metavar="TASK",
        help=f"default: all (with --summarize-only: all found on disk); {', '.join(TASKS)}",
    )
    p.add_argument("--tutorials", nargs="+", help="--figures: these tutorials (default: every one)")
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="default 0 1 2 (0 with --smoke); --figures: only these of the documented seeds",
    )
    p.add_argument("--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES))
    p.add_argument(
        "--total-frames-scale",
        type=float,
        help="multiplies every task's frame budget, e.g. 0.05 for a quick look",
    )
    p.add_argument(
        "--jobs", type=int, help="runs at a time, one thread each (default 1; --figures: 2)"
    )
    p.add_argument("--device", help="passed to the tutorials (default cpu)")
    p.add_argument(
        "--results-dir",
        type=Path,
        help="run dirs <results-dir>/<task>/<library>/seed<k>/ (default "
        "benchmarks/results/learning; --figures: a temporary directory)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="summary JSON, the figures next to it (default benchmarks/results/learning.json)",
    )
    p.add_argument(
        "--summarize-only",
        action="store_true",
        default=None,
        help="rebuild the JSON and figures from the run dirs on disk, run nothing",
    )
    p.add_argument("--rnd-runs", type=Path, help="ppo_rnd_sparse's runs: draw --out from them")
    p.add_argument("--rnd-title", help="--rnd-runs' panels (default: sparse MountainCar-v0)")
    p.add_argument(
        "--smoke",
        action="store_true",
        default=None,
        help=f"{SMOKE_FRAMES} frames, seed 0, tasks {' '.join(SMOKE_TASKS)} (unless given)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        help="--figures: largest difference allowed (default: half a unit of each documented "
        "value's last digit, the docstring's rounding)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with each use's defaults; an option of the other use is refused."""
    p = parser()
    cfg = p.parse_args(argv)
    cfg.figures = cfg.figures or cfg.list
    mine, others = (
        (FIGURES_OPTIONS, LEARNING_OPTIONS) if cfg.figures else (LEARNING_OPTIONS, FIGURES_OPTIONS)
    )
    given = [f"--{name.replace('_', '-')}" for name in others if getattr(cfg, name) is not None]
    if given:
        use = "the learning runs" if cfg.figures else "--figures"
        verb = "goes" if len(given) == 1 else "go"
        p.error(f"{', '.join(given)} {verb} with {use}: drop them, or run that use")
    if cfg.figures:
        cfg.jobs = cfg.jobs or 2
        return cfg
    return learning_defaults(p, cfg)


def learning_defaults(p: argparse.ArgumentParser, cfg: argparse.Namespace) -> argparse.Namespace:
    """The learning runs' defaults (``--smoke``'s where given) filled into ``cfg``."""
    cfg.smoke, cfg.summarize_only = bool(cfg.smoke), bool(cfg.summarize_only)
    cfg.jobs, cfg.device = cfg.jobs or 1, cfg.device or "cpu"
    cfg.rnd_title = cfg.rnd_title or "sparse MountainCar-v0"
    if cfg.total_frames_scale is None:
        cfg.total_frames_scale = 1.0
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


def figures(cfg: argparse.Namespace, work: Path) -> int:
    """``--figures``: the [figures] check run in ``work``."""
    return check_figures(
        cfg.tutorials, cfg.libraries, cfg.seeds, cfg.jobs, cfg.tolerance, work, cfg.list
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.figures and cfg.results_dir is not None:
        return figures(cfg, cfg.results_dir)
    if cfg.figures:
        with tempfile.TemporaryDirectory() as work:
            return figures(cfg, Path(work))
    if cfg.rnd_runs is not None:
        return rnd_figure(cfg)
    recorded = run_machine(cfg.results_dir, cfg.tasks) if cfg.summarize_only else None
    return learning_runs(cfg, recorded or machine_info())


if __name__ == "__main__":
    sys.exit(main())
