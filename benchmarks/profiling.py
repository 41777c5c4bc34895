"""Where the overhead goes: one step of plain torch and of rlloss split by where the time is
spent (cProfile), and the instructions it executes (callgrind).

Profiles
--------
For each case of :mod:`benchmarks.cases` (same networks, batch and step as the overhead
benchmark) and each method, the step runs ``steps`` times under ``cProfile``; the self time of
every function is summed into a category by where the function lives:

* ``torch ops``: calls into torch's C++ (tensor methods, ``torch.*`` and ``torch._C`` functions):
  the arithmetic itself and its dispatch. Arithmetic written with operators (``a + b``) is not a
  separate function to the profiler: it counts in the self time of the function that wrote it
  (``harness`` for the plain implementation, ``rlloss`` for the functional core);
* ``autograd backward``: the C++ backward pass (``run_backward``);
* ``torch (Python)``: torch's own Python around the ops (``nn.Module.__call__``, optimizers,
  ``torch.nn.functional`` wrappers...);
* ``tensordict``, ``torchrl``: those packages' Python (key lookups, TensorDict construction);
* ``rlloss``: rlloss's own Python (its modules and functional core);
* ``harness``: this benchmark's code (the plain implementation's Python lives here).

Compiled (``mode="compiled"``), the step is ``torch.compile``d (as in the overhead benchmark):
the guard checks made on entering a compiled function count in ``dynamo frame entry (guards)``
(the self time of dynamo's ``compile_wrapper``, which runs them), AOTAutograd's and inductor's
Python wrappers in ``compiled-graph runtime``, the generated kernels in ``other``.

Profiling adds a fixed cost to every Python call, so Python-heavy categories are inflated: read
the categories as shares, and the unprofiled ``wall`` time per step (the best of several timed
blocks, measured before profiling) as the real figure. ``torch calls`` is exact: the torch
functions, tensor methods and operators called from Python in one step, counted by a
``TorchFunctionMode`` (attribute reads such as ``.shape`` are not counted, nor the backward
pass's own operations): a method that issues more operations than another does more work,
whatever the batch size. The difference between rlloss's and plain's category times locates
rlloss's overhead; the instruction count measures its total without a profiler's distortion.

Instructions
------------
Wall-clock timings on a busy machine drift with whatever else runs; callgrind counts the
instructions a process executes, which do not. The step of one case and method runs
``steps_low`` and ``steps_high`` times in two processes under callgrind; the difference divided
by the extra steps cancels interpreter start-up, imports and set-up. Instructions are not time
(memory stalls and vectorisation differ), but in the overhead-bound small-batch regime, where
Python and dispatch dominate, they track it closely. Each process runs ~50x slower under
callgrind (a couple of minutes per process, mostly the import of torch); ``valgrind`` must be on
the PATH.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torch.overrides import TorchFunctionMode

from benchmarks.cases import CASES
from benchmarks.cases.ensembles import with_critics
from benchmarks.harness import REPO_ROOT, CaseSetup, level_steps

HERE = Path(__file__).resolve().parent
CATEGORIES = (
    "torch ops",
    "autograd backward",
    "dynamo frame entry (guards)",
    "compiled-graph runtime",
    "torch (Python)",
    "tensordict",
    "torchrl",
    "rlloss",
    "harness",
    "other",
)


# --------------------------------------------------------------------------- #
# Profiles
# --------------------------------------------------------------------------- #
def category(filename: str, name: str) -> str:
    """The category of a profiled function from its pstats key (file, function name)."""
    if filename == "~":  # a builtin: its name says whose it is
        if "run_backward" in name:
            return "autograd backward"
        if "torch" in name:
            return "torch ops"
        return "other"
    for package in ("tensordict", "torchrl", "rlloss"):
        if f"/{package}/" in filename:
            return package
    if "/torch/_dynamo/" in filename:
        return "dynamo frame entry (guards)"
    if "/torch/_functorch/" in filename or "/torch/_inductor/" in filename:
        return "compiled-graph runtime"
    if "/torch/" in filename:
        return "torch (Python)"
    if f"{HERE.name}/" in filename or filename.startswith("<"):
        return "harness"
    return "other"


def best_step_time_us(step, steps: int, blocks: int = 7) -> float:
    """The fastest of ``blocks`` timed blocks of ``steps`` steps, per step."""
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps * 1e6)
    return min(times)


class _CountTorchCalls(TorchFunctionMode):
    """Counts the torch functions, tensor methods and operators called from Python."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += getattr(func, "__name__", None) != "__get__"  # not attribute reads
        return func(*args, **(kwargs or {}))


def torch_calls_per_step(step) -> float:
    """The torch calls one step makes from Python (the mean over a few steps)."""
    with _CountTorchCalls() as counter:
        for _ in range(5):
            step()
    return counter.calls / 5


TOP_FUNCTIONS = 15  # the Python functions of the packages listed per row, by self time


def profile_step(step, steps: int) -> dict:
    """Per-step self time by category (microseconds, under the profiler), and the
    ``TOP_FUNCTIONS`` functions of tensordict, torchrl, rlloss and torch's Python with the most
    self time (``[function, category, us per step, calls per step]``)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    times = dict.fromkeys(CATEGORIES, 0.0)
    functions = []
    for (filename, line, name), (_, calls, self_time, _, _) in stats.items():
        where = category(filename, name)
        times[where] += self_time / steps * 1e6
        if where in ("tensordict", "torchrl", "rlloss", "torch (Python)"):
            label = f"{filename.rsplit('site-packages/', 1)[-1]}:{line}({name})"
            functions.append([label, where, self_time / steps * 1e6, calls / steps])
    top = sorted(functions, key=lambda f: -f[2])[:TOP_FUNCTIONS]
    return {"profiled_us": sum(times.values()), "categories_us": times, "top_functions": top}


def profile_rows(
    case: str, batch_size: int, level: str, mode: str, methods: list[str], steps: int
) -> list[dict]:
    """One row per method of ``case``: the unprofiled wall time, the torch calls and the
    profiled time by category of one step at ``level`` in ``mode``."""
    setup = CASES[case](batch_size, 0)
    batch = next(iter(setup.batches.values()))
    rows = []
    for method in methods:
        if method not in setup.factories:
            continue
        method_steps = level_steps(setup.factories[method](batch), mode == "compiled")
        step = method_steps[level]
        for _ in range(max(20, steps // 10)):  # warm-up: caches, allocator, lazy state
            step()
        wall = best_step_time_us(step, steps)
        row = {"case": case, "batch_size": batch_size, "level": level, "mode": mode}
        row["method"] = method
        # Compiled: no count (a TorchFunctionMode around a compiled function recompiles it).
        calls = torch_calls_per_step(step) if mode == "eager" else None
        rows.append({**row, "wall_us": wall, "torch_calls": calls, **profile_step(step, steps)})
        print(
            f"{case} B={batch_size} {mode} {level} {method}: {wall:.1f} us/step, "
            f"{'-' if calls is None else f'{calls:.0f}'} torch calls/step",
            flush=True,
        )
    return rows


# --------------------------------------------------------------------------- #
# Instructions
# --------------------------------------------------------------------------- #
def case_setup(case: str, batch_size: int, critics: int | None = None) -> CaseSetup:
    """``CASES[case]`` at ``batch_size`` (seed 0); ``critics``: an ensemble case
    (``REDQLoss``, ``TQCLoss``, with or without the custom-critic suffix) with that many
    critics instead of its default."""
    build = CASES[case] if critics is None else with_critics(case, critics)
    return build(batch_size, 0)


RUNNER = """
import sys, torch
sys.path.insert(0, {root!r})
from benchmarks.harness import level_steps
from benchmarks.profiling import case_setup
torch.set_num_threads(1)
setup = case_setup({case!r}, {batch_size}, {critics!r})
method = setup.factories[{method!r}](next(iter(setup.batches.values())))
step = level_steps(method, compiled=False)[{level!r}]
for _ in range({steps}):
    step()
"""


def instructions(
    case: str, method: str, batch_size: int, steps: int, level: str, critics: int | None = None
) -> int:
    """Total instructions of a process that runs ``steps`` steps (start-up included)."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "run.py", Path(tmp) / "callgrind.out"
        script.write_text(
            RUNNER.format(
                root=str(REPO_ROOT),
                case=case,
                method=method,
                batch_size=batch_size,
                steps=steps,
                level=level,
                critics=critics,
            )
        )
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                str(script),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        return int(re.search(r"^summary: (\d+)", out.read_text(), re.M).group(1))


def instructions_per_step(
    case: str,
    methods: list[str],
    batch_size: int,
    level: str,
    steps_low: int,
    steps_high: int,
    critics: int | None = None,
) -> dict[str, dict[str, float]]:
    """Per method of ``case`` the instructions of one step, and each one's ratio to plain's (to the
    first method's without plain); ``critics``: see :func:`case_setup`."""
    available = case_setup(case, batch_size, critics).factories
    per_step = {}
    for method in [m for m in methods if m in available]:
        low = instructions(case, method, batch_size, steps_low, level, critics)
        high = instructions(case, method, batch_size, steps_high, level, critics)
        per_step[method] = (high - low) / (steps_high - steps_low)
        print(
            f"{case} B={batch_size} {method}: {per_step[method] / 1e6:.3f} M instr/step", flush=True
        )
    base = "plain" if "plain" in per_step else next(iter(per_step))  # e.g. plain-min
    ratios = {f"{m}/{base}": per_step[m] / per_step[base] for m in per_step if m != base}
    print(
        f"{case} B={batch_size} ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()),
        flush=True,
    )
    return {"instructions_per_step": per_step, "ratios": ratios}


def dumped_instructions(
    entries: list[tuple[str, int]], methods: list[str], steps: int, warmup: int, out: Path
) -> subprocess.Popen:
    """Start one process under callgrind (``callgrind/run.sh``) that runs ``steps`` steps of each
    method of each ``(case, batch size)`` of ``entries`` and dumps the counters around them (no
    start-up, import or set-up counted); :func:`read_dumped_instructions` reads its counts."""
    env = {
        **os.environ,
        "ROOT": str(REPO_ROOT),
        "CASES": " ".join(f"{case}:{batch_size}" for case, batch_size in entries),
        "METHODS": " ".join(methods),
        "N": str(steps),
        "WARMUP": str(warmup),
        "OMP_NUM_THREADS": "1",
    }
    command = ["bash", str(HERE / "callgrind" / "run.sh"), str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def read_dumped_instructions(out: Path) -> dict[tuple[str, int], dict[str, float]]:
    """The instructions per step of a :func:`dumped_instructions` run, by (case, batch size) and
    method."""
    counts: dict[tuple[str, int], dict[str, float]] = {}
    for line in (out / "counts.tsv").read_text().split("\n"):
        if line.strip():
            case, batch_size, method, per_step = line.split("\t")
            counts.setdefault((case, int(batch_size)), {})[method] = float(per_step)
    return counts
