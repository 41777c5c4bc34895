"""Critic losses: elementwise distances and PPO's clipped value loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlloss.functional._checks import check_same_shape

Scalar = float | torch.Tensor

DISTANCES = ("l1", "l2", "smooth_l1")


def distance(prediction: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise regression loss between ``prediction`` and ``target``.

    ``kind``: ``"l2"`` (squared error, no 1/2 factor, as ``F.mse_loss``), ``"l1"`` (absolute
    error) or ``"smooth_l1"`` (Huber with delta 1, as ``F.smooth_l1_loss``).
    """
    check_same_shape(prediction=prediction, target=target)
    if kind == "l2":
        return F.mse_loss(prediction, target, reduction="none")
    if kind == "l1":
        return F.l1_loss(prediction, target, reduction="none")
    if kind == "smooth_l1":
        return F.smooth_l1_loss(prediction, target, reduction="none")
    raise ValueError(f"unknown distance {kind!r}; expected one of {DISTANCES}")


def clipped_value_loss(
    value: torch.Tensor,
    old_value: torch.Tensor,
    target: torch.Tensor,
    clip: Scalar,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO value clipping: ``max(L(V, y), L(V_old + clamp(V - V_old, -clip, clip), y))``.

    Returns:
        The elementwise loss and the (gradient-free) indicator of clipped elements.
    """
    check_same_shape(value=value, old_value=old_value)
    change = value - old_value.detach()
    clipped_change = change.clamp(-clip, clip)
    loss = torch.maximum(
        distance(value, target, kind), distance(old_value.detach() + clipped_change, target, kind)
    )
    return loss, (change != clipped_change).to(value.dtype).detach()
