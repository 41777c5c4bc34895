"""Reductions: mean / sum / none, with optional padding masks and importance weights.

Every loss reduces through :func:`reduce`, so masks (padded sequence batches) and prioritized
replay weights enter in one place. Masked elements are selected out with ``torch.where`` (never
multiplied), so a NaN or inf in a masked element of ``loss`` cannot reach the reduced value.

The gradient is another matter: ``torch.where`` sends a zero gradient into a masked element, but
the backward pass of the arithmetic that produced it multiplies that zero by its local
derivative, and ``0 * nan = nan``. The losses therefore replace the content of padded steps
*before* any arithmetic (:func:`rlloss.common.fill_padding`); the functions here only promise
NaN-safe values.
"""

from __future__ import annotations

import torch

from rlloss._checks import check_same_shape

REDUCTIONS = ("mean", "sum", "none")
_DIAGNOSTIC_REDUCTIONS = ("max",)


def _expand_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """``mask`` (``[*B]`` or ``[*B, 1]``) expanded to ``like``'s shape; a ``ValueError`` naming
    both shapes when it does not fit (a ``[B, 3]`` mask for a ``[B, 1]`` loss)."""
    shape = mask.shape
    if shape == like.shape:  # a mask the loss's own (RNDLoss's sampled one): nothing to check
        return mask
    while mask.ndim > like.ndim and mask.shape[-1] == 1:
        mask = mask.squeeze(-1)
    if mask.ndim < like.ndim:
        mask = mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))
    if mask.ndim != like.ndim or any(
        m not in (1, n) for m, n in zip(mask.shape, like.shape, strict=True)
    ):
        raise ValueError(
            f"the {name} has shape {tuple(shape)}, which does not fit the elementwise loss of "
            f"shape {tuple(like.shape)}: give one value per batch element ([*B] or [*B, 1])."
        )
    return mask.expand_as(like)


def reduce(
    loss: torch.Tensor,
    reduction: str,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    normalize_weights: bool = False,
) -> torch.Tensor:
    """Reduce an elementwise loss.

    Args:
        loss: the elementwise loss.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (the elementwise loss, masked elements
            set to 0); ``"max"`` for diagnostics (masked elements ignored, no weights).
        mask: boolean, broadcastable to ``loss`` (a ``[*B, 1]`` mask applies to a ``[*B]`` loss);
            ``False`` marks padding.
        weights: importance weights (prioritized replay), broadcastable like ``mask``.
        normalize_weights: with weights and ``"mean"``, ``sum(w l) / sum(w)`` (TorchRL) instead
            of ``mean(w l)`` (Schaul et al., arXiv:1511.05952).

    Returns:
        A scalar, or a tensor of the loss's shape for ``"none"``.
    """
    if reduction == "max":
        if mask is None:
            return loss.max()
        return torch.where(_expand_mask(mask, loss), loss, -torch.inf).max()
    if mask is not None:
        mask = _expand_mask(mask, loss)
        loss = torch.where(mask, loss, 0.0)
    if weights is not None:
        weights = _expand_mask(weights, loss, "weights")
        if mask is not None:
            weights = torch.where(mask, weights, 0.0)
        loss = loss * weights
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if weights is not None and normalize_weights:
        return loss.sum() / weights.sum()
    if mask is not None:
        return loss.sum() / mask.sum().clamp_min(1)
    return loss.mean()


def standardize(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    exclude_dims: tuple[int, ...] = (),
) -> torch.Tensor:
    """``(x - mean) / max(std, eps)`` over all (valid) elements, std with Bessel's correction.

    This is TorchRL's advantage normalisation (``normalize_advantage=True``), so the two agree.
    ``exclude_dims``: dims that keep their own statistics (TorchRL's
    ``normalize_advantage_exclude_dims``, e.g. ``(-2,)`` for the agent dim of ``[*B, n_agents,
    1]`` advantages: one mean and std per agent); the moments reduce over the other dims.
    """
    dims = reduced_dims(x.shape, exclude_dims)
    if dims == ():
        return x  # every dim excluded: nothing to standardise over (TorchRL warns)
    if mask is None and dims is None:
        return (x - x.mean()) / x.std().clamp_min(eps)
    return standardized_with(x, *masked_moments(x, mask, dims), mask=mask, eps=eps)


def reduced_dims(shape: torch.Size, exclude_dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims of a tensor of ``shape`` that statistics reduce over when ``exclude_dims`` keep
    their own (``None``: all of them); a ``ValueError`` for a repeated or out-of-range dim."""
    if not exclude_dims:
        return None
    ndim = len(shape)
    excluded = [dim + ndim if dim < 0 else dim for dim in exclude_dims]
    if len(set(excluded)) != len(excluded) or any(not 0 <= dim < ndim for dim in excluded):
        raise ValueError(
            f"exclude_dims={tuple(exclude_dims)} must name distinct dims of the standardised "
            f"tensor, of shape {tuple(shape)} (negative dims count from the end: (-2,) is the "
            "agent dim of a [*B, n_agents, 1] advantage)."
        )
    return tuple(dim for dim in range(ndim) if dim not in excluded)


def group_standardize(
    x: torch.Tensor,
    groups: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-4,
) -> torch.Tensor:
    """``x`` standardised within each group of equal ids: ``(x - mean_g) / max(std_g, eps)``,
    the moments over the group's valid elements, std with Bessel's correction (TorchRL's
    ``group_key`` standardisation, e.g. per task).

    ``groups``: integer ids whose leading dims are ``x``'s (trailing singleton dims added), any
    values. No host sync: the groups are found by sorting the ids (no ``torch.unique``), each
    element's group is its rank among the distinct ids.
    """
    while groups.ndim < x.ndim:
        groups = groups.unsqueeze(-1)
    if groups.ndim > x.ndim:
        raise ValueError(
            f"group ids of shape {tuple(groups.shape)} cannot index values of shape "
            f"{tuple(x.shape)}: give one id per batch element (leading dims of the values)."
        )
    ids, flat = groups.expand(x.shape).reshape(-1), x.reshape(-1)
    weight = torch.ones_like(flat) if mask is None else _expand_mask(mask, x).reshape(-1)
    weight = weight.to(flat.dtype)
    sorted_ids, order = ids.sort(stable=True)
    starts = torch.cat((sorted_ids[:1] == sorted_ids[:1], sorted_ids[1:] != sorted_ids[:-1]))
    group = torch.empty_like(order).scatter_(0, order, starts.long().cumsum(0) - 1)
    count = torch.zeros_like(flat).index_add_(0, group, weight)
    mean = torch.zeros_like(flat).index_add_(0, group, flat * weight) / count.clamp_min(1)
    centered = flat - mean[group]
    m2 = torch.zeros_like(flat).index_add_(0, group, centered.square() * weight)
    std = (m2 / (count - 1).clamp_min(1)).sqrt().clamp_min(eps)
    return (centered / std[group]).reshape(x.shape)


def masked_moments(
    x: torch.Tensor, mask: torch.Tensor | None = None, dims: tuple[int, ...] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(count, mean, M2)`` of the valid elements of ``x`` (``M2``: the sum of squared
    deviations from the mean); padding enters no arithmetic. The moments Chan's formula merges
    (:func:`rlloss.training.distributed.all_moments`). ``dims``: the dims reduced over (kept as
    size 1), all by default (scalars)."""
    mask = torch.ones_like(x, dtype=torch.bool) if mask is None else _expand_mask(mask, x)
    keep = dims is not None
    dims = tuple(range(x.ndim)) if dims is None else dims
    count = mask.sum(dims, keepdim=keep)
    valid = torch.where(mask, x, 0.0)
    mean = valid.sum(dims, keepdim=keep) / count.clamp_min(1)
    m2 = torch.where(mask, (valid - mean) ** 2, 0.0).sum(dims, keepdim=keep)
    return count, mean, m2


def standardized_with(
    x: torch.Tensor,
    count: torch.Tensor,
    mean: torch.Tensor,
    m2: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``(x - mean) / max(std, eps)`` with given moments, std with Bessel's correction
    (``M2 / (count - 1)``); masked elements come out as ``-mean / std`` of a 0 (callers ignore
    them)."""
    valid = x if mask is None else torch.where(_expand_mask(mask, x), x, 0.0)
    std = (m2 / (count - 1).clamp_min(1)).sqrt()
    return (valid - mean) / std.clamp_min(eps)


def normalized_effective_sample_size(
    log_weight: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """``ESS / N = (sum w)^2 / (N sum w^2)`` of importance weights ``w = exp(log_weight)``; 1 when
    all weights are equal. The weights are rescaled by their maximum first, so log-weights of
    any size stay finite. ``dim=None``: one number over every valid element; ``dim=d``: one per
    element of the other dims, over ``d`` (TorchRL's PPO ESS takes ``d = 0``, the batch's first
    dim: one per time step, agent or feature of a multi-dim batch); a slice with no valid
    element gives 1.
    """
    if dim is None:
        return normalized_effective_sample_size(log_weight.reshape(-1), _flat(mask, log_weight), 0)
    if mask is not None:
        mask = _expand_mask(mask, log_weight).movedim(dim, 0)
    log_weight = log_weight.movedim(dim, 0)
    if mask is None:
        weight = (log_weight - log_weight.amax(0)).exp()
        count = log_weight.shape[0]
    else:
        count = mask.sum(0)
        top = torch.where(mask, log_weight, -torch.inf).amax(0)
        shifted = log_weight - torch.where(count > 0, top, 0.0)
        weight = torch.where(mask, shifted.exp(), 0.0)
    ess = weight.sum(0).square() / (weight.square().sum(0) * count)
    return ess if mask is None else torch.where(count > 0, ess, 1.0)


def explained_variance(
    prediction: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor | None = None,
    dim: int | None = None,
) -> torch.Tensor:
    """``1 - Var[target - prediction] / Var[target]`` (population variances over the valid
    elements: those where ``mask`` is ``True``, all without one), without gradient. ``dim=None``:
    one number over every valid element; ``dim=d``: one per element of the other dims, the
    variances over ``d`` (TorchRL's PPO takes ``d = 0``: ``[n_agents, 1]`` for per-agent values
    ``[B, n_agents, 1]``)."""
    prediction, target = prediction.detach(), target.detach()
    eps = torch.finfo(target.dtype).eps
    if dim is None:
        flat_mask = _flat(mask, target)
        return explained_variance(prediction.reshape(-1), target.reshape(-1), flat_mask, 0)
    if mask is not None:
        mask = _expand_mask(mask, target).movedim(dim, 0)
    prediction, target = prediction.movedim(dim, 0), target.movedim(dim, 0)
    return 1.0 - _variance(target - prediction, mask) / (_variance(target, mask) + eps)


def _flat(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """``mask`` expanded to ``like`` and flattened (``None`` stays ``None``)."""
    return None if mask is None else _expand_mask(mask, like).reshape(-1)


def _variance(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The population variance over dim 0 of the elements of ``x`` where ``mask`` (``x``'s
    shape) holds; all of them without one."""
    if mask is None:
        return torch.var(x, dim=0, correction=0)
    count = mask.sum(0).clamp_min(1)
    valid = torch.where(mask, x, 0.0)
    mean = valid.sum(0) / count
    return torch.where(mask, (valid - mean) ** 2, 0.0).sum(0) / count


AGGREGATIONS = ("token_mean", "prompt_mean", "none", "seq_sum_constant")


def aggregate_tokens(
    value: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
    num_items: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[*B, T]`` over its valid tokens.

    - ``"token_mean"``: the mean over every valid token of the batch (DAPO's token-level loss,
      arXiv:2503.14476, eq. 12): long sequences weigh more.
    - ``"prompt_mean"``: each sequence's mean over its valid tokens, then the mean over the
      sequences (GRPO's ``1/G sum_i 1/|o_i| sum_t``, arXiv:2402.03300, eq. 3); a sequence with
      no valid token counts as 0.
    - ``"seq_sum_constant"``: each sequence's sum divided by one constant ``max_tokens``
      (default: ``T``), then the mean over the sequences (Dr. GRPO, arXiv:2503.20783, sec. 3.2:
      no per-sequence length normalisation).
    - ``"none"``: the per-token loss, 0 on masked tokens.

    ``num_items``: the mean's denominator instead of this batch's own count: a number of valid
    tokens for ``"token_mean"``, of sequences for the two others (a number or a 0-dim tensor;
    ``None``: the batch's own). Sums over the parts of a batch, each divided by the whole
    batch's count, add up to the whole batch's mean (gradient accumulation).
    """
    check_same_shape(value=value, mask=mask)
    valid = torch.where(mask, value, 0.0)
    if aggregation == "none":
        return valid
    if aggregation == "token_mean":
        return valid.sum() / (mask.sum().clamp_min(1) if num_items is None else num_items)
    if aggregation == "prompt_mean":
        per_sequence = valid.sum(-1) / mask.sum(-1).clamp_min(1)
    elif aggregation == "seq_sum_constant":
        per_sequence = valid.sum(-1) / (value.shape[-1] if max_tokens is None else max_tokens)
    else:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}.")
    return per_sequence.mean() if num_items is None else per_sequence.sum() / num_items


def masked_token_ess(log_weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(sum_t w_t)^2 / sum_t w_t^2`` over the valid tokens, ``w = exp(log_weight)``, no
    gradient, without a boolean index (no host sync); TorchRL's GRPO logs it divided by the
    number of valid tokens."""
    check_same_shape(log_weight=log_weight, mask=mask)
    masked = torch.where(mask, log_weight.detach(), -torch.inf)
    return (2 * masked.flatten().logsumexp(0) - (2 * masked).flatten().logsumexp(0)).exp()
