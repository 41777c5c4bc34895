"""rlloss.SoftUpdate / rlloss.HardUpdate: TorchRL's updaters' numbers in one fused call."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import MLP, Actor, ProbabilisticActor, QValueActor, TanhNormal, ValueOperator

import rlloss

OBS, ACT = 4, 2


def sac_loss():
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(
                MLP(in_features=OBS, out_features=2 * ACT, num_cells=[8]), NormalParamExtractor()
            ),
            ["observation"],
            ["loc", "scale"],
        ),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
    )
    critics = [
        ValueOperator(
            MLP(in_features=OBS + ACT, out_features=1, num_cells=[8]),
            in_keys=["observation", "action"],
        )
        for _ in range(2)
    ]
    return rlloss.SACLoss(actor, critics, target_entropy=-float(ACT))


def td3_loss():
    actor = Actor(MLP(in_features=OBS, out_features=ACT, num_cells=[8]), in_keys=["observation"])
    critics = [
        ValueOperator(
            MLP(in_features=OBS + ACT, out_features=1, num_cells=[8]),
            in_keys=["observation", "action"],
        )
        for _ in range(2)
    ]
    return rlloss.TD3Loss(actor, critics, bounds=(-1.0, 1.0))


def dqn_loss(library=rlloss):
    net = QValueActor(
        MLP(in_features=OBS, out_features=3, num_cells=[8]),
        in_keys=["observation"],
        action_space="one-hot",
    )
    return library.DQNLoss(net, action_space="one-hot", delay_value=True)


def perturb_online(loss, seed):
    """An optimizer step stand-in: move every trainable parameter."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in loss.parameters():
            p.add_(0.1 * torch.randn_like(p))


def target_state(loss):
    return {k: v.clone() for k, v in loss.state_dict().items() if "target_" in k}


@pytest.mark.parametrize("make", [sac_loss, td3_loss, dqn_loss])
def test_soft_update_matches_torchrl(make):
    ours, theirs = make(), None
    theirs = copy.deepcopy(ours)
    fused = rlloss.SoftUpdate(ours, tau=0.05)
    reference = torchrl_objectives.SoftUpdate(theirs, tau=0.05)
    assert isinstance(fused, torchrl_objectives.SoftUpdate)
    for step in range(4):
        perturb_online(ours, step), perturb_online(theirs, step)
        fused.step(), reference.step()
    mine, expected = target_state(ours), target_state(theirs)
    assert mine.keys() == expected.keys() and mine
    for key in expected:
        torch.testing.assert_close(mine[key], expected[key], msg=key)
    initial = target_state(make())
    assert any(not torch.equal(mine[k], initial[k]) for k in mine)  # the targets moved


@pytest.mark.parametrize("interval", [1, 3])
def test_hard_update_matches_torchrl_counter(interval):
    ours = dqn_loss()
    theirs = copy.deepcopy(ours)
    fused = rlloss.HardUpdate(ours, value_network_update_interval=interval)
    reference = torchrl_objectives.HardUpdate(theirs, value_network_update_interval=interval)
    for step in range(2 * interval + 3):
        perturb_online(ours, step), perturb_online(theirs, step)
        fused.step(), reference.step()
        for key, value in target_state(theirs).items():
            torch.testing.assert_close(target_state(ours)[key], value, msg=f"{step} {key}")
        assert fused.counter == reference.counter


def test_soft_update_follows_the_loss_when_it_moves():
    """After ``loss.double()`` the updater writes the loss's new target tensors."""
    loss = sac_loss()
    updater = rlloss.SoftUpdate(loss, tau=0.5)
    updater.step()
    loss.double()
    perturb_online(loss, 0)
    before = target_state(loss)
    updater.step()
    after = target_state(loss)
    online = loss.qvalue_network_params.flatten_keys(".")
    targets = loss.target_qvalue_network_params.flatten_keys(".")
    for key, value in targets.items():
        assert value.dtype == torch.float64
        expected = 0.5 * before[f"target_qvalue_network_params.{key}"] + 0.5 * online[key]
        torch.testing.assert_close(after[f"target_qvalue_network_params.{key}"], expected)


def test_torchrl_loss_is_updated_like_torchrl():
    ours = dqn_loss(torchrl_objectives)
    theirs = copy.deepcopy(ours)
    fused = rlloss.SoftUpdate(ours, tau=0.1)
    reference = torchrl_objectives.SoftUpdate(theirs, tau=0.1)
    for step in range(3):
        perturb_online(ours, step), perturb_online(theirs, step)
        fused.step(), reference.step()
    for key, value in target_state(theirs).items():
        torch.testing.assert_close(target_state(ours)[key], value, msg=key)
