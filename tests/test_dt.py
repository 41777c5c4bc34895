"""DTLoss and OnlineDTLoss: parity with TorchRL's on the same actors, trajectories and seed
(distances, reductions, sequence batches, temperature bounds, Monte-Carlo entropy), and the
errors of bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import ProbabilisticActor, TanhDelta, TanhNormal
from torchrl.objectives import DTLoss as TorchRLDTLoss
from torchrl.objectives import OnlineDTLoss as TorchRLOnlineDTLoss

import rlloss
from tests.parity import assert_same_seeded

OBS, ACT = 5, 3


def spec() -> Bounded:
    return Bounded(-torch.ones(ACT), torch.ones(ACT), (ACT,))


def deterministic_actor() -> ProbabilisticActor:
    module = TensorDictModule(nn.Linear(OBS + 1, ACT), ["context"], ["param"])
    return ProbabilisticActor(module, in_keys=["param"], distribution_class=TanhDelta, spec=spec())


def regression_actor() -> TensorDictModule:
    """A deterministic actor writing ``action`` (a transformer's head, here linear)."""
    return TensorDictModule(
        nn.Sequential(nn.Linear(OBS + 1, ACT), nn.Tanh()), ["context"], ["action"]
    )


def stochastic_actor() -> ProbabilisticActor:
    net = nn.Sequential(nn.Linear(OBS + 1, 2 * ACT), NormalParamExtractor())
    module = TensorDictModule(net, in_keys=["context"], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module, in_keys=["loc", "scale"], distribution_class=TanhNormal, spec=spec()
    )


def trajectories(batch=(4, 6)) -> TensorDict:
    """States with their return-to-go (the transformer's context, flattened) and actions."""
    return TensorDict(
        {
            "context": torch.randn(*batch, OBS + 1),
            "action": torch.rand(*batch, ACT) * 1.8 - 0.9,
        },
        batch,
    )


@pytest.mark.parametrize("loss_function", ["l2", "l1", "smooth_l1"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("make_actor", [deterministic_actor, regression_actor])
def test_dt_matches_torchrl(loss_function, reduction, make_actor):
    actor = make_actor()
    kwargs = {"loss_function": loss_function, "reduction": reduction}
    ours, theirs = rlloss.DTLoss(actor, **kwargs), TorchRLDTLoss(copy.deepcopy(actor), **kwargs)
    assert_same_seeded(ours, theirs, trajectories())
    batch = trajectories()
    batch["collector", "mask"] = torch.rand(4, 6) < 0.7
    assert_same_seeded(ours, theirs, batch)


def odt_pair(**kwargs):
    actor = stochastic_actor()
    ours = rlloss.OnlineDTLoss(actor, **kwargs)
    theirs = TorchRLOnlineDTLoss(copy.deepcopy(actor), **kwargs)
    return ours, theirs


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"samples_mc_entropy": 4, "alpha_init": 0.3},
        {"min_alpha": 0.5, "max_alpha": 0.8, "alpha_init": 2.0},
        {"max_alpha": 0.2},
        {"fixed_alpha": True, "target_entropy": -1.5},
        {"reduction": "sum"},
        {"reduction": "none", "scalar_output_mode": "exclude"},
    ],
    ids=lambda kwargs: ",".join(f"{k}={v}" for k, v in kwargs.items()) or "defaults",
)
def test_online_dt_matches_torchrl(kwargs):
    ours, theirs = odt_pair(**kwargs)
    assert_same_seeded(ours, theirs, trajectories())
    torch.testing.assert_close(ours.alpha, theirs.alpha)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    for name in ("alpha_init", "log_alpha", "target_entropy", "min_log_alpha", "max_log_alpha"):
        assert (name in ours_state) == (name in theirs_state)
        if name in ours_state:
            torch.testing.assert_close(ours_state[name], theirs_state[name])


def _seeded(loss, batch, seed=1):
    torch.manual_seed(seed)
    return loss(batch.clone())


def test_online_dt_padding_and_non_tensor_scalars():
    ours, theirs = odt_pair()
    batch = trajectories()
    mask = torch.rand(4, 6) < 0.7
    batch["collector", "mask"] = mask
    out, expected = _seeded(ours, batch), _seeded(theirs, batch)
    for key in ("loss_log_likelihood", "loss_entropy", "loss_alpha", "alpha"):
        torch.testing.assert_close(out[key], expected[key], msg=key)
    # the entropy diagnostic is over the valid steps only (TorchRL's averages padding in):
    # what padding holds does not change it
    other = batch.clone()
    other["context"][~mask] = 100.0
    torch.testing.assert_close(_seeded(ours, other)["entropy"], out["entropy"])
    assert not torch.allclose(_seeded(theirs, other)["entropy"], expected["entropy"])
    loss = rlloss.OnlineDTLoss(
        stochastic_actor(), reduction="none", scalar_output_mode="non_tensor"
    )
    out = loss(trajectories())
    assert out.batch_size == (4, 6) and out["loss_alpha"].shape == (4, 6)
    torch.testing.assert_close(out["alpha"], loss.alpha)
    with pytest.warns(UserWarning, match="scalar_output_mode='exclude'"):
        rlloss.OnlineDTLoss(stochastic_actor(), reduction="none")


def test_online_dt_target_entropy_and_temperature_learning():
    loss = rlloss.OnlineDTLoss(stochastic_actor())
    assert loss.target_entropy.item() == -ACT
    optimizer = torch.optim.Adam([loss.log_alpha], lr=0.1)
    for _ in range(30):  # an entropy above the target lowers the temperature
        optimizer.zero_grad()
        out = loss(trajectories())
        out["loss_alpha"].backward()
        optimizer.step()
    assert loss.alpha < 1.0 and out["entropy"] > loss.target_entropy


def test_bad_inputs_raise_clear_errors():
    writes_other = TensorDictModule(nn.Linear(OBS + 1, ACT), ["context"], ["prediction"])
    with pytest.raises(RuntimeError, match="did not write its prediction at 'action'"):
        rlloss.DTLoss(writes_other)(trajectories())
    with pytest.raises(ValueError, match="loss_function"):
        rlloss.DTLoss(deterministic_actor(), loss_function="huber")
    batch = trajectories()
    batch["action"] = batch["action"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="target action cannot be part of a graph"):
        rlloss.OnlineDTLoss(stochastic_actor())(batch)
    actor = stochastic_actor()
    actor = ProbabilisticActor(
        actor.module[0], in_keys=["loc", "scale"], distribution_class=TanhNormal
    )
    with pytest.raises(RuntimeError, match="target_entropy=<a number>"):
        rlloss.OnlineDTLoss(actor)
    with pytest.raises(ValueError, match="max_alpha must be either None or greater than 0"):
        rlloss.OnlineDTLoss(stochastic_actor(), min_alpha=0.1, max_alpha=0)
    with pytest.raises(ValueError, match="alpha_init"):
        rlloss.OnlineDTLoss(stochastic_actor(), alpha_init=0.0)
