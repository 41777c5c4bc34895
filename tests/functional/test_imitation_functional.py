"""rlloss.functional.imitation against the naive references of tests/reference_imitation.py:
behaviour cloning's errors, GAIL's cross-entropy, gradient penalty and reward, the DDPM
schedule and forward process, ACT's chunk L1 and KL, RND's error; gradient routes and shape
errors."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from rlloss import functional as rlf
from tests import reference
from tests import reference_imitation as ref

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-10, "atol": 1e-10},
}
SHAPES = [(5, 3), (2, 4, 3), (1, 1)]


def assert_matches(actual, expected, dtype):
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "kind,scalar",
    [
        ("l1", ref.absolute_error),
        ("l2", ref.squared_error),
        ("mse", ref.squared_error),
        ("smooth_l1", ref.huber),
    ],
)
def test_action_error_matches_reference(kind, scalar, shape, dtype):
    prediction = 2 * torch.randn(shape, dtype=dtype)
    target = 2 * torch.randn(shape, dtype=dtype)
    expected = reference.elementwise(scalar, prediction, target)
    assert_matches(rlf.action_error(prediction, target, kind), expected, dtype)


@pytest.mark.parametrize("batch", [(6,), (2, 3)], ids=str)
@pytest.mark.parametrize("trailing", [True, False])
def test_action_error_cross_entropy_matches_reference(batch, trailing):
    logits = torch.randn(*batch, 5, dtype=torch.float64)
    index = torch.randint(5, batch)
    target = index.unsqueeze(-1) if trailing else index
    expected = torch.tensor(
        [
            ref.cross_entropy(row, i)
            for row, i in zip(
                logits.reshape(-1, 5).tolist(), index.reshape(-1).tolist(), strict=True
            )
        ],
        dtype=torch.float64,
    ).reshape(batch)
    torch.testing.assert_close(rlf.action_error(logits, target, "cross_entropy"), expected)


def test_action_error_refuses_mismatched_shapes_and_unknown_kinds():
    with pytest.raises(ValueError, match="shape mismatch"):
        rlf.action_error(torch.zeros(4, 3), torch.zeros(4, 1), "l2")
    with pytest.raises(ValueError, match="class indices"):
        rlf.action_error(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), "cross_entropy")
    with pytest.raises(ValueError, match="unknown action error 'huber'"):
        rlf.action_error(torch.zeros(4, 3), torch.zeros(4, 3), "huber")


def test_action_error_sends_no_gradient_to_the_target_and_squared_error_is_its_mean():
    prediction = torch.randn(4, 3, requires_grad=True)
    target = torch.randn(4, 3, requires_grad=True)
    rlf.action_error(prediction, target, "l1").sum().backward()
    assert target.grad is None and prediction.grad is not None
    torch.testing.assert_close(
        rlf.action_squared_error(prediction, target),
        rlf.action_error(prediction, target, "l2").mean(-1),
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_discriminator_cross_entropy_matches_reference(dtype):
    d_expert = torch.rand(7, 1, dtype=dtype)
    d_policy = torch.rand(7, 1, dtype=dtype)
    d_expert[0], d_policy[1] = 0.0, 1.0  # the clamped logs
    expected = reference.elementwise(ref.discriminator_cross_entropy, d_expert, d_policy)
    assert_matches(rlf.discriminator_cross_entropy(d_expert, d_policy), expected, dtype)
    with pytest.raises(ValueError, match="shape mismatch"):
        rlf.discriminator_cross_entropy(d_expert, d_policy[:3])


@pytest.mark.parametrize("coefficient", [1.0, 10.0])
def test_gradient_penalty_and_interpolation_match_reference(coefficient):
    gradient = torch.randn(6, 4, dtype=torch.float64)
    expected = reference.per_row(partial(ref.gradient_penalty, coefficient=coefficient), gradient)
    torch.testing.assert_close(rlf.gradient_penalty(gradient, coefficient), expected)
    first, second, weight = torch.randn(3, 2), torch.randn(3, 2), torch.rand(3, 2)
    mixed = rlf.interpolate(first, second, weight)
    torch.testing.assert_close(
        mixed[weight > 0.5], (weight * first + (1 - weight) * second)[weight > 0.5]
    )
    torch.testing.assert_close(rlf.interpolate(first, second, torch.ones(3, 2)), first)


@pytest.mark.parametrize("form", ["positive", "negative", "logit"])
def test_gail_reward_matches_reference_and_has_no_gradient(form):
    d = torch.rand(9, dtype=torch.float64, requires_grad=True)
    expected = reference.elementwise(partial(ref.gail_reward, form=form), d)
    reward = rlf.gail_reward(d, form)
    torch.testing.assert_close(reward, expected)
    assert not reward.requires_grad
    assert torch.isfinite(rlf.gail_reward(torch.tensor([0.0, 1.0]), form)).all()
    with pytest.raises(ValueError, match="unknown GAIL reward form"):
        rlf.gail_reward(d, "airl")


@pytest.mark.parametrize("steps", [1, 10, 100])
def test_linear_beta_schedule_matches_reference(steps):
    betas, alpha_bars = rlf.linear_beta_schedule(steps, 1e-4, 0.02)
    ref_betas, ref_alpha_bars = ref.linear_beta_schedule(steps, 1e-4, 0.02)
    torch.testing.assert_close(betas.double(), torch.tensor(ref_betas, dtype=torch.float64))
    torch.testing.assert_close(
        alpha_bars.double(), torch.tensor(ref_alpha_bars, dtype=torch.float64), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_diffuse_and_noise_prediction_error_match_reference(dtype):
    action, noise = torch.randn(5, 3, dtype=dtype), torch.randn(5, 3, dtype=dtype)
    alpha_bar = torch.rand(5, dtype=dtype)
    expected = reference.elementwise(ref.diffuse, action, alpha_bar[:, None].expand(5, 3), noise)
    assert_matches(rlf.diffuse(action, alpha_bar, noise), expected, dtype)
    predicted = torch.randn(5, 3, dtype=dtype)
    expected = reference.elementwise(ref.squared_error, predicted, noise)
    assert_matches(rlf.noise_prediction_error(predicted, noise), expected, dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    "formula,reference_of,kind",
    [
        ("action_error", ref.squared_error, "l2"),
        ("action_error", ref.absolute_error, "l1"),
        ("action_error", ref.huber, "smooth_l1"),
        ("noise_prediction_error", ref.squared_error, None),
        ("discriminator_cross_entropy", ref.discriminator_cross_entropy, None),
    ],
)
def test_formulas_reduce_in_their_own_operation_as_the_reference_sum_or_mean(
    formula, reference_of, kind, reduction
):
    """The fused ``reduction`` (what a loss takes when nothing masks it) is the reference's
    elementwise values summed or averaged, and sends the same gradient as reducing after."""
    first = torch.rand(6, 3, dtype=torch.float64, requires_grad=True)
    second = torch.rand(6, 3, dtype=torch.float64)
    args = (first, second) if kind is None else (first, second, kind)
    fused = getattr(rlf, formula)(*args, reduction)
    elementwise = reference.elementwise(reference_of, first.detach(), second)
    expected = elementwise.sum() if reduction == "sum" else elementwise.mean()
    torch.testing.assert_close(fused.detach(), expected, rtol=1e-10, atol=1e-10)
    (gradient,) = torch.autograd.grad(fused, first)
    unfused = getattr(rlf, formula)(*args)
    (expected_gradient,) = torch.autograd.grad(getattr(unfused, reduction)(), first)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-10, atol=1e-10)


def test_diffusion_endpoints():
    """``alpha_bar = 1`` leaves the action clean; ``alpha_bar = 0`` is pure noise."""
    action, noise = torch.randn(4, 2), torch.randn(4, 2)
    torch.testing.assert_close(rlf.diffuse(action, torch.ones(4), noise), action)
    torch.testing.assert_close(rlf.diffuse(action, torch.zeros(4), noise), noise)


@pytest.mark.parametrize("masked", [False, True])
def test_chunk_l1_matches_reference(masked):
    prediction = torch.randn(3, 4, 2, dtype=torch.float64)
    chunk = torch.randn(3, 4, 2, dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    mask = valid if masked else None
    expected = torch.tensor(
        [
            ref.chunk_l1(p.tolist(), c.tolist(), None if mask is None else v.tolist())
            for p, c, v in zip(prediction, chunk, valid, strict=True)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(rlf.chunk_l1(prediction, chunk, mask), expected)


def test_chunk_l1_refuses_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"padding mask has shape \(3, 5\)"):
        rlf.chunk_l1(torch.zeros(3, 4, 2), torch.zeros(3, 4, 2), torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="shape mismatch"):
        rlf.chunk_l1(torch.zeros(3, 5, 2), torch.zeros(3, 4, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_standard_normal_kl_and_distillation_error_match_reference(dtype):
    mu, log_var = torch.randn(6, 3, dtype=dtype), torch.randn(6, 3, dtype=dtype)
    assert_matches(
        rlf.standard_normal_kl(mu, log_var),
        reference.per_row(ref.standard_normal_kl, mu, log_var),
        dtype,
    )
    prediction, target = torch.randn(6, 5, dtype=dtype), torch.randn(6, 5, dtype=dtype)
    assert_matches(
        rlf.distillation_error(prediction, target),
        reference.per_row(ref.distillation_error, prediction, target),
        dtype,
    )


def test_distillation_error_trains_only_the_predictor():
    prediction = torch.randn(4, 3, requires_grad=True)
    target = torch.randn(4, 3, requires_grad=True)
    rlf.distillation_error(prediction, target).sum().backward()
    assert target.grad is None and prediction.grad.abs().sum() > 0
    assert (rlf.standard_normal_kl(torch.zeros(2, 3), torch.zeros(2, 3)) == 0).all()


def test_bc_negative_log_likelihood_is_minus_the_log_prob():
    log_prob = torch.randn(5)
    torch.testing.assert_close(rlf.bc_negative_log_likelihood(log_prob), -log_prob)
