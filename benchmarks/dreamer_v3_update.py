"""One DreamerV3 update, rlloss against TorchRL: ``DreamerV3Loss`` (world model on real
sequences, actor and critic on trajectories imagined from every posterior state, replay critic)
forward and backward, eager, on the same small RSSM, the same batch and the same seed.

    PYTHONPATH=. python benchmarks/dreamer_v3_update.py [--batch 16] [--time 64] [--horizon 15]

Prints the median and interquartile range of the update time for each library and their ratio.
Both libraries imagine through TorchRL's ``DreamerEnv.rollout`` (the actor loss's rollout is
TorchRL's code either way); the difference is the losses' own work.
"""

from __future__ import annotations

import argparse
import copy
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
        TensorDictModule(nn.Linear(OBS, HIDDEN), [("next", "observation")], [("next", "encoded")]),
        RSSMRolloutV3(
            TensorDictModule(
                prior_net,
                ["state", "belief", "action"],
                [("next", "prior_logits"), ("next", "state"), ("next", "belief")],
            ),
            TensorDictModule(
                posterior_net,
                [("next", "belief"), ("next", "encoded")],
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


def update(loss, sample, parameters) -> None:
    out = loss(sample)
    total = sum(value for key, value in out.items() if key.startswith("loss_"))
    torch.autograd.grad(total, parameters, allow_unused=True)


def interleaved_seconds(losses: dict, sample, repeats: int) -> dict[str, list[float]]:
    """Each library's update time, the libraries alternating call by call (a busy machine's
    load then weighs on both alike); the first call of each builds lazy state, untimed."""
    parameters = {
        name: [p for p in loss.parameters() if p.requires_grad] for name, loss in losses.items()
    }
    times = {name: [] for name in losses}
    for step in range(repeats + 1):
        for name, loss in losses.items():
            torch.manual_seed(step)
            start = time.perf_counter()
            update(loss, sample, parameters[name])
            if step:
                times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    nets, sample = networks(), sequences(args.batch, args.time)
    libraries = {"rlloss": rlloss, "torchrl": torchrl_objectives}
    losses = {name: composed(library, nets, args.horizon) for name, library in libraries.items()}
    results = interleaved_seconds(losses, sample, args.repeats)
    print(f"DreamerV3 update, batch {args.batch} x {args.time}, horizon {args.horizon}, "
          f"{torch.get_num_threads()} threads, {args.repeats} timed calls")  # fmt: skip
    for name, times in results.items():
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else times * 3
        print(f"  {name:8s} median {statistics.median(times) * 1e3:9.1f} ms  "
              f"IQR {quartiles[0] * 1e3:.1f}-{quartiles[2] * 1e3:.1f} ms")  # fmt: skip
    ratio = statistics.median(results["torchrl"]) / statistics.median(results["rlloss"])
    print(f"  TorchRL / rlloss: {ratio:.2f}x")


if __name__ == "__main__":
    main()
