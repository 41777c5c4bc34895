"""MPOLoss / DiscreteMPOLoss against naive per-state references written from the papers and
Acme's losses (E-step, decoupled M-step, duals, expected-SARSA critic), the identities with
identical online and target networks, the direction each dual moves, its floor, n-step,
prioritized replay, updaters, state, bad hyperparameters and compile."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch._dynamo
from tensordict import TensorDict
from torch import distributions as D
from torchrl.data import Bounded, Composite
from torchrl.modules import IndependentNormal, TanhNormal
from torchrl.objectives import SoftUpdate

from rlloss import DiscreteMPOLoss, MPOLoss
from rlloss.functional.mpo import MIN_LOG_DUAL
from tests import test_sac
from tests.nets import perturbed

ACT, B, N = test_sac.ACT, test_sac.B, 6
LOW, HIGH = -2.0, 1.0


def actor(distribution=TanhNormal, low=LOW, high=HIGH):
    return test_sac.actor(distribution, low, high)


def spec(low=LOW, high=HIGH):
    return Bounded(low, high, shape=(ACT,))


def transitions(batch=B):
    td = test_sac.transitions(batch)
    td["action"] = LOW + (HIGH - LOW) * torch.rand(batch, ACT)
    return td


def continuous_loss(distribution=TanhNormal, **kwargs):
    """An MPOLoss whose target actor and critic are perturbed copies of the online ones; returns
    the loss and the (target actor, target critic) as separate modules for the references."""
    online_actor, online_critic = actor(distribution), test_sac.qvalue()
    kwargs = {"num_samples": N, "action_spec": spec(), **kwargs}
    loss = MPOLoss(online_actor, online_critic, **kwargs)
    target_actor, target_critic = perturbed(online_actor, 0.3), perturbed(online_critic, 0.3)
    set_targets(loss, target_actor, target_critic)
    return loss, target_actor, target_critic


def set_targets(loss, target_actor, target_critic):
    with torch.no_grad():
        if loss.delay_actor:
            loss.target_actor_network_params.update_(TensorDict.from_module(target_actor))
        if loss.delay_qvalue:
            loss.target_qvalue_network_params.update_(TensorDict.from_module(target_critic))


def gaussian_params(policy, observation):
    params = policy.module[0](TensorDict(observation=observation))
    return params["loc"], params["scale"]


def policy_distribution(loc, scale, tanh):
    """The actor's distribution over actions, built from torch.distributions only."""
    if not tanh:
        return D.Independent(D.Normal(loc, scale), 1)
    squash = [D.TanhTransform(), D.AffineTransform((HIGH + LOW) / 2, (HIGH - LOW) / 2)]
    return D.Independent(D.TransformedDistribution(D.Normal(loc, scale), squash), 1)


def critic_value(critic, observation, action):
    td = TensorDict(observation=observation, action=action)
    return float(critic(td)["state_action_value"])


def naive_mpo(loss, online_actor, target_actor, target_critic, batch, noise, tanh):
    """Acme's MPO loss (acme/jax/losses/mpo.py) state by state and sample by sample: returns the
    policy loss, the temperature and alpha losses and the diagnostics, as batch means."""
    temperature = math.log1p(math.exp(float(loss.log_temperature.detach()))) + 1e-8
    alpha_mean = torch.nn.functional.softplus(loss.log_alpha_mean.detach()) + 1e-8
    alpha_stddev = torch.nn.functional.softplus(loss.log_alpha_stddev.detach()) + 1e-8
    totals = dict.fromkeys(["policy", "temperature", "kl_q", "q"], 0.0)
    kl_means, kl_stddevs = [], []
    with torch.no_grad():
        for i in range(B):
            observation = batch["observation"][i]
            loc, scale = gaussian_params(online_actor, observation)
            target_loc, target_scale = gaussian_params(target_actor, observation)
            preimages = [target_loc + target_scale * noise[j, i] for j in range(N)]
            if tanh:
                actions = [(HIGH + LOW) / 2 + (HIGH - LOW) / 2 * torch.tanh(u) for u in preimages]
                scored = actions
            else:
                actions = preimages
                scored = [a.clamp(LOW, HIGH) for a in actions]
            q = [critic_value(target_critic, observation, a) for a in scored]
            exps = [math.exp(v / temperature) for v in q]
            weights = [e / sum(exps) for e in exps]
            totals["temperature"] += temperature * (0.0 + math.log(sum(exps) / N))
            totals["kl_q"] += sum(w * math.log(N * w + 1e-8) for w in weights)
            totals["q"] += sum(q) / N
            if loss.action_penalization:
                eta_p = math.log1p(math.exp(float(loss.log_penalty_temperature.detach()))) + 1e-8
                costs = [-float(torch.linalg.norm(a - a.clamp(LOW, HIGH))) for a in actions]
                penalty_exps = [math.exp(c / eta_p) for c in costs]
                weights = [
                    w + e / sum(penalty_exps) for w, e in zip(weights, penalty_exps, strict=True)
                ]
                totals["temperature"] += eta_p * (
                    loss.epsilon_penalty + math.log(sum(penalty_exps) / N)
                )
            fixed_stddev = policy_distribution(loc, target_scale, tanh)
            fixed_mean = policy_distribution(target_loc, scale, tanh)
            totals["policy"] -= sum(
                w * float(fixed_stddev.log_prob(a) + fixed_mean.log_prob(a))
                for w, a in zip(weights, actions, strict=True)
            )
            target = D.Normal(target_loc, target_scale)
            kl_means.append(D.kl_divergence(target, D.Normal(loc, target_scale)))
            kl_stddevs.append(D.kl_divergence(target, D.Normal(target_loc, scale)))
    kl_mean, kl_stddev = torch.stack(kl_means), torch.stack(kl_stddevs)  # [B, D]
    diagnostics = {"kl_mean": kl_mean.sum(-1).mean(), "kl_stddev": kl_stddev.sum(-1).mean()}
    if not loss.per_dim_constraining:
        kl_mean, kl_stddev = kl_mean.sum(-1, keepdim=True), kl_stddev.sum(-1, keepdim=True)
    mean_kl_mean, mean_kl_stddev = kl_mean.mean(0), kl_stddev.mean(0)
    return {
        "loss_actor": totals["policy"] / B
        + float((alpha_mean * mean_kl_mean).sum() + (alpha_stddev * mean_kl_stddev).sum()),
        "loss_temperature": totals["temperature"] / B + temperature * loss.epsilon,
        "loss_alpha": float(
            (alpha_mean * (loss.epsilon_mean - mean_kl_mean)).sum()
            + (alpha_stddev * (loss.epsilon_stddev - mean_kl_stddev)).sum()
        ),
        "kl_q": totals["kl_q"] / B,
        "q_mean": totals["q"] / B,
        **{k: float(v) for k, v in diagnostics.items()},
    }


@pytest.mark.parametrize(
    "distribution, kwargs",
    [
        (TanhNormal, {}),
        (IndependentNormal, {}),
        (TanhNormal, {"per_dim_constraining": False, "init_log_alpha_mean": 0.5}),
        (
            IndependentNormal,
            {
                "action_penalization": True,
                "init_log_temperature": -1.0,
                "init_log_alpha_stddev": 2.0,
                "epsilon": 0.05,
            },
        ),
        (IndependentNormal, {"per_dim_constraining": False, "action_penalization": True}),
    ],
)
def test_policy_and_dual_losses_against_naive_acme_reference(distribution, kwargs):
    loss, target_actor, target_critic = continuous_loss(distribution, **kwargs)
    batch = transitions()
    torch.manual_seed(11)
    out_actor, info = loss.loss_actor(batch)
    torch.manual_seed(11)
    noise = torch.randn(N, B, ACT)
    expected = naive_mpo(
        loss,
        loss.actor_network,
        target_actor,
        target_critic,
        batch,
        noise,
        distribution is TanhNormal,
    )
    got = {"loss_actor": out_actor, **info}
    for key, value in expected.items():
        assert float(got[key]) == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert float(info["temperature"]) == pytest.approx(
        math.log1p(math.exp(float(loss.log_temperature.detach()))), rel=1e-6
    )


@pytest.mark.parametrize("distribution", [TanhNormal, IndependentNormal])
@pytest.mark.parametrize("delay_actor", [True, False])
def test_identical_online_and_target_policies_give_zero_kl_and_the_weighted_likelihood(
    distribution, delay_actor
):
    loss = MPOLoss(
        actor(distribution),
        test_sac.qvalue(),
        num_samples=N,
        action_spec=spec(),
        delay_actor=delay_actor,
        init_log_alpha_mean=1.0,
    )
    batch = transitions()
    torch.manual_seed(2)
    loss_actor, info = loss.loss_actor(batch)
    assert float(info["kl_mean"]) == 0.0 and float(info["kl_stddev"]) == 0.0
    alpha_mean = torch.nn.functional.softplus(loss.log_alpha_mean.detach()) + 1e-8
    alpha_stddev = torch.nn.functional.softplus(loss.log_alpha_stddev.detach()) + 1e-8
    expected_alpha = (alpha_mean * loss.epsilon_mean).sum() + (
        alpha_stddev * loss.epsilon_stddev
    ).sum()
    torch.testing.assert_close(info["loss_alpha"], expected_alpha)
    # the two decoupled policies are the policy itself: twice its weighted log-likelihood
    torch.manual_seed(2)
    noise = torch.randn(N, B, ACT)
    with torch.no_grad():
        loc, scale = gaussian_params(loss.actor_network, batch["observation"])
        preimage = loc + scale * noise
        tanh = distribution is TanhNormal
        action = (HIGH + LOW) / 2 + (HIGH - LOW) / 2 * torch.tanh(preimage) if tanh else preimage
        critic_action = action if tanh else action.clamp(LOW, HIGH)
        q = loss.qvalue_network(
            TensorDict(observation=batch["observation"].expand(N, B, -1), action=critic_action)
        )["state_action_value"].squeeze(-1)
        temperature = torch.nn.functional.softplus(loss.log_temperature) + 1e-8
        weights = torch.softmax(q / temperature, 0)
        log_prob = policy_distribution(loc, scale, tanh).log_prob(action)
    expected = -(weights * 2 * log_prob).sum(0).mean()
    torch.testing.assert_close(loss_actor, expected, rtol=1e-4, atol=1e-5)


def test_gradients_of_the_decoupled_terms():
    """The actor's gradient is the sum of the mean-only and the scale-only parts: the policy
    loss of the mean half reaches only loc, that of the scale half only scale (checked through
    the network's output layer, whose rows produce loc and scale separately)."""
    loss, _, _ = continuous_loss(IndependentNormal, init_log_alpha_mean=0.0)
    batch = transitions()
    loss_actor, _ = loss.loss_actor(batch)
    loss_actor.backward()
    last = loss.actor_network.module[0].module[0][-1]
    assert last.weight.grad[:ACT].abs().sum() > 0 and last.weight.grad[ACT:].abs().sum() > 0
    assert all(p.grad is None for p in loss.qvalue_network.parameters())
    assert loss.log_temperature.grad is None and loss.log_alpha_mean.grad is None


def naive_critic_target(loss, target_actor, target_critic, batch, noise, tanh, gamma):
    targets = []
    with torch.no_grad():
        for i in range(B):
            observation = batch["next", "observation"][i]
            target_loc, target_scale = gaussian_params(target_actor, observation)
            values = []
            for j in range(N):
                u = target_loc + target_scale * noise[j, i]
                a = (HIGH + LOW) / 2 + (HIGH - LOW) / 2 * torch.tanh(u) if tanh else u
                values.append(critic_value(target_critic, observation, a.clamp(LOW, HIGH)))
            alive = 0.0 if bool(batch["next", "terminated"][i]) else 1.0  # truncation bootstraps
            n = int(batch["steps_to_next_obs"][i])
            targets.append(float(batch["next", "reward"][i]) + gamma**n * alive * sum(values) / N)
    return torch.tensor(targets)


@pytest.mark.parametrize("distribution", [TanhNormal, IndependentNormal])
def test_expected_sarsa_target_with_n_step_and_truncation(distribution):
    loss, target_actor, target_critic = continuous_loss(distribution, gamma=0.9)
    batch = transitions()
    batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    torch.manual_seed(4)
    loss_qvalue, info = loss.loss_qvalue(batch)
    torch.manual_seed(4)
    noise = torch.randn(N, B, ACT)
    expected = naive_critic_target(
        loss, target_actor, target_critic, batch, noise, distribution is TanhNormal, 0.9
    )
    torch.testing.assert_close(info["target_value"], expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        value = loss.qvalue_network(batch.clone())["state_action_value"].squeeze(-1)
    torch.testing.assert_close(info["pred_value"], value)
    torch.testing.assert_close(loss_qvalue, ((value - expected) ** 2).mean(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(info["td_error"], (value - expected).abs(), rtol=1e-4, atol=1e-5)


def test_independent_normal_critic_sees_stored_actions_clipped_to_the_bounds():
    loss, _, _ = continuous_loss(IndependentNormal)
    batch = transitions()
    batch["action"] = 3 * torch.randn(B, ACT)  # unclipped Gaussian samples, as Acme stores them
    _, info = loss.loss_qvalue(batch)
    clipped = batch.clone().set("action", batch["action"].clamp(LOW, HIGH))
    with torch.no_grad():
        value = loss.qvalue_network(clipped)["state_action_value"].squeeze(-1)
    torch.testing.assert_close(info["pred_value"], value)


def test_truncation_bootstraps_and_termination_does_not():
    loss, _, _ = continuous_loss()
    batch = transitions()
    batch["next", "terminated"] = torch.zeros(B, 1, dtype=torch.bool)
    batch["next", "done"] = torch.ones(B, 1, dtype=torch.bool)
    _, truncated = loss.loss_qvalue(batch)
    batch["next", "terminated"] = torch.ones(B, 1, dtype=torch.bool)
    _, terminated = loss.loss_qvalue(batch)
    torch.testing.assert_close(terminated["target_value"], batch["next", "reward"].squeeze(-1))
    assert not torch.allclose(truncated["target_value"], terminated["target_value"])


def test_prioritized_weights_td_error_and_reduction_none():
    loss, _, _ = continuous_loss(reduction="none")
    batch = transitions()
    torch.manual_seed(0)
    plain = loss(batch)
    assert batch["td_error"].shape == (B,)
    for key in ("loss_actor", "loss_qvalue", "loss_temperature", "loss_alpha"):
        assert plain[key].shape == (B,), key
    weights = torch.rand(B)
    batch["priority_weight"] = weights
    for weighting, expected in (
        ("mean", lambda x: (weights * x).mean()),
        ("normalized", lambda x: (weights * x).sum() / weights.sum()),
    ):
        weighted = copy.deepcopy(loss)
        weighted.reduction, weighted.priority_weighting = "mean", weighting
        torch.manual_seed(0)
        out = weighted(batch.clone())
        for key in ("loss_actor", "loss_qvalue", "loss_temperature", "loss_alpha"):
            torch.testing.assert_close(out[key], expected(plain[key]), msg=key)
    ignoring = copy.deepcopy(loss)
    ignoring.reduction, ignoring.use_prioritized_weights = "mean", False
    torch.manual_seed(0)
    torch.testing.assert_close(ignoring(batch.clone())["loss_qvalue"], plain["loss_qvalue"].mean())


def sgd_step_on(loss, batch, key, lr=0.5):
    """One SGD step of the dual parameters on ``out[key]``; returns the parameters before."""
    before = {n: p.detach().clone() for n, p in loss.named_parameters() if n.startswith("log_")}
    loss.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    _, info = loss.loss_actor(batch)
    info[key].backward()
    with torch.no_grad():
        for parameter in loss.dual_parameters():
            if parameter.grad is not None:
                parameter -= lr * parameter.grad
    return before


@pytest.mark.parametrize("exceeds", [True, False])
def test_each_dual_grows_iff_its_kl_exceeds_its_epsilon(exceeds):
    bound = 1e-9 if exceeds else 1e3
    loss, _, _ = continuous_loss(
        IndependentNormal,
        epsilon=bound,
        epsilon_mean=bound,
        epsilon_stddev=bound,
        init_log_temperature=1.0,
        init_log_alpha_mean=1.0,
        init_log_alpha_stddev=1.0,
    )
    batch = transitions()
    before = sgd_step_on(loss, batch, "loss_alpha")
    for name in ("log_alpha_mean", "log_alpha_stddev"):
        moved = getattr(loss, name).detach() - before[name]
        assert bool((moved > 0).all()) == exceeds and bool((moved != 0).all()), name
    assert torch.equal(loss.log_temperature.detach(), before["log_temperature"])
    before = sgd_step_on(loss, batch, "loss_temperature")
    moved = loss.log_temperature.detach() - before["log_temperature"]
    assert bool(moved > 0) == exceeds and bool(moved != 0)


def test_per_dimension_duals_move_independently():
    """A policy that moved along dimension 0 only: alpha_mean[0] grows, alpha_mean[1] shrinks."""
    loss = MPOLoss(
        actor(IndependentNormal),
        test_sac.qvalue(),
        num_samples=N,
        action_spec=spec(),
        init_log_alpha_mean=1.0,
    )
    target = copy.deepcopy(loss.actor_network)
    with torch.no_grad():
        target.module[0].module[0][-1].bias[0] += 1.0  # the target's loc, dimension 0
    set_targets(loss, target, loss.qvalue_network)
    assert loss.log_alpha_mean.shape == (ACT,)
    before = sgd_step_on(loss, transitions(), "loss_alpha")
    moved = loss.log_alpha_mean.detach() - before["log_alpha_mean"]
    assert moved[0] > 0 and moved[1] < 0


def test_duals_are_floored_without_getting_stuck():
    loss, _, _ = continuous_loss(
        IndependentNormal, epsilon=1e-9, epsilon_mean=1e-9, action_penalization=True
    )
    with torch.no_grad():
        for parameter in loss.dual_parameters():
            parameter.fill_(-30.0)
    batch = transitions()
    loss.zero_grad(set_to_none=True)
    _, info = loss.loss_actor(batch)
    for name, parameter in loss.named_parameters():
        if name.startswith("log_"):
            assert torch.all(parameter.detach() == -18.0), name
    assert float(info["temperature"]) == pytest.approx(math.log1p(math.exp(-18.0)) + 1e-8)
    (info["loss_temperature"] + info["loss_alpha"]).backward()
    assert loss.log_temperature.grad < 0 and (loss.log_alpha_mean.grad < 0).all()
    with torch.no_grad():  # a large step: the duals leave the floor
        for parameter in loss.dual_parameters():
            parameter -= 1e9 * parameter.grad
    assert loss.log_temperature.detach() > -18.0 and (loss.log_alpha_mean.detach() > -18).all()
    with torch.no_grad():
        loss.log_alpha_stddev.fill_(-25.0)
    loss.clamp_duals()
    assert (loss.log_alpha_stddev.detach() == -18.0).all()


def test_dual_parameters_state_dict_round_trip_and_optimizer_groups():
    loss, _, _ = continuous_loss(action_penalization=True)
    duals = list(loss.dual_parameters())
    assert {id(p) for p in duals} <= {id(p) for p in loss.parameters()}
    names = ["log_temperature", "log_alpha_mean", "log_alpha_stddev", "log_penalty_temperature"]
    assert [p is getattr(loss, n) for p, n in zip(duals, names, strict=True)] == [True] * 4
    optimizer = torch.optim.Adam(duals, lr=0.1)
    batch = transitions()
    for _ in range(3):
        out = loss(batch)
        optimizer.zero_grad()
        (out["loss_temperature"] + out["loss_alpha"]).backward()
        optimizer.step()
    state = loss.state_dict()
    for name in names:
        assert name in state
    assert any(k.startswith("target_actor_network_params") for k in state)
    assert any(k.startswith("target_qvalue_network_params") for k in state)
    other, _, _ = continuous_loss(action_penalization=True)
    other.load_state_dict(state)
    for name in names:
        torch.testing.assert_close(getattr(other, name), getattr(loss, name))
    torch.manual_seed(1)
    expected = loss(batch.clone())
    torch.manual_seed(1)
    got = other(batch.clone())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], msg=key)


def test_soft_update_moves_both_targets():
    loss, _, _ = continuous_loss()
    updater = SoftUpdate(loss, tau=0.5)
    for name in ("actor_network", "qvalue_network"):
        before = getattr(loss, f"target_{name}_params").clone()
        updater.step()
        online = TensorDict.from_module(getattr(loss, name))
        for key, value in getattr(loss, f"target_{name}_params").items(True, True):
            expected = 0.5 * before[key] + 0.5 * online[key].detach()
            torch.testing.assert_close(value, 0.5 * expected + 0.5 * online[key].detach())
    targets = list(loss.target_actor_network_params.values(True, True))
    assert not {id(t) for t in targets} & {id(p) for p in loss.parameters()}


def test_finite_with_tanh_actions_at_the_bounds():
    loss, _, _ = continuous_loss()
    with torch.no_grad():
        loss.actor_network.module[0].module[0][-1].bias.fill_(40.0)  # tanh saturates at HIGH
    out = loss(transitions())
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    assert torch.isfinite(total)
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in loss.actor_network.parameters())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon": 0.0}, "epsilon must be in"),
        ({"epsilon": -0.1}, "epsilon must be in"),
        ({"epsilon_mean": 0.0}, "epsilon_mean"),
        ({"epsilon_stddev": -1e-6}, "epsilon_stddev"),
        ({"epsilon_penalty": 0.0}, "epsilon_penalty"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": 2.5}, "num_samples"),
        ({"loss_function": "huber"}, "loss_function"),
        ({"gamma": 1.5}, "gamma"),
        ({"reduction": "avg"}, "reduction"),
    ],
)
def test_bad_hyperparameters_are_rejected_clearly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MPOLoss(actor(), test_sac.qvalue(), action_spec=spec(), **kwargs)


def test_bad_networks_and_missing_bounds_are_rejected_clearly():
    with pytest.raises(ValueError, match="action dimension"):
        MPOLoss(actor(IndependentNormal), test_sac.qvalue())
    assert MPOLoss(actor(IndependentNormal), test_sac.qvalue(), per_dim_constraining=False)
    with pytest.raises(ValueError, match="action_penalization needs the action bounds"):
        MPOLoss(
            actor(IndependentNormal),
            test_sac.qvalue(),
            per_dim_constraining=False,
            action_penalization=True,
        )
    with pytest.raises(ValueError, match="IndependentNormal or TanhNormal"):
        MPOLoss(test_sac.discrete_actor(False), test_sac.qvalue(), action_spec=spec())
    with pytest.raises(ValueError, match="epsilon_policy"):
        DiscreteMPOLoss(
            test_sac.discrete_actor(False), test_sac.discrete_qvalue(), epsilon_policy=0.0
        )
    loss, _, _ = continuous_loss()
    batch = transitions()
    del batch["next", "reward"]
    with pytest.raises(KeyError, match=r"set_keys\(reward="):
        loss(batch)


def test_actor_spec_gives_bounds_and_dimension():
    policy = actor(IndependentNormal)
    policy.spec = Composite(action=spec(-0.5, 0.5))
    loss = MPOLoss(policy, test_sac.qvalue(), action_penalization=True)
    assert loss.log_alpha_mean.shape == (ACT,)
    torch.testing.assert_close(loss.action_high, torch.full((ACT,), 0.5))


# ------------------------------------------------------------------------------- discrete
NUM_ACTIONS = test_sac.NUM_ACTIONS


def discrete_loss(one_hot=False, **kwargs):
    online_actor, online_critic = test_sac.discrete_actor(one_hot), test_sac.discrete_qvalue()
    loss = DiscreteMPOLoss(online_actor, online_critic, **kwargs)
    target_actor, target_critic = perturbed(online_actor, 0.3), perturbed(online_critic, 0.3)
    set_targets(loss, target_actor, target_critic)
    return loss, target_actor, target_critic


def logits_of(policy, observation):
    return policy.module[0](TensorDict(observation=observation))["logits"]


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("kwargs", [{}, {"init_log_temperature": -0.5, "init_log_alpha": 0.0}])
def test_discrete_losses_against_enumerated_reference(one_hot, kwargs):
    loss, target_actor, target_critic = discrete_loss(one_hot, gamma=0.8, **kwargs)
    batch = test_sac.discrete_transitions(one_hot)
    batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    out = loss(batch)
    eta = math.log1p(math.exp(float(loss.log_temperature.detach()))) + 1e-8
    alpha = math.log1p(math.exp(float(loss.log_alpha.detach()))) + 1e-8
    totals = dict.fromkeys(["policy", "temperature", "kl", "kl_q", "critic"], 0.0)
    with torch.no_grad():
        for i in range(B):
            observation = batch["observation"][i]
            probs = logits_of(target_actor, observation).softmax(-1)
            online = logits_of(loss.actor_network, observation).log_softmax(-1)
            q = target_critic(TensorDict(observation=observation))["action_value"]
            terms = [float(probs[a]) * math.exp(float(q[a]) / eta) for a in range(NUM_ACTIONS)]
            e_step = [t / sum(terms) for t in terms]
            kl = sum(float(p * (p.log() - online[a])) for a, p in enumerate(probs))
            totals["policy"] -= sum(e * float(online[a]) for a, e in enumerate(e_step))
            totals["policy"] += alpha * kl
            totals["kl"] += kl
            totals["temperature"] += eta * (loss.epsilon + math.log(sum(terms)))
            totals["kl_q"] += sum(e * math.log(e / float(probs[a])) for a, e in enumerate(e_step))
            # critic: y = r + gamma^n (1 - terminated) sum_a' pi_target(a'|s') Q_target(s', a')
            next_observation = batch["next", "observation"][i]
            next_probs = logits_of(target_actor, next_observation).softmax(-1)
            next_q = target_critic(TensorDict(observation=next_observation))["action_value"]
            alive = 0.0 if bool(batch["next", "terminated"][i]) else 1.0
            n = int(batch["steps_to_next_obs"][i])
            y = float(batch["next", "reward"][i]) + 0.8**n * alive * float(
                (next_probs * next_q).sum()
            )
            action = batch["action"][i]
            index = int(action.argmax()) if one_hot else int(action)
            value = loss.qvalue_network(TensorDict(observation=observation))["action_value"]
            totals["critic"] += (float(value[index]) - y) ** 2
            assert float(batch["td_error"][i]) == pytest.approx(
                abs(float(value[index]) - y), rel=1e-4, abs=1e-5
            )
    expected = {
        "loss_actor": totals["policy"] / B,
        "loss_qvalue": totals["critic"] / B,
        "loss_temperature": totals["temperature"] / B,
        "loss_alpha": alpha * (loss.epsilon_policy - totals["kl"] / B),
        "kl": totals["kl"] / B,
        "kl_q": totals["kl_q"] / B,
        "temperature": eta,
        "alpha": alpha,
    }
    for key, value in expected.items():
        assert float(out[key]) == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_discrete_identical_policies_and_dual_directions():
    loss = DiscreteMPOLoss(
        test_sac.discrete_actor(False), test_sac.discrete_qvalue(), init_log_alpha=0.0
    )
    batch = test_sac.discrete_transitions(False)
    _, info = loss.loss_actor(batch)
    assert float(info["kl"]) == 0.0
    for bound, grows in ((1e-9, True), (1e3, False)):
        loss, _, _ = discrete_loss(epsilon=bound, epsilon_policy=bound)
        before = sgd_step_on(loss, batch, "loss_alpha")
        assert bool(loss.log_alpha.detach() > before["log_alpha"]) == grows
        before = sgd_step_on(loss, batch, "loss_temperature")
        assert bool(loss.log_temperature.detach() > before["log_temperature"]) == grows


@pytest.mark.slow  # compiled with inductor: tens of seconds with a cold cache
def test_compiled_mpo_matches_eager_without_recompiling():
    """Inductor, fullgraph: the same numbers as eager over fresh batches, no recompilation
    (the contract table traces every MPO variant with the eager backend)."""
    torch._dynamo.reset()
    loss, _, _ = continuous_loss(IndependentNormal, action_penalization=True)
    SoftUpdate(loss, tau=0.1)
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True)

    def batch_with_per():
        return transitions().set("priority_weight", torch.rand(B))

    with torch._inductor.config.patch(fallback_random=True):  # eager's random stream
        compiled(batch_with_per())
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(2):
                batch = batch_with_per()
                mine, reference = batch.clone(), batch.clone()
                torch.manual_seed(5)
                out = compiled(mine)
                torch.manual_seed(5)
                expected = loss(reference)
                for key in expected.keys():
                    torch.testing.assert_close(
                        out[key], expected[key], rtol=1e-4, atol=1e-5, msg=key
                    )
                torch.testing.assert_close(mine["td_error"], reference["td_error"])
    torch._dynamo.reset()


def test_dual_caps_hold_the_multipliers_below_their_maximum():
    """pytorchrl's ``alpha_mean_max`` / ``alpha_var_max`` (here ``alpha_stddev_max``) and the
    discrete ``alpha_max``: after clamp_duals (run by every loss_actor call) each multiplier is
    at most its cap; uncapped duals keep only Acme's floor."""
    loss, _, _ = continuous_loss(alpha_mean_max=0.4, alpha_stddev_max=3.0)
    with torch.no_grad():
        for parameter in loss.dual_parameters():
            parameter.fill_(50.0)
    loss.loss_actor(transitions())
    assert loss._dual("log_alpha_mean").max().item() == pytest.approx(0.4, rel=1e-5)
    assert loss._dual("log_alpha_stddev").max().item() == pytest.approx(3.0, rel=1e-5)
    assert loss._dual("log_temperature").item() == pytest.approx(50.0)  # uncapped
    discrete = discrete_mpo_loss(alpha_max=2.0)
    with torch.no_grad():
        discrete.log_alpha.fill_(-100.0)
    discrete.clamp_duals()
    assert discrete.log_alpha.item() == pytest.approx(MIN_LOG_DUAL)
    with torch.no_grad():
        discrete.log_alpha.fill_(100.0)
    discrete.clamp_duals()
    assert discrete._dual("log_alpha").item() == pytest.approx(2.0, rel=1e-5)


def test_dual_scales_multiply_only_their_dual_loss():
    """``alpha_*_scale`` scales the multiplier's dual loss, hence its gradient (its step
    size); the other outputs and gradients are unchanged."""
    batch = transitions()
    plain, _, _ = continuous_loss()
    scaled = copy.deepcopy(plain)
    scaled._dual_scales["log_alpha_mean"] = 4.0
    torch.manual_seed(0)
    out_plain = plain(batch.clone())
    torch.manual_seed(0)
    out_scaled = scaled(batch.clone())
    torch.testing.assert_close(out_scaled["loss_actor"], out_plain["loss_actor"])
    torch.testing.assert_close(out_scaled["loss_temperature"], out_plain["loss_temperature"])
    out_plain["loss_alpha"].backward()
    out_scaled["loss_alpha"].backward()
    torch.testing.assert_close(scaled.log_alpha_mean.grad, 4.0 * plain.log_alpha_mean.grad)
    torch.testing.assert_close(scaled.log_alpha_stddev.grad, plain.log_alpha_stddev.grad)
    built = MPOLoss(actor(), test_sac.qvalue(), action_spec=spec(), alpha_mean_scale=4.0)
    assert built._dual_scales["log_alpha_mean"] == 4.0
    with pytest.raises(ValueError, match="alpha_mean_max must be in"):
        MPOLoss(actor(), test_sac.qvalue(), action_spec=spec(), alpha_mean_max=0.0)
    with pytest.raises(ValueError, match="alpha_scale must be in"):
        discrete_mpo_loss(alpha_scale=-1.0)


def discrete_mpo_loss(**kwargs):
    return DiscreteMPOLoss(test_sac.discrete_actor(True), test_sac.discrete_qvalue(), **kwargs)


@pytest.mark.parametrize("maximum", [1e-3, 0.4, 3.0, 1000.0])
def test_dual_parameter_bound_inverts_the_dual_variable(maximum):
    from rlloss import functional as rlf

    bound = torch.tensor(rlf.dual_parameter_bound(maximum), dtype=torch.float64)
    assert rlf.dual_variable(bound).item() == pytest.approx(maximum, rel=1e-9)
