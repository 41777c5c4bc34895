"""Updates per second of a whole off-policy update: ``rlloss.compile_update`` on rlloss's
losses and on TorchRL's losses packaged the same way, eager and compiled on the CPU, and on a
CUDA GPU (``--device cuda``) also recorded as CUDA graphs.

One *update* is what ``compile_update`` runs: sample a batch of ``--batch-size`` from a
``TensorDictReplayBuffer`` (``LazyTensorStorage`` of ``--buffer-size`` random transitions), the
loss forward, backward of the summed losses, Adam step (``foreach=True``), priority write-back
(DQN+PER, rlloss's ``PrioritizedSampler`` for both libraries: TorchRL's C++ trees do not load
with this torch) and a soft target update (each library's ``SoftUpdate``, tau 0.005). Cases:
``DQN+PER`` (double DQN, ``QValueActor`` over an MLP 8->256x256->4, one-hot actions), ``TD3``
(MLP actor and 2 critics 256x256, obs 17, action 6, policy noise 0.2) and ``SAC`` (TanhNormal
actor and 2 critics 256x256), their networks tanh (TorchRL's ``MLP`` default) or, in the cases
``TD3-relu`` and ``SAC-relu``, ReLU. Compiled: ``torch.compile`` (inductor, default mode) of the
update's batch-in part; the first call's time (compilation included) is reported apart. On the
CPU it also times writing a ReLU's backward mask (``x <= 0``, bool) eager and compiled.

CPU: one thread, garbage collector off while timing, per method ``--warmup`` untimed updates,
then ``--repeats`` interleaved rounds of ``--inner`` updates; median updates/s over rounds (wall)
and from the median CPU time, as ``per_sampler.py`` times. GPU: ``GPU_METHODS``, the storage,
the sampler's trees and the networks on the device, capturable Adam with a tensor learning rate;
per method the median over rounds (the GPU synchronised at both ends) of ``update()`` (sampling
and write-back included), ``update(batch)`` and, for the graphs, the replay alone; the host-device
synchronisations of one eager step counted in sync-debug mode; for DQN, the compiled graph's
losses checked against eager ones on 6 batches; ``--profile``: each graph's kernels per replay.

Run from the repository root::

    python benchmarks/compiled_update.py          # writes benchmarks/results/compiled_update.json
    python benchmarks/compiled_update.py --cases DQN+PER --repeats 3 --out /tmp/cu.json  # smoke
    python benchmarks/compiled_update.py --device cuda --out benchmarks/results/gpu_update.json
"""

from __future__ import annotations

import argparse
import functools
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
    sys.path.insert(0, str(REPO_ROOT))  # benchmark the working tree's rlloss

import torchrl.objectives  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer  # noqa: E402
from torchrl.modules import MLP, Actor, QValueActor  # noqa: E402

import rlloss  # noqa: E402
from benchmarks.cases.common import (  # noqa: E402
    ACT_DIM,
    OBS_DIM,
    mlp,
    policy_net,
    q_module,
    q_net,
    random_replay,
)
from benchmarks.cases.sac import actor_of  # noqa: E402
from benchmarks.per_sampler import time_methods  # noqa: E402
from benchmarks.records import machine_info  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"
DQN_OBS, DQN_ACTIONS, GAMMA, TAU, LR = 8, 4, 0.99, 0.005, 3e-4
LIBRARIES = {"rlloss": rlloss, "torchrl": torchrl.objectives}
GPU_METHODS = {  # name: (compile, cuda_graph, the batch drawn in the step's trace where it can be)
    "eager": (False, False, True),
    "compiled": (True, False, True),
    "eager+graph": (False, True, True),
    "compiled+graph": (True, True, True),
    "compiled+graph, sample()": (True, True, False),  # before: buffer.sample(), then the step
}
DEFAULTS = {  # per device type: the settings the recorded results were taken with
    "cpu": {"buffer_size": 10_000, "repeats": 10, "inner": 10, "warmup": 5},
    "cuda": {"buffer_size": 100_000, "repeats": 5, "inner": 200, "warmup": 3},
}


def dqn_loss(library, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = MLP(in_features=DQN_OBS, out_features=DQN_ACTIONS, num_cells=[256, 256])
    actor = QValueActor(net, in_keys=["observation"], action_space="one-hot")
    return library.DQNLoss(actor, action_space="one-hot", delay_value=True, double_dqn=True)


def td3_loss(library, seed: int, activation: type[nn.Module] = nn.Tanh) -> nn.Module:
    torch.manual_seed(seed)
    actor = Actor(
        nn.Sequential(mlp(OBS_DIM, ACT_DIM, activation), nn.Tanh()), in_keys=["observation"]
    )
    critics = [q_module(q_net(False, ACT_DIM, activation=activation), False) for _ in range(2)]
    return library.TD3Loss(actor, critics, bounds=(-1.0, 1.0), num_qvalue_nets=2)


def sac_loss(library, seed: int, activation: type[nn.Module] = nn.Tanh) -> nn.Module:
    torch.manual_seed(seed)
    actor = actor_of(policy_net(False, ACT_DIM, activation), False)
    critics = [q_module(q_net(False, ACT_DIM, activation=activation), False) for _ in range(2)]
    return library.SACLoss(actor, critics, num_qvalue_nets=2, target_entropy=-float(ACT_DIM))


CASES = {  # name: (the loss's builder, prioritized replay); "-relu": ReLU networks, not tanh
    "DQN+PER": (dqn_loss, True),
    "TD3": (td3_loss, False),
    "SAC": (sac_loss, False),
    "TD3-relu": (functools.partial(td3_loss, activation=nn.ReLU), False),
    "SAC-relu": (functools.partial(sac_loss, activation=nn.ReLU), False),
}
# TD3 and SAC's replay: TorchRL's sampler draws on the host; rlloss's on the storage's device
UNIFORM_SAMPLERS = {"torchrl": RandomSampler, "rlloss": rlloss.data.RandomSampler}


def make_update(
    case: str, library_name: str, compiled: bool, a, graph: bool = False
) -> rlloss.Update:
    """One case's update for one library. On a CPU: Adam with a float learning rate. On CUDA:
    storage, sampler trees and networks on the device, capturable Adam with a tensor learning
    rate, ``cuda_graph=graph``, and the prioritized sampler compiled with ``a.compile_sampler``.
    Uniform replay: ``a.uniform_sampler``'s ``RandomSampler`` (rlloss's is capturable)."""
    device = torch.device(a.device)
    build, prioritized = CASES[case]
    library = LIBRARIES[library_name]
    loss = build(library, a.seed).to(device)
    loss.make_value_estimator(gamma=GAMMA)
    sampler = (
        rlloss.data.PrioritizedSampler(
            a.buffer_size,
            alpha=0.6,
            beta=0.4,
            device=device,
            compile=a.compile_sampler,
        )
        if prioritized
        else UNIFORM_SAMPLERS[a.uniform_sampler]()
    )
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(a.buffer_size, device=device),
        sampler=sampler,
        batch_size=a.batch_size,
        priority_key="td_error",
    )
    if prioritized:
        data = random_replay(a.buffer_size, a.seed, DQN_ACTIONS, True, obs_dim=DQN_OBS)
    else:
        data = random_replay(a.buffer_size, a.seed)
    buffer.extend(data.to(device))
    if device.type == "cuda":  # capturable: the step counter and the learning rate on the GPU
        lr = torch.tensor(LR, device=device)
        optimizer = torch.optim.Adam(loss.parameters(), lr=lr, foreach=True, capturable=True)
    else:
        optimizer = torch.optim.Adam(loss.parameters(), lr=LR, foreach=True)
    updater = library.SoftUpdate(loss, tau=TAU)
    return rlloss.compile_update(
        loss,
        optimizer,
        target_updater=updater,
        replay_buffer=buffer,
        compile=compiled,
        cuda_graph=graph,
        warmup=a.warmup,
    )


def cpu_rows(a: argparse.Namespace) -> list[dict]:
    """Per case, library and mode (eager, compiled) the update's rate on the CPU."""
    torch.set_num_threads(1)
    rows = []
    print(f"batch {a.batch_size}, CPU, 1 thread; updates/s (wall median [p25-p75], CPU-time)")
    for case in a.cases:
        updates, compile_s, failures = {}, {}, {}
        for library in a.libraries:
            for compiled in (False, True):
                name = f"{library} {'compiled' if compiled else 'eager'}"
                update = make_update(case, library, compiled, a)
                start = time.perf_counter()
                try:
                    update()  # the first compiled call compiles
                except Exception as err:  # noqa: BLE001 - recorded, the others still run
                    failures[name] = f"{type(err).__name__}: {str(err)[:300]}"
                    print(f"{case:<8} {name:<18} FAILED: {failures[name]}")
                    continue
                compile_s[name] = round(time.perf_counter() - start, 2)
                updates[name] = update
        timings = time_methods(updates, a.warmup, a.repeats, a.inner)
        for name, t in timings.items():
            per_s = 1e6 / t["median_us"]
            row = {
                "case": case,
                "method": name,
                "updates_per_s": round(per_s, 1),
                "updates_per_s_p25_p75": [round(1e6 / t["p75_us"], 1), round(1e6 / t["p25_us"], 1)],
                "updates_per_s_cpu": round(1e6 / t["cpu_median_us"], 1),
                "first_call_s": compile_s[name],
                **t,
            }
            rows.append(row)
            print(
                f"{case:<8} {name:<18} {per_s:8.1f} [{row['updates_per_s_p25_p75'][0]:.1f}-"
                f"{row['updates_per_s_p25_p75'][1]:.1f}]  cpu {row['updates_per_s_cpu']:8.1f}"
                f"  first call {compile_s[name]:.1f} s"
            )
        rows += [{"case": case, "method": n, "failed": why} for n, why in failures.items()]
    return rows


MASK_SHAPE = (2, 256, 256)  # a stacked critic pair's hidden layer at batch 256


def bool_mask_store(a: argparse.Namespace) -> dict:
    """CPU microseconds to write ``x <= 0`` for an ``x`` of ``MASK_SHAPE``, eager and compiled, as
    a bool tensor (the mask a ReLU's backward keeps: inductor saves it from the forward) and as
    float. Where the compiled code writes bool masks more slowly than eager, the compiled update
    of a ReLU network loses to eager (the ``-relu`` cases)."""
    x = torch.randn(MASK_SHAPE, generator=torch.Generator().manual_seed(a.seed))

    def as_bool(x: torch.Tensor) -> torch.Tensor:
        return x <= 0

    def as_float(x: torch.Tensor) -> torch.Tensor:
        return (x <= 0).float()

    methods = {}
    for name, fn in (("bool", as_bool), ("float", as_float)):
        compiled = torch.compile(fn, fullgraph=True)
        methods[f"{name} eager"] = functools.partial(fn, x)
        methods[f"{name} compiled"] = functools.partial(compiled, x)
    timings = time_methods(methods, a.warmup, a.repeats, 10 * a.inner)
    result = {name: round(t["cpu_median_us"], 1) for name, t in timings.items()}
    print("x <= 0 on", MASK_SHAPE, "CPU us:", result)
    return {"shape": list(MASK_SHAPE), "cpu_median_us": result}


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
            compiled, graph, draw_in_step = GPU_METHODS[method]
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


def gpu_run(a: argparse.Namespace, result: dict) -> None:
    """Every method of every case on the GPU, each figure written to ``a.out`` as it comes."""
    torch._dynamo.config.cache_size_limit = 64  # one compiled step per Update instance
    torch._dynamo.config.accumulated_cache_size_limit = 512
    result["machine"]["gpu"] = torch.cuda.get_device_name()
    result["method"] = __doc__.split("\n\n")[1:3]  # the update, and how each figure is taken
    result["rows"] = {}

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=None)
    p.add_argument("--libraries", nargs="+", choices=list(LIBRARIES), default=list(LIBRARIES))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--buffer-size", type=int, help="default 10,000 (CPU), 100,000 (GPU)")
    p.add_argument("--repeats", type=int, help="default 10 (CPU), 5 (GPU)")
    p.add_argument("--inner", type=int, help="default 10 (CPU), 200 (GPU)")
    p.add_argument("--warmup", type=int, help="default 5 (CPU), 3 (GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU methods")
    p.add_argument(
        "--uniform-sampler",
        choices=list(UNIFORM_SAMPLERS),
        help="TD3 and SAC: the replay buffer's uniform sampler (default: TorchRL's on the CPU; "
        "rlloss's on the GPU, which draws there: update() records the sampling in the graph)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=list(GPU_METHODS),
        default=list(GPU_METHODS),
        help="GPU: the methods timed",
    )
    p.add_argument(
        "--compile-sampler",
        action="store_true",
        help="DQN+PER: rlloss's PrioritizedSampler(compile=True) (its tree operations fused)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="GPU, the graphs: the kernels of one replay (count, device time, costliest)",
    )
    p.add_argument("--out", type=Path, help="default benchmarks/results/<compiled|gpu>_update.json")
    a = p.parse_args(argv)
    gpu = torch.device(a.device).type == "cuda"
    for key, value in DEFAULTS["cuda" if gpu else "cpu"].items():
        setattr(a, key, value if getattr(a, key) is None else getattr(a, key))
    a.cases = a.cases or (["SAC", "TD3", "DQN+PER"] if gpu else list(CASES))
    a.uniform_sampler = a.uniform_sampler or ("rlloss" if gpu else "torchrl")
    a.out = a.out or RESULTS / ("gpu_update.json" if gpu else "compiled_update.json")
    if gpu and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA device")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    result = {
        "benchmark": "benchmarks/compiled_update.py",
        "command": " ".join(["python", "benchmarks/compiled_update.py", *(argv or sys.argv[1:])]),
        "machine": machine_info(),
        "torch": torch.__version__,
        "batch_size": a.batch_size,
        "buffer_size": a.buffer_size,
        "method": (
            f"median over {a.repeats} interleaved rounds of {a.inner} updates each, after "
            f"{a.warmup} warm-up updates; updates per second (wall, and from the process's CPU "
            "time); first_call_s: the first update (compilation included when compiled)"
        ),
    }
    if torch.device(a.device).type == "cuda":
        gpu_run(a, result)
        return
    result["rows"] = cpu_rows(a)
    result["bool_mask_store"] = bool_mask_store(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
