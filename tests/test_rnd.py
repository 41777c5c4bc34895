"""RNDLoss: parity with TorchRL's on the same networks, observations and seed (update fractions,
reductions, observation statistics, padding masks), the intrinsic reward, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs.transforms.rnd import RunningMeanStd
from torchrl.objectives import RNDLoss as TorchRLRNDLoss

import rlloss

OBS, FEATURES = 4, 8


def networks():
    def net():
        return nn.Sequential(nn.Linear(OBS, 16), nn.ReLU(), nn.Linear(16, FEATURES))

    return net(), net()


def visited(batch=(32,)) -> TensorDict:
    return TensorDict({"next": {"observation": 2 * torch.randn(*batch, OBS)}}, batch)


def pair(**kwargs):
    predictor, target = networks()
    ours = rlloss.RNDLoss(predictor, target, **kwargs)
    theirs = TorchRLRNDLoss(copy.deepcopy(predictor), copy.deepcopy(target), **kwargs)
    return ours, theirs


def assert_same(ours, theirs, batch, seed=3):
    torch.manual_seed(seed)
    out_ours = ours(batch.clone())["loss_predictor"]
    torch.manual_seed(seed)
    out_theirs = theirs(batch.clone())["loss_predictor"]
    torch.testing.assert_close(out_ours, out_theirs)
    out_ours.sum().backward()
    out_theirs.sum().backward()
    for a, b in zip(
        ours.predictor_network.parameters(), theirs.predictor_network.parameters(), strict=True
    ):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("update_fraction", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torchrl(update_fraction, reduction):
    ours, theirs = pair(update_fraction=update_fraction, reduction=reduction)
    assert_same(ours, theirs, visited())


def test_observation_statistics_and_padding_match_torchrl():
    rms = RunningMeanStd(shape=(OBS,))
    rms.update(3 * torch.randn(100, OBS) + 1)
    ours, theirs = pair(obs_rms=rms, obs_clip=1.5, update_fraction=0.5)
    batch = visited((4, 8))
    batch["collector", "mask"] = torch.rand(4, 8) < 0.7
    assert_same(ours, theirs, batch)


def test_target_is_frozen_and_kept_as_given():
    predictor, target = networks()
    loss = rlloss.RNDLoss(predictor, target)
    assert loss.predictor_network is predictor and loss.target_network is target
    assert not any(p.requires_grad for p in target.parameters())
    loss(visited())["loss_predictor"].backward()
    assert all(p.grad is None for p in target.parameters())


def test_intrinsic_reward_is_the_detached_error_and_falls_where_trained():
    loss = rlloss.RNDLoss(*networks(), update_fraction=1.0, reduction="none")
    batch = visited((64,))
    bonus = loss.intrinsic_reward(batch)
    assert bonus.shape == (64, 1) and not bonus.requires_grad
    torch.testing.assert_close(bonus.squeeze(-1), loss(batch)["loss_predictor"].detach())
    familiar = batch[:32]
    optimizer = torch.optim.Adam(loss.predictor_network.parameters(), lr=3e-2)
    for _ in range(40):
        optimizer.zero_grad()
        loss(familiar)["loss_predictor"].mean().backward()
        optimizer.step()
    bonus = loss.intrinsic_reward(batch).squeeze(-1)
    assert bonus[:32].mean() < 0.5 * bonus[32:].mean()  # visited states earn less


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"update_fraction must be in the \[0, 1\] interval"):
        rlloss.RNDLoss(*networks(), update_fraction=1.5)
    with pytest.raises(TypeError, match="predictor_network must be a torch.nn.Module"):
        rlloss.RNDLoss(lambda x: x, networks()[1])
    loss = rlloss.RNDLoss(*networks())
    with pytest.raises(KeyError, match="observation"):
        loss(TensorDict({"observation": torch.randn(3, OBS)}, [3]))
    with pytest.raises(ValueError, match="update_fraction must be in"):
        loss.update_fraction = -0.1
