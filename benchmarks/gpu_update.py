"""Updates per second on a CUDA GPU: ``rlloss.compile_update`` eager, compiled, and compiled with
the step recorded as one CUDA graph (``cuda_graph=True``), for rlloss's losses and TorchRL's.

The cases and their networks are ``benchmarks/compiled_update.py``'s (DQN+PER: double DQN
8->256x256->4 with rlloss's ``PrioritizedSampler``; TD3 and SAC: actor and 2 critics 256x256,
observation 17, action 6), batch ``--batch-size`` (256), on the GPU: the replay buffer's storage
and the sampler's trees live there, Adam is ``foreach=True, capturable=True`` with a tensor
learning rate, each library's ``SoftUpdate`` (tau 0.005). Default float32 matmuls (no TF32).

Methods, per case and library:

* ``eager``: ``compile_update(..., compile=False)``;
* ``compiled``: ``compile=True`` (inductor, default mode);
* ``eager+graph`` and ``compiled+graph``: the same with ``cuda_graph=True``;
* ``compiled+graph, sample()``: ``compiled+graph`` with the batch taken by ``buffer.sample()``
  and then given to the step, as before rlloss's samplers drew in the step's own trace
  (``Update.draws_in_step`` off): the gathers as kernels of their own.

With ``--profile``, each recorded graph's kernels in one replay (count, summed device time, the
costliest) from ``torch.profiler``.

Figures per method (median over ``--repeats`` rounds of ``--inner`` updates, the GPU
synchronised at both ends of a round): ``update()`` (sample from the buffer, the step, priority
write-back: what a training loop runs), ``update(batch)`` (batches sampled beforehand) and, for
the graphs, the replay alone (the GPU's own time for the step; and for ``update()`` when the
sampling is recorded in the graph, as with rlloss's ``PrioritizedSampler`` and, for TD3 and SAC
with ``--uniform-sampler rlloss`` (the default), rlloss's ``RandomSampler``; ``--uniform-sampler
torchrl`` gives TorchRL's, which draws on the host). Before timing, each library's
``step`` runs once under ``torch.cuda.set_sync_debug_mode("warn")`` and the host-device
synchronisations it reports are counted; for DQN, the compiled graph's losses over 6 updates are
checked against eager ones on the same batches (float32, rtol 1e-4).

Run on a CUDA machine from the repository root::

    python benchmarks/gpu_update.py --out benchmarks/results/gpu_update.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


import rlloss  # noqa: E402
from benchmarks.compiled_update import (  # noqa: E402
    CASES,
    LIBRARIES,
    UNIFORM_SAMPLERS,
    make_update,
)
from benchmarks.records import machine_info  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "gpu_update.json"
METHODS = {  # name: (compile, cuda_graph, the batch drawn in the step's trace where it can be)
    "eager": (False, False, True),
    "compiled": (True, False, True),
    "eager+graph": (False, True, True),
    "compiled+graph": (True, True, True),
    "compiled+graph, sample()": (True, True, False),  # before: buffer.sample(), then the step
}


def per_second(run, a) -> dict:
    """Median (and p25-p75) updates per second of ``run()`` over rounds of ``a.inner`` calls."""
    rates = []
    for _ in range(a.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(a.inner):
            run()
        torch.cuda.synchronize()
        rates.append(a.inner / (time.perf_counter() - start))
    q = torch.tensor(rates, dtype=torch.float64).quantile(
        torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
    )
    return {
        "median": round(float(q[1]), 1),
        "p25_p75": [round(float(q[0]), 1), round(float(q[2]), 1)],
    }


def given_batches(update: rlloss.Update, batches: list):
    """``update(batch)`` over ``batches`` in turn."""
    cycle = itertools.cycle(batches)
    return lambda: update(next(cycle))


def syncs_in_step(update: rlloss.Update, batch) -> int:
    """Host-device synchronisations ``update.step(batch)`` reports in sync-debug mode, on the
    third step (the first creates the optimiser's state from host scalars)."""
    for _ in range(2):
        update.step(batch.clone())
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            update.step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def graph_matches_eager(library: str, a) -> float:
    """Largest relative difference of DQN's loss between eager and compiled+graph updates on the
    same 6 batches (3 warm-up, the recorded one, 2 replays)."""
    eager = make_update("DQN+PER", library, False, a)
    graph = make_update("DQN+PER", library, True, a, graph=True)
    batches = [eager.replay_buffer.sample() for _ in range(a.warmup + 3)]
    worst = 0.0
    for batch in batches:
        expected = eager(batch.clone())["loss"]
        got = graph(batch.clone())["loss"]
        worst = max(worst, float(((got - expected).abs() / expected.abs().clamp_min(1e-6)).max()))
    return worst


def kernels_per_replay(replay, n: int = 20) -> dict:
    """The GPU's kernels (and copies) in one replay of a recorded graph, from the profiler: how
    many, their summed device time (us), and the 12 costliest by name."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                replay()
            torch.cuda.synchronize()
        rows = [e for e in prof.key_averages() if str(e.device_type).endswith("CUDA")]
    except Exception as err:  # noqa: BLE001 - a profiler failure must not lose the timings
        return {"failed": f"{type(err).__name__}: {str(err)[:200]}"}

    def device_us(e) -> float:
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))

    rows.sort(key=device_us, reverse=True)
    return {
        "kernels": round(sum(e.count for e in rows) / n, 1),
        "device_us": round(sum(device_us(e) for e in rows) / n, 1),
        "top": [[e.key[:90], round(e.count / n, 1), round(device_us(e) / n, 1)] for e in rows[:12]],
    }


def bench_case(case: str, a, record) -> None:
    for library in a.libraries:
        for method in a.methods:
            compiled, graph, draw_in_step = METHODS[method]
            name = (
                f"{case} {library} {method}"
                + (" (compiled sampler)" if a.compile_sampler and CASES[case][1] else "")
                + (f" ({a.uniform_sampler} sampler)" if not CASES[case][1] else "")
            )
            try:
                start = time.perf_counter()
                update = make_update(case, library, compiled, a, graph=graph)
                update.draws_in_step &= draw_in_step
                batches = [update.replay_buffer.sample() for _ in range(8)]
                if method == "eager":
                    record(name, "host_syncs_in_step", syncs_in_step(update, batches[0].clone()))
                for batch in batches[: a.warmup + 2]:  # compilation, state, graph recording
                    update()
                    update(batch)
                torch.cuda.synchronize()
                record(name, "first_calls_s", round(time.perf_counter() - start, 1))
                record(name, "update()", per_second(update, a))
                record(name, "update(batch)", per_second(given_batches(update, batches), a))
                if graph:
                    record(name, "step replay only", per_second(update.graph.graph.replay, a))
                    if a.profile:
                        record(name, "step kernels", kernels_per_replay(update.graph.graph.replay))
                if update.sampling_graph is not None:
                    replay = update.sampling_graph.graph.replay
                    record(name, "update() replay only", per_second(replay, a))
                    if a.profile:
                        record(name, "update() kernels", kernels_per_replay(replay))
            except Exception as err:  # noqa: BLE001 - recorded; the other methods still run
                record(name, "failed", f"{type(err).__name__}: {str(err)[:400]}")
                traceback.print_exc()
        torch._dynamo.reset()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=["SAC", "TD3", "DQN+PER"])
    p.add_argument("--libraries", nargs="+", choices=list(LIBRARIES), default=list(LIBRARIES))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--inner", type=int, default=200)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument(
        "--compile-sampler",
        action="store_true",
        help="DQN+PER: rlloss's PrioritizedSampler(compile=True) (its tree operations fused)",
    )
    p.add_argument(
        "--uniform-sampler",
        choices=list(UNIFORM_SAMPLERS),
        default="rlloss",
        help="TD3 and SAC: rlloss's RandomSampler (draws on the GPU: update() records the "
        "sampling in the graph) or TorchRL's (draws on the host, the batch copied in)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="for the graphs: the kernels of one replay (count, device time, costliest)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_update.py needs a CUDA device (see compiled_update.py for the CPU).")
    torch._dynamo.config.cache_size_limit = 64  # one compiled step per Update instance
    torch._dynamo.config.accumulated_cache_size_limit = 512
    result = {
        "benchmark": "benchmarks/gpu_update.py",
        "command": " ".join(["python", "benchmarks/gpu_update.py", *(argv or sys.argv[1:])]),
        "machine": {**machine_info(), "gpu": torch.cuda.get_device_name()},
        "torch": torch.__version__,
        "batch_size": a.batch_size,
        "buffer_size": a.buffer_size,
        "method": __doc__.split("\n\n")[2:5],
        "rows": {},
    }

    def record(name: str, key: str, value) -> None:
        result["rows"].setdefault(name, {})[key] = value
        print(f"{name:<32} {key:<20} {value}", flush=True)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")

    for case in a.cases:
        bench_case(case, a, record)
        if case == "DQN+PER":
            for library in a.libraries:
                try:
                    worst = graph_matches_eager(library, a)
                    record(f"DQN+PER {library} check", "graph_vs_eager_max_rel", worst)
                except Exception as err:  # noqa: BLE001
                    record(f"DQN+PER {library} check", "failed", f"{type(err).__name__}: {err}")
    print("\nupdates/s: update() (sampling included) / update(batch) / step replay only")
    for name, row in result["rows"].items():
        if "update()" in row:
            cells = [row["update()"]["median"], row["update(batch)"]["median"]]
            cells += [row["step replay only"]["median"]] if "step replay only" in row else []
            print(f"{name:<32} " + " / ".join(f"{c:9.1f}" for c in cells))
        elif "failed" in row:
            print(f"{name:<32} FAILED {row['failed'][:100]}")


if __name__ == "__main__":
    main()
