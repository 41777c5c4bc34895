"""Where one step's time goes, for ``python benchmarks/overhead.py --profile``: the step of
each method runs ``steps`` times under ``cProfile`` and the self time of every function is
summed into a category by where the function lives (``CATEGORIES``: torch's C++ ops, the
autograd backward, dynamo's guards and the compiled-graph runtime when compiled, torch's Python,
tensordict, torchrl, rlloss, this harness, other). Profiling inflates Python-heavy categories:
read them as shares, and the unprofiled ``wall_us`` (the best of 7 timed blocks) as the real
figure. ``torch_calls`` counts exactly the torch functions, tensor methods and operators one
eager step calls from Python (a ``TorchFunctionMode``; attribute reads not counted).
"""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path

from torch.overrides import TorchFunctionMode

from benchmarks.cases import CASES
from benchmarks.harness import level_steps

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
