"""Naive references for :mod:`rlloss.functional.preference`, written from the papers on Python
floats with explicit loops, one pair or example at a time (see :mod:`tests.reference` for the
conventions): DPO (arXiv:2305.18290), conservative and robust DPO (arXiv:2403.00409), hinge
(SLiC-HF, arXiv:2305.10425), IPO (arXiv:2310.12036), SimPO (arXiv:2405.14734) and KTO
(arXiv:2402.01306)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def _log_sigmoid(z: float) -> float:
    """``log(1 / (1 + exp(-z)))`` without overflow."""
    return -math.log1p(math.exp(-z)) if z > -30 else z - math.log1p(math.exp(z))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -30 else math.exp(z) / (1.0 + math.exp(z))


def sequence_log_prob(log_probs: Sequence[float], mask: Sequence[bool]) -> float:
    """``log pi(y|x)``: the sum of the response tokens' log-probs."""
    return sum(x for x, m in zip(log_probs, mask, strict=True) if m)


def dpo_loss(
    chosen: float, rejected: float, ref_chosen: float, ref_rejected: float, beta: float, eps: float
) -> float:
    """DPO, eq. 7, the Bradley-Terry likelihood of the implicit rewards
    ``r = beta log(pi / pi_ref)``; with the label flipped with probability ``eps`` its expected
    cross-entropy (conservative DPO)."""
    reward_chosen = beta * (chosen - ref_chosen)
    reward_rejected = beta * (rejected - ref_rejected)
    p_chosen_wins = _sigmoid(reward_chosen - reward_rejected)
    p_rejected_wins = _sigmoid(reward_rejected - reward_chosen)
    return -(1 - eps) * math.log(p_chosen_wins) - eps * math.log(p_rejected_wins)


def robust_dpo_loss(
    chosen: float, rejected: float, ref_chosen: float, ref_rejected: float, beta: float, eps: float
) -> float:
    """Robust DPO (Chowdhury et al., eq. 12): the unbiased loss
    ``((1 - eps) l(y_w, y_l) - eps l(y_l, y_w)) / (1 - 2 eps)``, ``l`` DPO's loss of an order."""
    forward = -_log_sigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))
    backward = -_log_sigmoid(beta * ((rejected - ref_rejected) - (chosen - ref_chosen)))
    return ((1 - eps) * forward - eps * backward) / (1 - 2 * eps)


def hinge_loss(
    chosen: float, rejected: float, ref_chosen: float, ref_rejected: float, beta: float
) -> float:
    """The SLiC hinge with margin 1 on DPO's reward margin."""
    return max(0.0, 1 - beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))


def ipo_loss(
    chosen: Sequence[float],
    rejected: Sequence[float],
    ref_chosen: Sequence[float],
    ref_rejected: Sequence[float],
    tau: float,
) -> float:
    """IPO, eq. 17, ``(h - 1 / (2 tau))^2``, ``h`` the difference of the responses' mean
    per-token log-ratios (each response given as its list of token log-probs)."""
    h_chosen = sum(a - b for a, b in zip(chosen, ref_chosen, strict=True)) / max(len(chosen), 1)
    h_rejected = sum(a - b for a, b in zip(rejected, ref_rejected, strict=True))
    h = h_chosen - h_rejected / max(len(rejected), 1)
    return (h - 1 / (2 * tau)) ** 2


def simpo_loss(
    chosen: Sequence[float], rejected: Sequence[float], beta: float, gamma: float, eps: float
) -> float:
    """SimPO, eq. 6: the Bradley-Terry likelihood of the length-normalised rewards
    ``beta / |y| log pi(y)`` with the target margin ``gamma`` (label smoothing ``eps``)."""
    reward_chosen = beta * sum(chosen) / len(chosen)
    reward_rejected = beta * sum(rejected) / len(rejected)
    z = reward_chosen - reward_rejected - gamma
    return -(1 - eps) * _log_sigmoid(z) - eps * _log_sigmoid(-z)


def kto_reference_point(kl_log_probs: Sequence[float], kl_ref_log_probs: Sequence[float]) -> float:
    """KTO's ``z_0``: the mean log-ratio of the mismatched responses, floored at 0."""
    ratios = [a - b for a, b in zip(kl_log_probs, kl_ref_log_probs, strict=True)]
    return max(0.0, sum(ratios) / len(ratios))


def kto_loss(
    log_prob: float,
    ref_log_prob: float,
    desirable: bool,
    z0: float,
    beta: float,
    weight_desirable: float,
    weight_undesirable: float,
) -> float:
    """KTO, eq. 7: ``lambda_y - v(x, y)``, the value ``v`` being ``lambda_D sigmoid(beta (r -
    z0))`` for a desirable response and ``lambda_U sigmoid(beta (z0 - r))`` otherwise."""
    r = log_prob - ref_log_prob
    if desirable:
        return weight_desirable - weight_desirable * _sigmoid(beta * (r - z0))
    return weight_undesirable - weight_undesirable * _sigmoid(beta * (z0 - r))
