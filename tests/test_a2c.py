"""A2CLoss: parity with TorchRL's A2CLoss (values and gradients), the objective against a naive
reference, estimated advantages, keyword-tensor calls, TorchRL's refused arguments."""

from __future__ import annotations

import copy

import pytest
import torch
from torchrl.objectives.utils import ValueEstimators

import rlloss
from rlloss import functional as rlf
from tests import reference
from tests.nets import ACTOR_KINDS, make_actor, make_critic, perturbed, rollout
from tests.test_ppo import pair, total


def assert_parity(ours, theirs, batch):
    out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    assert set(out_ours.keys()) == set(out_theirs.keys())
    for key in out_theirs.keys():
        torch.testing.assert_close(
            out_ours[key].detach(), out_theirs[key].detach(), rtol=1e-5, atol=1e-6, msg=key
        )
    total(out_ours).sum().backward()
    total(out_theirs).sum().backward()
    for name in ("actor_network", "critic_network"):
        theirs_params = getattr(theirs, f"{name}_params").flatten_keys(".")
        for key, parameter in getattr(ours, name).named_parameters():
            expected = theirs_params[key].grad
            if expected is None:
                assert parameter.grad is None or not parameter.grad.any(), key
                continue
            torch.testing.assert_close(parameter.grad, expected, rtol=1e-4, atol=1e-6, msg=key)


CONFIGS = [
    {},
    {"clip_value": 0.1, "loss_critic_type": "l2"},
    {"entropy_coeff": 0.05, "critic_coeff": 0.5, "loss_critic_type": "l1"},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"separate_losses": True},
    {"entropy_bonus": False},
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda kwargs: "-".join(kwargs) or "default")
def test_matches_torchrl(kwargs):
    assert_parity(*pair("A2CLoss", **kwargs))


@pytest.mark.parametrize("kind", ACTOR_KINDS)
def test_matches_torchrl_for_every_actor(kind):
    torch.manual_seed(0)  # TanhNormal's entropy is a Monte-Carlo estimate: same draws
    ours, theirs, batch = pair("A2CLoss", kind)
    if kind == "tanh_normal":
        ours.entropy_bonus = theirs.entropy_bonus = False
    assert_parity(ours, theirs, batch)


@pytest.mark.parametrize("estimator", [ValueEstimators.GAE, ValueEstimators.TDLambda])
def test_estimated_advantage_matches_torchrl(estimator):
    ours, theirs, _ = pair("A2CLoss")
    batch = rollout(make_actor(), batch_size=(4, 10))
    del batch["advantage"], batch["value_target"], batch["state_value"]
    for loss in (ours, theirs):
        loss.make_value_estimator(estimator, gamma=0.9, lmbda=0.8)
    assert_parity(ours, theirs, batch)


def test_objective_against_a_naive_reference():
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor, (8,))
    loss = rlloss.A2CLoss(actor, critic)
    out = loss(batch)
    with torch.no_grad():
        log_prob = actor.get_dist(batch.clone()).log_prob(batch["action"])
    expected = -sum(
        reference.surrogate(0.0, 1.0) * lp * a  # r = 1: the plain policy gradient
        for lp, a in zip(log_prob.tolist(), batch["advantage"].squeeze(-1).tolist(), strict=True)
    ) / len(log_prob)
    assert out["loss_objective"].item() == pytest.approx(expected, rel=1e-5)


def test_policy_gradient_objective_is_log_prob_times_a_constant_advantage():
    log_prob = torch.randn(5, requires_grad=True)
    advantage = torch.randn(5, requires_grad=True)
    out = rlf.policy_gradient_objective(log_prob, advantage)
    torch.testing.assert_close(out, log_prob * advantage)
    out.sum().backward()
    torch.testing.assert_close(log_prob.grad, advantage.detach())
    assert advantage.grad is None
    with pytest.raises(ValueError, match="shape mismatch"):
        rlf.policy_gradient_objective(log_prob, advantage[:, None])


def test_keyword_tensor_call_returns_torchrl_order():
    ours, theirs, batch = pair("A2CLoss")
    names = {"_".join((k,) if isinstance(k, str) else k): k for k in ours.in_keys}
    kwargs = {name: batch.get(key) for name, key in names.items() if key in batch.keys(True)}
    values = ours(**kwargs)
    expected = ours(batch.clone())
    assert ours.out_keys == ["loss_objective", "loss_critic", "entropy", "loss_entropy"]
    for value, key in zip(values, ours.out_keys, strict=True):
        torch.testing.assert_close(value, expected[key])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"gamma": 0.9}, TypeError, "make_value_estimator"),
        ({"advantage_key": "adv"}, RuntimeError, r"set_keys\(advantage='adv'\)"),
        ({"advantage_norm": object()}, TypeError, "advantage_norm"),
        ({"entropy_coef": 0.1}, TypeError, "entropy_coeff"),
        ({"critic_coef": 0.1}, TypeError, "critic_coeff"),
        ({"clip_epsilon": 0.2}, TypeError, "clip_epsilon"),
    ],
)
def test_torchrl_refused_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        rlloss.A2CLoss(make_actor(), make_critic(), **kwargs)


def test_needs_both_networks_and_takes_torchrl_aliases():
    with pytest.raises(TypeError, match="Missing positional arguments"):
        rlloss.A2CLoss(make_actor())
    actor, critic = make_actor(), make_critic()
    loss = rlloss.A2CLoss(actor=actor, critic=critic)
    assert loss.actor_network is actor and loss.critic_network is critic


def test_perturbed_policy_learns_toward_positive_advantages():
    """One SGD step on ``loss_objective`` raises the log-probability of actions with positive
    advantage (the policy-gradient direction)."""
    actor = make_actor("categorical")
    batch = rollout(actor, (64,))
    loss = rlloss.A2CLoss(perturbed(actor), make_critic(), entropy_coeff=0.0)
    policy = loss.actor_network
    before = policy.get_dist(batch.clone()).log_prob(batch["action"]).detach()
    loss(batch)["loss_objective"].backward()
    torch.optim.SGD(policy.parameters(), lr=0.05).step()
    after = policy.get_dist(batch.clone()).log_prob(batch["action"]).detach()
    advantage = batch["advantage"].squeeze(-1)
    assert ((after - before) * advantage).sum() > 0


def test_deep_copy_and_state_dict():
    loss = rlloss.A2CLoss(make_actor(), make_critic(), clip_value=0.2)
    other = copy.deepcopy(loss)
    other.load_state_dict(loss.state_dict())
    batch = rollout(make_actor())
    torch.testing.assert_close(other(batch)["loss_objective"], loss(batch)["loss_objective"])


# ----------------------------------------------------------------------------- REINFORCE
REINFORCE_CONFIGS = [{}, {"clip_value": 0.1}, {"reduction": "none"}, {"loss_critic_type": "l2"}]


def assert_reinforce_parity(ours, theirs, batch):
    out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    assert set(out_ours.keys()) == set(out_theirs.keys())
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key].detach(), out_theirs[key].detach(), msg=key)
    (out_ours["loss_actor"].sum() + out_ours["loss_value"].sum()).backward()
    (out_theirs["loss_actor"].sum() + out_theirs["loss_value"].sum()).backward()
    for name in ("actor_network", "critic_network"):
        theirs_params = getattr(theirs, f"{name}_params").flatten_keys(".")
        for key, parameter in getattr(ours, name).named_parameters():
            torch.testing.assert_close(parameter.grad, theirs_params[key].grad, msg=key)


@pytest.mark.parametrize("kwargs", REINFORCE_CONFIGS, ids=lambda k: "-".join(k) or "default")
def test_reinforce_matches_torchrl(kwargs):
    assert_reinforce_parity(*pair("ReinforceLoss", **kwargs))


def test_reinforce_with_a_target_critic_matches_torchrl():
    """``delay_value``: V(s') comes from the target critic (here moved away from the online one
    in both losses), through a TD(1) estimator."""
    ours, theirs, _ = pair("ReinforceLoss", delay_value=True)
    batch = rollout(make_actor(), batch_size=(3, 8))
    del batch["advantage"], batch["value_target"], batch["state_value"]
    online = rlloss.ReinforceLoss(ours.actor_network, ours.critic_network)
    for loss in (ours, theirs, online):
        loss.make_value_estimator(ValueEstimators.TD1, gamma=0.9)
    for loss in (ours, theirs):
        rlloss.SoftUpdate(loss, tau=0.5)  # an updater (it copies the online weights): no warning
    shifted = torchrl_params(perturbed(ours.critic_network, 0.5)).detach()
    with torch.no_grad():
        ours.target_critic_network_params.update_(shifted)
        theirs.target_critic_network_params.update_(shifted)
    differs = online(batch.clone())["loss_actor"] - ours(batch.clone())["loss_actor"]
    assert differs.abs() > 1e-4  # the target critic is the one read
    assert_reinforce_parity(ours, theirs, batch)


def torchrl_params(module):
    from tensordict import TensorDict

    return TensorDict.from_module(module)


def test_reinforce_target_critic_follows_its_updater():
    loss = rlloss.ReinforceLoss(make_actor(), make_critic(), delay_value=True)
    updater = rlloss.SoftUpdate(loss, tau=1.0)
    with torch.no_grad():
        for parameter in loss.critic_network.parameters():
            parameter.add_(1.0)
    updater.step()
    online = torchrl_params(loss.critic_network).flatten_keys(".")
    target = loss.target_critic_network_params.flatten_keys(".")
    for key in online.keys():
        torch.testing.assert_close(target[key], online[key].detach())
    assert "target_critic_network_params.module.0.weight" in loss.state_dict()


def test_reinforce_refuses_what_torchrl_refuses():
    with pytest.raises(TypeError, match="Missing positional arguments"):
        rlloss.ReinforceLoss(make_actor())
    with pytest.raises(RuntimeError, match="delay_value and ~functional"):
        rlloss.ReinforceLoss(make_actor(), make_critic(), delay_value=True, functional=False)
    with pytest.raises(TypeError, match="make_value_estimator"):
        rlloss.ReinforceLoss(make_actor(), make_critic(), gamma=0.99)
