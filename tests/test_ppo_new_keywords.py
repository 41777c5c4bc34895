"""TorchRL 0.14.1's newer PPO keywords against the installed TorchRL classes: ``delay_actor``
(PPO-EWMA's proximal policy), ``max_importance_ratio``, ``advantage_norm`` and
``normalize_advantage_exclude_dims``; values and gradients on the same networks and batches,
with an online actor moved away from its target copy and stale behaviour log-probs."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from torchrl.modules.value_norm import PercentileValueNorm, PopArtValueNorm, RunningValueNorm

import rlloss
from rlloss import functional as rlf
from rlloss.common import fill_padding
from rlloss.onpolicy.advantage import standardized_advantage
from tests.nets import make_actor, make_critic, rollout

CLASSES = ("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss")
SHARED_OUTPUTS = ("loss_objective", "loss_critic", "loss_entropy", "kl_approx")
CLIP_OUTPUTS = ("clip_fraction", "ESS", "max_ratio", "mean_ratio")


def _pair(name, actor, critic, **kwargs):
    """rlloss's and TorchRL's class of one name on the same networks; KLPEN's beta held fixed
    (TorchRL's backward sees the beta it updated in place: a documented difference)."""
    if name == "KLPENPPOLoss":
        kwargs = {"increment": 1.0, "decrement": 1.0, **kwargs}
    ours = getattr(rlloss, name)(actor, critic, **kwargs)
    theirs = getattr(torchrl_objectives, name)(actor, critic, **kwargs)
    return ours, theirs


def _moved(actor, scale=0.3):
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.add_(scale * torch.randn_like(parameter))


def _stale(batch, scale=1.0):
    """The behaviour log-probs of an older policy: ratios far from 1."""
    batch["action_log_prob"] = batch["action_log_prob"] + scale * torch.randn_like(
        batch["action_log_prob"]
    )
    return batch


def _outputs_and_grads(loss, batch, actor):
    torch.manual_seed(10)  # the same Monte-Carlo entropy draws (TanhNormal)
    out = loss(batch.clone())
    actor.zero_grad()
    out["loss_objective"].backward()
    grads = [p.grad.clone() for p in actor.parameters()]
    return out, grads


def _assert_same(ours, theirs, keys):
    for key in keys:
        if key in theirs.keys():
            expected = theirs[key]
            expected = expected.mean() if key == "kl" else expected
            torch.testing.assert_close(ours[key], expected.detach(), msg=key)


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("kind", ["normal", "tanh_normal", "categorical"])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_delay_actor_matches_torchrl(name, kind, cap):
    torch.manual_seed(0)
    actor, critic = make_actor(kind), make_critic()
    ours, theirs = _pair(name, actor, critic, delay_actor=True, max_importance_ratio=cap)
    _moved(actor)  # the online policy leaves its target copy behind
    batch = _stale(rollout(make_actor(kind)))
    keys = (*SHARED_OUTPUTS, *CLIP_OUTPUTS, "kl")
    monte_carlo_kl = name == "KLPENPPOLoss" and kind == "tanh_normal"  # other draws: not equal
    if monte_carlo_kl:
        keys = ("loss_critic", "kl_approx")
    out_ours, grads_ours = _outputs_and_grads(ours, batch, actor)
    with pytest.warns(UserWarning, match="No target network updater"):
        out_theirs, grads_theirs = _outputs_and_grads(theirs, batch, actor)
    _assert_same(out_ours, out_theirs, keys)
    if monte_carlo_kl:
        return
    for mine, expected in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(mine, expected)


@pytest.mark.parametrize("name", CLASSES)
def test_max_importance_ratio_without_delay_matches_torchrl(name):
    torch.manual_seed(1)
    actor, critic = make_actor(), make_critic()
    ours, theirs = _pair(name, actor, critic, max_importance_ratio=1.5)
    batch = _stale(rollout(actor), scale=2.0)
    out_ours, grads_ours = _outputs_and_grads(ours, batch, actor)
    out_theirs, grads_theirs = _outputs_and_grads(theirs, batch, actor)
    _assert_same(out_ours, out_theirs, (*SHARED_OUTPUTS, *CLIP_OUTPUTS, "kl"))
    for mine, expected in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(mine, expected)
    assert out_ours["max_ratio"] <= 1.5 + 1e-5 if "max_ratio" in out_ours.keys() else True


def test_max_importance_ratio_caps_the_weight_not_the_gradient():
    """A capped sample keeps a rescaled gradient: the cap lifts the behaviour log-prob."""
    torch.manual_seed(2)
    log_ratio = torch.tensor([[0.0], [3.0]], requires_grad=True)
    weight = rlf.capped_log_weight(torch.zeros_like(log_ratio), log_ratio, 2.0)
    behaviour = log_ratio + weight
    torch.testing.assert_close(behaviour.exp().detach(), torch.tensor([[1.0], [2.0]]))
    (behaviour.exp() * torch.ones_like(behaviour)).sum().backward()
    torch.testing.assert_close(log_ratio.grad, torch.tensor([[1.0], [2.0]]))


def test_soft_update_moves_the_proximal_policy():
    torch.manual_seed(3)
    actor, critic = make_actor(), make_critic()
    loss = rlloss.ClipPPOLoss(actor, critic, delay_actor=True)
    updater = rlloss.SoftUpdate(loss, tau=0.5)
    target = loss.target_actor_network_params.clone()
    _moved(actor)
    updater.step()
    online = loss.actor_network_params
    for key, value in loss.target_actor_network_params.items(True, True):
        expected = 0.5 * target.get(key) + 0.5 * online.get(key)
        torch.testing.assert_close(value, expected.detach())
    batch = rollout(actor)
    proximal = loss._proximal(batch).log_prob(batch["action"])
    reference = copy.deepcopy(actor)
    reference_params = loss.target_actor_network_params.clone()
    reference_params.to_module(reference)
    torch.testing.assert_close(proximal, reference.get_dist(batch).log_prob(batch["action"]))
    saved = [k for k in loss.state_dict() if k.startswith("target_actor_network_params.")]
    assert len(saved) == len(list(actor.parameters()))


@pytest.mark.parametrize("norm", [PopArtValueNorm, RunningValueNorm, PercentileValueNorm])
@pytest.mark.parametrize("name", ["ClipPPOLoss", "A2CLoss"])
def test_advantage_norm_matches_torchrl(norm, name):
    """Estimated advantages in training mode update the norm; precomputed ones only divide."""
    torch.manual_seed(4)
    actor, critic = make_actor(), make_critic()
    norm_ours, norm_theirs = norm(shape=1), norm(shape=1)
    ours = getattr(rlloss, name)(actor, critic, advantage_norm=norm_ours)
    theirs = getattr(torchrl_objectives, name)(actor, critic, advantage_norm=norm_theirs)
    estimated = rollout(actor).exclude("advantage", "value_target", "state_value")
    for batch in (estimated, rollout(actor), estimated):
        out_ours, grads_ours = _outputs_and_grads(ours, batch, actor)
        out_theirs, grads_theirs = _outputs_and_grads(theirs, batch, actor)
        _assert_same(out_ours, out_theirs, ("loss_objective", "loss_critic"))
        for mine, expected in zip(grads_ours, grads_theirs, strict=True):
            torch.testing.assert_close(mine, expected)
        torch.testing.assert_close(norm_ours.state_dict(), norm_theirs.state_dict())
    state = copy.deepcopy(norm_ours.state_dict())
    ours.eval()
    ours(estimated.clone())
    torch.testing.assert_close(norm_ours.state_dict(), state)  # eval mode: no update
    assert any(k.startswith("advantage_norm.") for k in ours.state_dict())


def test_advantage_norm_skips_padded_rows():
    torch.manual_seed(5)
    actor, critic = make_actor(), make_critic()
    norm, reference = RunningValueNorm(shape=1), RunningValueNorm(shape=1)
    loss = rlloss.ClipPPOLoss(actor, critic, advantage_norm=norm)
    batch = rollout(actor, batch_size=(4, 8)).exclude("advantage", "value_target", "state_value")
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[:, 6:] = False
    batch["collector", "mask"] = mask
    loss(batch)
    filled = fill_padding(batch, mask, [("collector", "mask")])  # as the loss estimates
    estimated = loss.value_estimator(filled.copy())
    reference.update(estimated["value_target"][mask])
    torch.testing.assert_close(norm.state_dict(), reference.state_dict())


@pytest.mark.parametrize("name", CLASSES)
def test_exclude_dims_matches_torchrl(name):
    """Per-agent advantages ``[B, n_agents, 1]``: one mean and std per agent."""
    torch.manual_seed(6)
    actor, critic = make_actor(), make_critic()
    kwargs = {"normalize_advantage": True, "normalize_advantage_exclude_dims": (-2,)}
    ours, theirs = _pair(name, actor, critic, **kwargs)
    batch = rollout(actor, batch_size=(16, 3))
    batch["advantage"] = batch["advantage"] * torch.tensor([1.0, 10.0, 100.0]).view(1, 3, 1)
    out_ours, grads_ours = _outputs_and_grads(ours, batch, actor)
    out_theirs, grads_theirs = _outputs_and_grads(theirs, batch, actor)
    _assert_same(out_ours, out_theirs, SHARED_OUTPUTS)
    for mine, expected in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(mine, expected)


def test_standardize_exclude_dims_against_a_loop():
    torch.manual_seed(7)
    x = torch.randn(10, 4, 1) * torch.arange(1, 5).view(1, 4, 1)
    mask = torch.rand(10, 4) > 0.3
    out = rlf.standardize(x, mask, exclude_dims=(-2,))
    for agent in range(4):
        valid = x[:, agent][mask[:, agent]]
        expected = (valid - valid.mean()) / valid.std()
        torch.testing.assert_close(out[:, agent][mask[:, agent]], expected)
    unmasked = rlf.standardize(x, exclude_dims=(1,))
    torch.testing.assert_close(unmasked, (x - x.mean((0, 2), True)) / x.std((0, 2), keepdim=True))
    torch.testing.assert_close(rlf.standardize(x, exclude_dims=(0, 1, 2)), x)
    with pytest.raises(ValueError, match="distinct dims"):
        rlf.standardize(x, exclude_dims=(1, -2))
    with pytest.raises(ValueError, match="distinct dims"):
        rlf.standardize(x, exclude_dims=(3,))


def test_per_agent_advantage_without_exclude_dims_warns():
    """TorchRL's warning: more advantage elements than batch elements, no dim excluded."""
    advantage = torch.randn(32, 3, 1)
    with pytest.warns(UserWarning, match="normalize_advantage_exclude_dims"):
        pooled = standardized_advantage("ClipPPOLoss", advantage, None, 32, (), False, None)
    torch.testing.assert_close(pooled, rlf.standardize(advantage))
    per_agent = standardized_advantage("ClipPPOLoss", advantage, None, 32, (-2,), False, None)
    torch.testing.assert_close(per_agent, rlf.standardize(advantage, exclude_dims=(-2,)))
