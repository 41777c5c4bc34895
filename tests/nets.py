"""Small TorchRL networks and batches shared by the module tests."""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    IndependentNormal,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)

OBS, ACT, HIDDEN = 5, 3, 16
ACTOR_KINDS = ("normal", "tanh_normal", "categorical", "one_hot")


def mlp(out_features: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, out_features))


def make_actor(kind: str = "normal") -> ProbabilisticActor:
    """A TorchRL ProbabilisticActor over the given distribution family."""
    if kind in ("normal", "tanh_normal"):
        params = TensorDictModule(
            nn.Sequential(mlp(2 * ACT), NormalParamExtractor()), ["observation"], ["loc", "scale"]
        )
        distribution, kwargs = IndependentNormal, {}
        if kind == "tanh_normal":
            distribution, kwargs = TanhNormal, {"low": -1.0, "high": 1.0}
        return ProbabilisticActor(
            params,
            in_keys=["loc", "scale"],
            distribution_class=distribution,
            distribution_kwargs=kwargs,
            return_log_prob=True,
        )
    distribution = torch.distributions.Categorical if kind == "categorical" else OneHotCategorical
    return ProbabilisticActor(
        TensorDictModule(mlp(ACT), ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=distribution,
        return_log_prob=True,
    )


def make_critic() -> ValueOperator:
    return ValueOperator(mlp(1), in_keys=["observation"])


def perturbed(module: nn.Module, scale: float = 0.1) -> nn.Module:
    """A deep copy with every parameter moved by Gaussian noise (a policy after some updates)."""
    module = copy.deepcopy(module)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(scale * torch.randn_like(parameter))
    return module


def rollout(actor, batch_size=(32,), critic=None) -> TensorDict:
    """A batch as a collector would store it: observations, actions and log-probs from
    ``actor``, next observations, rewards, done/terminated flags (some truncations), and random
    advantages and value targets."""
    batch_size = torch.Size(batch_size)
    td = TensorDict(
        {
            "observation": torch.randn(*batch_size, OBS),
            "next": {
                "observation": torch.randn(*batch_size, OBS),
                "reward": torch.randn(*batch_size, 1),
            },
        },
        batch_size,
    )
    terminated = torch.rand(*batch_size, 1) < 0.1
    truncated = torch.rand(*batch_size, 1) < 0.1
    td["next", "terminated"] = terminated
    td["next", "done"] = terminated | truncated
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        actor(td)
    td["advantage"] = 2 * torch.randn(*batch_size, 1)
    td["value_target"] = torch.randn(*batch_size, 1)
    td["state_value"] = torch.randn(*batch_size, 1)
    if critic is not None:
        with torch.no_grad():
            critic(td)
    return td
