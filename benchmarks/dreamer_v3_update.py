"""One DreamerV3 update, rlloss against TorchRL and a hand-written plain-torch update:
``DreamerV3Loss`` (world model on real sequences, actor and critic on trajectories imagined from
every posterior state, replay critic) forward and backward, on the same small RSSM, the same
batch and the same seed; eager, or each update's losses compiled (``--compiled``).

    PYTHONPATH=. python benchmarks/dreamer_v3_update.py [--batch 16] [--time 64] [--horizon 15]
        [--repeats 10] [--compiled] [--methods rlloss torchrl plain] [--device cuda [--graph]]
        [--out FILE.json]

Prints, per method, the median and interquartile range of the CPU time (process time) of one
update, the methods alternating call by call (a busy machine's load weighs on all alike), and
the ratios. On a GPU (``--device cuda``) the time is the wall clock between two device
synchronisations, and ``--graph`` also records each method's update as one CUDA graph (after
warm-up calls on a side stream) and times its replays: a method whose update reads a value on
the host cannot be recorded, and the error is reported in its place. The world model's RSSM uses TorchRL's standard keys (``("next", "encoded_latents")``),
so TorchRL's ``RSSMRolloutV3`` runs its tensor recurrence for both libraries. rlloss imagines on
tensors (``TensorImagination``); TorchRL through ``DreamerEnv.rollout``. The hand-written update
(:mod:`benchmarks.dreamer_v3_plain`) calls the same networks as plain modules. Compiled:
``torch.compile(fullgraph=True)`` of rlloss's ``DreamerV3Loss`` and of the plain update's
losses; TorchRL's loss with ``torch.compile`` (its rollout breaks the graph: no fullgraph).
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import time
import warnings

import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import (
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import nn
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs.model_based import DreamerEnv
from torchrl.modules import (
    MLP,
    RSSMPosteriorV3,
    RSSMPriorV3,
    RSSMRolloutV3,
    SymExpTwoHot,
    TanhNormal,
    WorldModelWrapper,
)

import rlloss
from benchmarks.dreamer_v3_plain import PlainDreamerV3

CATS, CLASSES, BELIEF, HIDDEN, OBS, ACTION, BINS = 8, 8, 64, 64, 16, 4, 255
STATE = CATS * CLASSES


def mlp(out_features: int) -> MLP:
    return MLP(in_features=STATE + BELIEF, out_features=out_features, num_cells=[HIDDEN])


def networks() -> tuple:
    """World model (encoder, RSSM rollout, decoder, two-hot reward), the imagination env sharing
    its prior and reward head, a TanhNormal actor, a two-hot critic."""
    prior_net = RSSMPriorV3(
        action_shape=(ACTION,), hidden_dim=HIDDEN, rnn_hidden_dim=BELIEF,
        num_categoricals=CATS, num_classes=CLASSES, action_dim=ACTION,
    )  # fmt: skip
    posterior_net = RSSMPosteriorV3(
        hidden_dim=HIDDEN, rnn_hidden_dim=BELIEF, num_categoricals=CATS,
        num_classes=CLASSES, obs_embed_dim=HIDDEN,
    )  # fmt: skip
    next_latent = [("next", "state"), ("next", "belief")]
    reward_net, decoder = mlp(BINS), mlp(OBS)
    world_model = TensorDictSequential(
        TensorDictModule(
            nn.Linear(OBS, HIDDEN), [("next", "observation")], [("next", "encoded_latents")]
        ),
        RSSMRolloutV3(
            TensorDictModule(
                prior_net,
                ["state", "belief", "action"],
                [("next", "prior_logits"), ("next", "state"), ("next", "belief")],
            ),
            TensorDictModule(
                posterior_net,
                [("next", "belief"), ("next", "encoded_latents")],
                [("next", "posterior_logits"), ("next", "state")],
            ),
            reset_key="is_init",
        ),
        TensorDictModule(decoder, next_latent, [("next", "reco_pixels")]),
        TensorDictModule(reward_net, next_latent, [("next", "reward_logits")]),
        TensorDictModule(SymExpTwoHot(BINS), [("next", "reward_logits")], [("next", "reward")]),
    )
    imagination = WorldModelWrapper(
        TensorDictModule(prior_net, ["state", "belief", "action"], ["_", "state", "belief"]),
        TensorDictSequential(
            TensorDictModule(reward_net, ["state", "belief"], ["reward_logits"]),
            TensorDictModule(SymExpTwoHot(BINS), ["reward_logits"], ["reward"]),
        ),
    )
    env = DreamerEnv(imagination, prior_shape=(STATE,), belief_shape=(BELIEF,))
    env.observation_spec = Composite(state=Unbounded(STATE), belief=Unbounded(BELIEF))
    env.state_spec = env.observation_spec.clone()
    env.action_spec, env.reward_spec = Bounded(-1, 1, (ACTION,)), Unbounded((1,))
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(mlp(2 * ACTION), ["state", "belief"], ["params"]),
        TensorDictModule(NormalParamExtractor(), ["params"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], distribution_class=TanhNormal),
    )
    value = TensorDictSequential(
        TensorDictModule(mlp(BINS), ["state", "belief"], ["state_value_logits"]),
        TensorDictModule(SymExpTwoHot(BINS), ["state_value_logits"], ["state_value"]),
    )
    return world_model, env, actor, value


def composed(library, nets, horizon: int):
    world_model, env, actor, value = copy.deepcopy(nets)
    model_loss = library.DreamerV3ModelLoss(world_model, num_reward_bins=BINS, detach_output=False)
    model_loss.set_keys(pixels="observation")
    actor_loss = library.DreamerV3ActorLoss(actor, value, env, imagination_horizon=horizon)
    actor_loss.make_value_estimator(None, gamma=0.997, lmbda=0.95)
    value_loss = library.DreamerV3ValueLoss(
        value, value_loss="two_hot", num_value_bins=BINS, actor_loss=actor_loss,
        slow_critic_regularization=1.0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        library.SoftUpdate(value_loss, tau=0.02)
    return library.DreamerV3Loss(model_loss, actor_loss, value_loss)


def sequences(batch: int, time_steps: int) -> TensorDict:
    shape = (batch, time_steps)
    return TensorDict(
        {
            "state": torch.zeros(*shape, STATE),
            "belief": torch.zeros(*shape, BELIEF),
            "action": torch.rand(*shape, ACTION) * 2 - 1,
            "is_init": torch.zeros(*shape, 1, dtype=torch.bool),
            "next": {
                "observation": torch.randn(*shape, OBS),
                "reward": torch.randn(*shape, 1),
                "done": torch.zeros(*shape, 1, dtype=torch.bool),
                "terminated": torch.zeros(*shape, 1, dtype=torch.bool),
            },
        },
        shape,
    )


def plain_inputs(sample: TensorDict) -> tuple:
    """The hand-written update's tensors: observation, action, is_init, reward, done."""
    return (
        sample["next", "observation"], sample["action"], sample["is_init"],
        sample["next", "reward"], sample["next", "done"],
    )  # fmt: skip


def to_device(nets: tuple, sample: TensorDict, device: str) -> tuple:
    """The networks (the imagination env with its specs) and the batch on ``device``."""
    return tuple(net.to(device) for net in nets), sample.to(device)


def make_updates(names, nets, horizon: int, sample, compiled: bool) -> dict:
    """One closure per method running a full update (forward and the gradients)."""
    updates = {}
    for name in names:
        if name == "plain":
            module = PlainDreamerV3(nets, horizon, BINS).to(sample.device)
            call = torch.compile(module, fullgraph=True) if compiled else module
            inputs = plain_inputs(sample)
            losses = lambda call=call, inputs=inputs: {"loss": call(*inputs)}  # noqa: E731
        else:
            module = composed(LIBRARIES[name], nets, horizon).to(sample.device)
            call = torch.compile(module, fullgraph=name == "rlloss") if compiled else module
            losses = lambda call=call: call(sample)  # noqa: E731
        parameters = [p for p in module.parameters() if p.requires_grad]
        updates[name] = lambda losses=losses, parameters=parameters: gradients(losses, parameters)
    return updates


def gradients(losses, parameters) -> None:
    out = losses()
    total = sum(value for key, value in out.items() if key.startswith("loss"))
    torch.autograd.grad(total, parameters, allow_unused=True)


def cuda_graph(update):
    """``update`` recorded as one CUDA graph, warmed up on a side stream first; its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            update()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        update()
    return graph.replay


def recorded(updates: dict) -> tuple[dict, dict]:
    """Each update as a CUDA graph's replay, and the methods that could not be recorded (their
    error's first line)."""
    replays, failures = {}, {}
    for name, update in updates.items():
        try:
            replays[f"{name}+graph"] = cuda_graph(update)
        except Exception as error:  # noqa: BLE001 - a method that cannot be recorded is a result
            failures[f"{name}+graph"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            torch.cuda.synchronize()
    return replays, failures


def clock(device: str):
    """CPU time on the CPU; on a GPU the wall clock after the device's queue drains."""
    if device == "cpu":
        return time.process_time

    def synchronized() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()

    return synchronized


def interleaved_seconds(
    updates: dict, repeats: int, warmup: int = 2, device: str = "cpu"
) -> dict[str, list[float]]:
    """Each method's time per update (:func:`clock`), the methods alternating call by call; the
    first ``warmup`` calls of each (lazy state, compilation) untimed."""
    now, times = clock(device), {name: [] for name in updates}
    for step in range(repeats + warmup):
        for name, update in updates.items():
            torch.manual_seed(step)
            start = now()
            update()
            if step >= warmup:
                times[name].append(now() - start)
    return times


LIBRARIES = {"rlloss": rlloss, "torchrl": torchrl_objectives}


def report(results: dict, args) -> dict:
    mode = "compiled" if args.compiled else "eager"
    where = "CPU time" if args.device == "cpu" else f"wall time on {torch.cuda.get_device_name()}"
    print(f"DreamerV3 update ({mode}), batch {args.batch} x {args.time}, horizon {args.horizon}, "
          f"{torch.get_num_threads()} threads, {args.repeats} timed calls, {where}")  # fmt: skip
    medians, ratios = {}, {}
    for name, times in results.items():
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else times * 3
        medians[name] = statistics.median(times)
        print(f"  {name:8s} median {medians[name] * 1e3:9.1f} ms  "
              f"IQR {quartiles[0] * 1e3:.1f}-{quartiles[2] * 1e3:.1f} ms")  # fmt: skip
    for suffix in ("", "+graph"):
        pairs = (("torchrl", "rlloss"), ("rlloss", "plain"), ("torchrl", "plain"))
        for num, den in ((a + suffix, b + suffix) for a, b in pairs):
            if num in medians and den in medians:
                paired = [a / b for a, b in zip(results[num], results[den], strict=True)]
                q = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
                ratios[f"{num} / {den}"] = [statistics.median(paired), q[0], q[2]]
                print(
                    f"  {num} / {den}: {medians[num] / medians[den]:.2f}x "
                    f"(paired median {statistics.median(paired):.2f}x, IQR {q[0]:.2f}-{q[2]:.2f})"
                )
    return {"median_ms": {name: m * 1e3 for name, m in medians.items()}, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--methods", nargs="+", default=["rlloss", "torchrl", "plain"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--graph", action="store_true", help="also as CUDA graphs (GPU only)")
    parser.add_argument("--out", help="append the medians and ratios to this JSON file")
    args = parser.parse_args()
    torch.manual_seed(0)
    nets, sample = to_device(networks(), sequences(args.batch, args.time), args.device)
    updates = make_updates(args.methods, nets, args.horizon, sample, args.compiled)
    failures = {}
    if args.graph:
        interleaved_seconds(updates, 0, device=args.device)  # compiled before recording
        replays, failures = recorded(updates)
        updates.update(replays)
    summary = report(interleaved_seconds(updates, args.repeats, device=args.device), args)
    for name, error in failures.items():
        print(f"  {name}: not recorded ({error})")
    if args.out:
        record(args.out, {**vars(args), **summary, "not_recorded": failures})


def record(path: str, entry: dict) -> None:
    """Append ``entry`` to the JSON list at ``path`` (created if missing)."""
    file = pathlib.Path(path)
    entries = json.loads(file.read_text()) if file.exists() else []
    file.write_text(json.dumps([*entries, entry], indent=1) + "\n")


if __name__ == "__main__":
    main()
