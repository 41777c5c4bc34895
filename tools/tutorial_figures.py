"""The ``[figures]`` check of ``tools/tutorial_runs.py --figures``: rerun the tutorials'
documented per-seed figures and compare them with their docstrings.

A tutorial documents what it measured in its docstring; the figures this tool checks are the
lines marked ``[figures]``, one per library and setting::

    [figures] rlloss, seeds 0 1 2, --total-frames 50000: final_return = 500.0 373.7 364.0

read as: ``python tutorials/<name>.py --seed S --total-frames 50000`` (rlloss's losses, or
``torchrl``: the script with its ``from rlloss import ...`` lines importing TorchRL's classes
instead, ``tools/tutorial_process.py``'s swap, the learning runs' too) prints
``final_return=<value>`` as its result for seed S, for each seed listed, in order. The metric is
any ``name=value`` line the script prints (its last one; the value's first word, so
``first_eval_at_target=4000 (target -200, ...)`` reads 4000), brackets included
(``return_at_target[-144.1]``). Lines of one tutorial, library, arguments and seed share one
run, so a second metric of the same run costs nothing. An argument ``<script args>`` is a
prerequisite: ``python tutorials/<script>.py args --out DIR`` runs first, once per session of
the tool (rlloss's script, the seed its own arguments give), and ``DIR`` takes its place, e.g.
``--dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset`` (the dataset an offline
tutorial reads). The tool reruns every marked line's seeds (a subprocess each, one CPU thread,
``--jobs`` at a time) and reports, per seed, the documented and the measured value and the
run's wall time; it exits 1 if any differs by more than the documented rounding (half a unit of
the last digit written, or of the printed one where the script prints fewer: ``500`` allows
0.5, ``0.604`` 0.0005), or ``--tolerance`` if given, or a run fails.

Tutorials with results but no ``[figures]`` line, and why (``*_mujoco.py``: their results are
``tools/mujoco_results.py``'s):

- ``cql_offline``, ``iql_offline``, ``td3bc_offline``: measured on CUDA (an H100, torch 2.11);
  a CPU rerun is another float32 trajectory, not a check of those figures;
- ``bc_offline``, "medium" dataset: measured with the regression in plain torch, before the
  script took ``BCLoss`` (its expert-dataset figures have lines);
- ``ppo_ddp``: two processes under ``torchrun``, not a plain command of the script;
- ``sac_pendulum``'s first figures (-108.5, -106.7, -160.3; training -178.8, -190.5, -196.2):
  recorded before the periodic evaluation; its lines give the re-run's;
- ``dt_offline``'s earlier version (returns-to-go scaled by 1/1000, expert dataset): not the
  current script;
- ``compile_and_cudagraphs``: throughput on an H100, not a per-seed result;
- ``ppo_cartpole``, ``klpen_cartpole``, ``rpo_pendulum``, ``torchrl_pipeline``: no per-seed
  figure in their docstrings (``ppo_ddp``'s table gives ``ppo_cartpole``'s 500.0 on seeds 0-2,
  run by ``ppo_ddp --baseline`` under ``torchrun``).

Not run in CI (a dqn_cartpole run takes 6 to 10 minutes a seed on the 2-core machine, a Pendulum
one 3 to 16). Run it whenever a loss's hot path changes (its forward's arithmetic or the order of
its operations): the tutorials are training runs whose outcome can flip with float32 rounding, so
a documented figure can stop holding without any change of maths (``tests/test_trajectories.py``
tells the two apart). Then either the figures still hold, or the docstring is re-measured (this
tool's output gives the new line) and, if a result no longer meets its target, the tutorial's
settings are made robust again.

Robustness to rounding (issue 49): rerun a tutorial's lines under a perturbation that changes
float32 rounding without changing the maths, e.g. on an AVX-512 machine
``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 python tools/tutorial_runs.py --figures``
(the environment reaches every run): the matrix products take AVX2 kernels, and 50 Adam steps of
dqn_cartpole's MLP end with parameters that differ in their last bits, where
``OMP_NUM_THREADS=2`` leaves them bit-identical; dqn_cartpole, seed 0, 4,000 frames: final_return
250.9 native, 248.4 perturbed (rlloss's DQNLoss, measured again 2026-11-29).
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import re
import sys
from pathlib import Path

from tutorial_process import (
    LIBRARIES,
    TUTORIALS_DIR,
    Finished,
    as_number,
    run_tutorial,
    script_for,
)

FIGURES_LINE = re.compile(
    r"^\s*\[figures\]\s+(?P<library>\w+),\s+seeds\s+(?P<seeds>[\d ]+?),\s*(?P<args>.*?):\s+"
    r"(?P<metric>[\w\[\].-]+?)\s*=\s*(?P<values>[-+\d. na]+?)\s*$"
)
PREREQUISITE = re.compile(r"<(?P<tutorial>\w+)(?P<args>[^<>]*)>")


@dataclasses.dataclass(frozen=True, eq=False)  # keyed by identity
class Figures:
    """One ``[figures]`` line: the tutorial, the library, the command-line arguments (with a
    ``{i}`` where the output directory of ``prerequisites[i]`` goes), the printed result's name,
    the documented value of each seed and its number of decimals (the documented rounding)."""

    tutorial: str
    library: str
    args: tuple[str, ...]
    metric: str
    documented: dict[int, float]
    decimals: dict[int, int]
    prerequisites: tuple[tuple[str, tuple[str, ...]], ...] = ()


def written_args(fig: Figures) -> str:
    """A line's arguments as its docstring writes them (each prerequisite as ``<script args>``)."""
    runs = [f"<{' '.join((script, *args))}>" for script, args in fig.prerequisites]
    return " ".join(fig.args).format(*runs)


def decimals_of(value: str) -> int:
    """The number of decimals a documented value is written with (``"-0.29"``: 2)."""
    return len(value.split(".", 1)[1]) if "." in value else 0


def split_prerequisites(
    tutorial: str, line: str, args: str
) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """A line's arguments with each ``<script args>`` (a tutorial run whose ``--out`` directory
    the arguments name, e.g. the dataset an offline tutorial reads) replaced by ``{i}``, and those
    runs as ``(script, args)``; a brace outside them, or a script that is not a tutorial, raises
    ``ValueError`` naming the tutorial and the line."""
    prerequisites = []

    def placeholder(match: re.Match) -> str:
        if not (TUTORIALS_DIR / f"{match['tutorial']}.py").is_file():
            raise ValueError(
                f"{tutorial}: [figures] prerequisite {match['tutorial']!r} is not a script of "
                f"{TUTORIALS_DIR}: {line.strip()!r}"
            )
        prerequisites.append((match["tutorial"], tuple(match["args"].split())))
        return f"{{{len(prerequisites) - 1}}}"

    if "{" in args or "}" in args:
        raise ValueError(f"{tutorial}: [figures] arguments may not hold braces: {line.strip()!r}")
    return tuple(PREREQUISITE.sub(placeholder, args).split()), tuple(prerequisites)


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
        values = match["values"].split()
        if match["library"] not in LIBRARIES or len(seeds) != len(values):
            raise ValueError(
                f"{tutorial}: [figures] line needs a library of {LIBRARIES} and one value per "
                f"seed ({len(seeds)} seeds, {len(values)} values): {line.strip()!r}"
            )
        args, prerequisites = split_prerequisites(tutorial, line, match["args"])
        found.append(
            Figures(
                tutorial,
                match["library"],
                args,
                match["metric"],
                dict(zip(seeds, map(float, values), strict=True)),
                dict(zip(seeds, map(decimals_of, values), strict=True)),
                prerequisites,
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


def run_one(script: Path, args: tuple[str, ...], seed: int, metric: str, out: Path) -> float:
    """The last printed ``metric`` value of one run for ``seed`` (NaN if the run fails or prints
    none)."""
    return as_number((run_and_report(script, args, out, seed).printed or {}).get(metric))


def run_and_report(
    script: Path, args: tuple[str, ...], out: Path, seed: int | None = None
) -> Finished:
    """``run_tutorial``, with a failed run's command and the end of its error output printed."""
    finished = run_tutorial(script, args, out, seed)
    if finished.returncode != 0:
        stderr = (out / "stderr.txt").read_text(errors="replace")
        print(f"  failed: {' '.join(finished.command)}\n{stderr[-2000:]}", file=sys.stderr)
    return finished


def run_prerequisites(
    figures: list[Figures], pool: concurrent.futures.Executor, work: Path
) -> dict[tuple[str, tuple[str, ...]], Path | None]:
    """Run each distinct prerequisite of ``figures`` once (rlloss's script, the seed its own
    arguments give): its output directory, or None if it failed."""
    distinct = list(dict.fromkeys(p for fig in figures for p in fig.prerequisites))
    outs = {p: work / f"prerequisite-{i}-{p[0]}" for i, p in enumerate(distinct)}
    futures = {
        p: pool.submit(run_and_report, TUTORIALS_DIR / f"{p[0]}.py", p[1], outs[p])
        for p in distinct
    }
    done = {}
    for prerequisite, future in futures.items():
        printed, wall_s = future.result().printed, future.result().wall_s
        result = "failed" if printed is None else f"final_return={printed.get('final_return')}"
        command = " ".join((prerequisite[0], *prerequisite[1]))
        print(f"prerequisite {command}: {result}, {wall_s:.0f} s")
        done[prerequisite] = None if printed is None else outs[prerequisite]
    return done


def remeasure(
    figures: list[Figures],
    seeds: list[int] | None,
    jobs: int,
    tolerance: float | None,
    work: Path,
) -> bool:
    """Rerun every documented seed (of ``seeds`` if given; one run per tutorial, library,
    arguments and seed, whatever the number of metrics read from it), print documented vs
    measured and each run's wall time, and the re-measured ``[figures]`` lines; True if all
    agree within ``tolerance`` (default: half a unit of the documented value's last digit)."""
    work.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        prerequisite_outs = run_prerequisites(figures, pool, work)
        runs, by_line = {}, {}
        for fig in figures:
            outs = [prerequisite_outs[p] for p in fig.prerequisites]
            if None in outs:
                continue  # its prerequisite failed: its seeds are reported as not measured
            args = tuple(arg.format(*outs) for arg in fig.args)
            for seed in fig.documented:
                if seeds is not None and seed not in seeds:
                    continue
                key = (fig.tutorial, fig.library, args, seed)
                if key not in runs:
                    out = work / f"{fig.tutorial}-{fig.library}-{len(runs)}-seed{seed}"
                    path = TUTORIALS_DIR / f"{fig.tutorial}.py"
                    script = script_for(path, fig.library, work)
                    runs[key] = pool.submit(run_and_report, script, args, out, seed)
                by_line[fig, seed] = runs[key]
        agree = True
        for fig in figures:
            agree &= compare(fig, by_line, tolerance)
    return agree


def compare(fig: Figures, runs: dict, tolerance: float | None) -> bool:
    """Print one line's documented and measured values, seed by seed, and its re-measured
    ``[figures]`` line; True if every seed agrees within ``tolerance``."""
    rows = []
    for seed in fig.documented:
        future = runs.get((fig, seed))
        if future is not None:
            finished = future.result()
            rows.append((seed, (finished.printed or {}).get(fig.metric), finished.wall_s))
    agree = True
    for seed, text, wall_time in rows:
        documented, value = fig.documented[seed], as_number(text)
        digits = min(fig.decimals[seed], decimals_of(text or ""))  # the coarser rounding
        allowed = 0.5 * 10**-digits + 1e-9 if tolerance is None else tolerance
        same = abs(documented - value) <= allowed
        agree &= same
        print(
            f"{fig.tutorial} {fig.library} {written_args(fig)} seed {seed}: {fig.metric} "
            f"documented {documented:.{fig.decimals[seed]}f}, measured {text or 'nothing'} "
            f"({wall_time:.0f} s){'' if same else '  <-- differs'}"
        )
    if rows:
        print(
            f"    [figures] {fig.library}, seeds {' '.join(str(r[0]) for r in rows)}, "
            f"{written_args(fig)}: {fig.metric} = {' '.join(r[1] or 'nan' for r in rows)}"
        )
    return agree


def check_figures(
    tutorials: list[str] | None,
    libraries: list[str],
    seeds: list[int] | None,
    jobs: int,
    tolerance: float | None,
    work: Path,
    list_only: bool = False,
) -> int:
    """``tools/tutorial_runs.py --figures``: the exit status of ``remeasure`` over the
    documented lines of ``tutorials`` (all if None) and ``libraries``, 0 if all agree; with
    ``list_only``, the lines printed instead of run; 1 where there is no line."""
    figures = [f for f in documented_figures(tutorials) if f.library in libraries]
    if list_only or not figures:
        for fig in figures:
            print(
                f"{fig.tutorial} {fig.library} {written_args(fig)}: {fig.metric} {fig.documented}"
            )
        return 0 if figures else 1
    return 0 if remeasure(figures, seeds, jobs, tolerance, work) else 1
