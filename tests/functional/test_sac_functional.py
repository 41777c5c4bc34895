"""The tanh-Normal functions against torch.distributions' transformed distribution, and finite
at the action bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import distributions as D

from rlloss.functional.distributions import (
    _is_unit_box,
    normal_log_prob,
    sampled_normal_log_prob,
    squash,
    squash_log_abs_det_jacobian,
    tanh_normal_log_prob,
    tanh_normal_sample_and_log_prob,
)


def reference(loc, scale, low, high):
    """torch's tanh-Normal: Normal over u, TanhTransform then AffineTransform, event dim 1."""
    transforms = [D.TanhTransform(), D.AffineTransform((high + low) / 2, (high - low) / 2)]
    return D.Independent(D.TransformedDistribution(D.Normal(loc, scale), transforms), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bounds", [(-1.0, 1.0), (-2.0, 0.5), "tensor"])
def test_log_prob_matches_torch_transformed_distribution(dtype, bounds):
    loc = torch.randn(6, 3, dtype=dtype)
    scale = torch.rand(6, 3, dtype=dtype) + 0.2
    if bounds == "tensor":
        low, high = (
            torch.tensor([-1.0, -3.0, 0.0], dtype=dtype),
            torch.tensor([1.0, 2.0, 4.0], dtype=dtype),
        )
    else:
        low, high = bounds
    preimage = loc + scale * torch.randn_like(loc).clamp(-2, 2)
    action = squash(preimage, low, high)
    expected = reference(loc, scale, low, high).log_prob(action)
    got = tanh_normal_log_prob(preimage, loc, scale, low, high)
    assert got.shape == (6,)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_jacobian_equals_log_derivative_of_squash():
    u = torch.linspace(-4, 4, 17, dtype=torch.float64, requires_grad=True)
    (derivative,) = torch.autograd.grad(squash(u, -2.0, 3.0).sum(), u)
    torch.testing.assert_close(squash_log_abs_det_jacobian(u.detach(), -2.0, 3.0), derivative.log())


def test_sample_is_reparameterised_and_uses_the_normal_rsample_stream():
    loc = torch.randn(5, 2, requires_grad=True)
    scale = (torch.rand(5, 2) + 0.1).requires_grad_()
    torch.manual_seed(3)
    action, log_prob = tanh_normal_sample_and_log_prob(loc, scale, -1.0, 1.0)
    torch.manual_seed(3)
    base = D.Normal(loc, scale).rsample()
    torch.testing.assert_close(action, torch.tanh(base))
    torch.testing.assert_close(
        log_prob, reference(loc, scale, -1.0, 1.0).log_prob(action), rtol=1e-4, atol=1e-4
    )
    (action.sum() + log_prob.sum()).backward()
    assert loc.grad is not None and scale.grad is not None


def test_finite_at_the_bounds():
    loc = torch.tensor([[30.0, -30.0], [0.0, 15.0]], requires_grad=True)
    scale = torch.full((2, 2), 0.1, requires_grad=True)
    action, log_prob = tanh_normal_sample_and_log_prob(loc, scale)
    assert action.abs()[0].eq(1.0).all()  # saturated to exactly +-1 in float32
    assert torch.isfinite(log_prob).all()
    log_prob.sum().backward()
    assert torch.isfinite(loc.grad).all() and torch.isfinite(scale.grad).all()
    # torch's path inverts the saturated action: infinite pre-image, non-finite log-prob.
    assert not torch.isfinite(reference(loc, scale, -1.0, 1.0).log_prob(action.detach())).all()


def naive_normal_log_density(u: float, loc: float, scale: float) -> float:
    """The Gaussian's log-density from its definition, one scalar at a time."""
    return math.log(math.exp(-((u - loc) ** 2) / (2 * scale**2)) / (scale * math.sqrt(2 * math.pi)))


def test_sampled_normal_log_prob_matches_naive_density_at_the_draw():
    loc = torch.randn(4, 3, dtype=torch.float64)
    scale = torch.rand(4, 3, dtype=torch.float64) + 0.1
    noise = torch.randn(4, 3, dtype=torch.float64)
    got = sampled_normal_log_prob(noise, scale)
    u = loc + scale * noise
    expected = torch.tensor(
        [
            [naive_normal_log_density(*(float(x[i, j]) for x in (u, loc, scale))) for j in range(3)]
            for i in range(4)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_sampled_normal_log_prob_has_the_gradients_of_the_density_at_the_draw():
    """Through ``u = loc + scale * noise``: loc's gradient cancels in the density at ``u``, and
    scale's is ``-1 / scale``; the shortcut gives the same."""
    noise = torch.randn(5, 2, dtype=torch.float64)
    grads = []
    for shortcut in (False, True):
        loc = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        scale = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        loc, scale = loc.requires_grad_(), (scale + 0.1).requires_grad_()
        if shortcut:
            value = sampled_normal_log_prob(noise, scale)
        else:
            value = normal_log_prob(loc + scale * noise, loc, scale)
        grads.append(torch.autograd.grad(value.sum(), (loc, scale), allow_unused=True))
    (loc_full, scale_full), (loc_short, scale_short) = grads
    torch.testing.assert_close(loc_full, torch.zeros_like(loc_full))
    assert loc_short is None  # no path from loc: the same zero gradient
    torch.testing.assert_close(scale_short, scale_full)


def test_unit_box_is_the_bounded_formula_exactly():
    """Float bounds -1 and 1 skip the affine map and ``log((high - low) / 2)``: bit-identical to
    the same bounds given as tensors (the general path)."""
    u = torch.randn(64, 3) * 4
    low, high = torch.full((3,), -1.0), torch.full((3,), 1.0)
    assert torch.equal(squash(u, -1.0, 1.0), squash(u, low, high))
    assert torch.equal(squash(u, -1.0, 1.0), torch.tanh(u))
    assert torch.equal(
        squash_log_abs_det_jacobian(u, -1.0, 1.0), squash_log_abs_det_jacobian(u, low, high)
    )
    assert torch.equal(squash(u, -1, 1), torch.tanh(u))  # integers are numbers too
    assert not _is_unit_box(low, high)  # tensors are never read (no sync)
    assert not _is_unit_box(np.full(3, -1.0), np.ones(3))  # nor arrays (no elementwise truth)
    assert not _is_unit_box(-1.0, 2.0) and not _is_unit_box(-2.0, 1.0)


def test_unit_box_sample_equals_tensor_bounds_sample():
    loc = torch.randn(8, 3, requires_grad=True)
    scale = (torch.rand(8, 3) + 0.1).requires_grad_()
    out = []
    for low, high in ((-1.0, 1.0), (torch.full((3,), -1.0), torch.ones(3))):
        torch.manual_seed(5)
        action, log_prob = tanh_normal_sample_and_log_prob(loc, scale, low, high)
        grads = torch.autograd.grad((action.sum() + log_prob.sum()), (loc, scale))
        out.append((action, log_prob, *grads))
    for unit, general in zip(*out, strict=True):
        torch.testing.assert_close(unit, general, rtol=0, atol=0)
