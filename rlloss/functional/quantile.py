"""Quantile critics: the quantile Huber loss of quantile regression (QR-DQN) and the truncated
mixture target of truncated quantile critics (TQC).

A quantile critic outputs ``M`` atoms ``theta_1..theta_M`` per state-action pair, the return
distribution's quantiles at the midpoints ``tau_m = (2m - 1) / 2M``; an ensemble stacks them
along a leading dim ``[E, *B, M]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def quantile_midpoints(
    num_quantiles: int, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> torch.Tensor:
    r"""The quantile fractions ``tau_m = (2m - 1) / 2M``, ``m = 1..M`` (``[M]``) that a critic
    with ``M`` atoms estimates (Dabney et al., "Distributional Reinforcement Learning with
    Quantile Regression", arXiv:1710.10044, Lemma 2).

    $$
    \tau_m = \frac{2m - 1}{2M}, \qquad m = 1, \ldots, M
    $$
    """
    steps = torch.arange(num_quantiles, dtype=dtype, device=device)
    return (steps + 0.5) / num_quantiles


def quantile_huber_loss(
    quantiles: torch.Tensor, target_atoms: torch.Tensor, kappa: float = 1.0
) -> torch.Tensor:
    """The quantile Huber loss of ``M`` predicted quantiles against ``K`` target atoms,
    averaged over the ``M K`` pairs: ``1/(MK) sum_m sum_k rho_tau_m(y_k - theta_m)`` with
    ``rho_tau(u) = |tau - 1(u < 0)| L_kappa(u) / kappa`` and the Huber loss ``L_kappa(u) =
    u^2 / 2`` for ``|u| <= kappa``, ``kappa (|u| - kappa / 2)`` otherwise (arXiv:1710.10044;
    TQC's critic loss, Kuznetsov et al., arXiv:2005.04269, with ``kappa = 1``).

    The target atoms get no gradient (detached here), nor does the indicator.

    Args:
        quantiles: ``[*B, M]`` the critic's atoms, in the order of :func:`quantile_midpoints`.
        target_atoms: ``[*B, K]`` samples of the target distribution (any order).
        kappa: the Huber threshold, > 0.

    Returns:
        ``[*B]`` the per-sample loss.
    """
    if quantiles.shape[:-1] != target_atoms.shape[:-1]:
        raise ValueError(
            f"quantiles of shape {tuple(quantiles.shape)} and target_atoms of shape "
            f"{tuple(target_atoms.shape)} must agree on every dim but the last (the atoms)."
        )
    difference = target_atoms.detach().unsqueeze(-2) - quantiles.unsqueeze(-1)  # [*B, M, K]
    huber = F.huber_loss(difference, torch.zeros_like(difference), reduction="none", delta=kappa)
    tau = quantile_midpoints(quantiles.shape[-1], quantiles.dtype, quantiles.device)
    weight = (tau.unsqueeze(-1) - (difference.detach() < 0).to(quantiles.dtype)).abs()
    return (weight * huber).mean((-2, -1)) / kappa


def quantile_td_error(quantiles: torch.Tensor, target_atoms: torch.Tensor) -> torch.Tensor:
    """The mean absolute difference ``1/(MK) sum_m sum_k |y_k - theta_m|`` between ``[*B, M]``
    predicted quantiles and ``[*B, K]`` target atoms, ``[*B]``, detached: a quantile critic's TD
    error (TorchRL's TQC priority)."""
    difference = target_atoms.detach().unsqueeze(-2) - quantiles.detach().unsqueeze(-1)
    return difference.abs().mean((-2, -1))


def truncated_mixture_atoms(quantiles: torch.Tensor, num_dropped: int) -> torch.Tensor:
    """TQC's target atoms: the ``E M`` atoms of an ensemble of ``E`` quantile critics pooled
    into one mixture, sorted in increasing order, with the ``num_dropped`` largest removed
    (Kuznetsov et al., "Controlling Overestimation Bias with Truncated Mixture of Continuous
    Distributional Quantile Critics", arXiv:2005.04269: ``num_dropped = d N``).

    Args:
        quantiles: ``[E, *B, M]`` the target critics' atoms at the next state-action pair.
        num_dropped: how many of the ``E M`` pooled atoms to drop, ``0 <= num_dropped < E M``.

    Returns:
        ``[*B, E M - num_dropped]`` the kept atoms, in increasing order.
    """
    pooled = quantiles.movedim(0, -2).flatten(-2)  # [*B, E M]
    kept = pooled.shape[-1] - num_dropped
    if num_dropped < 0 or kept < 1:
        raise ValueError(
            f"num_dropped={num_dropped} must be in [0, {pooled.shape[-1]}): the pooled mixture "
            f"has {pooled.shape[-1]} atoms and must keep at least one (it should be smaller)."
        )
    return pooled.sort(dim=-1).values[..., :kept]
