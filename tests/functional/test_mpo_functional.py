"""The MPO functions against naive loops written from the papers (arXiv:1806.06920,
arXiv:1812.02256) and Acme's losses, their gradient stops, and the direction each dual moves."""

from __future__ import annotations

import math

import pytest
import torch
from torch import distributions as D

from rlloss import functional as rlf
from tests import reference

DTYPES = [torch.float32, torch.float64]


def naive_weights(q, temperature):
    """w_ij = exp(Q_ij / eta) / sum_k exp(Q_ik / eta), one state at a time."""
    num_samples, num_states = q.shape
    weights = torch.empty_like(q)
    for i in range(num_states):
        exps = [math.exp(float(q[j, i]) / temperature) for j in range(num_samples)]
        for j in range(num_samples):
            weights[j, i] = exps[j] / sum(exps)
    return weights


def naive_temperature_loss(q, temperature, epsilon):
    """eta (epsilon + mean_i log(1/N sum_j exp(Q_ij / eta))): the dual of eq. 9 (1806.06920)."""
    num_samples, num_states = q.shape
    total = 0.0
    for i in range(num_states):
        mean_exp = sum(math.exp(float(q[j, i]) / temperature) for j in range(num_samples))
        total += math.log(mean_exp / num_samples)
    return temperature * (epsilon + total / num_states)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(20, 7), (1, 3), (5, 1)])
@pytest.mark.parametrize("temperature", [0.1, 1.0, 25.0])
def test_weights_against_naive_softmax_over_samples(dtype, shape, temperature):
    q = (3 * torch.randn(shape, dtype=dtype)).requires_grad_()
    eta = torch.tensor(temperature, dtype=dtype, requires_grad=True)
    weights = rlf.mpo_weights(q, eta)
    assert weights.shape == shape and not weights.requires_grad
    torch.testing.assert_close(weights.sum(0), torch.ones(shape[1], dtype=dtype))
    torch.testing.assert_close(weights, naive_weights(q.detach(), temperature))


def test_weights_normalise_over_samples_not_states():
    q = torch.tensor([[0.0, 10.0], [1.0, 10.0]])  # state 1's samples are equal
    weights = rlf.mpo_weights(q, torch.tensor(1.0))
    torch.testing.assert_close(weights[:, 1], torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(weights[:, 0], torch.tensor([1.0, math.e]) / (1 + math.e))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature, epsilon", [(0.5, 0.1), (3.0, 0.01), (10.0, 1.0)])
def test_temperature_loss_against_naive_reference(dtype, temperature, epsilon):
    q = torch.randn(20, 6, dtype=dtype, requires_grad=True)
    eta = torch.tensor(temperature, dtype=dtype, requires_grad=True)
    loss = rlf.mpo_temperature_loss(q, eta, epsilon)
    assert loss.shape == (6,)
    expected = naive_temperature_loss(q.detach(), temperature, epsilon)
    assert float(loss.detach().mean()) == pytest.approx(expected, rel=1e-5)
    loss.mean().backward()
    assert q.grad is None  # only the temperature is trained by its dual


@pytest.mark.parametrize("spread", [0.01, 0.3, 3.0, 30.0])
def test_temperature_gradient_is_epsilon_minus_sample_kl(spread):
    """d/d eta of the dual = epsilon - sum_j w_j log(N w_j): eta grows (negative gradient) exactly
    when the E-step policy's KL from the target policy exceeds epsilon."""
    epsilon = 0.1
    q = spread * torch.randn(20, 8, dtype=torch.float64)
    eta = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    rlf.mpo_temperature_loss(q, eta, epsilon).mean().backward()
    weights = rlf.mpo_weights(q, eta)
    kl = (weights * torch.log(20 * weights)).sum(0).mean()
    torch.testing.assert_close(eta.grad, epsilon - kl)
    assert (eta.grad < 0) == (kl > epsilon)
    torch.testing.assert_close(rlf.mpo_sample_kl(weights).mean(), kl, rtol=1e-6, atol=1e-6)


def test_temperature_moves_the_right_way_under_gradient_descent():
    for spread, grows in ((10.0, True), (0.01, False)):
        parameter = torch.tensor(1.0, requires_grad=True)
        q = spread * torch.randn(20, 16)
        rlf.mpo_temperature_loss(q, rlf.dual_variable(parameter), 0.1).mean().backward()
        with torch.no_grad():
            parameter -= 0.1 * parameter.grad
        assert (float(parameter.detach()) > 1.0) == grows


def test_dual_variable_is_softplus_plus_epsilon():
    parameter = torch.tensor([-18.0, 0.0, 10.0, 100.0])
    expected = torch.log1p(torch.exp(parameter.double())).float() + 1e-8
    torch.testing.assert_close(rlf.dual_variable(parameter), expected)
    assert float(rlf.dual_variable(torch.tensor(-1e4))) > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoupled_kls_against_torch_distributions(dtype):
    target_loc, loc = torch.randn(2, 9, 3, dtype=dtype)
    target_scale, scale = torch.rand(2, 9, 3, dtype=dtype) + 0.1
    kl_mean, kl_stddev = rlf.decoupled_gaussian_kl(target_loc, target_scale, loc, scale)
    target = D.Normal(target_loc, target_scale)
    torch.testing.assert_close(kl_mean, D.kl_divergence(target, D.Normal(loc, target_scale)))
    torch.testing.assert_close(kl_stddev, D.kl_divergence(target, D.Normal(target_loc, scale)))
    torch.testing.assert_close(kl_mean, (loc - target_loc) ** 2 / (2 * target_scale**2))


def test_decoupled_kls_route_gradients_to_mean_and_scale_separately():
    target_loc, target_scale = torch.randn(4, 2), torch.rand(4, 2) + 0.1
    loc = torch.randn(4, 2, requires_grad=True)
    scale = (torch.rand(4, 2) + 0.1).requires_grad_()
    kl_mean, kl_stddev = rlf.decoupled_gaussian_kl(target_loc, target_scale, loc, scale)
    (grad_scale,) = torch.autograd.grad(kl_mean.sum(), scale, allow_unused=True)
    (grad_loc,) = torch.autograd.grad(kl_stddev.sum(), loc, allow_unused=True)
    assert grad_scale is None and grad_loc is None


def test_decoupled_kls_are_zero_for_identical_policies():
    loc, scale = torch.randn(5, 3), torch.rand(5, 3) + 0.2
    for kl in rlf.decoupled_gaussian_kl(loc, scale, loc.clone(), scale.clone()):
        torch.testing.assert_close(kl, torch.zeros(5, 3))


def test_kl_penalty_and_lagrange_dual_against_acme_formulas():
    kl = torch.rand(10, 3, requires_grad=True)
    alpha = (torch.rand(3) + 0.5).requires_grad_()
    epsilon = 0.05
    penalty = rlf.kl_penalty(kl, alpha)
    dual = rlf.lagrange_dual_loss(kl, alpha, epsilon)
    # Acme: loss_kl = sum_d sg(alpha_d) mean_i KL_id; loss_alpha = sum_d alpha_d (eps - sg(mean KL))
    mean_kl = kl.detach().mean(0)
    torch.testing.assert_close(penalty.mean(), (alpha.detach() * mean_kl).sum())
    torch.testing.assert_close(dual.mean(), (alpha.detach() * (epsilon - mean_kl)).sum())
    (alpha_grad_of_penalty,) = torch.autograd.grad(penalty.mean(), alpha, allow_unused=True)
    assert alpha_grad_of_penalty is None
    (kl_grad_of_dual,) = torch.autograd.grad(dual.mean(), kl, allow_unused=True)
    assert kl_grad_of_dual is None
    (alpha_grad,) = torch.autograd.grad(dual.mean(), alpha)
    torch.testing.assert_close(alpha_grad, epsilon - mean_kl)


@pytest.mark.parametrize("kl_value", [0.001, 0.2, 1.0])
def test_each_multiplier_grows_iff_its_kl_exceeds_epsilon(kl_value):
    epsilon = torch.tensor([0.01, 0.5])  # one bound per dimension
    kl = torch.full((4, 2), kl_value)
    parameter = torch.zeros(2, requires_grad=True)
    rlf.lagrange_dual_loss(kl, rlf.dual_variable(parameter), epsilon).mean().backward()
    with torch.no_grad():
        parameter -= 0.1 * parameter.grad  # a gradient-descent step
    assert bool(parameter[0] > 0) == (kl_value > 0.01)
    assert bool(parameter[1] > 0) == (kl_value > 0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_samples", [1, 20])
@pytest.mark.parametrize("shape", [(3,), (6, 2), (2, 3, 4)])
def test_gaussian_samples_are_one_seeded_randn_draw(shape, num_samples, dtype):
    """The same draws as ``loc + scale * randn(N, *loc.shape)`` with the same seed, and each
    the reparameterised sample ``loc + scale * eps`` of the reference."""
    loc, scale = torch.randn(shape, dtype=dtype), torch.rand(shape, dtype=dtype) + 0.1
    torch.manual_seed(7)
    samples = rlf.gaussian_samples(loc, scale, num_samples)
    torch.manual_seed(7)
    noise = torch.randn((num_samples, *loc.shape), dtype=loc.dtype, device=loc.device)
    assert samples.shape == (num_samples, *shape) and samples.dtype == dtype
    assert torch.equal(samples, loc + scale * noise)
    expected = reference.elementwise(
        reference.gaussian_sample, loc.expand_as(noise), scale.expand_as(noise), noise
    )
    torch.testing.assert_close(samples.double(), expected)


def test_gaussian_samples_have_the_requested_moments():
    torch.manual_seed(0)
    loc, scale = torch.tensor([-1.0, 0.0, 3.0]), torch.tensor([0.1, 1.0, 5.0])
    samples = rlf.gaussian_samples(loc, scale, 200_000)
    assert ((samples.mean(0) - loc) / scale).abs().max() < 0.01  # 4 standard errors
    torch.testing.assert_close(samples.std(0), scale, rtol=0.01, atol=0.0)


def test_gaussian_samples_are_reparameterised():
    loc = torch.randn(4, 2, requires_grad=True)
    scale = (torch.rand(4, 2) + 0.5).requires_grad_()
    torch.manual_seed(3)
    samples = rlf.gaussian_samples(loc, scale, 16)
    loc_grad, scale_grad = torch.autograd.grad(samples.sum(), (loc, scale))
    torch.testing.assert_close(loc_grad, torch.full_like(loc, 16.0))
    torch.testing.assert_close(scale_grad, ((samples - loc) / scale).detach().sum(0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weighted_log_likelihood_and_gaussian_log_prob(dtype):
    loc, scale = torch.randn(6, 2, dtype=dtype), torch.rand(6, 2, dtype=dtype) + 0.3
    actions = torch.randn(20, 6, 2, dtype=dtype)
    log_prob = rlf.gaussian_log_prob(actions, loc, scale)
    expected = D.Independent(D.Normal(loc, scale), 1).log_prob(actions)
    torch.testing.assert_close(log_prob, expected)
    weights = torch.softmax(torch.randn(20, 6, dtype=dtype), 0)
    loss = rlf.weighted_log_likelihood_loss(log_prob, weights)
    naive = [-sum(float(weights[j, i] * log_prob[j, i]) for j in range(20)) for i in range(6)]
    torch.testing.assert_close(loss, torch.tensor(naive, dtype=dtype))
    with pytest.raises(ValueError, match="shape"):
        rlf.weighted_log_likelihood_loss(log_prob, weights[:, :1])


def test_action_penalty_cost_is_zero_inside_and_minus_the_excess_norm_outside():
    action = torch.tensor([[0.5, -0.5], [1.5, 0.0], [3.0, -5.0]])
    cost = rlf.action_penalty_cost(action, -1.0, 1.0)
    torch.testing.assert_close(cost, torch.tensor([0.0, -0.5, -math.hypot(2.0, 4.0)]))
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    torch.testing.assert_close(
        rlf.action_penalty_cost(action, low, high), torch.tensor([-0.5, 0.0, -math.hypot(1.0, 5.0)])
    )


def naive_categorical(action_values, target_logits, temperature, epsilon):
    """q(a|s) ~ pi_target(a|s) exp(Q(s, a) / eta) and eta (eps + mean_s log sum_a pi exp(Q / eta))
    by explicit sums over actions."""
    num_states, num_actions = action_values.shape
    log_weights = torch.empty_like(action_values)
    total = 0.0
    for s in range(num_states):
        probs = torch.softmax(target_logits[s], -1)
        terms = [
            float(probs[a]) * math.exp(float(action_values[s, a]) / temperature)
            for a in range(num_actions)
        ]
        for a in range(num_actions):
            log_weights[s, a] = math.log(terms[a] / sum(terms))
        total += math.log(sum(terms))
    return log_weights, temperature * (epsilon + total / num_states)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [0.3, 4.0])
def test_categorical_e_step_against_enumerated_reference(dtype, temperature):
    action_values = torch.randn(7, 4, dtype=dtype, requires_grad=True)
    target_logits = torch.randn(7, 4, dtype=dtype, requires_grad=True)
    eta = torch.tensor(temperature, dtype=dtype, requires_grad=True)
    log_weights = rlf.categorical_mpo_log_weights(action_values, target_logits, eta)
    loss = rlf.categorical_mpo_temperature_loss(action_values, target_logits, eta, 0.1)
    expected_log_weights, expected_loss = naive_categorical(
        action_values.detach(), target_logits.detach(), temperature, 0.1
    )
    assert not log_weights.requires_grad
    torch.testing.assert_close(log_weights, expected_log_weights)
    assert float(loss.detach().mean()) == pytest.approx(expected_loss, rel=1e-5)
    loss.mean().backward()
    assert action_values.grad is None and target_logits.grad is None and eta.grad is not None


def test_categorical_temperature_loss_with_uniform_prior_is_the_sampled_one():
    action_values = torch.randn(5, 6, dtype=torch.float64)
    eta = torch.tensor(0.7, dtype=torch.float64)
    categorical = rlf.categorical_mpo_temperature_loss(
        action_values, torch.zeros(5, 6, dtype=torch.float64), eta, 0.2
    )
    torch.testing.assert_close(categorical, rlf.mpo_temperature_loss(action_values.T, eta, 0.2))
    log_weights = rlf.categorical_mpo_log_weights(
        action_values, torch.zeros_like(action_values), eta
    )
    torch.testing.assert_close(log_weights.exp(), rlf.mpo_weights(action_values.T, eta).T)


def test_categorical_cross_entropy():
    target_log_probs = torch.randn(3, 5).log_softmax(-1)
    logits = torch.randn(3, 5, requires_grad=True)
    loss = rlf.categorical_cross_entropy(target_log_probs, logits)
    expected = -(target_log_probs.exp() * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(loss, expected)
    # cross-entropy = entropy(p) + KL(p || pi): zero KL when pi = p
    entropy = rlf.categorical_entropy(target_log_probs)
    torch.testing.assert_close(
        rlf.categorical_cross_entropy(target_log_probs, target_log_probs), entropy
    )
