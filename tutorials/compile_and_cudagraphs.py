"""A whole SAC update under ``torch.compile`` (and CUDA graphs on a GPU) with rlloss.

The losses of rlloss never synchronise with the host (no ``.item()``, no ``.cpu()``, no Python
branch on a tensor's value), so an entire gradient step can be compiled, and on a GPU recorded
once as a CUDA graph and replayed. This tutorial builds the SAC of ``sac_pendulum.py`` (a
``TanhNormal`` ``ProbabilisticActor``, two 256x256 Q-networks, ``rlloss.SACLoss``,
``rlloss.SoftUpdate``) and one function ``update(batch)`` (``rlloss.compile_update``): loss
forward, backward, Adam step and target update. No environment is needed: the batches are
random replay-like TensorDicts.

What it shows, in order:

1. **Same numbers.** Two copies of the agent start from identical weights; one takes eager
   updates, the other compiled ones, on the same batches, and the losses of the first updates
   are compared: the largest ``|compiled - eager| / max(1, |eager|)`` is printed (float
   rounding only: 4e-6 over the first 3 updates here, growing slowly as the weights drift apart,
   because fused kernels round differently). SAC draws noise (the reparameterised actions).
   Compiled code draws it with inductor's own generator, a different stream from eager's for the
   same seed, so for this check the update is compiled with
   ``torch._inductor.config.fallback_random=True``: the compiled graph then calls the eager
   random operators, and ``torch.manual_seed`` before each update gives both copies the same
   noise. It costs a little speed, so the timed update is compiled again without it.
2. **Speed.** Updates per second, eager vs compiled, after warm-up (the first compiled call
   compiles: tens of seconds on a small CPU with an empty inductor cache, a few seconds with a
   warm one; reported separately), and the number of graphs the update compiles to.

``update`` compiles to a few graphs, not one: dynamo stops at ``total.backward()`` (the backward
runs through the autograd engine, on the backward graph AOTAutograd compiled with the forward),
and torch's optimizers put ``torch._dynamo.graph_break()`` around their step, which is compiled
as graphs of its own; the target update is one more. That is expected: each break costs some
Python on a CPU, and on a GPU the CUDA graph below records across the breaks. A loss that read
a value on the host would add breaks (and could not be captured at all).

Figures (one CPU thread, batch 256, torch 2.13): eager about
105 updates/s, compiled the same (1.00x to 1.06x over runs); the update compiles to 4 graphs.
With 256x256 MLPs and a batch of 256 a CPU update is dominated by the matrix products, which
compilation does not speed up. The gain is in the per-update overhead (Python, TensorDict,
kernel launches), which is what dominates on a GPU, and what CUDA graphs remove entirely.

How the update is made compilable and capturable (checked against torch 2.13):

- **No host synchronisation** anywhere in ``update``. On a CPU a sync is a graph break at worst;
  inside a CUDA graph capture it is an error. rlloss's losses and ``SoftUpdate`` keep everything
  on the device (the temperature, target entropy, and schedules are tensors); printing or
  logging a loss is done on the returned, detached values, outside ``update``.
- **Gradients set to ``None`` before each step, outside the compiled code**
  (``optimizer.zero_grad()``'s default, as in PyTorch's whole-network capture example): the
  backward then writes each gradient instead of adding it to a zeroed one. Zeroing in place
  inside the compiled step costs more than it looks: functionalised, ``_foreach_zero_`` becomes
  a copy of every gradient, a zeroing and a copy back, then the backward's accumulation adds to
  each (on an H100, 38 more kernels per SAC step: 141 kernels and 303 us a replay against 103
  and 259 us with the gradients cleared).
  Recorded in a CUDA graph, the gradients are the graph's own buffers, rewritten by each replay.
- **Adam**: ``foreach=True`` (the multi-tensor implementation: the default on CUDA, a for-loop
  over parameters otherwise; inductor fuses it into a few kernels). On CUDA, ``capturable=True``
  keeps the step counter and the bias correction on the device (without it the step count is a
  CPU scalar, which cannot be captured), and the learning rate is a tensor, so a schedule can
  change it in place (``lr.fill_(...)``) without a recompilation and with effect inside the
  captured graph (a Python float would be baked into the graph). torch 2.13 refuses
  ``capturable=True`` for CPU parameters in eager mode, and a tensor ``lr`` with ``foreach=True``
  needs ``capturable=True``, so on a CPU the learning rate is a float (a tensor ``lr`` on a CPU
  needs ``foreach=False``). (Under ``torch.compile``
  dynamo compiles the step with ``capturable`` semantics on its own; setting it explicitly on
  CUDA also covers eager steps taken before the first compiled one.)
- **CUDA graphs** (``--device cuda``): ``compile_update(..., cuda_graph=True)`` runs the compiled
  update a few times on a side stream (warm-up: compilation, optimizer state allocation) and then
  records the whole step, forward, backward, Adam and target update, as one CUDA graph; each
  later call copies the batch into the graph's static input and replays it. We chose this over
  ``torch.compile(mode="reduce-overhead")`` because the update is several dynamo graphs (the
  optimizer step is compiled as its own graphs, between ``torch._dynamo.graph_break()`` calls
  torch places around it), and ``reduce-overhead`` records one CUDA graph per dynamo graph with
  Python in between, while a graph recorded around the call covers the step end to end, graph
  breaks included. On one H100 (torch 2.11, 2026-11-26) this tutorial with ``--device cuda
  --updates 2000`` printed 3,067 compiled + graph updates/s against 146.5/s eager (20.9x; before
  the gradients were cleared outside the step, a change that made SAC's given-batch graph ~5 %
  slower on that GPU: see the README's H100 table),
  eager and compiled losses within 1.1e-5 over the first 3 updates, 4 graphs, no
  recompilation while timed.

Run:
    python tutorials/compile_and_cudagraphs.py --updates 200 --out runs/compile_sac
    python tutorials/compile_and_cudagraphs.py --device cuda --updates 2000

It writes ``OUT/updates_per_second.csv`` and ``OUT/summary.json``; the last printed line is
``updates_per_second=<compiled updates per second>``.
"""

import argparse
import copy
import json
import time
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py
import torch
import torch._dynamo.utils
import torch._inductor.config
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator

import rlloss
from rlloss import SACLoss, SoftUpdate

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
parser.add_argument("--updates", type=int, default=100, help="timed updates per mode")
parser.add_argument("--check-updates", type=int, default=3,
                    help="updates compared between eager and compiled (0: skip the check)")
parser.add_argument("--out", type=Path, default=Path("runs/compile_and_cudagraphs"))
args = parser.parse_args()

# Pendulum-sized SAC (sac_pendulum.py): observation 3, action 1 in [-2, 2], 256x256 MLPs.
OBS_DIM, ACTION_DIM, ACTION_BOUND = 3, 1, 2.0
BATCH_SIZE = 256
GAMMA, TAU, LR = 0.99, 0.005, 1e-3
WARMUP_UPDATES = 5  # untimed; the first compiled one compiles
BATCH_POOL = 32  # distinct random batches, cycled through

device = torch.device(args.device)
if device.type == "cpu":
    torch.set_num_threads(1)  # small MLPs: more threads only add synchronisation


def make_loss() -> SACLoss:
    """SAC with a tanh-Gaussian actor on [-2, 2] and two Q-networks (target copies inside)."""
    spec = Bounded(low=-ACTION_BOUND, high=ACTION_BOUND, shape=(ACTION_DIM,), device=device)
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(
                MLP(in_features=OBS_DIM, out_features=2 * ACTION_DIM, num_cells=[256, 256]),
                NormalParamExtractor(),
            ),
            in_keys=["observation"],
            out_keys=["loc", "scale"],
        ),
        in_keys=["loc", "scale"],
        spec=spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
    )
    critics = [
        ValueOperator(
            MLP(in_features=OBS_DIM + ACTION_DIM, out_features=1, num_cells=[256, 256]),
            in_keys=["observation", "action"],
        )
        for _ in range(2)
    ]
    return SACLoss(actor, critics, loss_function="l2", alpha_init=1.0, gamma=GAMMA).to(device)


def make_optimizer(loss_module: SACLoss) -> torch.optim.Adam:
    """Adam over actor, critics and log(alpha), set up to be captured on CUDA (see the module
    docstring)."""
    params = list(loss_module.parameters())
    if device.type == "cuda":
        lr = torch.tensor(LR, device=device)  # a schedule may fill_() it: no recompilation
        return torch.optim.Adam(params, lr=lr, foreach=True, capturable=True)
    return torch.optim.Adam(params, lr=LR, foreach=True)


def random_batches(count: int, generator: torch.Generator) -> list[TensorDict]:
    """Replay-like batches: observations, actions in bounds, rewards, 1% terminations."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    batches = []
    for _ in range(count):
        action = (torch.rand(BATCH_SIZE, ACTION_DIM, generator=generator) * 2 - 1) * ACTION_BOUND
        terminated = torch.rand(BATCH_SIZE, 1, generator=generator) < 0.01
        batch = TensorDict(
            observation=randn(BATCH_SIZE, OBS_DIM),
            action=action,
            next=TensorDict(
                observation=randn(BATCH_SIZE, OBS_DIM),
                reward=randn(BATCH_SIZE, 1),
                terminated=terminated,
                done=terminated.clone(),
                batch_size=[BATCH_SIZE],
            ),
            batch_size=[BATCH_SIZE],
        )
        batches.append(batch.to(device))
    return batches


def agent(template: SACLoss, compile: bool) -> rlloss.Update:
    """An independent copy of ``template`` (same weights) with its optimizer, as ``update(batch)``:
    one SAC gradient step and target update (``rlloss.compile_update``: gradients cleared before
    each step; the detached losses returned)."""
    loss_module = copy.deepcopy(template)
    optimizer = make_optimizer(loss_module)
    updater = SoftUpdate(loss_module, tau=TAU)
    return rlloss.compile_update(
        loss_module,
        optimizer,
        target_updater=updater,
        compile=compile,
        cuda_graph=compile and device.type == "cuda",
        warmup=WARMUP_UPDATES,
    )


def synchronize() -> None:
    """Wait for the GPU's queued work (timings); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def max_loss_difference(template: SACLoss, batches: list[TensorDict]) -> float:
    """Largest ``|compiled - eager| / max(1, |eager|)`` of the three losses over the first
    updates of two identical agents, the compiled one drawing its noise with eager's generator
    (``fallback_random``)."""
    eager, compiled = agent(template, False), agent(template, True)
    worst = 0.0
    with torch._inductor.config.patch(fallback_random=True):
        for step, batch in enumerate(batches):
            torch.manual_seed(args.seed + step)
            expected = eager(batch.copy())
            torch.manual_seed(args.seed + step)
            got = compiled(batch.copy())
            for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
                difference = (got[key] - expected[key]).abs() / expected[key].abs().clamp_min(1)
                worst = max(worst, difference.max().item())
    torch._dynamo.reset()  # the timed update compiles afresh, with inductor's own generator
    return worst


def sample(batches: list[TensorDict], step: int) -> TensorDict:
    """The batch of update ``step``: a new TensorDict over stored tensors, as a replay buffer's
    ``sample()`` returns (the loss writes ``td_error`` into it, not into the stored batch, so
    every update sees the same keys and nothing recompiles)."""
    return batches[step % len(batches)].copy()


def updates_per_second(update, batches: list[TensorDict], count: int) -> float:
    """Run ``count`` updates cycling through ``batches`` and return updates per second."""
    synchronize()
    start = time.perf_counter()
    for step in range(count):
        update(sample(batches, step))
    synchronize()
    return count / (time.perf_counter() - start)


def compiled_update(template: SACLoss):
    """The timed compiled update: ``torch.compile``, recorded as a CUDA graph on CUDA."""
    return agent(template, True)


def warm_up(update, batches: list[TensorDict]) -> float:
    """The untimed first updates (compilation, CUDA graph capture); their seconds."""
    synchronize()
    start = time.perf_counter()
    for step in range(WARMUP_UPDATES + 1):
        update(sample(batches, step))
    synchronize()
    return time.perf_counter() - start


torch.manual_seed(args.seed)
template = make_loss()
batches = random_batches(BATCH_POOL, torch.Generator().manual_seed(args.seed))

# ---- 1. The compiled update gives the eager numbers ----
summary = {"device": str(device), "torch": torch.__version__, "batch_size": BATCH_SIZE}
if args.check_updates > 0:
    start = time.perf_counter()
    difference = max_loss_difference(template, batches[: args.check_updates])
    summary["max_loss_difference"] = difference
    print(f"eager vs compiled, first {args.check_updates} updates: max |difference| / max(1, |loss|)"
          f" = {difference:.1e} ({time.perf_counter() - start:.1f} s with compilation)")

# ---- 2. Updates per second, eager and compiled (on CUDA: compiled and graph-captured) ----
if device.type == "cuda":
    # a sync in the eager step would be reported here: it would break the capture below
    probe = agent(template, False)
    torch.cuda.set_sync_debug_mode("warn")
    probe(sample(batches, 0))
    torch.cuda.set_sync_debug_mode("default")
eager = agent(template, False)
warm_up(eager, batches)
summary["eager_updates_per_second"] = updates_per_second(eager, batches, args.updates)
compiled = compiled_update(template)
graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
summary["compile_and_warmup_s"] = warm_up(compiled, batches)
summary["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
summary["compiled_updates_per_second"] = updates_per_second(compiled, batches, args.updates)
summary["recompiles_while_timed"] = (
    torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before - summary["graphs"]
)
summary["speedup"] = summary["compiled_updates_per_second"] / summary["eager_updates_per_second"]
print(f"compilation and warm-up: {summary['compile_and_warmup_s']:.1f} s; the update is "
      f"{summary['graphs']} graphs, {summary['recompiles_while_timed']} recompiled while timed")
print(f"eager:    {summary['eager_updates_per_second']:.1f} updates/s")
print(f"compiled: {summary['compiled_updates_per_second']:.1f} updates/s "
      f"({summary['speedup']:.2f}x)")

helpers.write_csv(
    args.out / "updates_per_second.csv",
    ["mode", "updates_per_second"],
    [["eager", summary["eager_updates_per_second"]],
     ["compiled", summary["compiled_updates_per_second"]]],
)
(args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"updates_per_second={summary['compiled_updates_per_second']:.1f}")
