"""WorldModelLoss: parity with TorchRL's (values and gradients) for every sub-loss and distance,
keys, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

import rlloss

N, OBS, LATENT, ACTION = 5, 6, 3, 2


class Dynamics(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(LATENT + ACTION, LATENT)

    def forward(self, latent, action):
        return self.linear(torch.cat([latent, action], -1))


def world_model():
    """Encoder, dynamics, reward and done heads, decoder: a TensorDictSequential."""
    return TensorDictSequential(
        TensorDictModule(nn.Linear(OBS, LATENT), ["observation"], ["latent"]),
        TensorDictModule(Dynamics(), ["latent", "action"], ["predicted_latent"]),
        TensorDictModule(nn.Linear(LATENT, 1), ["predicted_latent"], [("next", "reward")]),
        TensorDictModule(nn.Linear(LATENT, 1), ["predicted_latent"], [("next", "done")]),
        TensorDictModule(nn.Linear(LATENT, OBS), ["latent"], ["reconstructed_observation"]),
    )


def transitions(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(N, OBS, generator=generator),
            "action": torch.randn(N, ACTION, generator=generator),
            "target_latent": torch.randn(N, LATENT, generator=generator),
            "next": {
                "reward": torch.randn(N, 1, generator=generator),
                "done": torch.rand(N, 1, generator=generator) > 0.5,
                "terminated": torch.zeros(N, 1, dtype=torch.bool),
            },
        },
        [N],
    )


SETTINGS = [
    {},
    {"losses": ["reward", "done", "reconstruction", "latent"]},
    {"losses": ["done", "latent"], "done_loss": "smooth_l1", "latent_weight": 0.5},
    {"losses": ["reward", "reconstruction"], "reward_loss": "l1", "reconstruction_weight": 2.0},
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_matches_torchrl(settings):
    model = world_model()
    ours = rlloss.WorldModelLoss(copy.deepcopy(model), **settings)
    theirs = torchrl_objectives.WorldModelLoss(copy.deepcopy(model), **settings)
    batch = transitions()
    out, expected = ours(batch), theirs(batch)
    assert set(out.keys()) == set(expected.keys()) == set(ours.out_keys)
    for key in expected.keys():
        torch.testing.assert_close(out[key], expected[key])
    grads = torch.autograd.grad(sum(out.values()), list(ours.parameters()), allow_unused=True)
    expected_grads = torch.autograd.grad(
        sum(expected.values()), list(theirs.parameters()), allow_unused=True
    )
    for grad, grad_expected in zip(grads, expected_grads, strict=True):
        assert (grad is None) == (grad_expected is None)
        if grad is not None:
            torch.testing.assert_close(grad, grad_expected)
    assert batch["next", "reward"].dtype == torch.float32  # the caller's batch is untouched
    assert ("next", "true_reward") not in batch.keys(True)


def test_set_keys_and_bad_input():
    loss = rlloss.WorldModelLoss(world_model(), losses=["reward"])
    with pytest.raises(ValueError, match="Unknown loss type"):
        rlloss.WorldModelLoss(world_model(), losses=["reward", "kl"])
    with pytest.raises(ValueError, match="reward_loss"):
        rlloss.WorldModelLoss(world_model(), reward_loss="l4")
    with pytest.raises(ValueError, match="done_weight"):
        rlloss.WorldModelLoss(world_model(), done_weight=-1.0)
    with pytest.raises(KeyError, match="reward"):
        loss(transitions().exclude(("next", "reward")))
    loss.set_keys(reward="my_reward")
    batch = transitions()
    batch["next", "my_reward"] = batch["next"].pop("reward")
    with pytest.raises(KeyError, match="my_reward"):
        loss(batch)  # the model still writes ("next", "reward"): the prediction is missing


def test_reads_no_tensor_on_the_host():
    from tests.test_contract import HostReads

    loss = rlloss.WorldModelLoss(world_model(), losses=list(SETTINGS[1]["losses"]))
    loss(transitions())
    with HostReads() as reads:
        sum(loss(transitions()).values()).backward()
    assert not reads.seen
