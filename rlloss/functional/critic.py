"""Critic losses: elementwise distances, PPO's clipped value loss, the TD errors that
prioritized replay uses as priorities, and the regression's reported diagnostics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlloss import _fast
from rlloss._checks import check_same_shape
from rlloss.functional.reduce import reduce

Scalar = float | torch.Tensor

DISTANCES = ("l1", "l2", "smooth_l1")
TD_ERRORS = ("squared", "absolute")


def distance(
    prediction: torch.Tensor, target: torch.Tensor, kind: str, reduction: str = "none"
) -> torch.Tensor:
    """Regression loss between ``prediction`` and ``target``.

    ``kind``: ``"l2"`` (squared error, no 1/2 factor, as ``F.mse_loss``), ``"l1"`` (absolute
    error) or ``"smooth_l1"`` (Huber with delta 1, as ``F.smooth_l1_loss``). ``reduction``:
    ``"none"`` (elementwise), or ``"mean"`` / ``"sum"`` over every element in the same
    operation (one autograd node instead of two: what an unweighted, unmasked loss takes).
    """
    check_same_shape(prediction=prediction, target=target)
    if kind == "l2":  # F.mse_loss's operation without its broadcast (the shapes are equal)
        return _fast.mse_loss(prediction, target, reduction)
    if kind == "l1":
        return F.l1_loss(prediction, target, reduction=reduction)
    if kind == "smooth_l1":
        return F.smooth_l1_loss(prediction, target, reduction=reduction)
    raise ValueError(f"unknown distance {kind!r}; expected one of {DISTANCES}")


def reduced_distance(
    prediction: torch.Tensor,
    target: torch.Tensor,
    kind: str,
    reduction: str,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    normalize_weights: bool = False,
) -> torch.Tensor:
    """``reduce(distance(prediction, target, kind), reduction, mask, weights, ...)``; without
    a mask or weights, reduced inside the distance (one operation, the same value)."""
    if mask is None and weights is None and reduction in ("mean", "sum"):
        return distance(prediction, target, kind, reduction)
    loss = distance(prediction, target, kind)
    return reduce(loss, reduction, mask, weights, normalize_weights)


def clipped_value_loss(
    value: torch.Tensor,
    old_value: torch.Tensor,
    target: torch.Tensor,
    clip: Scalar,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""PPO value clipping: ``max(L(V, y), L(V_old + clamp(V - V_old, -clip, clip), y))``.

    $$
    \max\Big(L(V, y),\; L\big(V_{\text{old}} + \operatorname{clip}(V - V_{\text{old}}, -c, c),
    y\big)\Big)
    $$

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


def clamped_loss(loss: torch.Tensor, limit: Scalar) -> torch.Tensor:
    """rl8's / RLlib's ``vf_clip_param``: the per-element critic loss clamped to ``[0, limit]``
    (elements above ``limit`` then send no gradient). Not PPO's value clipping
    (:func:`clipped_value_loss`), which clips the value around its old estimate."""
    return loss.clamp(0.0, limit)


def expectile_loss(difference: torch.Tensor, expectile: Scalar) -> torch.Tensor:
    r"""The asymmetric squared loss ``|tau - 1(u < 0)| u^2`` of ``u = target - prediction``,
    elementwise: its minimiser is the ``tau``-expectile of the target (Kostrikov et al., "Offline
    Reinforcement Learning with Implicit Q-Learning", arXiv:2110.06169, eq. 5; ``tau = 0.5`` is
    half the squared error).

    $$
    \big|\tau - \mathbb{1}(u < 0)\big| \, u^2, \qquad u = \text{target} - \text{prediction}
    $$
    """
    weight = torch.where(difference < 0, 1.0 - expectile, expectile)
    return weight * difference.square()


def td_error(value: torch.Tensor, target: torch.Tensor, kind: str = "squared") -> torch.Tensor:
    """The per-element TD error used as a replay priority, detached (no gradient).

    ``delta = V - y``; ``"squared"``: ``delta^2`` (TorchRL's DQN), ``"absolute"``: ``|delta|``
    (Schaul et al., "Prioritized Experience Replay", arXiv:1511.05952, sec. 3.3).

    Args:
        value: ``[*B, 1]`` predicted values (any shape).
        target: the targets, same shape as ``value``.
        kind: one of :data:`TD_ERRORS`.

    Returns:
        The detached error, same shape as the inputs.
    """
    check_same_shape(value=value, target=target)
    if kind == "squared":  # the l2 distance's one operation: the same numbers as the square
        squared = _fast.mse_loss(value.detach(), target, "none")
        return squared.detach() if squared.requires_grad else squared  # a target with gradient
    return _error_size(value.detach() - target, kind)


def ensemble_td_error(
    values: torch.Tensor, target: torch.Tensor, kind: str = "squared"
) -> torch.Tensor:
    """``max_i td_error(Q_i, y)`` over an ensemble of Q networks, detached (no gradient): the
    priority of a transition is the error of its worst-fitting member (TorchRL's SAC/TD3).

    Args:
        values: ``[E, *B, 1]`` the ensemble's values, members along dim 0.
        target: ``[*B, 1]`` the targets shared by every member.
        kind: one of :data:`TD_ERRORS`.

    Returns:
        ``[*B, 1]`` the detached maximum error over the members.
    """
    if values.shape[1:] != target.shape:
        raise ValueError(
            f"shape mismatch: values has shape {tuple(values.shape)} (ensemble dim first) but "
            f"target has shape {tuple(target.shape)}; target must have shape "
            f"{tuple(values.shape[1:])}."
        )
    return _error_size(values.detach() - target, kind).amax(0)


def regression_diagnostics(values: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """A critic regression's diagnostics as TorchRL reports them: ``pred_value``, the
    predictions detached with their last dim dropped (``[*B]`` from ``[*B, 1]``, or ``[E, *B]``
    from an ensemble's ``[E, *B, 1]``), and ``target_value``, the targets ``[*B, 1]`` as
    ``[*B]`` (built without gradient)."""
    return {"pred_value": values.detach().squeeze(-1), "target_value": target.squeeze(-1)}


def _error_size(difference: torch.Tensor, kind: str) -> torch.Tensor:
    """``difference^2`` or ``|difference|``, detached (callers subtract from a detached value:
    no autograd node is built for the difference)."""
    if difference.requires_grad:  # a target with gradient; else no detach op (and no view)
        difference = difference.detach()
    if kind == "squared":
        return difference.square()
    if kind == "absolute":
        return difference.abs()
    raise ValueError(f"unknown TD error kind {kind!r}; expected one of {TD_ERRORS}")
