"""CQLLoss: parity with TorchRL's CQLLoss (values, gradients, td_error) with identically seeded
draws, the CQL penalty and the max-backup against naive per-state loops written from the paper
(Kumar et al., arXiv:2006.04779), the Lagrangian form, the methods called alone."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from torch import distributions as D
from torchrl.data import Bounded
from torchrl.modules import IndependentNormal, TanhNormal

import rlloss
from tests.test_sac import ACT, B, actor, qvalue, shift_targets, transitions


def pair(num_random=10, bounds=(-1.0, 1.0), distribution=TanhNormal, **kwargs):
    """rlloss's and TorchRL's CQLLoss on the same networks (target Q networks moved away from
    the online ones by the same amount)."""
    policy, critics = actor(distribution, *bounds), [qvalue(), qvalue()]
    spec = Bounded(*bounds, shape=(ACT,))
    common = {"action_spec": spec, "num_random": num_random, **kwargs}
    ours = rlloss.CQLLoss(
        copy.deepcopy(policy), copy.deepcopy(critics), priority_weighting="normalized", **common
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torchrl_objectives.CQLLoss(copy.deepcopy(policy), copy.deepcopy(critics), **common)
        theirs.make_value_estimator(gamma=0.99)
    if common.get("delay_qvalue", True):
        shift_targets(ours), shift_targets(theirs)
    return ours, theirs


def run_both(ours, theirs, batch):
    mine, reference = batch.clone(), batch.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        out_ours = ours(mine)
        torch.manual_seed(0)
        out_theirs = theirs(reference)
    return out_ours, out_theirs, mine, reference


def assert_same_gradients(ours, theirs, networks=("actor_network", "qvalue_network")):
    for name in networks:
        theirs_params = getattr(theirs, f"{name}_params").flatten_keys(".")
        ours_params = getattr(ours, f"{name}_params").flatten_keys(".")
        for key in theirs_params.keys():
            torch.testing.assert_close(
                ours_params[key].grad, theirs_params[key].grad, msg=f"{name}.{key}"
            )
    if theirs.log_alpha.requires_grad:
        torch.testing.assert_close(ours.log_alpha.grad, theirs.log_alpha.grad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"deterministic_backup": False, "alpha_init": 0.3, "num_random": 3},
        {"loss_function": "l2", "reduction": "sum", "temperature": 2.0, "min_q_weight": 5.0},
        {"reduction": "none", "scalar_output_mode": "exclude", "delay_qvalue": False},
        {"alpha_init": 5.0, "max_alpha": 2.0, "min_alpha": 0.1, "bounds": (-2.0, 0.5)},
        {"fixed_alpha": True, "alpha_init": 0.2, "delay_actor": True, "target_entropy": -0.5},
        {"distribution": IndependentNormal, "deactivate_vmap": True},
    ],
)
def test_matches_torchrl_except_the_penalty(kwargs):
    """Every output but ``loss_cql`` (whose log-sum-exp TorchRL groups differently, see
    test_penalty_matches_torchrl_where_the_groupings_agree) with the same draws; the gradients
    of the actor, critic and temperature losses."""
    ours, theirs = pair(**kwargs)
    batch = transitions()
    out_ours, out_theirs, mine, reference = run_both(ours, theirs, batch)
    assert set(out_ours.keys()) == set(out_theirs.keys())
    for key in out_theirs.keys():
        if key != "loss_cql":
            torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    assert mine["td_error"].shape == batch.batch_size
    keys = ("loss_actor", "loss_actor_bc", "loss_qvalue", "loss_alpha")
    sum(out_ours[k].sum() for k in keys).backward()
    sum(out_theirs[k].sum() for k in keys).backward()
    assert_same_gradients(ours, theirs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.5, "min_q_weight": 5.0, "reduction": "sum"},
        {"with_lagrange": True, "lagrange_thresh": 3.0},
    ],
)
def test_penalty_matches_torchrl_where_the_groupings_agree(kwargs):
    """With one action per proposal and ``s' = s``, TorchRL's log-sum-exp (over the three
    proposals of each sample, the ``s'`` samples evaluated at ``s'``) is the paper's: every
    output and every gradient agree. With ``with_lagrange`` and ``alpha' = 1`` (its initial
    value) the values agree too, and so do the gradients but TorchRL's of ``loss_alpha_prime``
    on the Q networks (rlloss sends it none)."""
    ours, theirs = pair(num_random=1, **kwargs)
    batch = transitions()
    batch["next", "observation"] = batch["observation"].clone()
    out_ours, out_theirs, mine, reference = run_both(ours, theirs, batch)
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    losses = [k for k in out_theirs.keys() if k.startswith("loss_") and k != "loss_alpha_prime"]
    sum(out_ours[k] for k in losses).backward(retain_graph=True)
    sum(out_theirs[k] for k in losses).backward(retain_graph=True)
    assert_same_gradients(ours, theirs)
    if "loss_alpha_prime" in out_theirs.keys():
        out_ours["loss_alpha_prime"].backward()
        out_theirs["loss_alpha_prime"].backward()
        torch.testing.assert_close(ours.log_alpha_prime.grad, theirs.log_alpha_prime.grad)


def member(loss, index, target=False):
    """The ``index``-th Q network of ``loss`` as a plain module."""
    critic = qvalue()
    params = loss.target_qvalue_network_params if target else loss.qvalue_network_params
    for name, parameter in critic.named_parameters():
        parameter.data.copy_(params.flatten_keys(".")[name][index])
    return critic


def q_of(critic, observation, action):
    step = TensorDict(observation=observation, action=action, batch_size=[])
    return float(critic(step)["state_action_value"])


def tanh_normal_draw(policy, observation, noise, low, high):
    """The action ``c + h tanh(loc + scale noise)`` and its log-density (torch.distributions)."""
    params = policy.module[0](TensorDict(observation=observation, batch_size=[]))
    preimage = params["loc"] + params["scale"] * noise
    half, centre = (high - low) / 2, (high + low) / 2
    squashed = D.TransformedDistribution(
        D.Normal(params["loc"], params["scale"]),
        [D.TanhTransform(), D.AffineTransform(centre, half)],
    )
    action = centre + half * torch.tanh(preimage)
    return action, float(squashed.log_prob(action).sum())


@pytest.mark.parametrize(
    "num_random, temperature, min_q_weight, bounds",
    [(4, 1.0, 1.0, (-1.0, 1.0)), (3, 2.5, 0.7, (-2.0, 0.5))],
)
def test_penalty_against_a_per_state_loop(num_random, temperature, min_q_weight, bounds):
    """``w sum_i [T log sum_k exp((Q_i(s, a_k) - log q(a_k)) / T) - Q_i(s, a)]`` over the
    ``3N`` actions of each state (N uniform on the box, N from pi(.|s'), N from pi(.|s), all
    evaluated at s), with the draws replayed from the same seed."""
    low, high = bounds
    policy = actor(TanhNormal, low, high)
    loss = rlloss.CQLLoss(
        policy,
        [qvalue(), qvalue()],
        num_random=num_random,
        temperature=temperature,
        min_q_weight=min_q_weight,
        reduction="none",
    )
    batch = transitions(6)
    torch.manual_seed(5)
    penalty, _ = loss.cql_loss(batch)
    torch.manual_seed(5)
    uniform = low + (high - low) * torch.rand(6, num_random, ACT)
    noise_s = torch.randn(6 * num_random, ACT).reshape(6, num_random, ACT)
    noise_next = torch.randn(6 * num_random, ACT).reshape(6, num_random, ACT)
    critics = [member(loss, i) for i in range(2)]
    log_uniform = -ACT * math.log(high - low)
    with torch.no_grad():
        for b in range(6):
            s, s_next = batch["observation"][b], batch["next", "observation"][b]
            proposals = [(a, log_uniform) for a in uniform[b]]
            proposals += [tanh_normal_draw(policy, s, n, low, high) for n in noise_s[b]]
            proposals += [tanh_normal_draw(policy, s_next, n, low, high) for n in noise_next[b]]
            expected = 0.0
            for critic in critics:
                terms = [(q_of(critic, s, a) - lq) / temperature for a, lq in proposals]
                soft_max = temperature * math.log(sum(math.exp(t) for t in terms))
                expected += min_q_weight * (soft_max - q_of(critic, s, batch["action"][b]))
            assert float(penalty[b]) == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_max_q_backup_against_a_per_state_loop():
    """``y = r + gamma (1 - terminated) min_i max_k Q_i,target(s', a'_k)``, ``a'_k ~ pi(.|s')``."""
    policy = actor()
    loss = rlloss.CQLLoss(
        policy, [qvalue(), qvalue()], max_q_backup=True, num_random=3, loss_function="l2"
    )
    shift_targets(loss)
    batch = transitions(6)
    torch.manual_seed(2)
    _, info = loss.q_loss(batch)
    torch.manual_seed(2)
    noise = torch.randn(6 * 3, ACT).reshape(6, 3, ACT)
    targets, critics = (
        [member(loss, i, target=True) for i in range(2)],
        [member(loss, i) for i in range(2)],
    )
    with torch.no_grad():
        for b in range(6):
            s_next = batch["next", "observation"][b]
            actions = [tanh_normal_draw(policy, s_next, n, -1.0, 1.0)[0] for n in noise[b]]
            value = min(max(q_of(t, s_next, a) for a in actions) for t in targets)
            alive = 0.0 if bool(batch["next", "terminated"][b]) else 1.0
            y = float(batch["next", "reward"][b]) + 0.99 * alive * value
            for i, critic in enumerate(critics):
                error = (q_of(critic, batch["observation"][b], batch["action"][b]) - y) ** 2
                assert float(info["td_error"][i, b]) == pytest.approx(error, rel=1e-4, abs=1e-5)


def test_lagrange_weights_the_penalty_and_adapts_alpha_prime():
    """``loss_cql = alpha' sum_i penalty_i`` (alpha' without gradient) and ``loss_alpha_prime =
    alpha' (tau - mean_i penalty_i)`` (only ``log_alpha_prime`` gets gradient)."""
    policy, critics = actor(), [qvalue(), qvalue()]
    plain = rlloss.CQLLoss(copy.deepcopy(policy), copy.deepcopy(critics), reduction="none")
    dual = rlloss.CQLLoss(
        copy.deepcopy(policy),
        copy.deepcopy(critics),
        with_lagrange=True,
        lagrange_thresh=2.0,
        reduction="none",
    )
    dual.load_state_dict({**plain.state_dict(), "log_alpha_prime": torch.tensor(math.log(3.0))})
    assert "loss_alpha_prime" in dual.out_keys and "loss_alpha_prime" not in plain.out_keys
    batch = transitions()
    torch.manual_seed(0)
    unweighted = plain(batch.clone())["loss_cql"]
    torch.manual_seed(0)
    out = dual(batch.clone())
    torch.testing.assert_close(out["loss_cql"], 3.0 * unweighted)
    torch.testing.assert_close(out["loss_alpha_prime"], 3.0 * (2.0 - unweighted.detach() / 2))
    out["loss_alpha_prime"].mean().backward()
    assert dual.log_alpha_prime.grad is not None
    assert all(p.grad is None for p in dual.qvalue_network_params.values(True, True))
    expected = -3.0 * (unweighted.detach().mean() / 2 - 2.0)  # d loss / d log alpha'
    torch.testing.assert_close(dual.log_alpha_prime.grad, expected)
    # the method alone gives the forward's numbers
    torch.manual_seed(0)
    dual.q_loss(batch)
    alone, _ = dual.alpha_prime_loss(batch)
    torch.testing.assert_close(alone, out["loss_alpha_prime"])


def test_methods_callable_alone_give_the_forward_numbers():
    """TorchRL's methods, each on a fresh batch, in the forward's draw order."""
    loss = rlloss.CQLLoss(actor(), [qvalue(), qvalue()], alpha_init=0.5, num_random=4)
    batch = transitions()
    torch.manual_seed(0)
    out = loss(batch.clone())
    torch.manual_seed(0)
    q, info = loss.q_loss(batch)
    cql, _ = loss.cql_loss(batch)
    bc, bc_info = loss.actor_bc_loss(batch)
    actor_loss, actor_info = loss.actor_loss(batch)
    alpha_loss, _ = loss.alpha_loss(actor_info)
    for key, value in [
        ("loss_qvalue", q),
        ("loss_cql", cql),
        ("loss_actor_bc", bc),
        ("loss_actor", actor_loss),
        ("loss_alpha", alpha_loss),
    ]:
        torch.testing.assert_close(value, out[key], msg=key)
    assert set(actor_info) == {"_log_prob"} and info["td_error"].shape == (2, B)
    assert bc_info["bc_log_prob"].shape == ()
    assert "pred_q1" not in batch.keys()  # nothing is written but td_error (forward only)


def test_uniform_actions_cover_the_actor_bounds():
    """The random proposal is uniform on the tanh-Normal's box (its density in the penalty)."""
    loss = rlloss.CQLLoss(actor(TanhNormal, -3.0, 0.5), qvalue(), num_random=50)
    actions, log_density = loss._proposal_actions(transitions(4), torch.zeros(4, ACT))
    uniform = actions[:, :50]
    assert (uniform >= -3.0).all() and (uniform <= 0.5).all() and uniform.min() < -2.5
    torch.testing.assert_close(log_density[:, :50], torch.full((4, 50), -ACT * math.log(3.5)))


def test_prioritized_weights_weight_every_loss():
    ours, _ = pair(reduction="none", with_lagrange=True)
    batch = transitions()
    torch.manual_seed(0)
    per_sample = ours(batch.clone())
    weighted = rlloss.CQLLoss(ours.actor_network, [qvalue(), qvalue()], with_lagrange=True)
    weighted.load_state_dict(ours.state_dict())
    batch["priority_weight"] = torch.rand(B)
    torch.manual_seed(0)
    out = weighted(batch.clone())
    for key in [k for k in per_sample.keys() if k.startswith("loss_")]:
        expected = (per_sample[key] * batch["priority_weight"]).mean()
        torch.testing.assert_close(out[key], expected, msg=key)


def test_loss_function_reaches_the_regression():
    """With ``"l1"`` the per-sample loss is ``sum_i |Q_i - y| = sum_i sqrt(td_error_i)``."""
    loss = rlloss.CQLLoss(actor(), [qvalue(), qvalue()], loss_function="l1", reduction="none")
    value, info = loss.q_loss(transitions())
    assert value.shape == (B,)
    torch.testing.assert_close(value, info["td_error"].sqrt().sum(0))


def test_bad_arguments_are_named():
    for kwargs, message in [
        ({"temperature": 0.0}, "temperature must be in"),
        ({"min_q_weight": -1.0}, "min_q_weight must be in"),
        ({"num_random": 0}, "num_random"),
        ({"num_random": 2.5}, "integer"),
        ({"loss_function": "huber"}, "loss_function"),
    ]:
        with pytest.raises(ValueError, match=message):
            rlloss.CQLLoss(actor(), qvalue(), **kwargs)
    loss = rlloss.CQLLoss(actor(), qvalue())
    with pytest.raises(ValueError, match="temperature"):
        loss.temperature = -1.0


class GenericTanhNormal(TanhNormal):
    """TorchRL's TanhNormal under another class name: rlloss samples such an actor through the
    distribution (``rsample``, ``log_prob``), not from its ``loc``/``scale``."""


def same_actor_generic_path(policy):
    """A copy of the TanhNormal ``policy`` whose head builds a :class:`GenericTanhNormal`."""
    generic = copy.deepcopy(policy)
    generic.module[-1].distribution_class = GenericTanhNormal
    return generic


def test_fast_and_generic_paths_give_the_same_bounds_and_losses():
    """A TanhNormal actor with bounds other than ±1, sampled from its ``loc``/``scale`` (the fast
    path) or through its distribution: the uniform proposals cover the same ``[low, high]``
    with the same density, and every loss, under the same seed, has the same value and
    gradients (up to float32 rounding: the distribution's log-prob inverts the tanh, the fast
    path's reads the pre-tanh value); both losses hold the bounds in ``state_dict``."""
    low, high = -2.0, 0.5
    fast_actor = actor(TanhNormal, low, high)
    fast = rlloss.CQLLoss(fast_actor, [qvalue(), qvalue()], num_random=50, alpha_init=0.5)
    generic = rlloss.CQLLoss(
        same_actor_generic_path(fast_actor), [qvalue(), qvalue()], num_random=50
    )
    generic.load_state_dict(fast.state_dict())
    assert fast._actor_call.squashes and not generic._actor_call.squashes
    batch = transitions(action=torch.rand(B, ACT) * 1.75 - 1.5)
    proposals = []
    for loss in (fast, generic):
        torch.manual_seed(0)
        proposals.append(loss._proposal_actions(batch, batch["action"]))
    uniform, log_density = proposals[1][0][:, :50], proposals[1][1][:, :50]
    assert (uniform >= low).all() and (uniform <= high).all() and uniform.min() < -1.5
    torch.testing.assert_close(log_density, torch.full((B, 50), -ACT * math.log(high - low)))
    torch.testing.assert_close(proposals[1], proposals[0], rtol=1e-4, atol=1e-4)
    outputs = []
    for loss in (fast, generic):
        torch.manual_seed(1)
        out = loss(batch.clone())
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        outputs.append(out)
    for key in outputs[0].keys():
        torch.testing.assert_close(outputs[1][key], outputs[0][key], rtol=1e-4, atol=1e-4)
    for name in ("actor_network_params", "qvalue_network_params"):
        grads = [getattr(loss, name).flatten_keys(".") for loss in (fast, generic)]
        for key in grads[0].keys():
            torch.testing.assert_close(
                grads[1][key].grad, grads[0][key].grad, rtol=1e-4, atol=1e-4, msg=key
            )
