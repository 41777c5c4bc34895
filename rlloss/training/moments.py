"""Running moments shared by the reward and value normalisers: ``(count, mean, M2)`` merged with a
batch (masked, pooled across the ranks of a ``torch.distributed`` group), the scale they give,
and the state layouts of earlier versions."""

from __future__ import annotations

import torch

from rlloss.training.distributed import all_moments

MOMENT_BUFFERS = ("count", "mean", "m2")  # the running-moment buffers of both normalizers


def merged_moments(
    count: torch.Tensor,
    mean: torch.Tensor,
    m2: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor | None = None,
    process_group=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Running ``(count, mean, M2)`` merged with a batch of ``values`` (Chan, Golub & LeVeque,
    "Updating formulae and a pairwise algorithm for computing sample variances", 1979)::

        delta = mean_b - mean,  n = count + n_b
        mean' = mean + delta * n_b / n
        M2'   = M2 + M2_b + delta^2 * count * n_b / n

    ``M2`` is the sum of squared deviations, so the population variance is ``M2 / count``. The
    batch moments come from ``torch.var_mean`` (Welford), so equal values give ``M2 = 0`` exactly.
    With ``valid`` (a boolean mask of ``values``' shape), only those values enter, without a host
    sync: their moments are taken on the values shifted by a valid one (equal values still give
    ``M2 = 0`` exactly), and a batch with no valid value leaves the moments unchanged.

    With a ``process_group`` (or the default group when ``torch.distributed`` is initialised),
    the batch is the union of every rank's ``values``: the ranks' batch moments are merged first
    (:func:`rlloss.training.distributed.all_moments`), so ranks that start from the same running
    moments end with the same ones.

    Returns:
        The merged ``(count, mean, M2)``, 0-dim tensors.
    """
    if valid is None:
        batch_count = values.numel()
        batch_var, batch_mean = torch.var_mean(values, correction=0)
        batch_m2 = batch_var * batch_count
    else:
        batch_count, batch_mean, batch_m2 = masked_moments(values, valid)
    batch_count, batch_mean, batch_m2 = all_moments(
        batch_count, batch_mean, batch_m2, process_group
    )
    total = count + batch_count
    share = batch_count / torch.as_tensor(total).clamp_min(1)
    delta = batch_mean - mean
    merged_mean = mean + delta * share
    merged_m2 = m2 + batch_m2 + delta.square() * count * share
    return total, merged_mean, merged_m2


def masked_moments(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(count, mean, M2)`` of the valid values (the shifted-data algorithm, shifted by the
    first valid value, 0 when there is none)."""
    flat, ok = values.reshape(-1), valid.reshape(-1)
    first = flat.index_select(0, ok.to(torch.uint8).argmax().reshape(1)).squeeze(0)
    shift = torch.where(ok.any(), first, 0.0)
    shifted = torch.where(ok, flat - shift, 0.0)
    count = ok.sum().to(values.dtype)
    total = shifted.sum()
    mean = shift + total / count.clamp_min(1)
    m2 = (shifted.square().sum() - total.square() / count.clamp_min(1)).clamp_min(0.0)
    return count, mean, m2


def upgraded_state(state: dict, prefix: str, num_nonfinite: torch.Tensor) -> dict:
    """``state`` with the layouts of earlier versions made current: 0-dim moments and count as
    shape ``[1]``, a missing ``num_nonfinite`` as 0."""
    state = dict(state)
    state.setdefault(prefix + "num_nonfinite", torch.zeros_like(num_nonfinite))
    for name in (*MOMENT_BUFFERS, "num_nonfinite"):
        value = state.get(prefix + name)
        if isinstance(value, torch.Tensor) and value.ndim == 0:
            state[prefix + name] = value.reshape(1)
    return state


def moments_scale(var: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(var) + eps``, or 1 where ``var == 0`` (rewards then pass unscaled)."""
    return torch.where(var > 0, var.sqrt() + eps, torch.ones_like(var))
