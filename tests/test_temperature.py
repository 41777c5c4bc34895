"""The soft actor-critic temperature's functions (``rlloss.offpolicy.temperature``), shared by
the continuous SAC losses and ``DiscreteSACLoss``, against plain references."""

from __future__ import annotations

import math

import pytest
import torch

from rlloss.offpolicy.temperature import (
    OUT_KEYS,
    log_temperatures,
    projected_alpha,
    soft_outputs,
    zero_where_done,
)


@pytest.mark.parametrize(
    ("alpha", "low", "high", "expected"),
    [(5.0, 0.1, 2.0, 2.0), (0.01, 0.1, 2.0, 0.1), (0.5, 0.1, 2.0, 0.5), (7.0, None, None, 7.0)],
)
def test_projected_alpha_clamps_log_alpha_in_place(alpha, low, high, expected):
    log_alpha = torch.nn.Parameter(torch.tensor(math.log(alpha)))
    bounds = [None if b is None else torch.tensor(math.log(b)) for b in (low, high)]
    value = projected_alpha(log_alpha, *bounds)
    torch.testing.assert_close(value, torch.tensor(expected))
    torch.testing.assert_close(log_alpha.detach(), torch.tensor(math.log(expected)))
    assert not value.requires_grad


def test_zero_where_done_matches_a_loop():
    value = torch.randn(4, 3, 2)
    done = torch.tensor([[True, False, False], [False, False, True]] * 2)
    expected = value.clone()
    for i in range(4):
        for j in range(3):
            if done[i, j]:
                expected[i, j] = 0.0
    torch.testing.assert_close(zero_where_done(value, done), expected)


def test_log_temperatures_are_logs_and_bounds_are_checked():
    assert log_temperatures(2.0, 0.5, None) == (math.log(2.0), math.log(0.5), None)
    with pytest.raises(ValueError, match="max_alpha"):
        log_temperatures(1.0, 0.5, 0.1)
    with pytest.raises(ValueError, match="alpha_init"):
        log_temperatures(0.0, None, None)


@pytest.mark.parametrize("mode", ["exclude", "non_tensor"])
def test_soft_outputs_per_sample_and_reduced(mode):
    log_alpha, log_prob = torch.tensor(math.log(0.3)), torch.randn(5)
    losses = {name: torch.randn(5) for name in OUT_KEYS[:3]}
    out = soft_outputs(losses, log_alpha, log_prob, "none", mode, torch.Size([5]))
    assert out.batch_size == torch.Size([5])
    assert ("alpha" in out.keys()) == (mode == "non_tensor")
    if mode == "non_tensor":
        torch.testing.assert_close(out["alpha"], torch.tensor(0.3))
        torch.testing.assert_close(out["entropy"], -log_prob.mean())
    reduced = {name: loss.mean() for name, loss in losses.items()}
    out = soft_outputs(reduced, log_alpha, log_prob, "mean", mode, torch.Size([5]))
    assert set(out.keys()) == set(OUT_KEYS)
    torch.testing.assert_close(out["entropy"], -log_prob.mean())
