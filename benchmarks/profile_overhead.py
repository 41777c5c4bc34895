"""Where the overhead goes: one step of plain torch and of rlloss, split by where the time
is spent.

For each case of ``benchmarks/overhead.py`` (same networks, batch and step) and each method,
the step runs ``--steps`` times under ``cProfile``; the self time of every function is summed
into a category by where the function lives:

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

With ``--modes compiled`` the step is ``torch.compile``d (as in ``overhead.py``): the guard
checks made on entering a compiled function count in ``dynamo frame entry (guards)`` (the self
time of dynamo's ``compile_wrapper``, which runs them), AOTAutograd's and inductor's Python
wrappers in ``compiled-graph runtime``, the generated kernels in ``other``.

Profiling adds a fixed cost to every Python call, so Python-heavy categories are inflated: read
the categories as shares, and the unprofiled ``wall`` time per step (the best of several timed
blocks, measured before profiling) as the real figure. ``torch calls`` is exact: the torch
functions, tensor methods and operators called from Python in one step, counted by a
``TorchFunctionMode`` (attribute reads such as ``.shape`` are not counted, nor the backward
pass's own operations): a method that
issues more operations than another does more work, whatever the batch size. The difference between rlloss's and
plain's category times locates rlloss's overhead; ``benchmarks/instructions.py`` measures its
total without a profiler's distortion.

    python benchmarks/profile_overhead.py --cases DQNLoss ClipPPOLoss --batch-size 64

Writes ``benchmarks/results/profile.json``, which ``benchmarks/report.py`` renders into
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

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


def profile_step(step, steps: int) -> dict:
    """Per-step self time by category (microseconds, under the profiler)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    times = dict.fromkeys(CATEGORIES, 0.0)
    for (filename, _, name), (_, _, self_time, _, _) in stats.items():
        times[category(filename, name)] += self_time / steps * 1e6
    return {"profiled_us": sum(times.values()), "categories_us": times}


def run(
    case: str, batch_size: int, level: str, mode: str, methods: list[str], steps: int
) -> list[dict]:
    from benchmarks import overhead

    setup = overhead.CASES[case](batch_size, 0)
    batch = next(iter(setup.batches.values()))
    rows = []
    for method in methods:
        if method not in setup.factories:
            continue
        method_steps = overhead.level_steps(setup.factories[method](batch), mode == "compiled")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["DQNLoss", "ClipPPOLoss"])
    parser.add_argument("--methods", nargs="+", default=["plain", "rlloss"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--levels", nargs="+", default=["forward", "backward"])
    parser.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "compiled"])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "profile.json")
    args = parser.parse_args()
    command = "python benchmarks/" + Path(sys.argv[0]).name + " " + " ".join(sys.argv[1:])
    sys.argv = sys.argv[:1]  # overhead.py parses its own arguments at import in some paths
    from benchmarks.overhead import machine_info

    torch.set_num_threads(1)
    rows = [
        row
        for case in args.cases
        for mode in args.modes
        for level in args.levels
        for row in run(case, args.batch_size, level, mode, args.methods, args.steps)
    ]
    machine = {**machine_info(), "command": command.strip()}
    method = (
        "self time per step under cProfile, summed by where each function lives (see "
        "benchmarks/profile_overhead.py); wall = best unprofiled block, per step; "
        f"{' and '.join(args.modes)}, 1 CPU thread, {args.steps} steps per block"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "method": method, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
