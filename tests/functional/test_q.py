"""Action-value targets against per-element loops written from the papers."""

from __future__ import annotations

import pytest
import torch

from rlloss.functional.q import (
    chosen_action_value,
    clipped_double_q_value,
    discrete_soft_value,
    double_q_value,
    greedy_value,
    smoothed_target_action,
    soft_value,
    temperature_loss,
)

SHAPES = [(7,), (3, 5)]


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
