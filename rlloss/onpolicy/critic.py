"""The on-policy critic's regression (:meth:`rlloss.onpolicy.OnPolicyLoss.loss_critic`): the
distance of ``V(s)`` to its target, value-clipped around the old value (PPO) and clamped
(``vf_clip_param``) if asked, reduced over the valid steps, with its diagnostics.
"""

from __future__ import annotations

import torch

from rlloss import functional as rlf


def critic_regression(
    value: torch.Tensor,
    target: torch.Tensor,
    old_value: torch.Tensor | None,
    mask: torch.Tensor | None,
    *,
    coeff: torch.Tensor,
    distance: str,
    reduction: str,
    clip_value: torch.Tensor | None,
    vf_clip_param: float | None,
    explained_variance: bool,
    clip_fraction: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``coeff * L(V(s), y)`` reduced over the valid steps of ``mask`` as ``reduction`` says,
    and its diagnostics.

    ``L`` is the ``distance`` (:func:`rlloss.functional.distance`); with an ``old_value``
    ``V_old(s)`` (``[*B, 1]``, stored at collection) the value-clipped loss
    ``max(L(V, y), L(V_old + clamp(V - V_old, -clip_value, clip_value), y))``
    (:func:`rlloss.functional.clipped_value_loss`); with ``vf_clip_param`` the per-element loss
    clamped to ``[0, vf_clip_param]`` (:func:`rlloss.functional.clamped_loss`). Without
    clipping, clamping or padding the loss is reduced inside the distance (one operation, the
    same value).

    Args:
        value: ``[*B, 1]`` the critic's ``V(s)`` (``[*B, n_agents, 1]`` per agent).
        target: the value targets ``y``, same shape.
        old_value: ``V_old(s)``, same shape, or ``None`` (no value clipping).
        mask: ``[*B]`` the valid steps of a padded batch, or ``None`` (all).
        coeff: the critic's coefficient.
        distance: ``"l1"``, ``"l2"`` or ``"smooth_l1"``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        clip_value: the value clipping's half-width (read with ``old_value``).
        vf_clip_param: the clamp of the per-element loss, or ``None``.
        explained_variance: report ``explained_variance`` (over dim 0, as TorchRL).
        clip_fraction: report ``value_clip_fraction``, the mean of the clipped elements (with
            ``old_value``).

    Returns:
        The loss (``[*B, 1]`` with ``reduction="none"``, else a scalar) and the diagnostics.
    """
    info = {}
    if explained_variance:
        info["explained_variance"] = rlf.explained_variance(value, target, mask, dim=0)
    if old_value is None and vf_clip_param is None and mask is None:
        return coeff * rlf.reduced_distance(value, target, distance, reduction), info
    if old_value is None:
        loss = rlf.distance(value, target, distance)
    else:
        loss, clipped = rlf.clipped_value_loss(value, old_value, target, clip_value, distance)
        if clip_fraction:
            info["value_clip_fraction"] = rlf.reduce(clipped, "mean", mask)
    if vf_clip_param is not None:  # rl8's clamp of the per-element loss
        loss = rlf.clamped_loss(loss, vf_clip_param)
    return rlf.reduce(coeff * loss, reduction, mask), info
