"""Updates per second of a whole off-policy update, eager and compiled: ``rlloss.compile_update``
on rlloss's losses and on TorchRL's losses packaged the same way.

One *update* is what ``compile_update`` runs: sample a batch of ``--batch-size`` from a
``TensorDictReplayBuffer`` (``LazyTensorStorage`` of ``--buffer-size`` random transitions), the
loss forward, backward of the summed losses, Adam step (``foreach=True``), priority write-back
(DQN+PER, rlloss's ``PrioritizedSampler`` for both libraries: TorchRL's C++ trees do not load
with this torch) and a soft target update (each library's ``SoftUpdate``, tau 0.005). Cases:

* ``DQN+PER``: double DQN, ``QValueActor`` over an MLP 8->256x256->4, one-hot actions;
* ``TD3``: MLP actor and 2 critics 256x256 (obs 17, action 6), policy noise 0.2;
* ``SAC``: TanhNormal actor and 2 critics 256x256 (obs 17, action 6).

Compiled: ``torch.compile`` (inductor, default mode) of the update's batch-in part; sampling and
priority write-back stay eager (see ``rlloss/update.py``). The first compiled call compiles; its
time is reported apart (``compile_s``). Method: CPU, one thread, garbage collector off while
timing, per method ``--warmup`` untimed updates, then ``--repeats`` interleaved rounds of
``--inner`` updates; reported: median updates/s over rounds (wall) and from the median CPU time
(``time.process_time``: steadier on a shared machine), and paired per-round ratios.

Run from the repository root::

    python benchmarks/compiled_update.py          # writes benchmarks/results/compiled_update.json
    python benchmarks/compiled_update.py --cases DQN+PER --repeats 3 --out /tmp/cu.json  # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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
    replay_batch,
)
from benchmarks.cases.sac import actor_of  # noqa: E402
from benchmarks.per_sampler import time_methods  # noqa: E402
from benchmarks.records import machine_info  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "compiled_update.json"
DQN_OBS, DQN_ACTIONS, GAMMA, TAU, LR = 8, 4, 0.99, 0.005, 3e-4
LIBRARIES = {"rlloss": rlloss, "torchrl": torchrl.objectives}


def dqn_loss(library, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = MLP(in_features=DQN_OBS, out_features=DQN_ACTIONS, num_cells=[256, 256])
    actor = QValueActor(net, in_keys=["observation"], action_space="one-hot")
    return library.DQNLoss(actor, action_space="one-hot", delay_value=True, double_dqn=True)


def td3_loss(library, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    actor = Actor(nn.Sequential(mlp(OBS_DIM, ACT_DIM), nn.Tanh()), in_keys=["observation"])
    critics = [q_module(q_net(False, ACT_DIM), False) for _ in range(2)]
    return library.TD3Loss(actor, critics, bounds=(-1.0, 1.0), num_qvalue_nets=2)


def sac_loss(library, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    actor = actor_of(policy_net(False, ACT_DIM), False)
    critics = [q_module(q_net(False, ACT_DIM), False) for _ in range(2)]
    return library.SACLoss(actor, critics, num_qvalue_nets=2, target_entropy=-float(ACT_DIM))


def transitions(size: int, discrete: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    if discrete:
        index = torch.randint(0, DQN_ACTIONS, (size,), generator=g)
        action = nn.functional.one_hot(index, DQN_ACTIONS)
        return replay_batch(torch.randn(size, DQN_OBS, generator=g), action, g)
    action = torch.rand(size, ACT_DIM, generator=g) * 2 - 1
    return replay_batch(torch.randn(size, OBS_DIM, generator=g), action, g)


CASES = {"DQN+PER": (dqn_loss, True), "TD3": (td3_loss, False), "SAC": (sac_loss, False)}
# TD3 and SAC's replay: TorchRL's sampler draws on the host; rlloss's on the storage's device
UNIFORM_SAMPLERS = {"torchrl": RandomSampler, "rlloss": rlloss.data.RandomSampler}


def make_update(
    case: str, library_name: str, compiled: bool, a, graph: bool = False
) -> rlloss.Update:
    """One case's update for one library. On a CPU (``a.device`` absent or ``"cpu"``): Adam with a
    float learning rate. On CUDA (``benchmarks/gpu_update.py``): storage, sampler trees and
    networks on the device, capturable Adam with a tensor learning rate, ``cuda_graph=graph``,
    and the prioritized sampler compiled with ``a.compile_sampler``. Uniform replay: TorchRL's
    ``RandomSampler``, or rlloss's (capturable) with ``a.uniform_sampler == "rlloss"``."""
    device = torch.device(getattr(a, "device", "cpu"))
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
            compile=getattr(a, "compile_sampler", False),
        )
        if prioritized
        else UNIFORM_SAMPLERS[getattr(a, "uniform_sampler", "torchrl")]()
    )
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(a.buffer_size, device=device),
        sampler=sampler,
        batch_size=a.batch_size,
        priority_key="td_error",
    )
    buffer.extend(transitions(a.buffer_size, prioritized, a.seed).to(device))
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
        warmup=getattr(a, "warmup", 3),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--libraries", nargs="+", choices=list(LIBRARIES), default=list(LIBRARIES))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--buffer-size", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--inner", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--uniform-sampler",
        choices=list(UNIFORM_SAMPLERS),
        default="torchrl",
        help="TD3 and SAC: the replay buffer's uniform sampler",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
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
    result = {
        "benchmark": "benchmarks/compiled_update.py",
        "command": " ".join(["python", "benchmarks/compiled_update.py", *(argv or sys.argv[1:])]),
        "machine": machine_info(),
        "batch_size": a.batch_size,
        "buffer_size": a.buffer_size,
        "method": (
            f"median over {a.repeats} interleaved rounds of {a.inner} updates each, after "
            f"{a.warmup} warm-up updates; updates per second (wall, and from the process's CPU "
            "time); first_call_s: the first update (compilation included when compiled)"
        ),
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
