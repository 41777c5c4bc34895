"""The Gaussian and categorical formulas (``rlloss.functional.normal_log_prob``,
``normal_entropy``, ``categorical_log_prob``) against the naive references, and
``rlloss._distributions``: TorchRL's standard distributions evaluated through them give the
distributions' own numbers and gradients; every other distribution keeps its own call."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch import distributions as D
from torchrl.modules import IndependentNormal, MaskedCategorical, OneHotCategorical, TanhNormal

from rlloss import _distributions
from rlloss import functional as rlf
from tests import reference

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}
SHAPES = [(1,), (7,), (4, 5), (2, 3, 4)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_normal_log_prob_and_entropy_match_reference(shape, dtype):
    generator = torch.Generator().manual_seed(0)
    value, loc = (3 * torch.randn(2, *shape, generator=generator, dtype=dtype)).unbind(0)
    scale = torch.rand(shape, generator=generator, dtype=dtype) * 2 + 0.05
    expected = reference.elementwise(reference.normal_log_density, value, loc, scale)
    actual = rlf.normal_log_prob(value, loc, scale)
    assert actual.shape == shape and actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected, **TOLERANCE[dtype])
    entropy = rlf.normal_entropy(scale)
    expected = reference.elementwise(reference.normal_entropy, scale)
    torch.testing.assert_close(entropy.double(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [(1,), (6,), (2, 3)], ids=str)
def test_categorical_log_prob_matches_reference(batch, dtype):
    generator = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(*batch, 5, generator=generator, dtype=dtype)
    action = torch.randint(5, batch, generator=generator)
    actual = rlf.categorical_log_prob(logits.log_softmax(-1), action)
    assert actual.shape == batch and actual.dtype == dtype
    rows = [
        reference.categorical_log_prob(row, a)
        for row, a in zip(logits.reshape(-1, 5).tolist(), action.reshape(-1).tolist(), strict=True)
    ]
    expected = torch.tensor(rows, dtype=torch.float64).reshape(batch)
    torch.testing.assert_close(actual.double(), expected, **TOLERANCE[dtype])
    # float-coded indices read as the same actions (torch's Categorical casts with .long())
    torch.testing.assert_close(
        rlf.categorical_log_prob(logits.log_softmax(-1), action.double()), actual
    )


def test_normal_entropy_identity_unit_scale():
    """``H[N(mu, 1)] = 1/2 log(2 pi e)`` for any mean; doubling sigma adds log 2."""
    one = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(
        rlf.normal_entropy(one), torch.full((3,), 1.4189385332046727, dtype=torch.float64)
    )
    torch.testing.assert_close(
        rlf.normal_entropy(2 * one) - rlf.normal_entropy(one),
        torch.full((3,), 0.6931471805599453, dtype=torch.float64),
    )


def standard_distributions():
    """``(name, distribution, value, leaves)`` of each standard distribution: its parameters'
    leaf tensors (with grad) and a value to score."""
    torch.manual_seed(0)
    loc = torch.randn(8, 3, requires_grad=True)
    scale = (torch.rand(8, 3) + 0.1).requires_grad_()
    logits = torch.randn(8, 4, requires_grad=True)
    index = torch.randint(4, (8,))
    one_hot = torch.nn.functional.one_hot(index, 4).float()
    gaussian, categorical = (loc, scale), (logits,)
    return [
        ("Normal", D.Normal(loc, scale), torch.randn(8, 3), gaussian),
        ("Independent(Normal)", D.Independent(D.Normal(loc, scale), 1), loc.detach(), gaussian),
        ("Independent(Normal, 2)", D.Independent(D.Normal(loc, scale), 2), loc + 1, gaussian),
        ("IndependentNormal", IndependentNormal(loc, scale), torch.randn(8, 3), gaussian),
        ("Categorical", D.Categorical(logits=logits), index, categorical),
        ("Categorical(probs)", D.Categorical(probs=logits.softmax(-1)), index, categorical),
        ("OneHotCategorical", D.OneHotCategorical(logits=logits), one_hot, categorical),
        ("torchrl.OneHotCategorical", OneHotCategorical(logits=logits), one_hot, categorical),
    ]


@pytest.mark.parametrize("case", range(8))
def test_standard_distributions_by_formula_match_their_own_methods(case):
    name, distribution, value, leaves = standard_distributions()[case]
    formula = "categorical_log_prob" if "ategorical" in name else "normal_log_prob"
    expected_log_prob, expected_entropy = distribution.log_prob(value), distribution.entropy()
    with mock.patch.object(rlf, formula, wraps=getattr(rlf, formula)) as called:
        log_prob = _distributions.log_prob(distribution, value)
    called.assert_called_once()  # the formula, not the distribution's own method
    entropy = _distributions.entropy(distribution)
    assert log_prob.shape == expected_log_prob.shape
    assert entropy.shape == expected_entropy.shape
    torch.testing.assert_close(log_prob, expected_log_prob, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy, expected_entropy, rtol=1e-6, atol=1e-6)
    ours = torch.autograd.grad(log_prob.sum() + entropy.sum(), leaves, retain_graph=True)
    theirs = torch.autograd.grad(expected_log_prob.sum() + expected_entropy.sum(), leaves)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def other_distributions():
    torch.manual_seed(0)
    loc, scale, logits = torch.randn(8, 3), torch.rand(8, 3) + 0.1, torch.randn(8, 4)
    mask = torch.ones(8, 4, dtype=torch.bool)
    return [
        (TanhNormal(loc, scale), torch.rand(8, 3) * 1.8 - 0.9),
        (MaskedCategorical(logits=logits, mask=mask), torch.randint(4, (8,))),
        (D.Normal(loc, scale, validate_args=True), torch.randn(8, 3)),
        (D.Independent(D.Laplace(loc, scale), 1), torch.randn(8, 3)),
        (D.Categorical(logits=logits, validate_args=True), torch.randint(4, (8,))),
    ]


@pytest.mark.parametrize("case", range(5))
def test_other_distributions_keep_their_own_call(case):
    distribution, value = other_distributions()[case]
    with (
        mock.patch.object(rlf, "normal_log_prob", side_effect=AssertionError("formula")),
        mock.patch.object(rlf, "categorical_log_prob", side_effect=AssertionError("formula")),
    ):
        log_prob = _distributions.log_prob(distribution, value)
    torch.testing.assert_close(log_prob, distribution.log_prob(value))


def test_validating_distribution_raises_its_own_error():
    """A distribution built with ``validate_args=True`` keeps torch's check of the value."""
    distribution = D.Categorical(logits=torch.zeros(4, 3), validate_args=True)
    with pytest.raises(ValueError, match="support"):
        _distributions.log_prob(distribution, torch.tensor([0, 1, 2, 7]))


def test_duck_typed_distribution_keeps_its_own_call():
    """An object with ``log_prob`` / ``entropy`` but none of torch's attributes (a user's
    distribution-like class) is called as it is."""

    class Scores:
        def log_prob(self, value):
            return value.sum(-1)

        def entropy(self):
            return torch.ones(2)

    value = torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(_distributions.log_prob(Scores(), value), torch.tensor([3.0, 12.0]))
