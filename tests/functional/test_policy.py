"""rlloss.functional.policy against the references: ratios, (dual-)clipped surrogate, KL,
adaptive KL coefficient, entropy; gradient routing, extreme inputs, shape errors."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import distributions as D

from rlloss.functional import (
    adaptive_kl_beta,
    adaptive_kl_thresholds,
    categorical_kl,
    clip_bounds,
    clipped,
    clipped_surrogate,
    distribution_entropy,
    gaussian_kl,
    has_analytic_entropy,
    kl_divergence,
    kl_k3,
    kl_penalized_surrogate,
    log_ratio,
    rpo_perturbation,
    surrogate,
)
from tests import reference

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}
SHAPES = [(1,), (7,), (4, 5), (2, 3, 4)]
EPSILONS = [(0.2, 0.2), (0.1, 0.3), (0.3, 0.05)]


def shape_id(shape):
    return "x".join(map(str, shape))


def assert_matches(actual, expected, dtype, **context):
    assert actual.dtype == dtype
    torch.testing.assert_close(
        actual.to(torch.float64), expected, **TOLERANCE[dtype], msg=lambda m: f"{context}: {m}"
    )


def ratios_and_advantages(shape, dtype, seed=0):
    """Log-ratios spread over both clip boundaries, advantages of both signs."""
    generator = torch.Generator().manual_seed(seed)
    ratio = 0.5 * torch.randn(shape, generator=generator, dtype=dtype)
    advantage = torch.randn(shape, generator=generator, dtype=dtype)
    return ratio, advantage


def exact_bounds(low, high):
    """Log-space clip bounds in double precision."""
    return math.log1p(-low), math.log1p(high)


# --------------------------------------------------------------------------- log ratio, clip bounds


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_log_ratio_is_difference_and_old_log_prob_gets_no_gradient(dtype):
    new = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    old = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    out = log_ratio(new, old)
    assert_matches(out, (new.double() - old.double()).detach(), dtype)
    (out * torch.arange(12.0, dtype=dtype).reshape(3, 4)).sum().backward()
    assert old.grad is None
    torch.testing.assert_close(new.grad, torch.arange(12.0, dtype=dtype).reshape(3, 4))


@pytest.mark.parametrize("low,high", EPSILONS)
def test_clip_bounds_are_log_space_bounds(low, high):
    log_low, log_high = clip_bounds(low, high)
    assert isinstance(log_low, float) and isinstance(log_high, float)
    assert log_low == pytest.approx(math.log(1 - low), rel=1e-6)
    assert log_high == pytest.approx(math.log(1 + high), rel=1e-6)
    tensor_low, tensor_high = clip_bounds(torch.tensor(low), torch.tensor(high))
    assert isinstance(tensor_low, torch.Tensor)
    assert tensor_low.item() == pytest.approx(math.log(1 - low), rel=1e-6)
    assert tensor_high.item() == pytest.approx(math.log(1 + high), rel=1e-6)


def test_clip_bounds_are_double_precision():
    assert clip_bounds(0.2, 0.2) == (math.log1p(-0.2), math.log1p(0.2))


# --------------------------------------------------------------------------- clipped surrogate


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_clipped_surrogate_matches_reference(shape, dtype):
    ratio, advantage = ratios_and_advantages(shape, dtype)
    for low, high in EPSILONS:
        for dual_clip in (None, 1.5, 3.0):
            bounds = exact_bounds(low, high)
            actual = clipped_surrogate(ratio, advantage, *bounds, dual_clip=dual_clip)
            expected = reference.elementwise(
                partial(
                    reference.clipped_surrogate,
                    epsilon_low=low,
                    epsilon_high=high,
                    dual_clip=dual_clip,
                ),
                ratio,
                advantage,
            )
            assert_matches(actual, expected, dtype, eps=(low, high), dual_clip=dual_clip)
            indicator = clipped(ratio, *bounds)
            expected = reference.elementwise(
                partial(reference.is_clipped, epsilon_low=low, epsilon_high=high), ratio
            )
            assert_matches(indicator, expected, dtype, eps=(low, high))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_surrogate_and_kl_penalized_surrogate_match_reference(shape, dtype):
    ratio, advantage = ratios_and_advantages(shape, dtype)
    kl = ratio.square()  # any non-negative per-element KL
    expected = reference.elementwise(reference.surrogate, ratio, advantage)
    assert_matches(surrogate(ratio, advantage), expected, dtype)
    for beta in (0.0, 0.5, torch.tensor(2.0, dtype=dtype)):
        actual = kl_penalized_surrogate(surrogate(ratio, advantage), kl, beta)
        expected = reference.elementwise(
            partial(reference.kl_penalized_surrogate, beta=float(beta)), ratio, advantage, kl
        )
        assert_matches(actual, expected, dtype, beta=beta)


def test_identities_of_the_surrogates():
    """Clipping that never binds is the plain surrogate; a KL penalty with beta = 0 is too."""
    ratio, advantage = ratios_and_advantages((64,), torch.float64)
    plain = surrogate(ratio, advantage)
    never_clipped = clipped_surrogate(ratio, advantage, -math.inf, math.inf)
    torch.testing.assert_close(never_clipped, plain, rtol=0, atol=0)
    torch.testing.assert_close(kl_penalized_surrogate(plain, ratio.abs(), 0.0), plain)


def test_surrogate_refuses_broadcasting():
    with pytest.raises(ValueError, match="shape"):
        surrogate(torch.zeros(4), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="shape"):
        kl_penalized_surrogate(torch.zeros(4, 1), torch.zeros(4), 1.0)


def test_clipped_surrogate_accepts_tensor_hyperparameters():
    ratio, advantage = ratios_and_advantages((64,), torch.float32)
    as_floats = clipped_surrogate(ratio, advantage, *clip_bounds(0.1, 0.3), dual_clip=3.0)
    as_tensors = clipped_surrogate(
        ratio, advantage, *clip_bounds(torch.tensor(0.1), torch.tensor(0.3)), torch.tensor(3.0)
    )
    torch.testing.assert_close(as_tensors, as_floats)


def test_dual_clip_bounds_negative_advantages_only():
    ratio = torch.full((4,), math.log(10.0))
    advantage = torch.tensor([-2.0, -1.0, 1.0, 2.0])
    bounds = clip_bounds(0.2, 0.2)
    plain = clipped_surrogate(ratio, advantage, *bounds)
    dual = clipped_surrogate(ratio, advantage, *bounds, dual_clip=3.0)
    # ratio 10, negative A: min(10 A, 1.2 A) = 10 A, bounded below by 3 A.
    torch.testing.assert_close(plain, torch.tensor([-20.0, -10.0, 1.2, 2.4]))
    torch.testing.assert_close(dual, torch.tensor([-6.0, -3.0, 1.2, 2.4]))


# (ratio, advantage, dual clip, d surrogate / d log ratio): r A where the unclipped term is
# the one selected, 0 where a clip is active.
GRADIENT_CASES = [
    (1.5, 1.0, None, 0.0),  # above 1 + eps, A > 0: clipped, no push further up
    (0.5, -1.0, None, 0.0),  # below 1 - eps, A < 0: clipped, no push further down
    (1.5, -1.0, None, -1.5),  # above 1 + eps, A < 0: pessimistic min keeps r A
    (0.5, 1.0, None, 0.5),  # below 1 - eps, A > 0: pessimistic min keeps r A
    (1.1, 2.0, None, 2.2),  # inside the range
    (0.9, -2.0, None, -1.8),  # inside the range
    (4.0, -1.0, None, -4.0),  # without dual clip, large r and A < 0 keep r A
    (4.0, -1.0, 3.0, 0.0),  # dual clip active: constant c A
    (2.0, -1.0, 3.0, -2.0),  # dual clip inactive (r < c)
    (4.0, 1.0, 3.0, 0.0),  # dual clip ignores A > 0: ordinary clip
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clipped_surrogate_gradient_cases(dtype):
    ratio = torch.tensor([case[0] for case in GRADIENT_CASES], dtype=dtype).log()
    advantage = torch.tensor([case[1] for case in GRADIENT_CASES], dtype=dtype)
    expected = torch.tensor([case[3] for case in GRADIENT_CASES], dtype=dtype)
    bounds = clip_bounds(0.2, 0.2)
    for index, (_, _, dual_clip, _) in enumerate(GRADIENT_CASES):
        lr = ratio[index : index + 1].clone().requires_grad_()
        clipped_surrogate(
            lr, advantage[index : index + 1], *bounds, dual_clip=dual_clip
        ).sum().backward()
        torch.testing.assert_close(
            lr.grad,
            expected[index : index + 1],
            msg=lambda m, case=GRADIENT_CASES[index]: f"{case}: {m}",
        )


@pytest.mark.parametrize("dual_clip", [None, 2.0])
def test_clipped_surrogate_gradient_is_zero_exactly_where_a_clip_binds(dual_clip):
    """Random elements: the gradient is ``r A`` where the reference picks the unclipped term,
    zero elsewhere."""
    ratio, advantage = ratios_and_advantages((500,), torch.float64, seed=1)
    ratio = ratio * 2  # reach the dual clip too
    ratio.requires_grad_()
    bounds = clip_bounds(0.2, 0.2)
    clipped_surrogate(ratio, advantage, *bounds, dual_clip=dual_clip).sum().backward()
    objective = reference.elementwise(
        lambda lr, a: reference.clipped_surrogate(lr, a, 0.2, 0.2, dual_clip), ratio, advantage
    )
    unclipped = ratio.detach().exp() * advantage
    expected = torch.where(torch.isclose(objective, unclipped, rtol=1e-12), unclipped, 0.0)
    torch.testing.assert_close(ratio.grad, expected)
    binds = expected == 0
    assert 0 < binds.sum() < 500  # the case has both kinds of elements


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extreme_inputs_give_finite_surrogate_and_gradients(dtype, dual_clip):
    ratio = torch.tensor([50.0, -50.0, 50.0, -50.0, 0.0, 20.0], dtype=dtype, requires_grad=True)
    advantage = torch.tensor([1e6, 1e6, -1e6, -1e6, 1e6, -1e6], dtype=dtype, requires_grad=True)
    surrogate = clipped_surrogate(ratio, advantage, *clip_bounds(0.2, 0.2), dual_clip=dual_clip)
    surrogate.sum().backward()
    assert torch.isfinite(surrogate).all()
    assert torch.isfinite(ratio.grad).all() and torch.isfinite(advantage.grad).all()
    expected = reference.elementwise(
        lambda lr, a: reference.clipped_surrogate(lr, a, 0.2, 0.2, dual_clip), ratio, advantage
    )
    torch.testing.assert_close(surrogate.double(), expected, rtol=1e-5, atol=0.0)
    kl = kl_k3(ratio.detach())
    assert torch.isfinite(kl).all() and (kl >= 0).all()


def test_bfloat16_surrogate_is_finite_and_close():
    ratio, advantage = ratios_and_advantages((256,), torch.float64)
    bounds = clip_bounds(0.2, 0.2)
    for dual_clip in (None, 3.0):
        expected = clipped_surrogate(ratio, advantage, *bounds, dual_clip=dual_clip)
        low = ratio.bfloat16().requires_grad_()
        actual = clipped_surrogate(low, advantage.bfloat16(), *bounds, dual_clip=dual_clip)
        actual.sum().backward()
        assert actual.dtype == torch.bfloat16
        assert torch.isfinite(actual).all() and torch.isfinite(low.grad).all()
        torch.testing.assert_close(actual.double(), expected, rtol=0.03, atol=0.03)


# --------------------------------------------------------------------------- KL


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kl_k3_matches_reference(dtype):
    ratio = torch.cat([torch.linspace(-5, 5, 41, dtype=dtype), torch.tensor([0.0, 1e-4, -1e-4])])
    actual = kl_k3(ratio)
    assert_matches(actual, reference.elementwise(reference.kl_k3, ratio), dtype)
    assert (actual >= 0).all()
    assert actual[ratio == 0].eq(0).all()


def test_kl_k3_is_an_unbiased_kl_estimate():
    """Sampled under the old policy, mean k3 estimates KL(old || new)."""
    old, new = D.Normal(0.0, 1.0), D.Normal(0.3, 1.2)
    samples = old.sample((200_000,))
    estimate = kl_k3(new.log_prob(samples) - old.log_prob(samples)).mean()
    torch.testing.assert_close(estimate, D.kl_divergence(old, new), rtol=0.02, atol=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gaussian_kl_matches_reference(dtype):
    generator = torch.Generator().manual_seed(0)
    loc_p, loc_q = torch.randn(2, 3, 4, generator=generator, dtype=dtype).unbind(0)
    scale_p, scale_q = (torch.rand(2, 3, 4, generator=generator, dtype=dtype) + 0.1).unbind(0)
    expected = reference.elementwise(reference.gaussian_kl, loc_p, scale_p, loc_q, scale_q)
    assert_matches(gaussian_kl(loc_p, scale_p, loc_q, scale_q), expected, dtype)
    assert gaussian_kl(loc_p, scale_p, loc_p, scale_p).abs().max() < 1e-6


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_categorical_kl_matches_reference(dtype):
    logits_p, logits_q = (2 * torch.randn(2, 5, 6, dtype=dtype)).unbind(0)
    logits_p[0, 2] = -torch.inf  # an impossible action under p contributes 0
    expected = torch.tensor(
        [
            reference.categorical_kl(p, q)
            for p, q in zip(logits_p.tolist(), logits_q.tolist(), strict=True)
        ],
        dtype=torch.float64,
    )
    actual = categorical_kl(logits_p, logits_q)
    assert actual.shape == (5,)
    assert_matches(actual, expected, dtype)
    assert categorical_kl(logits_q, logits_q + 3.0).abs().max() < 1e-6  # logits up to a shift


def test_categorical_kl_gradient_with_masked_actions_reaches_q_finite():
    """Action masking: the same action impossible under both policies (KLPEN's KL(old || new)
    differentiates through q only)."""
    logits_p = torch.tensor([[0.0, 1.0, -torch.inf]])
    logits_q = torch.tensor([[0.5, -1.0, -torch.inf]], requires_grad=True)
    kl = categorical_kl(logits_p, logits_q)
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logits_q.grad).all()
    assert logits_q.grad[0, 2] == 0


def test_categorical_kl_gradient_wrt_p_with_masked_action_is_finite():
    logits_p = torch.tensor([[0.0, 1.0, -torch.inf]], requires_grad=True)
    categorical_kl(logits_p, torch.tensor([[0.5, -1.0, 2.0]])).sum().backward()
    assert torch.isfinite(logits_p.grad).all()


def _kl_pairs():
    loc_p, loc_q = torch.randn(2, 3, 2).unbind(0)
    scale_p, scale_q = (torch.rand(2, 3, 2) + 0.5).unbind(0)
    logits_p, logits_q = torch.randn(2, 3, 4).unbind(0)
    return {
        "normal": (D.Normal(loc_p, scale_p), D.Normal(loc_q, scale_q)),
        "independent": (
            D.Independent(D.Normal(loc_p, scale_p), 1),
            D.Independent(D.Normal(loc_q, scale_q), 1),
        ),
        "independent-2": (
            D.Independent(D.Normal(loc_p, scale_p), 2),
            D.Independent(D.Normal(loc_q, scale_q), 2),
        ),
        "categorical": (D.Categorical(logits=logits_p), D.Categorical(logits=logits_q)),
        "one-hot": (
            D.OneHotCategorical(logits=logits_p),
            D.OneHotCategorical(logits=logits_q),
        ),
    }


@pytest.mark.parametrize("family", list(_kl_pairs()))
def test_kl_divergence_closed_forms_equal_torch(family):
    p, q = _kl_pairs()[family]
    expected = D.kl_divergence(p, q)
    actual = kl_divergence(p, q)
    assert actual.shape == p.batch_shape
    torch.testing.assert_close(actual, expected)


def test_kl_divergence_monte_carlo_without_closed_form():
    loc = torch.randn(3)
    scale = (torch.rand(3) + 0.5).requires_grad_()
    p, q = D.Normal(torch.zeros(3), torch.ones(3)), D.Normal(loc, scale)
    # The same bijection applied to both leaves KL unchanged: the MC path must find the base KL.
    shift = [D.AffineTransform(1.0, 2.0)]
    mc = kl_divergence(
        D.TransformedDistribution(p, shift), D.TransformedDistribution(q, shift), samples=50_000
    )
    assert mc.shape == (3,)
    torch.testing.assert_close(mc, D.kl_divergence(p, q), rtol=0.0, atol=0.03)
    mc.sum().backward()  # gradient through the log-probs, not through the draws
    assert scale.grad is not None and torch.isfinite(scale.grad).all()


def test_rpo_perturbation_is_fresh_bounded_noise_on_the_location():
    loc = torch.randn(4, 1000, requires_grad=True)
    for alpha in (0.5, torch.tensor(0.01)):
        first, second = rpo_perturbation(loc, alpha), rpo_perturbation(loc, alpha)
        noise = (first - loc).detach()
        bound = float(alpha)
        assert first.shape == loc.shape
        assert noise.abs().max() <= bound * (1 + 1e-5) and noise.abs().max() > 0.9 * bound
        assert noise.mean().abs() < 0.05 * bound  # U(-a, a): mean 0, std a / sqrt(3)
        torch.testing.assert_close(noise.std(), torch.tensor(bound / 3**0.5), rtol=0.05, atol=0.0)
        assert not torch.equal(first, second)
    (grad,) = torch.autograd.grad(rpo_perturbation(loc, 0.5).sum(), loc)
    torch.testing.assert_close(grad, torch.ones_like(loc))
    torch.testing.assert_close(rpo_perturbation(loc, 0.0), loc)


# --------------------------------------------------------------------------- adaptive KL coefficient

BETA_BOUNDS = [(None, None), (0.75, None), (None, 1.5), (0.75, 1.5)]


def kl_grid(dtarg):
    """KLs in each branch and on both thresholds (exact in float32 for the dtargs below)."""
    return [0.0, 0.25 * dtarg, dtarg / 1.5, dtarg, 1.5 * dtarg, 2.0 * dtarg, 100.0 * dtarg]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bounds", BETA_BOUNDS, ids=str)
@pytest.mark.parametrize("increment,decrement", [(2.0, 0.5), (1.5, 0.75)])
@pytest.mark.parametrize("dtarg", [0.75, 3.0])
def test_adaptive_kl_beta_matches_reference(dtarg, increment, decrement, bounds, dtype):
    beta_min, beta_max = bounds
    for beta in (1.0, 0.3):
        for kl in kl_grid(dtarg):
            actual = adaptive_kl_beta(
                torch.tensor(beta, dtype=dtype),
                torch.tensor(kl, dtype=dtype),
                dtarg,
                increment,
                decrement,
                beta_min,
                beta_max,
            )
            expected = reference.adaptive_kl_beta(
                float(torch.tensor(beta, dtype=dtype)), kl, dtarg, increment, decrement, *bounds
            )
            assert actual.shape == ()
            assert_matches(actual, torch.tensor(expected, dtype=torch.float64), dtype, kl=kl)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaptive_kl_beta_is_beta_times_the_factor_bit_for_bit(dtype):
    """``beta * factor`` in beta's dtype (the factor not rounded to float32 first), with factors
    that are not exact in binary; the precomputed tensor constants KLPENPPOLoss passes give the
    same bits as the numbers."""
    beta = torch.tensor(0.7, dtype=dtype)
    constants = [torch.tensor(v, dtype=dtype) for v in (1.1, 0.9, 1.5 * 0.01, 0.01 / 1.5)]
    for kl, factor in ((0.001, 0.9), (0.01, 1.0), (0.1, 1.1)):
        kl = torch.tensor(kl, dtype=dtype)
        for bounds in BETA_BOUNDS:
            inline = beta * factor if bounds == (None, None) else (beta * factor).clamp(*bounds)
            actual = adaptive_kl_beta(beta, kl, 0.01, 1.1, 0.9, *bounds)
            assert actual.dtype == inline.dtype and torch.equal(actual, inline)
            increment, decrement, *thresholds = constants
            given = adaptive_kl_beta(beta, kl, 0.01, increment, decrement, *bounds, thresholds)
            assert given.dtype == inline.dtype and torch.equal(given, inline)


def test_adaptive_kl_thresholds_are_the_papers_band():
    """``d > 1.5 d_targ`` raises beta, ``d < d_targ / 1.5`` lowers it (arXiv:1707.06347, sec. 4);
    a tensor ``dtarg`` gives tensors of its dtype."""
    assert adaptive_kl_thresholds(0.01) == (1.5 * 0.01, 0.01 / 1.5)
    high, low = adaptive_kl_thresholds(torch.tensor(0.01, dtype=torch.float64))
    assert high.dtype == low.dtype == torch.float64
    assert (float(high), float(low)) == (1.5 * 0.01, 0.01 / 1.5)


def test_adaptive_kl_beta_without_adaptation_keeps_beta():
    beta = torch.tensor(0.37)
    for kl in kl_grid(0.75):
        assert torch.equal(adaptive_kl_beta(beta, torch.tensor(kl), 0.75, 1.0, 1.0), beta)


def test_adaptive_kl_beta_accepts_tensor_hyperparameters_and_broadcast_kl():
    kl = torch.tensor([0.0, 0.75, 10.0])
    expected = torch.tensor([0.5, 1.0, 2.0])
    torch.testing.assert_close(adaptive_kl_beta(torch.tensor(1.0), kl, 0.75, 2.0, 0.5), expected)
    actual = adaptive_kl_beta(
        torch.tensor(1.0), kl, torch.tensor(0.75), torch.tensor(2.0), torch.tensor(0.5)
    )
    torch.testing.assert_close(actual, expected)
    beta = torch.tensor(1.0)
    adaptive_kl_beta(beta, kl, 0.75, 2.0, 0.5, 0.75, 1.5)
    assert beta == 1.0  # the input is not written


# --------------------------------------------------------------------------- entropy


def test_analytic_entropy_is_used_when_available():
    normal = D.Independent(D.Normal(torch.zeros(3, 2), torch.ones(3, 2)), 1)
    categorical = D.Categorical(logits=torch.randn(3, 4))
    assert has_analytic_entropy(normal) and has_analytic_entropy(categorical)
    torch.testing.assert_close(distribution_entropy(normal), normal.entropy())
    torch.testing.assert_close(distribution_entropy(categorical), categorical.entropy())


def test_monte_carlo_entropy_without_closed_form():
    """An affine map of a Normal is a Normal: compare the MC estimate with its entropy."""
    loc, scale = torch.randn(3), torch.rand(3) + 0.5
    base = D.Normal(loc, scale)
    transformed = D.TransformedDistribution(base, [D.AffineTransform(1.0, 2.0)])
    assert not has_analytic_entropy(transformed)
    assert not has_analytic_entropy(D.Independent(transformed, 1))
    estimate = distribution_entropy(transformed, samples=20_000)
    assert estimate.shape == (3,)
    torch.testing.assert_close(estimate, D.Normal(loc, 2 * scale).entropy(), rtol=0.0, atol=0.03)


def test_monte_carlo_entropy_is_differentiable_through_rsample():
    scale = torch.ones(2, requires_grad=True)
    transformed = D.TransformedDistribution(D.Normal(torch.zeros(2), scale), [D.ExpTransform()])
    distribution_entropy(transformed, samples=8).sum().backward()
    assert scale.grad is not None and torch.isfinite(scale.grad).all() and (scale.grad != 0).all()


# --------------------------------------------------------------------------- shape errors


@pytest.mark.parametrize("swap", [False, True], ids=["new[B]", "old[B]"])
def test_log_ratio_refuses_broadcast(swap):
    a, b = torch.zeros(5), torch.zeros(5, 1)
    with pytest.raises(ValueError) as error:
        log_ratio(*((b, a) if swap else (a, b)))
    assert "(5,)" in str(error.value) and "(5, 1)" in str(error.value)


@pytest.mark.parametrize("swap", [False, True], ids=["ratio[B]", "advantage[B]"])
def test_clipped_surrogate_refuses_broadcast(swap):
    a, b = torch.zeros(5), torch.zeros(5, 1)
    with pytest.raises(ValueError) as error:
        clipped_surrogate(*((b, a) if swap else (a, b)), *clip_bounds(0.2, 0.2))
    assert "(5,)" in str(error.value) and "(5, 1)" in str(error.value)
