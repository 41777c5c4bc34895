"""CQL's functional pieces against loops written from the paper (Kumar et al., arXiv:2006.04779):
the importance-sampled soft maximum, the max-backup, the uniform proposal, the BC actor loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlloss.functional import (
    cql_penalty,
    lagrange_dual_loss,
    max_backup_value,
    soft_behavior_cloning_loss,
    uniform_sample_and_log_prob,
)

DTYPES = [torch.float32, torch.float64]


def naive_soft_maximum(values, log_densities, temperature):
    """``T log sum_k exp((Q_k - log q_k) / T)`` for one state, as written (no max-shift)."""
    return temperature * math.log(
        sum(math.exp((q - lq) / temperature) for q, lq in zip(values, log_densities, strict=True))
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
@pytest.mark.parametrize("batch", [(6,), (2, 3)])
def test_importance_sampled_penalty_against_a_loop(dtype, temperature, batch):
    samples = 7
    values = torch.randn(*batch, samples, dtype=dtype)
    log_densities = torch.randn(*batch, samples, dtype=dtype)
    chosen = torch.randn(*batch, 1, dtype=dtype)
    penalty = cql_penalty(values, chosen, log_densities, temperature)
    assert penalty.shape == (*batch, 1)
    flat_values, flat_logq = values.reshape(-1, samples), log_densities.reshape(-1, samples)
    expected = torch.tensor(
        [
            naive_soft_maximum(v.tolist(), lq.tolist(), temperature) - float(c)
            for v, lq, c in zip(flat_values, flat_logq, chosen.reshape(-1), strict=True)
        ],
        dtype=dtype,
    ).reshape(*batch, 1)
    torch.testing.assert_close(penalty, expected)


def test_penalty_identities():
    values, chosen = torch.randn(5, 4), torch.randn(5, 1)
    # the discrete penalty is the continuous one with a flat log-density of 0 and T = 1
    torch.testing.assert_close(
        cql_penalty(values, chosen), cql_penalty(values, chosen, torch.zeros(5, 4), 1.0)
    )
    # T = 1 given as a tensor (the scaled expression) equals the unscaled one
    torch.testing.assert_close(
        cql_penalty(values, chosen, temperature=torch.tensor(1.0)), cql_penalty(values, chosen)
    )
    # the log-sum-exp is a soft maximum: T -> 0 gives the maximum
    torch.testing.assert_close(
        cql_penalty(values, chosen, temperature=1e-3),
        values.max(-1, keepdim=True).values - chosen,
        atol=1e-2,
        rtol=0,
    )
    # an ensemble dim broadcasts against shared log-densities
    ensemble = torch.randn(3, 5, 4)
    shared = cql_penalty(ensemble, torch.zeros(3, 5, 1), torch.full((5, 4), 0.3), 2.0)
    for i in range(3):
        torch.testing.assert_close(shared[i], cql_penalty(ensemble[i], torch.zeros(5, 1), 0.3, 2.0))


def test_penalty_gradient_pushes_sampled_values_down_and_the_data_value_up():
    values = torch.randn(4, 6, requires_grad=True)
    chosen = torch.randn(4, 1, requires_grad=True)
    cql_penalty(values, chosen, torch.randn(4, 6), 2.0).sum().backward()
    assert (values.grad > 0).all() and (chosen.grad == -1).all()
    torch.testing.assert_close(values.grad.sum(-1), torch.ones(4))  # softmax weights


def test_max_backup_is_min_over_networks_of_max_over_samples():
    values = torch.randn(3, 5, 4, 1)
    expected = torch.tensor(
        [
            [min(max(values[i, b, k, 0].item() for k in range(4)) for i in range(3))]
            for b in range(5)
        ]
    )
    torch.testing.assert_close(max_backup_value(values), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_samples_cover_the_box_with_the_right_density(dtype):
    low, high = torch.tensor([-2.0, 0.0, -1.0]), torch.tensor([0.5, 3.0, 1.0])
    action, log_density = uniform_sample_and_log_prob(low, high, (400, 3), dtype, "cpu")
    assert action.shape == (400, 3) and action.dtype == dtype
    assert ((action >= low.to(dtype)) & (action <= high.to(dtype))).all()
    assert log_density.shape == (400,)
    torch.testing.assert_close(log_density, torch.full((400,), -math.log(15.0), dtype=dtype))
    # scalar bounds: the density of [-1, 1]^D, and TorchRL's random stream
    torch.manual_seed(0)
    action, log_density = uniform_sample_and_log_prob(-1.0, 1.0, (6, 4), torch.float32, "cpu")
    torch.manual_seed(0)
    torch.testing.assert_close(action, torch.empty(6, 4).uniform_(-1, 1), rtol=0, atol=0)
    torch.testing.assert_close(log_density, torch.full((6,), 4 * math.log(0.5)))


def test_soft_behavior_cloning_and_the_lagrange_dual():
    log_prob, data_log_prob = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(
        soft_behavior_cloning_loss(log_prob, data_log_prob, 0.3), 0.3 * log_prob - data_log_prob
    )
    with pytest.raises(ValueError, match=r"\(5,\).*\(4,\)"):
        soft_behavior_cloning_loss(log_prob, data_log_prob[:4], 0.3)
    # the dual loss grows alpha' while the penalty exceeds the threshold, and only alpha'
    penalty = torch.tensor([[3.0], [5.0]], requires_grad=True)
    log_alpha_prime = torch.zeros((), requires_grad=True)
    lagrange_dual_loss(penalty, log_alpha_prime.exp(), 2.0).mean().backward()
    assert log_alpha_prime.grad < 0 and penalty.grad is None
