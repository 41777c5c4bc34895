"""rlloss.functional.world_models against the loop references written from the DreamerV3 and PILCO
papers, identities, gradient stops and TorchRL's functions."""

from __future__ import annotations

import pytest
import torch
from torchrl.modules.models import model_based as torchrl_model_based
from torchrl.objectives import dreamer_v3 as torchrl_dreamer_v3

from rlloss import functional as rlf
from tests import reference

SHAPES = [(1,), (7,), (3, 5), (2, 3, 4)]
BIN_COUNTS = [2, 3, 8, 41, 255, 256]


def randn(*shape, seed=0, dtype=torch.float64, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(shape, generator=generator, dtype=dtype)


# ----------------------------------------------------------------------------- symlog


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [0.1, 1.0, 100.0])
def test_symlog_symexp_match_the_reference(shape, scale):
    x = randn(*shape, scale=scale)
    torch.testing.assert_close(rlf.symlog(x), reference.elementwise(reference.symlog, x))
    torch.testing.assert_close(
        rlf.symexp(x / scale), reference.elementwise(reference.symexp, x / scale)
    )


def test_symlog_and_symexp_are_inverse_and_odd():
    x = torch.linspace(-1e4, 1e4, 1001, dtype=torch.float64)
    torch.testing.assert_close(rlf.symexp(rlf.symlog(x)), x)
    torch.testing.assert_close(rlf.symlog(-x), -rlf.symlog(x))
    small = torch.tensor([1e-6, -1e-6], dtype=torch.float64)
    torch.testing.assert_close(rlf.symlog(small), small, rtol=1e-5, atol=0)  # identity near 0


def test_symlog_squared_error_refuses_broadcasting():
    rlf.symlog_squared_error(torch.ones(3, 1), torch.ones(3, 1))
    with pytest.raises(ValueError, match="shape mismatch"):
        rlf.symlog_squared_error(torch.ones(3, 1), torch.ones(3))


# ----------------------------------------------------------------------------- two-hot


@pytest.mark.parametrize("num_bins", BIN_COUNTS)
def test_symexp_bins_are_torchrls_support(num_bins):
    ours = rlf.symexp_bins(num_bins, dtype=torch.float64)
    theirs = torchrl_model_based._default_bins(num_bins, dtype=torch.float64)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours, -ours.flip(0), rtol=0, atol=0)  # antisymmetric
    assert (ours.diff() > 0).all()


def test_symexp_bins_refuses_a_single_bin():
    with pytest.raises(ValueError, match="num_bins"):
        rlf.symexp_bins(1)


@pytest.mark.parametrize("num_bins", [3, 8, 255])
@pytest.mark.parametrize("shape", SHAPES)
def test_two_hot_encode_matches_the_reference(num_bins, shape):
    bins = rlf.symexp_bins(num_bins, dtype=torch.float64)
    x = randn(*shape, scale=30.0)
    x.view(-1)[0] = bins[-1] * 2  # beyond the support: saturates
    if x.numel() > 1:
        x.view(-1)[1] = bins[1]  # exactly on a bin
    expected = torch.tensor(
        [reference.two_hot(v, bins.tolist()) for v in x.reshape(-1).tolist()], dtype=torch.float64
    ).reshape(*shape, num_bins)
    encoded = rlf.two_hot_encode(x, bins)
    torch.testing.assert_close(encoded, expected)
    torch.testing.assert_close(encoded.sum(-1), torch.ones(shape, dtype=torch.float64))
    inside = x.abs() <= bins[-1]
    torch.testing.assert_close((encoded @ bins)[inside], x[inside])  # interpolation is exact


@pytest.mark.parametrize("num_bins", [3, 8, 255])
def test_two_hot_cross_entropy_matches_the_reference_and_torchrl(num_bins):
    bins = rlf.symexp_bins(num_bins, dtype=torch.float64)
    logits, target = randn(6, num_bins, seed=1), randn(6, 1, seed=2, scale=50.0)
    ours = rlf.two_hot_cross_entropy(logits, target, bins)
    expected = torch.tensor(
        [
            reference.two_hot_cross_entropy(row, y, bins.tolist())
            for row, y in zip(logits.tolist(), target.squeeze(-1).tolist(), strict=True)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(ours, torchrl_dreamer_v3.two_hot_cross_entropy(logits, target, bins))


def test_two_hot_cross_entropy_has_no_gradient_to_the_target_and_checks_shapes():
    bins = rlf.symexp_bins(5)
    logits, target = torch.randn(4, 5, requires_grad=True), torch.randn(4, requires_grad=True)
    rlf.two_hot_cross_entropy(logits, target, bins).sum().backward()
    assert target.grad is None and logits.grad is not None
    with pytest.raises(ValueError, match="two-hot targets must have shape"):
        rlf.two_hot_cross_entropy(logits, torch.randn(4, 2), bins)
    with pytest.raises(ValueError, match="1-D ascending support"):
        rlf.two_hot_encode(torch.randn(3), torch.ones(2, 2))


def test_two_hot_decode_inverts_the_encoding():
    bins = rlf.symexp_bins(255, dtype=torch.float64)
    x = randn(50, scale=100.0)
    logits = (rlf.two_hot_encode(x, bins) + 1e-300).log()
    torch.testing.assert_close(rlf.two_hot_decode(logits, bins), x)
    uniform = torch.zeros(3, 255, dtype=torch.float64)
    torch.testing.assert_close(
        rlf.two_hot_decode(uniform, bins), torch.zeros(3, dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="must match"):
        rlf.two_hot_decode(torch.zeros(3, 4), bins)


# ----------------------------------------------------------------------------- KL balancing


def _kl_reference(posterior_logits, prior_logits, unimix):
    """``KL(posterior || prior)`` per categorical, from the reference's probabilities."""
    rows = zip(
        posterior_logits.reshape(-1, posterior_logits.shape[-1]).tolist(),
        prior_logits.reshape(-1, prior_logits.shape[-1]).tolist(),
        strict=True,
    )
    values = [
        reference.categorical_kl_probs(
            reference.mixed_categorical(q, unimix), reference.mixed_categorical(p, unimix)
        )
        for q, p in rows
    ]
    return torch.tensor(values, dtype=torch.float64).reshape(posterior_logits.shape[:-1])


@pytest.mark.parametrize("unimix", [0.0, 0.01, 0.3])
@pytest.mark.parametrize("shape", [(1, 2, 3), (4, 3, 5), (2, 3, 4, 8)])
def test_dynamics_and_representation_kl_match_the_reference(unimix, shape):
    posterior, prior = randn(*shape, seed=3, scale=3.0), randn(*shape, seed=4, scale=3.0)
    dynamics, representation = rlf.dynamics_and_representation_kl(posterior, prior, unimix)
    expected = _kl_reference(posterior, prior, unimix)
    torch.testing.assert_close(dynamics, expected)
    torch.testing.assert_close(representation, expected)


def test_kl_terms_stop_the_gradient_of_the_other_side():
    posterior = torch.randn(4, 3, 5, requires_grad=True)
    prior = torch.randn(4, 3, 5, requires_grad=True)
    dynamics, representation = rlf.dynamics_and_representation_kl(posterior, prior, 0.01)
    (gpost, gprior) = torch.autograd.grad(dynamics.sum(), (posterior, prior), allow_unused=True)
    assert gpost is None and gprior.abs().sum() > 0
    (gpost, gprior) = torch.autograd.grad(
        representation.sum(), (posterior, prior), allow_unused=True
    )
    assert gprior is None and gpost.abs().sum() > 0


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("threshold", [0.0, 0.1, 1.0, 100.0])
def test_balanced_kl_matches_the_reference_and_torchrl(alpha, threshold):
    posterior, prior = randn(5, 4, 6, seed=5, scale=2.0), randn(5, 4, 6, seed=6, scale=2.0)
    ours = rlf.balanced_kl(posterior, prior, alpha, threshold)
    kl = _kl_reference(posterior, prior, 0.0).clamp_min(threshold)
    torch.testing.assert_close(ours, kl)  # both terms have the KL's value
    theirs = torchrl_dreamer_v3.categorical_kl_balanced(posterior, prior, alpha, threshold)
    torch.testing.assert_close(ours.mean(), theirs)


def test_free_bits_stop_the_gradient_below_the_threshold():
    kl = torch.tensor([0.5, 2.0], requires_grad=True)
    rlf.free_bits(kl, 1.0).sum().backward()
    torch.testing.assert_close(kl.grad, torch.tensor([0.0, 1.0]))


def test_separate_terms_match_torchrls_categorical_kl_terms():
    posterior, prior = randn(3, 4, 2, 5, seed=7), randn(3, 4, 2, 5, seed=8)
    dynamics, representation = rlf.dynamics_and_representation_kl(posterior, prior, 0.01)
    ours = (
        rlf.free_bits(dynamics.sum(-1), 1.0).mean(),
        rlf.free_bits(representation.sum(-1), 1.0).mean(),
    )
    theirs = torchrl_dreamer_v3.categorical_kl_terms(posterior, prior, 1.0, 0.01)
    torch.testing.assert_close(ours, theirs)


# ----------------------------------------------------------------------------- returns


@pytest.mark.parametrize("horizon", [1, 2, 5, 15])
@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.0, 0.5)])
@pytest.mark.parametrize("with_continuation", [False, True])
def test_imagined_lambda_return_matches_the_reference(horizon, gamma, lmbda, with_continuation):
    reward, next_value = randn(4, horizon, 1, seed=9), randn(4, horizon, 1, seed=10)
    continuation = torch.rand(4, horizon, 1, dtype=torch.float64) if with_continuation else None
    ours = rlf.imagined_lambda_return(reward, next_value, continuation, gamma, lmbda)
    ones = torch.ones_like(reward) if continuation is None else continuation
    expected = reference.per_sequence(
        lambda r, v, c: reference.lambda_return_imagined(r, v, c, gamma, lmbda),
        reward,
        next_value,
        ones,
    )
    torch.testing.assert_close(ours, expected)


def test_imagined_lambda_return_with_lambda_one_is_the_discounted_return_to_the_horizon():
    reward, next_value = randn(2, 6, 1, seed=11), randn(2, 6, 1, seed=12)
    ours = rlf.imagined_lambda_return(reward, next_value, None, 0.9, 1.0)
    powers = 0.9 ** torch.arange(6, dtype=torch.float64)
    first = (reward[:, :, 0] * powers).sum(-1) + 0.9**6 * next_value[:, -1, 0]
    torch.testing.assert_close(ours[:, 0, 0], first)


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_imagination_weights_match_the_reference(gamma):
    continuation = torch.rand(3, 7, 1, dtype=torch.float64)
    expected = reference.per_sequence(
        lambda c: reference.imagination_weights(c, gamma), continuation
    )
    torch.testing.assert_close(rlf.imagination_weights(continuation, gamma), expected)


# ----------------------------------------------------------------------------- return scale


@pytest.mark.parametrize("size", [1, 2, 20, 257])
@pytest.mark.parametrize("levels", [(0.05, 0.95), (0.0, 1.0), (0.25, 0.5)])
def test_percentile_range_matches_the_reference(size, levels):
    returns = randn(size, 1, seed=13, scale=10.0)
    low, high = rlf.percentile_range(returns, *levels)
    values = returns.reshape(-1).tolist()
    assert low.item() == pytest.approx(reference.quantile(values, levels[0]), rel=1e-12)
    assert high.item() == pytest.approx(reference.quantile(values, levels[1]), rel=1e-12)


def test_percentile_range_refuses_reversed_levels():
    with pytest.raises(ValueError, match="high must be in"):
        rlf.percentile_range(torch.randn(5), 0.9, 0.1)


def test_moving_average_and_scale_follow_torchrls_percentile_normaliser():
    from torchrl.modules.value_norm import PercentileValueNorm

    norm = PercentileValueNorm(rate=0.3, min_scale=1.0)
    low = high = torch.zeros(1)
    for seed in range(4):
        returns = randn(40, 1, seed=seed, scale=5.0, dtype=torch.float32)
        norm.update(returns)
        batch_low, batch_high = rlf.percentile_range(returns)
        low, high = (
            rlf.moving_average(low, batch_low, 0.3),
            rlf.moving_average(high, batch_high, 0.3),
        )
        torch.testing.assert_close(rlf.return_scale(low, high, 1.0), norm.scale())
    assert rlf.return_scale(torch.tensor(0.0), torch.tensor(0.5), 1.0).item() == 1.0


# ----------------------------------------------------------------------------- PILCO cost


def _random_covariance(size, batch, seed):
    factor = randn(*batch, size, size, seed=seed)
    return factor @ factor.mT / size + 0.01 * torch.eye(size, dtype=torch.float64)


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("batch", [(1,), (5,), (2, 3)])
def test_expected_saturating_cost_matches_the_reference(size, batch):
    mean, target = randn(*batch, size, seed=14), randn(size, seed=15)
    covariance = _random_covariance(size, batch, 16)
    weights = _random_covariance(size, (), 17)
    ours = rlf.expected_saturating_cost(mean, covariance, target, weights, jitter=0.0)
    flat_mean, flat_cov = (
        mean.reshape(-1, size).tolist(),
        covariance.reshape(-1, size, size).tolist(),
    )
    expected = [
        reference.expected_saturating_cost(m, s, target.tolist(), weights.tolist())
        for m, s in zip(flat_mean, flat_cov, strict=True)
    ]
    torch.testing.assert_close(ours, torch.tensor(expected, dtype=torch.float64).reshape(batch))


def test_expected_saturating_cost_with_no_spread_is_the_cost_of_the_mean():
    mean, target = randn(6, 3, seed=18), torch.zeros(3, dtype=torch.float64)
    weights = torch.diag(torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64))
    cost = rlf.expected_saturating_cost(
        mean, torch.zeros(6, 3, 3, dtype=torch.float64), target, weights, 0.0
    )
    point = 1 - torch.exp(-0.5 * ((mean @ weights) * mean).sum(-1))
    torch.testing.assert_close(cost, point)
    assert ((cost >= 0) & (cost <= 1)).all()


def test_expected_saturating_cost_checks_the_covariance_shape():
    with pytest.raises(ValueError, match="state covariance must have shape"):
        rlf.expected_saturating_cost(
            torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(2), torch.eye(2)
        )


@pytest.mark.slow
def test_world_model_functions_compile_with_fullgraph():
    bins = rlf.symexp_bins(17)

    def step(logits, target, posterior, prior, reward, value):
        ce = rlf.two_hot_cross_entropy(logits, target, bins)
        kl = rlf.balanced_kl(posterior, prior, 0.8, 1.0)
        returns = rlf.imagined_lambda_return(reward, value, None, 0.99, 0.95)
        return ce.sum() + kl.sum() + returns.sum()

    args = (torch.randn(4, 17), torch.randn(4), torch.randn(4, 3, 5), torch.randn(4, 3, 5))
    args += (torch.randn(4, 6, 1), torch.randn(4, 6, 1))
    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(*args), step(*args))
