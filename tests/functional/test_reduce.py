"""rlloss.functional.reduce against the references: masked / weighted reductions,
standardisation, effective sample size, explained variance."""

from __future__ import annotations

import pytest
import torch

from rlloss.functional import (
    explained_variance,
    group_standardize,
    normalized_effective_sample_size,
    reduce,
    standardize,
)
from tests import reference

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}
SHAPES = [(1,), (7,), (4, 5), (2, 3, 4)]


def shape_id(shape):
    return "x".join(map(str, shape))


def scalar(value: float, dtype) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64).to(dtype).double()


def loss_mask_weights(shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    loss = torch.randn(shape, generator=generator, dtype=dtype)
    mask = torch.rand(shape, generator=generator) < 0.7
    mask.view(-1)[0] = True  # at least one valid element
    weights = torch.rand(shape, generator=generator, dtype=dtype) + 0.1
    return loss, mask, weights


def flat(t: torch.Tensor) -> list:
    return t.reshape(-1).tolist()


def assert_matches(actual, expected, dtype, **context):
    assert actual.dtype == dtype
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(
        actual.to(torch.float64), expected, **TOLERANCE[dtype], msg=lambda m: f"{context}: {m}"
    )


# --------------------------------------------------------------------------- reduce


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_reduce_matches_reference(shape, dtype):
    loss, mask, weights = loss_mask_weights(shape, dtype)
    everything = [True] * loss.numel()
    losses, m, w = flat(loss), flat(mask), flat(weights)
    assert_matches(reduce(loss, "mean"), reference.masked_mean(losses, everything), dtype)
    assert_matches(reduce(loss, "sum"), sum(losses), dtype)
    assert_matches(reduce(loss, "none"), loss.double(), dtype)
    assert_matches(reduce(loss, "max"), max(losses), dtype)

    assert_matches(reduce(loss, "mean", mask=mask), reference.masked_mean(losses, m), dtype)
    valid = [x for x, keep in zip(losses, m, strict=True) if keep]
    assert_matches(reduce(loss, "sum", mask=mask), sum(valid), dtype)
    assert_matches(reduce(loss, "max", mask=mask), max(valid), dtype)
    assert_matches(reduce(loss, "none", mask=mask), torch.where(mask, loss, 0).double(), dtype)

    for keep in (everything, m):
        mask_arg = None if keep is everything else mask
        kw = {"mask": mask_arg, "weights": weights}
        assert_matches(reduce(loss, "mean", **kw), reference.weighted_mean(losses, w, keep), dtype)
        assert_matches(
            reduce(loss, "mean", normalize_weights=True, **kw),
            reference.normalized_weighted_mean(losses, w, keep),
            dtype,
        )
        weighted_valid = [x * v for x, v, k in zip(losses, w, keep, strict=True) if k]
        assert_matches(reduce(loss, "sum", **kw), sum(weighted_valid), dtype)


def test_trailing_singleton_mask_and_weights_apply_to_a_loss_without_it():
    """A ``[B, T, 1]`` mask (as done flags are stored) reduces a ``[B, T]`` loss, and a ``[B, T]``
    mask a ``[B, T, 1]`` loss, elementwise; never a ``[B, T, T]`` broadcast."""
    loss, mask, weights = loss_mask_weights((3, 5), torch.float64)
    expected = reference.weighted_mean(flat(loss), flat(weights), flat(mask))
    got = reduce(loss, "mean", mask=mask.unsqueeze(-1), weights=weights.unsqueeze(-1))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    got = reduce(loss.unsqueeze(-1), "mean", mask=mask, weights=weights)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert reduce(loss, "none", mask=mask.unsqueeze(-1)).shape == (3, 5)


def test_fully_masked_mean_is_zero():
    loss = torch.randn(4, 3)
    mask = torch.zeros(4, 3, dtype=torch.bool)
    assert reduce(loss, "mean", mask=mask).item() == 0.0
    assert reduce(loss, "sum", mask=mask).item() == 0.0


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "max"])
def test_padding_cannot_leak_nan_or_inf(reduction, poison):
    loss, mask, weights = loss_mask_weights((4, 6), torch.float64)
    loss = torch.where(mask, loss, poison).requires_grad_()
    kw = {} if reduction == "max" else {"weights": weights}
    out = reduce(loss, reduction, mask=mask, **kw)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(loss.grad).all()
    assert loss.grad[~mask].eq(0).all()


def test_weights_receive_no_gradient_from_masked_elements_and_loss_keeps_its_gradient():
    loss, mask, weights = loss_mask_weights((10,), torch.float64)
    loss.requires_grad_()
    reduce(loss, "mean", mask=mask, weights=weights).backward()
    expected = torch.where(mask, weights, 0) / mask.sum()
    torch.testing.assert_close(loss.grad, expected)


# --------------------------------------------------------------------------- standardize


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2,), (7,), (4, 5, 1), (2, 3, 4)], ids=shape_id)
def test_standardize_matches_reference(shape, dtype):
    x, mask, _ = loss_mask_weights(shape, dtype)
    x = 3 * x + 1
    everything = [True] * x.numel()
    expected = torch.tensor(
        reference.standardize(flat(x), everything), dtype=torch.float64
    ).reshape(shape)
    assert_matches(standardize(x), expected, dtype)
    if mask.sum() >= 2:
        expected = torch.tensor(
            reference.standardize(flat(x), flat(mask)), dtype=torch.float64
        ).reshape(shape)
        assert_matches(
            torch.where(mask, standardize(x, mask), 0), torch.where(mask, expected, 0), dtype
        )


def test_standardize_masked_padding_does_not_change_statistics():
    x, mask, _ = loss_mask_weights((6, 5), torch.float64)
    moved = torch.where(mask, x, 1e6)
    torch.testing.assert_close(standardize(moved, mask)[mask], standardize(x[mask]))


def test_standardize_constant_input_uses_eps():
    x = torch.full((8,), 3.0)
    out = standardize(x)
    assert torch.isfinite(out).all() and out.eq(0).all()
    x = torch.tensor([0.0, 1e-8])  # std ~7e-9 < eps: divided by 1e-6, not by the std
    torch.testing.assert_close(standardize(x), (x - x.mean()) / 1e-6)


# --------------------------------------------------------------------------- effective sample size


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_normalized_ess_matches_reference(shape, dtype):
    log_weight, mask, _ = loss_mask_weights(shape, dtype)
    everything = [True] * log_weight.numel()
    expected = reference.normalized_ess(flat(log_weight), everything)
    assert_matches(normalized_effective_sample_size(log_weight), expected, dtype)
    expected = reference.normalized_ess(flat(log_weight), flat(mask))
    assert_matches(normalized_effective_sample_size(log_weight, mask), expected, dtype)


def test_normalized_ess_limits():
    assert normalized_effective_sample_size(torch.full((10,), 0.7)).item() == pytest.approx(1.0)
    one_dominant = torch.tensor([0.0] + [-1000.0] * 9)
    assert normalized_effective_sample_size(one_dominant).item() == pytest.approx(0.1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_normalized_ess_is_shift_invariant_and_finite_for_huge_log_weights(dtype):
    log_weight, mask, _ = loss_mask_weights((32,), dtype)
    expected = normalized_effective_sample_size(log_weight, mask)
    for shift in (-500.0, 50.0, 500.0):
        shifted = normalized_effective_sample_size(log_weight + shift, mask)
        assert torch.isfinite(shifted)
        torch.testing.assert_close(shifted, expected, **TOLERANCE[dtype])


# --------------------------------------------------------------------------- explained variance


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_explained_variance_matches_reference(dtype):
    target = torch.randn(50, 1, dtype=dtype)
    prediction = (target + 0.5 * torch.randn(50, 1, dtype=dtype)).requires_grad_()
    out = explained_variance(prediction, target)
    assert not out.requires_grad
    expected = reference.explained_variance(flat(prediction.detach()), flat(target))
    torch.testing.assert_close(out.double(), scalar(expected, torch.float64), rtol=1e-5, atol=1e-6)
    assert explained_variance(target, target).item() == pytest.approx(1.0)


# --------------------------------------------------------------------------- over the first dim
# TorchRL's PPO reports ESS and explained_variance over the batch's first dim only: one value
# per element of the other dims (time steps, agents, action features).


def columns(x: torch.Tensor, mask: torch.Tensor) -> list[tuple[tuple, list, list]]:
    """Per index of the dims after the first: the index, the column's values and its mask."""
    out = []
    for index in torch.cartesian_prod(*[torch.arange(n) for n in (1, *x.shape[1:])]).tolist():
        index = tuple(index[1:]) if isinstance(index, list) else ()
        out.append((index, flat(x[(slice(None), *index)]), flat(mask[(slice(None), *index)])))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(6,), (9, 3), (7, 2, 4)], ids=shape_id)
def test_normalized_ess_over_the_first_dim_matches_reference_per_column(shape, dtype):
    log_weight, mask, _ = loss_mask_weights(shape, dtype)
    mask[0] = True  # every column has a valid element
    plain = normalized_effective_sample_size(log_weight, dim=0)
    masked = normalized_effective_sample_size(log_weight, mask, dim=0)
    assert plain.shape == masked.shape == shape[1:]
    for index, values, keep in columns(log_weight, mask):
        everything = [True] * len(values)
        assert_matches(plain[index], reference.normalized_ess(values, everything), dtype)
        assert_matches(masked[index], reference.normalized_ess(values, keep), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(40,), (40, 1), (30, 3, 1), (20, 2, 3)], ids=shape_id)
def test_explained_variance_over_the_first_dim_matches_reference_per_column(shape, dtype):
    generator = torch.Generator().manual_seed(1)
    target = torch.randn(shape, generator=generator, dtype=dtype)
    prediction = target + 0.7 * torch.randn(shape, generator=generator, dtype=dtype)
    out = explained_variance(prediction, target, dim=0)
    assert out.shape == shape[1:]
    for index, values, _ in columns(target, torch.ones(shape, dtype=torch.bool)):
        predicted = flat(prediction[(slice(None), *index)])
        expected = reference.explained_variance(predicted, values)
        torch.testing.assert_close(
            out[index].double(), scalar(expected, torch.float64), rtol=1e-4, atol=1e-5
        )


def test_explained_variance_over_the_first_dim_with_a_batch_mask():
    """A ``[B, T]`` padding mask: each step's variances over its valid rows only."""
    target, prediction = torch.randn(10, 4, 1), torch.randn(10, 4, 1)
    mask = torch.rand(10, 4) < 0.6
    mask[:3] = True
    out = explained_variance(prediction, target, mask, dim=0)
    assert out.shape == (4, 1)
    for step in range(4):
        rows = mask[:, step]
        expected = reference.explained_variance(
            flat(prediction[rows, step]), flat(target[rows, step])
        )
        assert out[step, 0].item() == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_padding_cannot_leak_nan_weights_into_the_gradient():
    loss, mask, weights = loss_mask_weights((4, 6), torch.float64)
    weights = torch.where(mask, weights, float("nan"))
    loss.requires_grad_()
    out = reduce(loss, "mean", mask=mask, weights=weights)
    out.backward()
    assert torch.isfinite(out)
    assert torch.isfinite(loss.grad).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["all", "masked"])
@pytest.mark.parametrize("shape", [(9,), (6, 4), (3, 4, 2)], ids=shape_id)
def test_group_standardize_matches_the_loop_over_groups(shape, masked, dtype):
    """Arbitrary (negative, sparse) ids of the leading dim, broadcast over the trailing ones."""
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3 + 1
    ids = torch.tensor([7, -2, 7, 100, -2, 7, 100, 3, 7])[: shape[0]]
    groups = ids.reshape(shape[0], *(1,) * (len(shape) - 1))
    mask = torch.rand(shape) < 0.8 if masked else torch.ones(shape, dtype=torch.bool)
    expected = reference.group_standardize(
        x.double().reshape(-1).tolist(),
        groups.expand(shape).reshape(-1).tolist(),
        mask.reshape(-1).tolist(),
    )
    got = group_standardize(x, groups, mask if masked else None)
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=dtype).reshape(shape), **TOLERANCE[dtype]
    )


def test_group_standardize_with_one_group_is_standardize():
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(
        group_standardize(x, torch.zeros(5, dtype=torch.long)), standardize(x, eps=1e-4)
    )


def test_group_standardize_names_shapes_it_cannot_broadcast():
    with pytest.raises(ValueError, match=r"group ids of shape \(4, 2, 2\)"):
        group_standardize(torch.randn(4, 2), torch.zeros(4, 2, 2, dtype=torch.long))
