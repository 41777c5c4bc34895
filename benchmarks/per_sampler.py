"""Prioritized replay at scale: ``sample(batch)`` and ``update_priority(batch)`` of
``rlloss.data.PrioritizedSampler`` against TorchRL's C++ segment trees, at N = 10^4, 10^5, 10^6.

Every sampler holds N items with random priorities. One timed *sample* is the sampler's
``sample(storage, batch)`` (indices and importance weights); one timed *update* is
``update_priority(index, priority)`` of ``batch`` random indices. Also timed, for scale: a naive
O(N) sampler (``torch.multinomial`` over the N masses, weights from the min mass), and with
``--compiled`` rlloss's sampler built with ``compile=True`` (its tree operations under
``torch.compile(fullgraph=True)``). TorchRL's ``PrioritizedSampler`` is timed where its C++
extension loads (it needs the torch build TorchRL was compiled against); otherwise the output says
so and records why. The time of one small eager op (an add of two 256-element tensors) is
recorded beside the figures: on a shared machine it shows how much slower than usual it ran.

Method: CPU, one thread, garbage collector off while timing; per method ``--warmup`` untimed
calls, then ``--repeats`` rounds of ``--inner`` calls each, methods interleaved within a round;
reported: the median (and p25-p75) over rounds of the wall time per call, and the median CPU
time per call (``time.process_time``, which leaves out the time other jobs held the core: the
steadier figure on a shared machine).

Run from the repository root (the working tree's ``rlloss`` is imported)::

    python benchmarks/per_sampler.py                 # writes benchmarks/results/per_sampler.json
    python benchmarks/per_sampler.py --sizes 10000 --repeats 3 --out /tmp/per.json   # a smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # benchmark the working tree's rlloss

from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler  # noqa: E402

from benchmarks.records import machine_info  # noqa: E402
from rlloss.data import PrioritizedSampler  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "per_sampler.json"
# A load probe: the time of one small eager op shows how busy the machine was.
CALIBRATION = (torch.rand(256), torch.rand(256))


class FullStorage:
    """What a sampler reads from a storage: its length, shape and device (N items, no data)."""

    def __init__(self, size: int) -> None:
        self.size, self.ndim, self.shape, self.device = size, 1, torch.Size([size]), "cpu"

    def __len__(self) -> int:
        return self.size


def naive_sampler(priority: torch.Tensor, alpha: float, beta: float, batch: int):
    """O(N) proportional sampling: multinomial over all masses; O(1) updates."""
    mass = (priority + 1e-8) ** alpha

    def sample():
        index = torch.multinomial(mass, batch, replacement=True)
        return index, (mass[index] / mass.min()) ** -beta

    def update(index, new_priority):
        mass[index] = (new_priority + 1e-8) ** alpha

    return sample, update


def torchrl_trees_or_reason(size: int) -> TorchRLPrioritizedSampler | str:
    try:
        return TorchRLPrioritizedSampler(size, alpha=0.6, beta=0.4)
    except (RuntimeError, ImportError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


def methods_for(size: int, batch: int, compiled: bool) -> tuple[dict[str, Callable], str | None]:
    """The timed callables at one N (``"<sampler> sample"``, ``"<sampler> update"``), and why
    TorchRL's trees are missing (None when they loaded)."""
    priority = torch.rand(size) * 10
    index = torch.randint(0, size, (batch,))
    new_priority = torch.rand(batch) * 10
    storage = FullStorage(size)
    ours = PrioritizedSampler(size, alpha=0.6, beta=0.4)
    ours.update_priority(torch.arange(size), priority)
    methods = {
        "rlloss sample": lambda: ours.sample(storage, batch),
        "rlloss update": lambda: ours.update_priority(index, new_priority),
    }
    if compiled:
        fused = PrioritizedSampler(size, alpha=0.6, beta=0.4, compile=True)
        fused.update_priority(torch.arange(size), priority)
        methods["rlloss compiled sample"] = lambda: fused.sample(storage, batch)
        methods["rlloss compiled update"] = lambda: fused.update_priority(index, new_priority)
    theirs = torchrl_trees_or_reason(size)
    if not isinstance(theirs, str):
        theirs.update_priority(torch.arange(size), priority)
        methods["torchrl sample"] = lambda: theirs.sample(storage, batch)
        methods["torchrl update"] = lambda: theirs.update_priority(index, new_priority)
    naive_sample, naive_update = naive_sampler(priority, 0.6, 0.4, batch)
    methods["naive O(N) sample"] = naive_sample
    methods["naive O(N) update"] = lambda: naive_update(index, new_priority)
    return methods, theirs if isinstance(theirs, str) else None


def time_methods(methods: dict[str, Callable], warmup: int, repeats: int, inner: int) -> dict:
    """Per method, the median and p25-p75 over rounds of the wall time per call, and the median
    CPU time per call (``time.process_time``: what the process itself ran, without the time the
    machine's other jobs took the core away), in microseconds; rounds interleave the methods."""
    for run in methods.values():
        for _ in range(warmup):
            run()
    wall = {name: [] for name in methods}
    cpu = {name: [] for name in methods}
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, run in methods.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(inner):
                    run()
                cpu[name].append((time.process_time() - start_cpu) / inner * 1e6)
                wall[name].append((time.perf_counter() - start) / inner * 1e6)
    finally:
        gc.enable()
    result = {}
    quantiles = torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
    for name in methods:
        q = torch.tensor(wall[name], dtype=torch.float64).quantile(quantiles)
        result[name] = {
            "median_us": round(float(q[1]), 1),
            "p25_us": round(float(q[0]), 1),
            "p75_us": round(float(q[2]), 1),
            "cpu_median_us": round(float(torch.tensor(cpu[name]).median()), 1),
        }
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--inner", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compiled", action="store_true", help="also time torch.compile'd rlloss")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows, torchrl_missing = [], None
    calibration = time_methods({"add": lambda: CALIBRATION[0] + CALIBRATION[1]}, 5, 15, 200)
    add_us = calibration["add"]["median_us"]
    print(
        f"calibration: one add of two 256-element tensors takes {add_us:.1f} us here (about "
        f"1.5 us on an idle modern CPU core: divide the figures below by the ratio)"
    )
    print(
        f"batch {a.batch_size}, CPU, 1 thread; microseconds per call: wall median [p25-p75], "
        f"CPU time median"
    )
    for size in a.sizes:
        methods, missing = methods_for(size, a.batch_size, a.compiled)
        torchrl_missing = torchrl_missing or missing
        timings = time_methods(methods, a.warmup, a.repeats, a.inner)
        for name, t in timings.items():
            print(
                f"N={size:>9,}  {name:<24} {t['median_us']:>9.1f} "
                f"[{t['p25_us']:.1f}-{t['p75_us']:.1f}]  cpu {t['cpu_median_us']:.1f}"
            )
            rows.append({"N": size, "method": name, **t})
    if torchrl_missing:
        print(
            f"TorchRL's C++ segment trees are not timed: they do not load here ({torchrl_missing})."
        )
    result = {
        "benchmark": "benchmarks/per_sampler.py",
        "command": " ".join(["python", "benchmarks/per_sampler.py", *(argv or sys.argv[1:])]),
        "machine": {
            **machine_info(),
            "load_average_1_5_15_min_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "calibration_add_256_us": add_us,
        "batch_size": a.batch_size,
        "method": f"median over {a.repeats} interleaved rounds of {a.inner} calls each, "
        f"after {a.warmup} warm-up calls; microseconds per call (wall time, and the process's "
        f"CPU time: cpu_median_us)",
        "torchrl_trees": "timed"
        if torchrl_missing is None
        else f"not available: {torchrl_missing}",
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
