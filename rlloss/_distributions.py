"""The log-probability and entropy of TorchRL's standard policy distributions, by formula.

``Normal``, ``IndependentNormal`` (and any ``Independent`` over a ``Normal`` that keeps
torch's ``log_prob`` and ``entropy``), ``Categorical`` and ``OneHotCategorical`` (torch's and
TorchRL's) are evaluated from their parameters through :mod:`rlloss.functional`
(:func:`~rlloss.functional.normal_log_prob`, :func:`~rlloss.functional.normal_entropy`,
:func:`~rlloss.functional.categorical_log_prob`,
:func:`~rlloss.functional.categorical_entropy`): the same numbers as the distribution's own
methods, without their Python (argument validation checks, ``**`` through the tensor's Python
operator, nested ``Independent`` / ``Normal`` calls; ``docs/guides/performance.md``). Every
other distribution (TanhNormal, masked or ordinal categoricals, composite, truncated...) and any
distribution built with ``validate_args=True`` keeps its own call. The choice is made from the
Python types only: nothing is synchronised, and ``torch.compile`` traces either path.
"""

from __future__ import annotations

import torch
from torch import distributions as D
from torchrl.modules.distributions import OneHotCategorical

from rlloss import functional as rlf

# Categorical classes whose log-prob and entropy are the formulas', and whether an action is a
# one-hot vector (its index: the argmax, as both libraries' OneHotCategorical take it).
_CATEGORICALS = {D.Categorical: False, D.OneHotCategorical: True, OneHotCategorical: True}


def _standard(distribution: D.Distribution) -> tuple[D.Distribution, int] | None:
    """``(base, event_dims)`` of a distribution evaluated by formula: ``base`` a ``Normal`` (its
    log-density summed over the ``event_dims`` rightmost dims) or one of ``_CATEGORICALS``;
    ``None`` for any other, or when the distribution validates its arguments."""
    if getattr(distribution, "_validate_args", True):  # validating, or not torch's class
        return None
    kind, dims = type(distribution), 0
    if kind.log_prob is D.Independent.log_prob and kind.entropy is D.Independent.entropy:
        dims, distribution = distribution.reinterpreted_batch_ndims, distribution.base_dist
        kind = type(distribution)
    if kind is D.Normal or (dims == 0 and kind in _CATEGORICALS):
        return distribution, dims
    return None


def _sum_event_dims(value: torch.Tensor, dims: int) -> torch.Tensor:
    if dims == 0:
        return value
    if dims == 1:
        return value.sum(-1)
    return value.reshape(*value.shape[:-dims], -1).sum(-1)


def _log_scale(normal: D.Normal) -> torch.Tensor:
    """``log(scale)`` of a ``Normal``, computed once per distribution object and shared by its
    log-prob and entropy (one node of the graph, as in a hand-written step: one ``log`` less
    forward and backward). Kept only when computed with gradient enabled (a value made under
    ``no_grad`` would cut the gradient of a later use); not kept while compiling (the graph
    shares it by itself)."""
    if torch.compiler.is_dynamo_compiling():
        return torch.log(normal.scale)
    shared = normal.__dict__.get("_rlloss_log_scale")
    if shared is not None:
        return shared
    log_scale = torch.log(normal.scale)
    if torch.is_grad_enabled():
        normal.__dict__["_rlloss_log_scale"] = log_scale
    return log_scale


def log_prob(distribution: D.Distribution, value) -> torch.Tensor:
    """``distribution.log_prob(value)``, by formula for the standard distributions."""
    standard = _standard(distribution)
    if standard is None:
        return distribution.log_prob(value)
    base, dims = standard
    if type(base) is D.Normal:
        log_prob = rlf.normal_log_prob(value, base.loc, base.scale, _log_scale(base))
        return _sum_event_dims(log_prob, dims)
    index = value.argmax(-1) if _CATEGORICALS[type(base)] else value
    return rlf.categorical_log_prob(base.logits, index)


def entropy(distribution: D.Distribution, samples: int = 1) -> torch.Tensor:
    """The entropy of ``distribution`` (:func:`rlloss.functional.distribution_entropy`: the
    Monte-Carlo estimate over ``samples`` draws where there is no closed form), by formula for
    the standard distributions."""
    standard = _standard(distribution)
    if standard is None:
        return rlf.distribution_entropy(distribution, samples)
    base, dims = standard
    if type(base) is D.Normal:
        return _sum_event_dims(rlf.normal_entropy(base.scale, _log_scale(base)), dims)
    return rlf.categorical_entropy(base.logits)
