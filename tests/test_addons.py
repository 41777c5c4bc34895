"""Policy-loss add-ons (rlloss.addons, PyTorchRL's ``policy_loss_addons``): BehaviorCloning and
AttractionKL against hand-written references on PPO, SAC, TD3 and DDPG; gradients, state,
compilation and bad input. Every loss with an actor runs them through the contract table too
(tests/test_contract.py, the ``*-addons`` rows)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch._dynamo
from tensordict import TensorDict
from torch import nn
from torchrl.modules import IndependentNormal, TanhNormal

import rlloss
from rlloss import functional as rlf
from rlloss.addons import ActorOutput, PolicyLossAddon
from tests import test_dqn, test_sac, test_td3
from tests.nets import ACT, make_actor, make_critic, perturbed, rollout


def normal_params(actor, observation):
    """``loc, scale`` of a Normal ProbabilisticActor (its parameter module, run directly)."""
    out = actor.module[0](TensorDict(observation=observation, batch_size=observation.shape[:-1]))
    return out["loc"], out["scale"]


def normal_log_prob(x, loc, scale):
    """``sum_d log N(x_d; loc_d, scale_d^2)`` written out."""
    return (-((x - loc) ** 2) / (2 * scale**2) - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def normal_kl(loc_p, scale_p, loc_q, scale_q):
    """``KL(N(loc_p, scale_p^2) || N(loc_q, scale_q^2))`` summed over dims, written out."""
    return (
        torch.log(scale_q / scale_p) + (scale_p**2 + (loc_p - loc_q) ** 2) / (2 * scale_q**2) - 0.5
    ).sum(-1)


# ----------------------------------------------------------------------------- functional
def test_unit_gaussian_kl_is_the_kl_of_unit_gaussians():
    a, b = torch.randn(7, 3), torch.randn(7, 3)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Independent(torch.distributions.Normal(a, 1.0), 1),
        torch.distributions.Independent(torch.distributions.Normal(b, 1.0), 1),
    )
    torch.testing.assert_close(rlf.unit_gaussian_kl(a, b), expected)
    torch.testing.assert_close(rlf.unit_gaussian_kl(a, b), rlf.unit_gaussian_kl(b, a))


def test_action_squared_error_is_td3_bc_mse_and_sends_no_gradient_to_the_target():
    action, target = torch.randn(9, 3, requires_grad=True), torch.randn(9, 3, requires_grad=True)
    error = rlf.action_squared_error(action, target)
    assert error.shape == (9,)
    torch.testing.assert_close(error.mean(), nn.functional.mse_loss(action, target))
    error.sum().backward()
    assert target.grad is None and action.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="shape"):
        rlf.action_squared_error(torch.zeros(4, 3), torch.zeros(4, 1))


def test_reparameterized_monte_carlo_kl_differentiates_through_the_draws():
    """KL(pi || prior) of TanhNormals (no closed form): with detached draws the gradient of the
    estimate w.r.t. pi's scale averages to 0; reparameterised, it is the true one's sign."""
    loc = torch.zeros(4000, 1)
    scale = torch.full((4000, 1), 0.5, requires_grad=True)
    prior = TanhNormal(torch.zeros(4000, 1), torch.full((4000, 1), 0.5))
    torch.manual_seed(0)
    kl = rlf.kl_divergence(TanhNormal(loc, scale), prior, reparameterized=True)
    assert torch.isfinite(kl).all() and kl.mean().abs() < 0.05  # the same distributions
    # a wider policy than the prior: the KL grows with the scale
    scale2 = torch.full((4000, 1), 0.8, requires_grad=True)
    torch.manual_seed(0)
    rlf.kl_divergence(TanhNormal(loc, scale2), prior, reparameterized=True).mean().backward()
    assert scale2.grad.sum() > 0


# ----------------------------------------------------------------------------- PPO
def ppo_pair(addons, **kwargs):
    actor = make_actor("normal")
    policy, critic = perturbed(actor), make_critic()
    plain = rlloss.ClipPPOLoss(policy, critic, **kwargs)
    with_addons = rlloss.ClipPPOLoss(
        copy.deepcopy(policy), copy.deepcopy(critic), policy_loss_addons=addons, **kwargs
    )
    return actor, plain, with_addons


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_clip_ppo_with_both_addons_against_the_terms_written_out(reduction):
    actor = make_actor("normal")
    prior = perturbed(actor, 0.3)
    bc = rlloss.BehaviorCloning(0.3, action_key=("expert", "action"))
    kl = rlloss.AttractionKL(prior, 0.7)
    _, plain, loss = ppo_pair([bc, kl], reduction=reduction)
    batch = rollout(actor)
    batch["expert", "action"] = torch.randn(*batch.shape, ACT)
    out, reference = loss(batch), plain(batch)

    loc, scale = normal_params(loss.actor_network, batch["observation"])
    with torch.no_grad():
        prior_loc, prior_scale = normal_params(prior, batch["observation"])
    reduce = torch.mean if reduction == "mean" else torch.sum
    bc_term = 0.3 * reduce(-normal_log_prob(batch["expert", "action"], loc, scale))
    kl_term = 0.7 * reduce(normal_kl(prior_loc, prior_scale, loc, scale))
    torch.testing.assert_close(out["addon_behavior_cloning"], bc_term.detach())
    torch.testing.assert_close(out["addon_attraction_kl"], kl_term.detach())
    expected = reference["loss_objective"] + bc_term + kl_term
    torch.testing.assert_close(out["loss_objective"], expected)
    for key in ("loss_critic", "loss_entropy", "clip_fraction", "kl_approx"):
        torch.testing.assert_close(out[key], reference[key])
    assert not out["addon_attraction_kl"].requires_grad
    # the gradient of the loss is that of the hand-written sum
    grads = torch.autograd.grad(out["loss_objective"], list(loss.actor_network.parameters()))
    expected_grads = torch.autograd.grad(
        reference["loss_objective"], list(plain.actor_network.parameters())
    )
    hand = torch.autograd.grad(bc_term + kl_term, list(loss.actor_network.parameters()))
    for got, base, extra in zip(grads, expected_grads, hand, strict=True):
        torch.testing.assert_close(got, base + extra)
    # summing the loss_* entries counts the add-ons once; the entries are listed in out_keys
    assert sorted(out.keys()) == sorted(loss.out_keys)
    assert ("expert", "action") in loss.in_keys
    assert loss.policy_loss_addons == (bc, kl)


def test_ppo_addons_respect_the_padding_mask_and_reduction_none():
    actor = make_actor("normal")
    _, plain, loss = ppo_pair([rlloss.BehaviorCloning(2.0)], reduction="none")
    batch = rollout(actor, (4, 6))
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 4:] = False
    batch["collector", "mask"] = mask
    batch["action"][~mask] = float("nan")  # padding: reaches no value, no gradient
    out, reference = loss(batch), plain(batch)
    assert out["addon_behavior_cloning"].shape == (4, 6)
    assert (out["addon_behavior_cloning"][~mask] == 0).all()
    assert torch.isfinite(out["loss_objective"]).all()
    valid = batch[mask]
    loc, scale = normal_params(loss.actor_network, valid["observation"])
    term = 2.0 * -normal_log_prob(valid["action"], loc, scale)
    torch.testing.assert_close(out["addon_behavior_cloning"][mask], term.detach())
    torch.testing.assert_close(
        out["loss_objective"][mask], reference["loss_objective"][mask] + term
    )
    out["loss_objective"].sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in loss.actor_network.parameters())


def test_a2c_and_reinforce_add_to_their_own_actor_entry():
    actor = make_actor("normal")
    batch = rollout(actor)
    loc, scale = normal_params(actor, batch["observation"])
    term = 0.5 * -normal_log_prob(batch["action"], loc, scale).mean()
    for cls, key in ((rlloss.A2CLoss, "loss_objective"), (rlloss.ReinforceLoss, "loss_actor")):
        critic = make_critic()
        plain = cls(actor, critic)
        loss = cls(actor, critic, policy_loss_addons=[rlloss.BehaviorCloning(0.5)])
        out, reference = loss(batch), plain(batch)
        torch.testing.assert_close(out[key], reference[key] + term)
        assert out.keys() - reference.keys() == {"addon_behavior_cloning"}


# ----------------------------------------------------------------------------- SAC
def test_sac_with_both_addons_against_the_terms_written_out():
    """IndependentNormal actor: SAC's rsample path, a closed-form KL(pi || prior)."""
    actor, prior = test_sac.actor(IndependentNormal), test_sac.actor(IndependentNormal)
    critics = [test_sac.qvalue(), test_sac.qvalue()]
    bc = rlloss.BehaviorCloning(0.4)
    kl = rlloss.AttractionKL(prior, 1.5, direction="policy_to_prior")
    plain = rlloss.SACLoss(actor, critics, action_spec=None, target_entropy=-float(ACT))
    loss = rlloss.SACLoss(actor, critics, target_entropy=-float(ACT), policy_loss_addons=[bc, kl])
    batch = test_sac.transitions()
    torch.manual_seed(1)
    out = loss(batch)
    torch.manual_seed(1)
    reference = plain(batch)

    loc, scale = normal_params(actor, batch["observation"])
    with torch.no_grad():
        prior_loc, prior_scale = normal_params(prior, batch["observation"])
    bc_term = 0.4 * (-normal_log_prob(batch["action"], loc, scale)).mean()
    kl_term = 1.5 * normal_kl(loc, scale, prior_loc, prior_scale).mean()
    torch.testing.assert_close(out["loss_actor"], reference["loss_actor"] + bc_term + kl_term)
    torch.testing.assert_close(out["addon_behavior_cloning"], bc_term.detach())
    torch.testing.assert_close(out["addon_attraction_kl"], kl_term.detach())
    for key in ("loss_qvalue", "loss_alpha", "alpha", "entropy"):
        torch.testing.assert_close(out[key], reference[key])
    # loss_actor alone includes the terms too (delayed actor updates)
    torch.manual_seed(2)
    alone, info = loss.loss_actor(batch)
    torch.manual_seed(2)
    plain_alone, _ = plain.loss_actor(batch)
    torch.testing.assert_close(alone, plain_alone + bc_term + kl_term)
    assert set(info) == {"log_prob", "addon_behavior_cloning", "addon_attraction_kl"}


def test_sac_addons_are_weighted_by_priorities_and_reach_only_the_actor():
    actor = test_sac.actor()  # TanhNormal: the distribution built from the sampled parameters
    critics = [test_sac.qvalue(), test_sac.qvalue()]
    bc = rlloss.BehaviorCloning(1.0)
    loss = rlloss.SACLoss(actor, critics, policy_loss_addons=[bc])
    plain = rlloss.SACLoss(actor, critics)
    batch = test_sac.transitions()
    batch["priority_weight"] = torch.rand(batch.shape[0])
    torch.manual_seed(0)
    out = loss(batch)
    torch.manual_seed(0)
    reference = plain(batch)
    distribution = actor.get_dist(batch.select("observation").clone())
    term = -(batch["priority_weight"] * distribution.log_prob(batch["action"])).mean()
    torch.testing.assert_close(out["loss_actor"], reference["loss_actor"] + term)
    loss.zero_grad(set_to_none=True)
    (out["loss_actor"] - reference["loss_actor"]).backward()
    assert all(
        p.grad is None or (p.grad == 0).all() for p in loss.qvalue_network_params.values(True, True)
    )
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())
    assert loss.log_alpha.grad is None or loss.log_alpha.grad == 0


# ----------------------------------------------------------------------------- TD3 / DDPG
@pytest.mark.parametrize("name", ["TD3Loss", "DDPGLoss"])
def test_deterministic_actors_with_both_addons_against_the_terms_written_out(name):
    actor, prior = test_td3.actor(), test_td3.actor()
    critic = test_td3.qvalue()
    kwargs = {"bounds": (-1.0, 1.0)} if name == "TD3Loss" else {}
    if name == "TD3Loss":
        critic = [critic, test_td3.qvalue()]
    cls = getattr(rlloss, name)
    addons = [
        rlloss.BehaviorCloning(2.5),  # mode "auto": the squared error of mu(s)
        rlloss.AttractionKL(prior, 0.3),  # two deterministic policies: 1/2 |mu - mu_prior|^2
    ]
    plain = cls(actor, critic, **kwargs)
    loss = cls(actor, critic, policy_loss_addons=addons, **kwargs)
    batch = test_td3.transitions()
    torch.manual_seed(0)
    out = loss(batch)
    torch.manual_seed(0)
    reference = plain(batch)
    mu = actor(batch.select("observation").clone())["action"]
    with torch.no_grad():
        mu_prior = prior(batch.select("observation").clone())["action"]
    bc_term = 2.5 * ((mu - batch["action"]) ** 2).mean()
    kl_term = 0.3 * (0.5 * ((mu - mu_prior) ** 2).sum(-1)).mean()
    torch.testing.assert_close(out["loss_actor"], reference["loss_actor"] + bc_term + kl_term)
    torch.testing.assert_close(out["addon_behavior_cloning"], bc_term.detach())
    torch.testing.assert_close(out["addon_attraction_kl"], kl_term.detach())
    assert sorted(out.keys()) == sorted(loss.out_keys)
    # the prior is frozen: its copy has no parameters, the given module is untouched
    assert not list(addons[1].parameters())
    assert all(p.requires_grad for p in prior.parameters())
    loss.zero_grad(set_to_none=True)
    out["loss_actor"].backward()
    assert all(p.grad is None for p in prior.parameters())


def test_td3_actor_loss_alone_includes_the_addons():
    actor = test_td3.actor()
    bc = rlloss.BehaviorCloning(1.0, name="bc")
    loss = rlloss.TD3Loss(actor, test_td3.qvalue(), bounds=(-1, 1), policy_loss_addons=bc)
    plain = rlloss.TD3Loss(actor, test_td3.qvalue(), bounds=(-1, 1))
    plain.load_state_dict(
        {k: v for k, v in loss.state_dict().items() if not k.startswith("_policy_addons")}
    )
    batch = test_td3.transitions()
    value, info = loss.loss_actor(batch)
    reference, _ = plain.loss_actor(batch)
    mu = actor(batch.select("observation").clone())["action"]
    torch.testing.assert_close(value, reference + ((mu - batch["action"]) ** 2).mean())
    assert "addon_bc" in info


# ----------------------------------------------------------------------------- state, compile
def test_coefficient_is_a_checked_in_place_buffer_in_the_state_dict():
    actor = make_actor("normal")
    kl = rlloss.AttractionKL(perturbed(actor), 0.5)
    loss = rlloss.ClipPPOLoss(actor, make_critic(), policy_loss_addons=[kl])
    buffer = kl.coefficient
    kl.coefficient = 0.25
    assert kl.coefficient is buffer and float(buffer) == 0.25
    with pytest.raises(ValueError, match="coefficient"):
        kl.coefficient = -1.0
    state = loss.state_dict()
    assert "_policy_addons.0.coefficient" in state
    assert any(k.startswith("_policy_addons.0.prior.") for k in state)
    other = rlloss.ClipPPOLoss(
        make_actor("normal"),
        make_critic(),
        policy_loss_addons=[rlloss.AttractionKL(make_actor("normal"), 1.0)],
    )
    other.load_state_dict(state)
    batch = rollout(actor)
    torch.testing.assert_close(
        other(batch)["addon_attraction_kl"], loss(batch)["addon_attraction_kl"]
    )


@pytest.mark.slow  # compiled with inductor: tens of seconds with a cold cache
def test_compiled_loss_with_addons_matches_eager_without_recompiling():
    torch._dynamo.reset()
    actor = make_actor("normal")
    addons = [
        rlloss.BehaviorCloning(0.3, action_key=("expert", "action")),
        rlloss.AttractionKL(perturbed(actor, 0.3), 0.7),
    ]
    eager = rlloss.ClipPPOLoss(perturbed(actor), make_critic(), policy_loss_addons=addons)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True)

    def batch():
        data = rollout(actor)
        data["expert", "action"] = torch.randn(*data.shape, ACT)
        return data

    def run(module, call, data):
        module.zero_grad(set_to_none=True)
        out = call(data)
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        return out, [p.grad.clone() for p in module.actor_network.parameters()]

    for step in range(3):
        data = batch()
        if step == 2:  # an in-place coefficient change: no recompilation
            for module in (eager, twin):
                module.policy_loss_addons[1].coefficient = 0.1
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            (out, grads), (ref, ref_grads) = run(twin, compiled, data), run(eager, eager, data)
        for key in ref.keys():
            torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5, msg=key)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- bad input
def test_bad_addons_are_refused_with_clear_errors():
    actor, critic = make_actor("normal"), make_critic()
    with pytest.raises(TypeError, match=r"policy_loss_addons\[1\] is a Linear"):
        rlloss.ClipPPOLoss(
            actor, critic, policy_loss_addons=[rlloss.BehaviorCloning(), nn.Linear(2, 2)]
        )
    with pytest.raises(TypeError, match="must be a list of rlloss.PolicyLossAddon"):
        rlloss.ClipPPOLoss(actor, critic, policy_loss_addons="bc")
    with pytest.raises(ValueError, match="distinct name"):
        rlloss.ClipPPOLoss(
            actor, critic, policy_loss_addons=[rlloss.BehaviorCloning(), rlloss.BehaviorCloning()]
        )
    with pytest.raises(TypeError, match="DQNLoss has no actor loss"):
        rlloss.DQNLoss(test_dqn.q_actor(), policy_loss_addons=[rlloss.BehaviorCloning()])
    with pytest.raises(ValueError, match="needs a stochastic actor"):
        rlloss.TD3Loss(
            test_td3.actor(),
            test_td3.qvalue(),
            bounds=(-1, 1),
            policy_loss_addons=[rlloss.BehaviorCloning(mode="log_likelihood")],
        )
    with pytest.raises(ValueError, match="coefficient"):
        rlloss.BehaviorCloning(-0.1)
    with pytest.raises(ValueError, match="mode"):
        rlloss.BehaviorCloning(mode="l2")
    with pytest.raises(ValueError, match="direction"):
        rlloss.AttractionKL(actor, direction="forward")
    with pytest.raises(TypeError, match="prior"):
        rlloss.AttractionKL(nn.Linear(3, 3))


def test_missing_expert_actions_and_wrong_term_shapes_are_named():
    actor = make_actor("normal")
    bc = rlloss.BehaviorCloning(action_key=("expert", "action"))
    loss = rlloss.ClipPPOLoss(actor, make_critic(), policy_loss_addons=[bc])
    with pytest.raises(KeyError, match=r"reads the entry \('expert', 'action'\).*action_key="):
        loss(rollout(actor))

    class WholeBatch(PolicyLossAddon):
        def term(self, batch, actor: ActorOutput):
            return actor.distribution.mean.sum()  # a scalar, not one value per element

    loss = rlloss.ClipPPOLoss(actor, make_critic(), policy_loss_addons=[WholeBatch(1.0, "sum")])
    with pytest.raises(ValueError, match=r"shape \(\).*shape \(32,\)"):
        loss(rollout(actor))
