"""rlloss.functional.critic against the references: distances, PPO's clipped value loss, TD
errors (replay priorities), gradient routing, shape errors."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from rlloss.functional import (
    clipped_value_loss,
    distance,
    ensemble_td_error,
    reduce,
    reduced_distance,
    td_error,
)
from rlloss.functional.critic import TD_ERRORS
from tests import reference

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}
SHAPES = [(1, 1), (5, 1), (3, 7, 1), (2, 3, 4, 1)]
KINDS = ["l1", "l2", "smooth_l1"]


def shape_id(shape):
    return "x".join(map(str, shape))


def values(shape, dtype, seed=0):
    """value, old_value, target: differences on both sides of 1 (Huber's kink) and of the
    clip ranges used below."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(shape, generator=generator, dtype=dtype)
    value = target + 2 * torch.randn(shape, generator=generator, dtype=dtype)
    old_value = value + 0.5 * torch.randn(shape, generator=generator, dtype=dtype)
    return value, old_value, target


def assert_matches(actual, expected, dtype, **context):
    assert actual.dtype == dtype
    torch.testing.assert_close(
        actual.to(torch.float64), expected, **TOLERANCE[dtype], msg=lambda m: f"{context}: {m}"
    )


ELEMENTWISE_ERRORS = [
    pytest.param(distance, reference.distance, KINDS, id="distance"),
    pytest.param(td_error, reference.td_error, TD_ERRORS, id="td_error"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("function, naive, kinds", ELEMENTWISE_ERRORS)
def test_elementwise_error_matches_reference(function, naive, kinds, shape, dtype):
    """:func:`distance` and :func:`td_error`, every kind, one element at a time."""
    value, _, target = values(shape, dtype)
    for kind in kinds:
        expected = reference.elementwise(partial(naive, kind=kind), value, target)
        assert_matches(function(value, target, kind), expected, dtype, kind=kind)


def test_distance_worked_values():
    prediction = torch.tensor([0.0, 0.5, -3.0])
    target = torch.zeros(3)
    torch.testing.assert_close(distance(prediction, target, "l1"), torch.tensor([0.0, 0.5, 3.0]))
    torch.testing.assert_close(distance(prediction, target, "l2"), torch.tensor([0.0, 0.25, 9.0]))
    torch.testing.assert_close(
        distance(prediction, target, "smooth_l1"), torch.tensor([0.0, 0.125, 2.5])
    )


@pytest.mark.parametrize("kind", ["l1", "l2", "smooth_l1"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reduced_distance_is_the_reduced_elementwise_distance(kind, reduction):
    """``distance(..., reduction)`` (one operation) gives the value and the gradient of the
    elementwise distance reduced afterwards (what a weighted or masked loss does)."""
    torch.manual_seed(0)
    value = (3 * torch.randn(64, 1, dtype=torch.float64)).requires_grad_()
    target = 3 * torch.randn(64, 1, dtype=torch.float64)
    fused = distance(value, target, kind, reduction)
    (fused_grad,) = torch.autograd.grad(fused, value)
    elementwise = distance(value, target, kind)
    after = elementwise.mean() if reduction == "mean" else elementwise.sum()
    (after_grad,) = torch.autograd.grad(after, value)
    assert fused.shape == ()
    torch.testing.assert_close(fused, after, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused_grad, after_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reduced_distance_is_reduce_of_the_distance(masked, weighted, reduction):
    """``reduced_distance`` equals ``reduce(distance(...))`` with or without a mask and weights
    (only the unmasked, unweighted mean and sum take the one-operation path)."""
    torch.manual_seed(1)
    value, target = torch.randn(32, 1, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)
    mask = torch.rand(32, 1) < 0.7 if masked else None
    weights = torch.rand(32, dtype=torch.float64) if weighted else None
    expected = reduce(distance(value, target, "smooth_l1"), reduction, mask, weights)
    got = reduced_distance(value, target, "smooth_l1", reduction, mask, weights)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_unknown_distance_raises():
    with pytest.raises(ValueError, match="huber"):
        distance(torch.zeros(2, 1), torch.zeros(2, 1), "huber")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_clipped_value_loss_matches_reference(shape, dtype):
    value, old_value, target = values(shape, dtype)
    for kind in KINDS:
        for clip in (0.1, 0.5, 10.0, torch.tensor(0.2, dtype=dtype)):
            loss, was_clipped = clipped_value_loss(value, old_value, target, clip, kind)
            c = float(clip)
            expected = reference.elementwise(
                partial(reference.clipped_value_loss, clip=c, kind=kind),
                value,
                old_value,
                target,
            )
            assert_matches(loss, expected, dtype, kind=kind, clip=c)
            expected = ((value - old_value).abs() > c).to(dtype)
            assert_matches(was_clipped, expected.double(), dtype, kind=kind, clip=c)
            assert not was_clipped.requires_grad


def test_clipped_value_loss_without_binding_clip_is_plain_distance():
    value, old_value, target = values((50, 1), torch.float64)
    for kind in KINDS:
        loss, was_clipped = clipped_value_loss(value, old_value, target, 1e9, kind)
        torch.testing.assert_close(loss, distance(value, target, kind))
        assert was_clipped.eq(0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clipped_value_loss_gradients(dtype):
    """No gradient reaches ``old_value``; ``value`` gets ``dL(V)/dV`` except where the clipped
    branch is the larger one, whose clamp has zero gradient (l2: ``2 (V - y)``)."""
    value, old_value, target = values((200, 1), dtype, seed=3)
    value, old_value = value.requires_grad_(), old_value.requires_grad_()
    loss, was_clipped = clipped_value_loss(value, old_value, target, 0.3, "l2")
    loss.sum().backward()
    assert old_value.grad is None
    v, old = value.detach(), old_value.detach()
    clipped_loss = (old + (v - old).clamp(-0.3, 0.3) - target) ** 2
    clipped_wins = was_clipped.bool() & (clipped_loss > (v - target) ** 2)
    expected = torch.where(clipped_wins, torch.zeros_like(v), 2 * (v - target))
    torch.testing.assert_close(value.grad, expected)
    assert clipped_wins.any() and not clipped_wins.all()


def test_distances_agree_with_torch():
    value, _, target = values((64, 1), torch.float64)
    torch.testing.assert_close(
        distance(value, target, "l2"), F.mse_loss(value, target, reduction="none")
    )
    torch.testing.assert_close(
        distance(value, target, "smooth_l1"),
        F.huber_loss(value, target, reduction="none", delta=1.0),
    )


def test_extreme_values_are_finite():
    value = torch.tensor([[1e6], [-1e6]], requires_grad=True)
    old_value = torch.zeros(2, 1)
    target = torch.tensor([[-1e6], [1e6]])
    for kind in KINDS:
        loss, _ = clipped_value_loss(value, old_value, target, 0.2, kind)
        (grad,) = torch.autograd.grad(loss.sum(), value)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda a, b: distance(a, b, "l2"), id="distance-prediction"),
        pytest.param(lambda a, b: distance(b, a, "l2"), id="distance-target"),
        pytest.param(lambda a, b: clipped_value_loss(a, b, b, 0.2, "l2"), id="clip-value"),
        pytest.param(lambda a, b: clipped_value_loss(b, a, b, 0.2, "l2"), id="clip-old_value"),
        pytest.param(lambda a, b: clipped_value_loss(b, b, a, 0.2, "l2"), id="clip-target"),
        pytest.param(lambda a, b: td_error(a, b), id="td_error-value"),
        pytest.param(lambda a, b: td_error(b, a, "absolute"), id="td_error-target"),
        pytest.param(lambda a, b: ensemble_td_error(b.unsqueeze(0), a), id="ensemble-target"),
    ],
)
def test_shape_mismatch_raises_naming_both_shapes(call):
    with pytest.raises(ValueError) as error:
        call(torch.zeros(5), torch.zeros(5, 1))
    assert "(5,)" in str(error.value) and "(5, 1)" in str(error.value)


# --------------------------------------------------------------------------- TD errors


def test_td_error_is_the_detached_l2_or_l1_distance():
    value, _, target = values((64, 1), torch.float64)
    value.requires_grad_()
    for kind, distance_kind in (("squared", "l2"), ("absolute", "l1")):
        error = td_error(value, target, kind)
        assert not error.requires_grad
        torch.testing.assert_close(error, distance(value, target, distance_kind).detach())
    torch.testing.assert_close(td_error(value, target), td_error(value, target, "squared"))


def test_unknown_td_error_kind_raises_naming_the_accepted_kinds():
    with pytest.raises(ValueError, match="'huber'.*'squared', 'absolute'"):
        td_error(torch.zeros(2, 1), torch.zeros(2, 1), "huber")
    with pytest.raises(ValueError, match="'l2'.*'squared', 'absolute'"):
        ensemble_td_error(torch.zeros(3, 2, 1), torch.zeros(2, 1), "l2")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("members", [1, 2, 5])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_ensemble_td_error_matches_reference(shape, members, dtype):
    """The per-member maximum, computed one transition at a time."""
    generator = torch.Generator().manual_seed(members)
    ensemble = torch.randn((members, *shape), generator=generator, dtype=dtype)
    target = torch.randn(shape, generator=generator, dtype=dtype)
    for kind in TD_ERRORS:
        expected = reference.per_row(
            lambda column, y, kind=kind: reference.ensemble_td_error(column, y[0], kind),
            ensemble.movedim(0, -1),
            target.unsqueeze(-1),
        )
        assert_matches(ensemble_td_error(ensemble, target, kind), expected, dtype, kind=kind)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ensemble_td_error_is_the_max_over_members_bit_for_bit(dtype):
    """The same numbers as the expression the losses wrote inline before."""
    ensemble = torch.randn(3, 6, 4, 1, dtype=dtype)
    target = torch.randn(6, 4, 1, dtype=dtype)
    difference = (ensemble - target.expand_as(ensemble)).detach()
    squared, absolute = difference.square().max(0).values, difference.abs().max(0).values
    assert torch.equal(ensemble_td_error(ensemble, target), squared)
    assert torch.equal(ensemble_td_error(ensemble, target, "absolute"), absolute)


@pytest.mark.parametrize("kind", TD_ERRORS)
def test_ensemble_of_one_is_td_error(kind):
    value, _, target = values((5, 3, 1), torch.float64, seed=1)
    actual = ensemble_td_error(value.unsqueeze(0), target, kind)
    assert torch.equal(actual, td_error(value, target, kind))


def test_no_gradient_flows_through_td_errors():
    ensemble = torch.randn(2, 8, 1, requires_grad=True)
    target = torch.randn(8, 1, requires_grad=True)
    for kind in TD_ERRORS:
        for error in (
            td_error(ensemble[0], target, kind),
            ensemble_td_error(ensemble, target, kind),
        ):
            assert not error.requires_grad and error.grad_fn is None


@pytest.mark.parametrize(
    "values_shape, target_shape",
    [((3, 5, 1), (5,)), ((3, 5, 1), (3, 5, 1)), ((3, 5), (5, 1)), ((2, 4, 1), (5, 1))],
)
def test_ensemble_td_error_shape_mismatch_names_both_shapes(values_shape, target_shape):
    with pytest.raises(ValueError) as error:
        ensemble_td_error(torch.zeros(values_shape), torch.zeros(target_shape))
    assert str(values_shape) in str(error.value) and str(target_shape) in str(error.value)
