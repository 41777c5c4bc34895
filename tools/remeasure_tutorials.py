"""Rerun the tutorials' documented per-seed figures and compare them with their docstrings.

A tutorial documents what it measured in its docstring; the figures this tool checks are the
lines marked ``[figures]``, one per library and setting::

    [figures] rlloss, seeds 0 1 2, --total-frames 50000: final_return = 500.0 373.7 364.0

read as: ``python tutorials/<name>.py --seed S --total-frames 50000`` (rlloss's losses, or
``torchrl``: the script with its ``from rlloss import ...`` lines importing TorchRL's classes
instead, ``benchmarks/torchrl_swap.py``, the learning benchmark's swap) prints
``final_return=<value>`` as its result for seed S, for each seed listed, in order. The tool
reruns every marked line's seeds (a subprocess each, one CPU thread, ``--jobs`` at a time) and
reports, per seed, the documented and the measured value; it exits 1 if any differs by more than
``--tolerance`` (the docstring's rounding, 0.05 by default) or a run fails.

Not run in CI (a DQN line is ten CPU-minutes a seed). Run it whenever a loss's hot path changes
(its forward's arithmetic or the order of its operations): the tutorials are training runs whose
outcome can flip with float32 rounding, so a documented figure can stop holding without any
change of maths (``tests/test_trajectories.py`` tells the two apart). Then either the figures
still hold, or the docstring is re-measured (this tool's output gives the new line) and, if a
result no longer meets its target, the tutorial's settings are made robust again.

Robustness to rounding (issue 49): rerun a tutorial's lines under a perturbation that changes
float32 rounding without changing the maths, e.g. on an AVX-512 machine
``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 python tools/remeasure_tutorials.py ...``
(the environment reaches every run): the matrix products take AVX2 kernels, and 50 Adam steps of
dqn_cartpole's MLP end with parameters that differ in their last bits, where
``OMP_NUM_THREADS=2`` leaves them bit-identical; dqn_cartpole, seed 0, 4,000 frames: final_return
248.4 native, 250.9 perturbed (rlloss's DQNLoss).

    python tools/remeasure_tutorials.py --list
    python tools/remeasure_tutorials.py --tutorials dqn_cartpole --jobs 2
    python tools/remeasure_tutorials.py --tutorials dqn_cartpole --libraries torchrl --seeds 3
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TUTORIALS_DIR = REPO_ROOT / "tutorials"
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.torchrl_swap import swap_to_torchrl  # noqa: E402

LIBRARIES = ("rlloss", "torchrl")
FIGURES_LINE = re.compile(
    r"^\s*\[figures\]\s+(?P<library>\w+),\s+seeds\s+(?P<seeds>[\d ]+?),\s*(?P<args>.*?):\s+"
    r"(?P<metric>\w+)\s*=\s*(?P<values>[-+\d. na]+?)\s*$"
)


@dataclasses.dataclass(frozen=True, eq=False)  # keyed by identity
class Figures:
    """One ``[figures]`` line: the tutorial, the library, the command-line arguments, the
    printed result's name and the documented value of each seed."""

    tutorial: str
    library: str
    args: tuple[str, ...]
    metric: str
    documented: dict[int, float]


def parse_figures(tutorial: str, docstring: str) -> list[Figures]:
    """The ``[figures]`` lines of a tutorial's docstring; a malformed one raises ``ValueError``
    naming the tutorial and the line."""
    found = []
    for line in docstring.splitlines():
        if "[figures]" not in line:
            continue
        match = FIGURES_LINE.match(line)
        if match is None:
            raise ValueError(f"{tutorial}: malformed [figures] line: {line.strip()!r}")
        seeds = [int(s) for s in match["seeds"].split()]
        values = [float(v) for v in match["values"].split()]
        if match["library"] not in LIBRARIES or len(seeds) != len(values):
            raise ValueError(
                f"{tutorial}: [figures] line needs a library of {LIBRARIES} and one value per "
                f"seed ({len(seeds)} seeds, {len(values)} values): {line.strip()!r}"
            )
        found.append(
            Figures(
                tutorial,
                match["library"],
                tuple(match["args"].split()),
                match["metric"],
                dict(zip(seeds, values, strict=True)),
            )
        )
    return found


def documented_figures(names: list[str] | None = None) -> list[Figures]:
    """Every tutorial's ``[figures]`` lines (only those of ``names`` if given)."""
    figures = []
    for path in sorted(TUTORIALS_DIR.glob("[!_]*.py")):
        if names is None or path.stem in names:
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            figures.extend(parse_figures(path.stem, docstring))
    return figures


def script_for(tutorial: str, library: str, work: Path) -> Path:
    """The tutorial's script, or for ``torchrl`` its swapped copy (in the tutorials' directory's
    place on the path, as the learning benchmark runs it)."""
    path = TUTORIALS_DIR / f"{tutorial}.py"
    if library == "rlloss":
        return path
    swap = swap_to_torchrl(path.read_text())
    if not swap["ok"]:
        raise ValueError(f"{tutorial}: no TorchRL swap: {swap['reason']}")
    swapped = work / f"torchrl_{tutorial}.py"
    swapped.write_text(swap["source"])
    return swapped


def run_one(script: Path, args: tuple[str, ...], seed: int, metric: str, out: Path) -> float:
    """Run ``script --seed seed args --out out`` on one CPU thread; the last ``metric=`` value
    it prints (NaN if the run fails or prints none)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join([str(TUTORIALS_DIR), str(REPO_ROOT)]),
    }
    command = [sys.executable, str(script), "--seed", str(seed), *args, "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    values = [
        line.split("=", 1)[1]
        for line in result.stdout.splitlines()
        if line.startswith(f"{metric}=")
    ]
    if result.returncode != 0 or not values:
        print(f"  failed: {' '.join(command)}\n{result.stderr[-2000:]}", file=sys.stderr)
        return math.nan
    return float(values[-1].rstrip("s"))


def remeasure(
    figures: list[Figures], seeds: list[int] | None, jobs: int, tolerance: float, work: Path
) -> bool:
    """Rerun every documented seed (of ``seeds`` if given), print documented vs measured, and
    the re-measured ``[figures]`` lines; True if all agree within ``tolerance``."""
    planned = [
        (fig, seed) for fig in figures for seed in fig.documented if seeds is None or seed in seeds
    ]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            (fig, seed): pool.submit(
                run_one,
                script_for(fig.tutorial, fig.library, work),
                fig.args,
                seed,
                fig.metric,
                work / f"{fig.tutorial}-{fig.library}-{seed}",
            )
            for fig, seed in planned
        }
        measured = {key: future.result() for key, future in futures.items()}
    agree = True
    for fig in figures:
        rows = [
            (seed, fig.documented[seed], measured[fig, seed])
            for seed in fig.documented
            if (fig, seed) in measured
        ]
        for seed, documented, value in rows:
            same = abs(documented - value) <= tolerance
            agree &= same
            print(
                f"{fig.tutorial} {fig.library} seed {seed}: {fig.metric} documented "
                f"{documented:g}, measured {value:g}{'' if same else '  <-- differs'}"
            )
        if rows:
            print(
                f"    [figures] {fig.library}, seeds {' '.join(str(r[0]) for r in rows)}, "
                f"{' '.join(fig.args)}: {fig.metric} = "
                f"{' '.join(f'{r[2]:.1f}' for r in rows)}"
            )
    return agree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tutorials", nargs="+", default=None, help="default: every tutorial")
    parser.add_argument("--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES))
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=None, help="only these of the documented seeds"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--work", type=Path, default=None, help="run directories (default: temp)")
    parser.add_argument("--list", action="store_true", help="print the documented figures only")
    args = parser.parse_args(argv)
    figures = [f for f in documented_figures(args.tutorials) if f.library in args.libraries]
    if args.list or not figures:
        for fig in figures:
            print(
                f"{fig.tutorial} {fig.library} {' '.join(fig.args)}: {fig.metric} {fig.documented}"
            )
        return 0 if figures else 1
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        return 0 if remeasure(figures, args.seeds, args.jobs, args.tolerance, args.work) else 1
    with tempfile.TemporaryDirectory() as work:
        return 0 if remeasure(figures, args.seeds, args.jobs, args.tolerance, Path(work)) else 1


if __name__ == "__main__":
    sys.exit(main())
