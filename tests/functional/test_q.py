"""Action-value targets against per-element loops written from the papers."""

from __future__ import annotations

import math

import pytest
import torch

from rlloss.functional.q import (
    alpha_temperature_loss,
    categorical_entropy,
    categorical_projection,
    chosen_action_value,
    clipped_double_q_value,
    discrete_soft_value,
    double_q_value,
    expected_action_value,
    greedy_value,
    smoothed_target_action,
    soft_value,
    straight_through_clamp,
    temperature_loss,
)
from tests import reference

SHAPES = [(7,), (3, 5)]
DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}


@pytest.mark.parametrize("batch", SHAPES)
def test_chosen_action_value_for_index_and_one_hot_actions(batch):
    q = torch.randn(*batch, 4)
    index = torch.randint(0, 4, batch)
    expected = torch.empty(*batch, 1)
    for position in torch.cartesian_prod(*[torch.arange(n) for n in batch]).reshape(-1, len(batch)):
        position = tuple(position.tolist())
        expected[position] = q[position][index[position]]
    torch.testing.assert_close(chosen_action_value(q, index), expected)
    torch.testing.assert_close(chosen_action_value(q, index.unsqueeze(-1)), expected)
    one_hot = torch.nn.functional.one_hot(index, 4)
    torch.testing.assert_close(chosen_action_value(q, one_hot.float()), expected)
    torch.testing.assert_close(chosen_action_value(q, one_hot.bool()), expected)


def test_greedy_and_double_q_values():
    online, target = torch.randn(6, 5), torch.randn(6, 5)
    for row in range(6):
        assert greedy_value(target)[row, 0] == max(target[row].tolist())
        assert double_q_value(online, target)[row, 0] == target[row, int(online[row].argmax())]
    # with identical networks, double Q-learning is Q-learning
    torch.testing.assert_close(double_q_value(target, target), greedy_value(target))
    with pytest.raises(ValueError, match=r"\(6, 5\).*\(6, 4\)"):
        double_q_value(online, target[:, :4])


def test_clipped_double_q_is_the_ensemble_minimum():
    ensemble = torch.randn(3, 8, 1)
    expected = torch.tensor([[min(ensemble[i, b, 0].item() for i in range(3))] for b in range(8)])
    torch.testing.assert_close(clipped_double_q_value(ensemble), expected)


def test_smoothed_target_action_bounds():
    action = torch.rand(20_000, 2) * 2 - 1
    smoothed = smoothed_target_action(action, 0.5, 0.3, -1.0, 1.0)
    assert smoothed.min() >= -1 and smoothed.max() <= 1
    inside = (smoothed > -1) & (smoothed < 1)
    assert (smoothed - action)[inside].abs().max() <= 0.3 + 1e-6
    assert (smoothed - action)[inside].abs().max() > 0.29  # the clip is reached
    torch.testing.assert_close(
        smoothed_target_action(action * 2, 0.0, 0.3, -1.0, 1.0), (action * 2).clamp(-1, 1)
    )
    low, high = torch.tensor([-1.0, -0.5]), torch.tensor([1.0, 0.5])
    per_dimension = smoothed_target_action(action, 0.5, 0.3, low, high)
    assert (per_dimension[:, 1].abs() <= 0.5).all()


def test_soft_values():
    value, log_prob = torch.randn(5, 1), torch.randn(5)
    torch.testing.assert_close(soft_value(value, log_prob, 0.2), value - 0.2 * log_prob[:, None])
    q = torch.randn(5, 3)
    logits = torch.randn(5, 3)
    logits[0, 1] = -torch.inf  # an impossible action
    log_probs = logits.log_softmax(-1)
    expected = torch.tensor(
        [
            [
                sum(
                    log_probs[b, a].exp() * (q[b, a] - 0.2 * log_probs[b, a])
                    for a in range(3)
                    if log_probs[b, a] > -torch.inf
                )
            ]
            for b in range(5)
        ]
    )
    torch.testing.assert_close(discrete_soft_value(q, log_probs, 0.2), expected)
    logits.requires_grad_(True)
    discrete_soft_value(q, logits.log_softmax(-1), 0.2).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_temperature_loss_gradient_reaches_only_log_alpha():
    log_alpha = torch.tensor(0.3, requires_grad=True)
    log_prob = torch.randn(6, requires_grad=True)
    loss = temperature_loss(log_alpha, log_prob, -2.0)
    torch.testing.assert_close(loss, -0.3 * (log_prob.detach() - 2.0))
    loss.mean().backward()
    assert log_prob.grad is None
    torch.testing.assert_close(log_alpha.grad, -(log_prob.detach() - 2.0).mean())


# --------------------------------------------------------------------------- categorical entropy


def masked_logits(shape, dtype, seed=0):
    """Logits of spread 2 with every third action of the flattened batch impossible (never all
    of a row, as long as the rows have at least two actions)."""
    logits = 2 * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    if shape[-1] > 1:
        logits.view(-1)[::3] = -torch.inf
    return logits


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("actions", [1, 2, 6])
@pytest.mark.parametrize("batch", [(1,), *SHAPES, (2, 3, 4)])
def test_categorical_entropy_matches_reference(batch, actions, dtype):
    log_probs = masked_logits((*batch, actions), dtype).log_softmax(-1)
    actual = categorical_entropy(log_probs)
    assert actual.shape == batch and actual.dtype == dtype
    expected = reference.per_row(reference.categorical_entropy, log_probs)
    torch.testing.assert_close(actual.double(), expected, **TOLERANCE[dtype])


def test_categorical_entropy_of_finite_log_probs_is_the_plain_formula():
    log_probs = (3 * torch.randn(64, 7, dtype=torch.float64)).log_softmax(-1)
    naive = -(log_probs.exp() * log_probs).sum(-1)
    torch.testing.assert_close(categorical_entropy(log_probs), naive, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("actions", [1, 2, 5, 100])
def test_uniform_policy_has_entropy_log_num_actions(actions):
    log_probs = torch.zeros(3, actions, dtype=torch.float64).log_softmax(-1)
    expected = torch.full((3,), math.log(actions), dtype=torch.float64)
    torch.testing.assert_close(categorical_entropy(log_probs), expected)


def test_impossible_action_gives_entropy_of_the_rest_and_finite_gradients():
    """A masked action (logit -inf) is as if it were not there, in value and in gradient."""
    rest = torch.randn(4, 3, dtype=torch.float64)
    logits = torch.cat(
        [rest[:, :1], torch.full((4, 1), -torch.inf, dtype=torch.float64), rest[:, 1:]], -1
    )
    logits.requires_grad_()
    entropy = categorical_entropy(logits.log_softmax(-1))
    rest.requires_grad_()
    expected = categorical_entropy(rest.log_softmax(-1))
    torch.testing.assert_close(entropy, expected)
    entropy.sum().backward()
    expected.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[:, 1].eq(0).all()
    torch.testing.assert_close(logits.grad[:, [0, 2, 3]], rest.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_categorical_entropy_gradient_is_that_of_the_plain_formula(dtype):
    logits = torch.randn(5, 4, dtype=dtype, requires_grad=True)
    (grad,) = torch.autograd.grad(categorical_entropy(logits.log_softmax(-1)).sum(), logits)
    log_probs = logits.log_softmax(-1)
    (naive,) = torch.autograd.grad(-(log_probs.exp() * log_probs).sum(), logits)
    torch.testing.assert_close(grad, naive)


def naive_projection(atoms, probs, support):
    """Bellemare et al. (arXiv:1707.06887), Algorithm 1, one atom at a time."""
    v_min, v_max, k = float(support[0]), float(support[-1]), len(support)
    delta = (v_max - v_min) / (k - 1)
    m = [0.0] * k
    for a, p in zip(atoms.tolist(), probs.tolist(), strict=True):
        tz = min(max(a, v_min), v_max)
        b = (tz - v_min) / delta
        low, up = math.floor(b), math.ceil(b)
        if low == up:  # b lands on an atom: all the mass there
            m[low] += p
        else:
            m[low] += p * (up - b)
            m[up] += p * (b - low)
    return torch.tensor(m, dtype=probs.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_categorical_projection_matches_algorithm_1(dtype):
    torch.manual_seed(0)
    support = torch.linspace(-2.0, 3.0, 11, dtype=dtype)
    probs = torch.randn(6, 7, dtype=dtype).softmax(-1)
    atoms = 4 * torch.randn(6, 7, dtype=dtype)  # many outside [-2, 3]: clamped
    atoms[0] = support[torch.tensor([0, 2, 3, 5, 7, 9, 10])]  # exactly on atoms (b integer)
    atoms[1, :2] = torch.tensor([-1e9, 1e9], dtype=dtype)
    projected = categorical_projection(atoms, probs, support)
    expected = torch.stack(
        [naive_projection(a, p, support) for a, p in zip(atoms, probs, strict=True)]
    )
    torch.testing.assert_close(projected, expected, **TOLERANCE[dtype])
    torch.testing.assert_close(projected.sum(-1), probs.sum(-1), **TOLERANCE[dtype])


def test_categorical_projection_of_the_support_itself_is_the_identity():
    support = torch.linspace(0.0, 10.0, 51)
    probs = torch.randn(4, 51).softmax(-1)
    projected = categorical_projection(support.expand(4, 51), probs, support)
    torch.testing.assert_close(projected, probs)


def test_expected_action_value_is_the_mean_return_per_action():
    support = torch.linspace(-1.0, 4.0, 6)
    log_probs = torch.randn(5, 6, 3).log_softmax(-2)
    expected = torch.empty(5, 3)
    for i in range(5):
        for a in range(3):
            expected[i, a] = sum(support[j] * log_probs[i, j, a].exp() for j in range(6))
    torch.testing.assert_close(expected_action_value(log_probs, support), expected)


def test_alpha_temperature_loss_is_eq_18_in_alpha():
    """``-alpha (log pi + H)`` elementwise, gradient to alpha only; in ``log alpha`` its
    gradient is ``alpha`` times that of the log-alpha form (:func:`temperature_loss`)."""
    log_alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    log_prob = torch.randn(7, dtype=torch.float64, requires_grad=True)
    loss = alpha_temperature_loss(log_alpha.exp(), log_prob, -2.0)
    expected = [-math.exp(0.3) * (lp - 2.0) for lp in log_prob.tolist()]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    (grad_alpha_form,) = torch.autograd.grad(loss.sum(), log_alpha)
    (grad_log_form,) = torch.autograd.grad(
        temperature_loss(log_alpha, log_prob, -2.0).sum(), log_alpha
    )
    torch.testing.assert_close(grad_alpha_form, math.exp(0.3) * grad_log_form)
    fresh = alpha_temperature_loss(log_alpha.exp(), log_prob, -2.0).sum()
    assert torch.autograd.grad(fresh, log_prob, allow_unused=True) == (None,)


def test_straight_through_clamp_has_the_clamped_value_and_the_identity_gradient():
    x = torch.tensor([-3.0, -0.5, 0.2, 4.0], requires_grad=True)
    low, high = torch.tensor(-1.0), torch.tensor(1.0)
    clamped = straight_through_clamp(x, low, high)
    assert torch.equal(clamped, x.detach().clamp(-1.0, 1.0))  # exactly, not up to rounding
    clamped.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(4))
    assert torch.equal(straight_through_clamp(x, None, 0.0), x.detach().clamp_max(0.0))
