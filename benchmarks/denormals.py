"""What subnormal floats in Adam's state cost a TD3 update on CPU, and what flushing them saves.

A ReLU unit that stops firing gets exactly zero gradients. Adam's moments of its weights then
decay geometrically (``exp_avg`` by 0.9 a step, ``exp_avg_sq`` by 0.999) into the subnormal range
(|x| < 1.2e-38) and stay there: rounding keeps a few units of the last place
(``exp_avg`` sticks at 4 x 2^-149, ``exp_avg_sq`` at 500 x 2^-149). On x86 every arithmetic
instruction with a subnormal operand or result takes a microcode assist, many times slower. The
MuJoCo tutorials' long runs collect such entries as units die (with ``--keep-denormals`` they
log the share); ``torch.set_flush_denormal(True)``, their default, makes them zero.

This benchmark times one update of the TD3 tutorial's shape (``rlloss.TD3Loss``, HalfCheetah's
17 observations and 6 actions, 256-256 ReLU networks, batch 256: the losses' forward, one
backward, both Adam steps and the soft target update) with a share ``s`` of every Adam moment
tensor's entries dead: their moments set to the stuck subnormal values and their gradients
zeroed, as a dead unit's are. Each share is timed with subnormals kept and with them flushed.
The dead entries are drawn at random, so nearly every 8-float vector of a moment tensor holds
one: an upper bound. In a real run dead units are whole rows and columns; a ``perf`` profile of
a SAC run with 11% of Adam's state subnormal put Adam's kernels at 5.4% of its samples against
4.2% at 5.8% subnormal (docs/results.md, "Update speed over a run").

Method: ``benchmarks/per_sampler.py``'s ``time_methods`` (CPU, one thread, garbage collector
off while timing; per case ``--warmup`` untimed updates, then ``--repeats`` rounds of ``--inner``
updates, the cases interleaved within a round); reported: the median over rounds of the CPU time
per update (``time.process_time``).

Run from the repository root::

    python benchmarks/denormals.py                       # writes benchmarks/results/denormals.json
    python benchmarks/denormals.py --repeats 2 --inner 5 --out /tmp/denormals.json   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, ValueOperator

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # benchmark the working tree's rlloss

from benchmarks.per_sampler import time_methods  # noqa: E402
from benchmarks.records import machine_info  # noqa: E402
from rlloss import SoftUpdate, TD3Loss  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "denormals.json"
OBS_DIM, ACTION_DIM, BATCH = 17, 6, 256
SMALLEST = 2.0 ** -149  # the smallest positive subnormal float32
STUCK = {"exp_avg": 4 * SMALLEST, "exp_avg_sq": 500 * SMALLEST}  # where zero gradients leave them


class TD3Update:
    """The TD3 tutorial's update, with ``share`` of each Adam moment's entries dead."""

    def __init__(self, share: float) -> None:
        torch.manual_seed(0)
        actor = TensorDictModule(
            nn.Sequential(MLP(in_features=OBS_DIM, out_features=ACTION_DIM, num_cells=[256, 256],
                              activation_class=nn.ReLU), nn.Tanh()),
            in_keys=["observation"], out_keys=["action"])
        qvalue = ValueOperator(MLP(in_features=OBS_DIM + ACTION_DIM, out_features=1,
                                   num_cells=[256, 256], activation_class=nn.ReLU),
                               in_keys=["observation", "action"])
        spec = Bounded(low=-torch.ones(ACTION_DIM), high=torch.ones(ACTION_DIM),
                       shape=(ACTION_DIM,))
        self.loss = TD3Loss(actor_network=actor, qvalue_network=qvalue, action_spec=spec,
                            num_qvalue_nets=2)
        self.target_update = SoftUpdate(self.loss, tau=0.005)
        self.q_optimizer = torch.optim.Adam(
            self.loss.qvalue_network_params.flatten_keys().values(), lr=3e-4)
        self.actor_optimizer = torch.optim.Adam(
            self.loss.actor_network_params.flatten_keys().values(), lr=3e-4)
        self.batch = TensorDict(
            observation=torch.randn(BATCH, OBS_DIM), action=torch.rand(BATCH, ACTION_DIM) * 2 - 1,
            next=TensorDict(observation=torch.randn(BATCH, OBS_DIM), reward=torch.randn(BATCH, 1),
                            done=torch.zeros(BATCH, 1, dtype=torch.bool),
                            terminated=torch.zeros(BATCH, 1, dtype=torch.bool)),
            batch_size=[BATCH])
        self()  # creates Adam's state
        for optimizer in (self.q_optimizer, self.actor_optimizer):
            for param, state in optimizer.state.items():
                dead = torch.rand(param.shape) < share
                for name, value in STUCK.items():
                    state[name][dead] = value
                param.register_hook(lambda grad, alive=~dead: grad * alive)

    def __call__(self) -> None:
        losses = self.loss(self.batch)
        self.q_optimizer.zero_grad()
        self.actor_optimizer.zero_grad()
        (losses["loss_qvalue"] + losses["loss_actor"]).backward()
        self.q_optimizer.step()
        self.actor_optimizer.step()
        self.target_update.step()


def with_flush(update: TD3Update, flush: bool):
    """``update`` run with subnormals flushed or kept (the mode is per process: set on each call,
    since the cases interleave)."""
    def run() -> None:
        torch.set_flush_denormal(flush)
        update()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.1, 0.25, 0.5])
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = {(share, flush): with_flush(TD3Update(share), flush)
               for share in args.shares for flush in (False, True)}
    timings = time_methods(methods, args.warmup, args.repeats, args.inner)
    torch.set_flush_denormal(False)
    rows = []
    for share in args.shares:
        kept, flushed = (timings[share, flush]["cpu_median_us"] / 1e3 for flush in (False, True))
        rows.append({"dead_share": share, "kept_ms": kept, "flushed_ms": flushed,
                     "kept_over_flushed": kept / flushed})
        print(f"dead share {share:.2f}: subnormals kept {kept:.2f} ms, flushed {flushed:.2f} ms "
              f"per update ({kept / flushed:.2f}x)")
    record = {"benchmark": "denormals", "machine": machine_info(), "warmup": args.warmup,
              "repeats": args.repeats, "inner": args.inner, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
