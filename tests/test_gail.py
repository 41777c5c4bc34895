"""GAILLoss: parity with TorchRL's on the same discriminator, pairs and seed (with and without the
gradient penalty, flat and sequence batches, every reduction, padding masks), the reward it
gives, and the error for expert and policy batches of different layouts."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.objectives import GAILLoss as TorchRLGAILLoss

import rlloss
from rlloss import functional as rlf
from tests.parity import assert_same_seeded

OBS, ACT = 3, 2


def discriminator() -> TensorDictSequential:
    body = TensorDictModule(
        nn.Sequential(nn.Linear(OBS + ACT, 16), nn.Tanh()),
        in_keys=["observation", "action"],
        out_keys=["hidden"],
    )
    body.module = _Concat(body.module)
    head = TensorDictModule(
        nn.Sequential(nn.Linear(16, 1), nn.Sigmoid()), in_keys=["hidden"], out_keys=["d_logits"]
    )
    return TensorDictSequential(body, head)


class _Concat(nn.Module):
    """The body on ``(observation, action)`` concatenated."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, observation, action):
        return self.net(torch.cat([observation, action], -1))


def pairs(batch=(8,)) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(*batch, OBS),
            "action": torch.randn(*batch, ACT).clamp(-1, 1),
            "collector_observation": torch.randn(*batch, OBS) + 1.0,
            "collector_action": torch.rand(*batch, ACT),
        },
        batch,
    )


def pair(**kwargs):
    net = discriminator()
    return rlloss.GAILLoss(net, **kwargs), TorchRLGAILLoss(copy.deepcopy(net), **kwargs)


@pytest.mark.parametrize("use_grad_penalty", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("batch", [(8,), (3, 4)], ids=str)
def test_matches_torchrl(use_grad_penalty, reduction, batch):
    ours, theirs = pair(use_grad_penalty=use_grad_penalty, gp_lambda=2.0, reduction=reduction)
    assert_same_seeded(ours, theirs, pairs(batch))


class _OwnForward(TensorDictSequential):
    """A sequence with a forward of its own: the loss cannot plan its call."""

    def forward(self, tensordict, *args, **kwargs):
        return super().forward(tensordict, *args, **kwargs)


@pytest.mark.parametrize("planned", [True, False])
def test_discriminator_called_on_its_inputs_matches_torchrl(planned):
    """A planned discriminator runs on the concatenated pairs as tensors, one the loss cannot
    plan on a TensorDict of them; expert keys given as one-element tuples reach it either way."""
    net = discriminator() if planned else _OwnForward(*discriminator().module)
    ours, theirs = rlloss.GAILLoss(net), TorchRLGAILLoss(copy.deepcopy(net))
    assert (ours._discriminator_call.steps is None) is not planned
    keys = {"expert_observation": ("observation",), "expert_action": ("action",)}
    ours.set_keys(**keys)
    theirs.set_keys(**keys)
    assert_same_seeded(ours, theirs, pairs((3, 4)))


def test_padding_mask_matches_torchrl():
    ours, theirs = pair()
    batch = pairs((3, 4))
    batch["collector", "mask"] = torch.rand(3, 4) < 0.6
    assert_same_seeded(ours, theirs, batch)


def test_reward_is_the_discriminators_verdict_on_the_rollout():
    loss = rlloss.GAILLoss(discriminator())
    rollout = pairs((5,)).select("observation", "action")
    probability = loss.discriminator_network(rollout.clone())["d_logits"]
    for form in ("positive", "negative", "logit"):
        reward = loss.reward(rollout, form)
        assert reward.shape == (5, 1) and not reward.requires_grad
        torch.testing.assert_close(reward, rlf.gail_reward(probability, form))


def test_training_separates_expert_from_policy():
    loss = rlloss.GAILLoss(discriminator(), use_grad_penalty=True, gp_lambda=0.1)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-2)
    batch = pairs((64,))
    for _ in range(60):
        optimizer.zero_grad()
        loss(batch)["loss"].backward()
        optimizer.step()
    expert = batch.select("observation", "action")
    policy = TensorDict(
        {"observation": batch["collector_observation"], "action": batch["collector_action"]},
        [64],
    )
    assert loss.reward(expert).mean() > loss.reward(policy).mean() + 0.5


def test_batches_of_different_layouts_raise_a_clear_error():
    loss = rlloss.GAILLoss(discriminator())
    batch = pairs()
    batch["collector_observation"] = torch.randn(8, OBS + 1)
    with pytest.raises(ValueError, match=r"expert's observations 'observation' have shape \(8, 3"):
        loss(batch)
    batch = pairs()
    batch["collector_action"] = torch.randn(8, ACT + 2)
    with pytest.raises(ValueError, match="same layout"):
        loss(batch)
    with pytest.raises(ValueError, match="gp_lambda must be in"):
        rlloss.GAILLoss(discriminator(), gp_lambda=-1.0)
    with pytest.raises(KeyError, match="collector_action"):
        loss(pairs().exclude("collector_action"))
