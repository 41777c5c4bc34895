"""How the on-policy losses normalise the advantage: standardised with this batch's statistics
or every rank's, optionally one set of statistics per agent (``exclude_dims``), or divided by
the scale of a TorchRL ``ValueNorm`` (``advantage_norm``, e.g. DreamerV3's percentile return
scaling) without re-centring.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from rlloss import functional as rlf
from rlloss.training.distributed import global_standardize


def check_advantage_options(
    owner: str, local: bool, global_: bool, exclude_dims, advantage_norm
) -> tuple[int, ...]:
    """The checked ``normalize_advantage_exclude_dims`` as a tuple; a ``ValueError`` for
    options that contradict each other, a ``TypeError`` for an ``advantage_norm`` that is not a
    ``ValueNorm``-like module."""
    if global_ and not local:
        raise ValueError(
            f"{owner}: normalize_advantage_global=True chooses where normalize_advantage takes "
            "its statistics; pass normalize_advantage=True too."
        )
    if advantage_norm is not None and local:
        raise ValueError(
            "normalize_advantage=True and advantage_norm are mutually exclusive: pass either "
            "the mean/std standardization flag or a ValueNorm instance, not both."
        )
    check_value_norm(owner, "advantage_norm", advantage_norm, ("update", "scale"))
    if isinstance(exclude_dims, int) or not all(isinstance(d, int) for d in exclude_dims):
        raise TypeError(
            f"{owner}: normalize_advantage_exclude_dims must be a tuple of ints, e.g. (-2,) for "
            f"the agent dim; got {exclude_dims!r}."
        )
    return tuple(exclude_dims)


def check_value_norm(owner: str, keyword: str, norm, methods: tuple[str, ...]) -> None:
    """A ``TypeError`` unless ``norm`` is ``None`` or a TorchRL ``ValueNorm``-like module with
    ``methods`` (``advantage_norm`` needs ``update`` and ``scale``, MAPPO's ``value_norm``
    ``update`` and ``normalize``)."""
    if norm is None:
        return
    if not isinstance(norm, nn.Module) or not all(
        callable(getattr(norm, name, None)) for name in methods
    ):
        wanted = " and ".join(f"{name}()" for name in methods)
        raise TypeError(
            f"{owner}: {keyword} must be a torchrl.modules.ValueNorm (a module with {wanted}, "
            f"e.g. PopArtValueNorm(shape=1)), got {type(norm).__name__}."
        )


def standardized_advantage(
    owner: str,
    advantage: torch.Tensor,
    mask: torch.Tensor | None,
    batch_numel: int,
    exclude_dims: tuple[int, ...],
    global_: bool,
    process_group,
) -> torch.Tensor:
    """The advantage standardised over the valid steps (:func:`rlloss.functional.standardize`),
    or over every rank's with ``global_``; the dims of ``exclude_dims`` keep their own
    statistics. Warns, as TorchRL does, when the advantage has more elements than the batch
    (per-agent advantages, say) and no dim is excluded."""
    if advantage.numel() > batch_numel and not exclude_dims:
        warnings.warn(
            f"{owner}: advantage normalization over an advantage of shape "
            f"{tuple(advantage.shape)}, which has more elements than the batch ({batch_numel}): "
            "every agent (or objective) shares one mean and std. Pass "
            "normalize_advantage_exclude_dims=(-2,) (the agent dim) to keep them apart.",
            stacklevel=3,
        )
    if global_:
        return global_standardize(
            advantage, mask, process_group=process_group, exclude_dims=exclude_dims
        )
    if advantage.numel() > 1:
        return rlf.standardize(advantage, mask, exclude_dims=exclude_dims)
    return advantage


def norm_scaled_advantage(
    advantage: torch.Tensor,
    advantage_norm: nn.Module,
    value_target: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """``advantage / advantage_norm.scale()``, after folding ``value_target`` (its valid rows)
    into the norm's statistics when given. With a padding mask the valid rows are selected by
    boolean indexing, a host sync (a ``ValueNorm`` takes no weights)."""
    if value_target is not None:
        update_value_norm(advantage_norm, value_target, mask)
    return advantage / advantage_norm.scale()


def update_value_norm(norm: nn.Module, value_target: torch.Tensor, mask: torch.Tensor | None):
    """Fold the value targets of the valid steps into a TorchRL ``ValueNorm``'s statistics
    (``norm.update``), so that they do not depend on how much padding the batch holds. With a
    padding mask the valid rows are selected by boolean indexing, a host sync (a ``ValueNorm``
    takes no weights); without one, the targets as they are (TorchRL's call)."""
    if mask is not None:
        value_target = value_target[_row_mask(mask, value_target)]
    norm.update(value_target)


def _row_mask(mask: torch.Tensor, value_target: torch.Tensor) -> torch.Tensor:
    """A padding mask (``[*B]`` or ``[*B, 1]``) as the ``[*B]`` rows of a ``[*B, 1]`` value."""
    mask = mask.bool()
    while mask.ndim >= value_target.ndim and mask.shape[-1] == 1:
        mask = mask.squeeze(-1)
    return mask
