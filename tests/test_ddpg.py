"""DDPGLoss: TorchRL parity, the target against a naive loop, separate losses, compile."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from torchrl.objectives import SoftUpdate

import rlloss
from tests.test_td3 import B, actor, qvalue, transitions


def shift_targets(loss, seed=3):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, module in loss.named_children():
            if name.startswith("target_"):
                params = module.flatten_keys(".")
                for key in sorted(params.keys()):
                    params[key].add_(0.1 * torch.randn_like(params[key]))


@pytest.mark.parametrize("kwargs", [{}, {"delay_actor": True, "loss_function": "smooth_l1"}])
def test_matches_torchrl(kwargs):
    policy, critic = actor(), qvalue()
    ours = rlloss.DDPGLoss(
        copy.deepcopy(policy), copy.deepcopy(critic), priority_weighting="normalized", **kwargs
    )
    theirs = torchrl_objectives.DDPGLoss(copy.deepcopy(policy), copy.deepcopy(critic), **kwargs)
    theirs.make_value_estimator(gamma=0.99)
    shift_targets(ours), shift_targets(theirs)
    batch = transitions()
    batch["priority_weight"] = torch.rand(B)
    mine, reference = batch.clone(), batch.clone()
    out_ours, out_theirs = ours(mine), theirs(reference)
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    (out_ours["loss_actor"] + out_ours["loss_value"]).backward()
    (out_theirs["loss_actor"] + out_theirs["loss_value"]).backward()
    for name in ("actor_network", "value_network"):
        theirs_params = getattr(theirs, f"{name}_params").flatten_keys(".")
        for key, parameter in getattr(ours, name).named_parameters():
            torch.testing.assert_close(parameter.grad, theirs_params[key].grad, msg=key)


def test_target_against_naive_loop():
    loss = rlloss.DDPGLoss(actor(), qvalue(), delay_actor=True, gamma=0.8, reduction="none")
    shift_targets(loss)
    batch = transitions()
    out = loss(batch.clone())
    target_actor, target_critic = (
        copy.deepcopy(loss.actor_network),
        copy.deepcopy(loss.value_network),
    )
    for module, params in (
        (target_actor, loss.target_actor_network_params),
        (target_critic, loss.target_value_network_params),
    ):
        for name, parameter in module.named_parameters():
            parameter.data.copy_(params.flatten_keys(".")[name])
    with torch.no_grad():
        for b in range(B):
            next_step = batch[b : b + 1]["next"].clone()
            next_step = target_actor(next_step)
            bootstrap = float(target_critic(next_step)["state_action_value"])
            alive = 0.0 if bool(batch["next", "terminated"][b]) else 1.0
            expected = float(batch["next", "reward"][b]) + 0.8 * alive * bootstrap
            assert float(out["target_value"][b]) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_actor_loss_trains_only_the_actor_and_sees_current_critic_weights():
    loss = rlloss.DDPGLoss(actor(), qvalue())
    batch = transitions()
    loss.loss_actor(batch)[0].backward()
    assert all(p.grad is None for p in loss.value_network.parameters())
    assert all(p.grad is not None for p in loss.actor_network.parameters())
    with torch.no_grad():  # an optimizer step on the critic: the actor loss must see it
        for parameter in loss.value_network.parameters():
            parameter.add_(0.5)
    action = loss.actor_network(batch.clone())["action"]
    expected = -loss.value_network(batch.clone().set("action", action))["state_action_value"].mean()
    torch.testing.assert_close(loss.loss_actor(batch)[0], expected)


def test_compiles_as_one_graph_without_recompiling():
    torch._dynamo.reset()
    loss = rlloss.DDPGLoss(actor(), qvalue())
    SoftUpdate(loss, tau=0.1)
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    compiled(transitions())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            batch = transitions()
            out, expected = compiled(batch.clone()), loss(batch.clone())
            for key in ("loss_actor", "loss_value"):
                torch.testing.assert_close(out[key], expected[key])
    torch._dynamo.reset()
