"""Policy distributions by formula: the Gaussian's log-probability and entropy, the
categorical's log-probability, and squashed Gaussian policies (SAC's tanh-Normal): sampling
and log-probabilities, sync-free.

The Gaussian and categorical formulas are what ``torch.distributions.Normal`` / ``Categorical``
compute, written on their parameters (the categorical's entropy is
:func:`rlloss.functional.categorical_entropy`): the losses evaluate TorchRL's standard
distributions through them (one path for the maths, see :mod:`rlloss._distributions`).

An action is ``a = c + h tanh(u)`` with ``u ~ N(loc, scale^2)``, ``c = (high + low) / 2`` and
``h = (high - low) / 2``. Its log-density, by the change of variables, is the Gaussian's minus
``sum_d log |da_d / du_d|`` (Haarnoja et al., "Soft Actor-Critic Algorithms and Applications",
arXiv:1812.05905, appendix C). The log-probability is computed from the pre-tanh value ``u``
itself, never by inverting a (possibly saturated) action, so actions at the bounds keep a finite
log-probability; no ``.item()`` or data-dependent branch is involved, unlike
``torch.distributions``' transform path.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

Scalar = float | torch.Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)


def standard_normal_like(x: torch.Tensor) -> torch.Tensor:
    """``eps ~ N(0, 1)`` of ``x``'s shape, dtype and device: ``torch.randn_like``'s values, drawn
    with ``torch.randn``. AOTAutograd's common-subexpression pass knows ``aten.randn`` is random
    but not ``aten.randn_like`` (torch 2.13), so under ``torch.compile`` two ``randn_like`` draws
    of one tensor (SAC-family losses sample twice from the same actor output) became one draw."""
    return torch.randn(x.shape, dtype=x.dtype, device=x.device)


def normal_log_prob(
    value: torch.Tensor,
    loc: torch.Tensor,
    scale: torch.Tensor,
    log_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The Gaussian log-density ``log N(value; loc, scale^2)``, elementwise (the shapes
    broadcast; no sum over an event dim).

    $$
    \log N(x; \mu, \sigma^2) = -\frac{(x - \mu)^2}{2 \sigma^2} - \log \sigma - \log \sqrt{2 \pi}
    $$

    Args:
        value: the points, e.g. ``[*B, D]`` actions.
        loc: the Gaussian's mean and standard deviation (``scale > 0``), broadcastable
            to ``value``.
        scale: as ``loc``.
        log_scale: ``log(scale)`` when already computed (shared with :func:`normal_entropy`,
            as a hand-written step shares it); ``None``: computed here.
    """
    standardized = (value - loc) / scale
    log_scale = torch.log(scale) if log_scale is None else log_scale
    return -0.5 * standardized.square() - log_scale - _LOG_SQRT_2PI


def sampled_normal_log_prob(noise: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``log N(u; loc, scale^2)`` of a reparameterised draw ``u = loc + scale * noise`` from its
    standard-normal ``noise``: ``-noise^2 / 2 - log scale - log sqrt(2 pi)``, elementwise.

    :func:`normal_log_prob` at ``u``, since ``(u - loc) / scale = noise`` (equal up to float
    rounding), with the same gradients: the gradient through ``u`` and through ``loc`` cancel
    in :func:`normal_log_prob` and neither appears here; ``scale`` gets ``-1 / scale``.
    """
    return -0.5 * noise.square() - torch.log(scale) - _LOG_SQRT_2PI


def normal_entropy(scale: torch.Tensor, log_scale: torch.Tensor | None = None) -> torch.Tensor:
    r"""``H[N(loc, scale^2)] = 1/2 + log sqrt(2 pi) + log scale``, elementwise (``log_scale``:
    ``log(scale)`` when already computed, see :func:`normal_log_prob`).

    $$
    H[N(\mu, \sigma^2)] = \frac{1}{2} + \log \sqrt{2 \pi} + \log \sigma
    $$
    """
    log_scale = torch.log(scale) if log_scale is None else log_scale
    return log_scale + (0.5 + _LOG_SQRT_2PI)


def categorical_log_prob(log_probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``log pi(a)``: the normalised log-probabilities ``[*B, K]`` read at the integer actions
    ``a`` (``[*B]``, any integer or float dtype holding indices; broadcast against
    ``log_probs[..., 0]`` as ``torch.distributions.Categorical.log_prob`` does), ``[*B]``."""
    index, log_probs = torch.broadcast_tensors(index.long().unsqueeze(-1), log_probs)
    return log_probs.gather(-1, index[..., :1]).squeeze(-1)


def _is_unit_box(low: Scalar, high: Scalar) -> bool:
    """Whether the bounds are the numbers -1 and 1 (tensors and arrays are never read: no
    sync, no elementwise comparison)."""
    return isinstance(low, numbers.Real) and isinstance(high, numbers.Real) and low == -1 == -high


def squash(preimage: torch.Tensor, low: Scalar = -1.0, high: Scalar = 1.0) -> torch.Tensor:
    r"""``(high + low) / 2 + (high - low) / 2 * tanh(u)``: a pre-tanh value mapped into
    ``[low, high]`` (elementwise); ``tanh(u)`` itself on the unit box (float bounds -1 and 1,
    where the affine map is the identity: the same numbers, no arithmetic on the bounds).

    $$
    \operatorname{squash}(u) = \frac{h + l}{2} + \frac{h - l}{2} \tanh(u)
    $$
    """
    if _is_unit_box(low, high):
        return torch.tanh(preimage)
    return (high + low) / 2 + (high - low) / 2 * torch.tanh(preimage)


def squash_log_abs_det_jacobian(
    preimage: torch.Tensor, low: Scalar = -1.0, high: Scalar = 1.0
) -> torch.Tensor:
    """``log |d squash(u) / du| = log((high - low) / 2) + log(1 - tanh(u)^2)``, elementwise.

    ``log(1 - tanh(u)^2)`` is written ``2 (log 2 - u - softplus(-2u))``, finite for every
    finite ``u`` (where ``1 - tanh(u)^2`` rounds to 0 beyond ``|u| ~ 9`` in float32). On the
    unit box (float bounds -1 and 1) ``log((high - low) / 2) = 0`` is not added.
    """
    log_tanh_slope = 2 * (_LOG_2 - preimage - F.softplus(-2 * preimage))
    if _is_unit_box(low, high):
        return log_tanh_slope
    half_range = torch.as_tensor((high - low) / 2, dtype=preimage.dtype, device=preimage.device)
    return torch.log(half_range) + log_tanh_slope


def tanh_normal_log_prob(
    preimage: torch.Tensor,
    loc: torch.Tensor,
    scale: torch.Tensor,
    low: Scalar = -1.0,
    high: Scalar = 1.0,
) -> torch.Tensor:
    """Log-density of the action ``squash(u)`` of a tanh-Normal, from its pre-tanh value ``u``.

    ``sum_d [log N(u_d; loc_d, scale_d^2) - log |d a_d / d u_d|]``.

    Args:
        preimage: ``[*B, D]`` pre-tanh values ``u``.
        loc: ``[*B, D]`` parameters of the Gaussian over ``u``.
        scale: ``[*B, D]`` parameters of the Gaussian over ``u``.
        low: the action bounds (floats or tensors broadcastable to ``[D]``).
        high: the action bounds (floats or tensors broadcastable to ``[D]``).

    Returns:
        ``[*B]`` log-probabilities (the last dim is the event dim).
    """
    gaussian = normal_log_prob(preimage, loc, scale)
    return (gaussian - squash_log_abs_det_jacobian(preimage, low, high)).sum(-1)


def tanh_normal_sample_and_log_prob(
    loc: torch.Tensor, scale: torch.Tensor, low: Scalar = -1.0, high: Scalar = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised tanh-Normal action and its log-probability (SAC's policy sample).

    ``u = loc + scale * eps``, ``eps ~ N(0, 1)`` (one :func:`standard_normal_like` draw: the same
    random stream as ``torch.distributions.Normal.rsample``); gradients flow to ``loc`` and
    ``scale`` through both outputs (arXiv:1812.05905, eq. 11 and appendix C).

    Args:
        loc: ``[*B, D]`` parameters of the Gaussian over the pre-tanh value.
        scale: ``[*B, D]`` parameters of the Gaussian over the pre-tanh value.
        low: the action bounds.
        high: the action bounds.

    Returns:
        The action ``[*B, D]`` in ``[low, high]`` and its log-probability ``[*B]``.
    """
    noise = standard_normal_like(loc)
    preimage = loc + scale * noise
    log_prob = sampled_normal_log_prob(noise, scale) - squash_log_abs_det_jacobian(
        preimage, low, high
    )
    return squash(preimage, low, high), log_prob.sum(-1)


def uniform_sample_and_log_prob(
    low: Scalar, high: Scalar, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions drawn uniformly from the box ``[low, high]^D`` and their log-density
    ``-sum_d log(high_d - low_d)`` (one ``torch.rand`` draw: the same random stream as
    ``uniform_(-1, 1)``). CQL's random actions for its importance-sampled log-sum-exp (Kumar et
    al., arXiv:2006.04779, appendix F). Float bounds never become host tensors copied to the
    device (a copy would synchronise).

    Args:
        low: the bounds (floats, or tensors broadcastable to ``[D]`` on ``device``).
        high: the bounds (floats, or tensors broadcastable to ``[D]`` on ``device``).
        shape: ``(*S, D)`` the sample shape, action dim last.

    Returns:
        The actions ``[*S, D]`` and their log-densities ``[*S]`` (all equal).
    """
    width = high - low
    action = low + width * torch.rand(shape, dtype=dtype, device=device)
    if isinstance(width, torch.Tensor):
        log_density = -torch.log(width.to(dtype)).expand(shape[-1:]).sum()
        return action, log_density.expand(shape[:-1])
    log_density = -shape[-1] * math.log(width)
    return action, torch.full(shape[:-1], log_density, dtype=dtype, device=device)
