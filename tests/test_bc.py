"""BCLoss: parity with TorchRL's on the same actors and demonstrations (deterministic, stochastic,
discrete, chunked with a padding mask), the add-on's formula, and the errors of bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.objectives import BCLoss as TorchRLBCLoss

import rlloss
from rlloss.addons import ActorOutput
from tests.nets import ACT, OBS, make_actor, mlp

CHUNK = 4


def deterministic_actor(out_key="action") -> TensorDictModule:
    return TensorDictModule(mlp(ACT), in_keys=["observation"], out_keys=[out_key])


def chunk_actor() -> TensorDictModule:
    return TensorDictModule(
        nn.Sequential(mlp(CHUNK * ACT), nn.Unflatten(-1, (CHUNK, ACT))),
        in_keys=["observation"],
        out_keys=[("vla_action", "chunk")],
    )


def demonstrations(batch=(8,), discrete=False) -> TensorDict:
    action = torch.randint(ACT, batch) if discrete else torch.randn(*batch, ACT).clamp(-0.9, 0.9)
    return TensorDict({"observation": torch.randn(*batch, OBS), "action": action}, batch)


def chunks(batch=(6,)) -> TensorDict:
    data = TensorDict({"observation": torch.randn(*batch, OBS)}, batch)
    data["vla_action", "chunk"] = torch.randn(*batch, CHUNK, ACT)
    data["action_is_pad"] = torch.rand(*batch, CHUNK) < 0.3
    return data


def chunk_loss(**kwargs) -> rlloss.BCLoss:
    """L1 behaviour cloning of action chunks with their padding mask."""
    loss = rlloss.BCLoss(chunk_actor(), loss_function="l1", **kwargs)
    loss.set_keys(action=("vla_action", "chunk"), pad_mask="action_is_pad")
    return loss


def pair(actor, **kwargs):
    return rlloss.BCLoss(actor, **kwargs), TorchRLBCLoss(copy.deepcopy(actor), **kwargs)


def assert_same_loss_and_gradients(ours, theirs, batch, key="loss_bc"):
    out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    torch.testing.assert_close(out_ours[key], out_theirs[key])
    if out_ours[key].ndim:
        out_ours, out_theirs = {key: out_ours[key].sum()}, {key: out_theirs[key].sum()}
    out_ours[key].backward()
    out_theirs[key].backward()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("loss_function", [None, "l1", "l2", "mse", "smooth_l1"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_deterministic_actor_matches_torchrl(loss_function, reduction):
    ours, theirs = pair(deterministic_actor(), loss_function=loss_function, reduction=reduction)
    assert_same_loss_and_gradients(ours, theirs, demonstrations())


@pytest.mark.parametrize("kind", ["normal", "tanh_normal"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_stochastic_actor_matches_torchrl(kind, reduction):
    ours, theirs = pair(make_actor(kind), reduction=reduction)
    assert_same_loss_and_gradients(ours, theirs, demonstrations())


@pytest.mark.parametrize("loss_function", [None, "cross_entropy"])
def test_discrete_actions_match_torchrl(loss_function):
    actor = TensorDictModule(mlp(ACT), in_keys=["observation"], out_keys=["action"])
    ours, theirs = pair(actor, loss_function=loss_function)
    batch = demonstrations(discrete=True)
    assert_same_loss_and_gradients(ours, theirs, batch)
    batch["action"] = batch["action"].unsqueeze(-1)  # [B, 1] indices
    assert_same_loss_and_gradients(ours, theirs, batch)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunks_with_a_padding_mask_match_torchrl(reduction):
    ours, theirs = pair(chunk_actor(), loss_function="l1", reduction=reduction)
    for loss in (ours, theirs):
        loss.set_keys(action=("vla_action", "chunk"), pad_mask="action_is_pad")
    assert_same_loss_and_gradients(ours, theirs, chunks())
    assert ("vla_action", "chunk") in ours.in_keys and "action_is_pad" in ours.in_keys


def test_collector_mask_and_a_callable_loss_match_torchrl():
    ours, theirs = pair(deterministic_actor(), loss_function=lambda p, t: (p - t).abs() ** 1.5)
    batch = demonstrations((3, 4))
    batch["collector", "mask"] = torch.rand(3, 4) < 0.6
    assert_same_loss_and_gradients(ours, theirs, batch)


def test_padding_leaves_the_loss_unchanged():
    """A padded element's demonstration, however large, does not reach the loss."""
    loss = rlloss.BCLoss(chunk_actor(), loss_function="l2")
    loss.set_keys(action=("vla_action", "chunk"), pad_mask="action_is_pad")
    batch = chunks()
    before = loss(batch)["loss_bc"]
    batch["vla_action", "chunk"][batch["action_is_pad"]] = 1e6
    torch.testing.assert_close(loss(batch)["loss_bc"], before)


def test_the_add_on_and_the_loss_share_one_formula():
    """BehaviorCloning on a loss's actor adds what BCLoss computes for that actor."""
    actor, batch = make_actor("normal"), demonstrations()
    addon = rlloss.BehaviorCloning(1.0, mode="log_likelihood")

    actor_output = ActorOutput(distribution=actor.get_dist(batch.clone()))
    actor_output.action_key = "action"
    torch.testing.assert_close(
        addon(batch, actor_output).mean(), rlloss.BCLoss(actor)(batch)["loss_bc"]
    )
    mu = deterministic_actor()
    squared = rlloss.BehaviorCloning(1.0, mode="squared_error")
    output = ActorOutput(action=mu(batch.clone())["action"])
    output.action_key = "action"
    torch.testing.assert_close(
        squared(batch, output).mean(), rlloss.BCLoss(mu, loss_function="l2")(batch)["loss_bc"]
    )


def test_keyword_tensors_call():
    loss = rlloss.BCLoss(deterministic_actor())
    batch = demonstrations()
    expected = loss(batch)["loss_bc"]
    torch.testing.assert_close(
        loss(observation=batch["observation"], action=batch["action"]), expected
    )


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="Unsupported loss_function: 'huber'"):
        rlloss.BCLoss(deterministic_actor(), loss_function="huber")
    loss = rlloss.BCLoss(deterministic_actor("prediction"), loss_function="l1")
    with pytest.raises(RuntimeError, match="did not write a prediction at 'action'"):
        loss(demonstrations())
    loss = rlloss.BCLoss(chunk_actor(), loss_function="l1")
    loss.set_keys(action=("vla_action", "chunk"), pad_mask="action_is_pad")
    batch = chunks()
    batch["action_is_pad"] = torch.zeros(6, CHUNK + 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask has shape \(6, 5\).*loss of shape \(6, 4, 3\)"):
        loss(batch)
    batch["action_is_pad"] = torch.zeros(6, CHUNK, ACT, 2, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="more dimensions"):
        loss(batch)
    with pytest.raises(KeyError, match="action"):
        rlloss.BCLoss(deterministic_actor())(demonstrations().exclude("action"))
