"""Preference-optimisation losses for language models, per pair or per example: DPO and its
variants (IPO, hinge, robust), SimPO and KTO.

Rafailov et al., "Direct Preference Optimization: Your Language Model is Secretly a Reward
Model", arXiv:2305.18290 (DPO, eq. 7); Azar et al., "A General Theoretical Paradigm to
Understand Learning from Human Preferences", arXiv:2310.12036 (IPO, eq. 17); Zhao et al.,
"SLiC-HF", arXiv:2305.10425 (hinge); Chowdhury et al., "Provably Robust DPO",
arXiv:2403.00409 (robust DPO, eq. 12); Meng et al., "SimPO: Simple Preference Optimization with
a Reference-Free Reward", arXiv:2405.14734 (eq. 6); Ethayarajh et al., "KTO: Model Alignment as
Prospect Theoretic Optimization", arXiv:2402.01306 (eq. 7).

Convention: one value per sequence ``[*B]``: ``log pi(y|x)`` summed over the response tokens
(:func:`rlloss.functional.sequence_log_likelihood`), or their mean where a loss says so. The
reference model's log-probs and KTO's reference point carry no gradient (detached here).
"""

from __future__ import annotations

import torch
from torch.nn.functional import logsigmoid

from rlloss._checks import check_same_shape

Scalar = float | torch.Tensor


def dpo_log_ratio_margin(
    chosen_log_prob: torch.Tensor,
    rejected_log_prob: torch.Tensor,
    ref_chosen_log_prob: torch.Tensor,
    ref_rejected_log_prob: torch.Tensor,
) -> torch.Tensor:
    r"""DPO's margin ``h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))``
    of the chosen ``y_w`` over the rejected ``y_l`` (arXiv:2305.18290, eq. 7; ``beta h`` is the
    difference of the implicit rewards); the reference terms are detached.

    $$
    h = \big(\log \pi(y_w) - \log \pi_{\text{ref}}(y_w)\big)
    - \big(\log \pi(y_l) - \log \pi_{\text{ref}}(y_l)\big)
    $$
    """
    check_same_shape(
        chosen_log_prob=chosen_log_prob,
        rejected_log_prob=rejected_log_prob,
        ref_chosen_log_prob=ref_chosen_log_prob,
        ref_rejected_log_prob=ref_rejected_log_prob,
    )
    chosen = chosen_log_prob - ref_chosen_log_prob.detach()
    return chosen - (rejected_log_prob - ref_rejected_log_prob.detach())


def dpo_sigmoid_loss(margin: torch.Tensor, beta: Scalar, label_smoothing: Scalar = 0.0):
    r"""DPO's loss ``-log sigmoid(beta h)`` (arXiv:2305.18290, eq. 7); with label smoothing
    ``eps`` (conservative DPO: the label is flipped with probability ``eps``), the cross-entropy
    ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``.

    $$
    \mathcal{L} = -(1 - \epsilon) \log \sigma(\beta h) - \epsilon \log \sigma(-\beta h)
    $$
    """
    return -(1 - label_smoothing) * logsigmoid(beta * margin) - label_smoothing * logsigmoid(
        -beta * margin
    )


def robust_dpo_loss(margin: torch.Tensor, beta: Scalar, label_smoothing: Scalar):
    """Robust DPO's unbiased loss under labels flipped with probability ``eps < 1/2``:
    ``(-(1 - eps) log sigmoid(beta h) + eps log sigmoid(-beta h)) / (1 - 2 eps)``
    (Chowdhury et al., arXiv:2403.00409, eq. 12)."""
    clean = -(1 - label_smoothing) * logsigmoid(beta * margin)
    return (clean + label_smoothing * logsigmoid(-beta * margin)) / (1 - 2 * label_smoothing)


def dpo_hinge_loss(margin: torch.Tensor, beta: Scalar) -> torch.Tensor:
    """The hinge loss on the implicit reward margin ``max(0, 1 - beta h)`` (SLiC-HF,
    arXiv:2305.10425, eq. 3, with DPO's margin)."""
    return torch.relu(1 - beta * margin)


def ipo_loss(
    chosen_log_ratio: torch.Tensor,
    rejected_log_ratio: torch.Tensor,
    chosen_length: torch.Tensor,
    rejected_length: torch.Tensor,
    tau: Scalar,
) -> torch.Tensor:
    r"""IPO's squared loss ``(h - 1 / (2 tau))^2`` (arXiv:2310.12036, eq. 17), the margin ``h``
    of the per-token log-ratios: each sequence's ``log pi(y) - log pi_ref(y)`` divided by its
    token count (at least 1), as the IPO authors' results and TRL compute it.

    $$
    \mathcal{L} = \Big(h - \frac{1}{2 \tau}\Big)^2
    $$

    Args:
        chosen_log_ratio: ``[*B]`` the chosen response's summed log-ratio to the reference.
        rejected_log_ratio: ``[*B]`` the rejected response's.
        chosen_length: ``[*B]`` the chosen response's token count.
        rejected_length: ``[*B]`` the rejected response's.
        tau: IPO's regularisation ``tau`` (DPO's ``beta``).
    """
    check_same_shape(
        chosen_log_ratio=chosen_log_ratio,
        rejected_log_ratio=rejected_log_ratio,
        chosen_length=chosen_length,
        rejected_length=rejected_length,
    )
    chosen = chosen_log_ratio / chosen_length.clamp_min(1)
    margin = chosen - rejected_log_ratio / rejected_length.clamp_min(1)
    return (margin - 1 / (2 * tau)).square()


def simpo_loss(
    chosen_mean_log_prob: torch.Tensor,
    rejected_mean_log_prob: torch.Tensor,
    beta: Scalar,
    gamma: Scalar,
    label_smoothing: Scalar = 0.0,
) -> torch.Tensor:
    r"""SimPO's reference-free loss ``-log sigmoid(beta/|y_w| log pi(y_w) - beta/|y_l| log
    pi(y_l) - gamma)`` (arXiv:2405.14734, eq. 6) on the responses' mean token log-probs, with
    the target margin ``gamma``; label smoothing ``eps`` as :func:`dpo_sigmoid_loss`'s.

    $$
    \mathcal{L} = -\log \sigma\Big(\frac{\beta}{|y_w|} \log \pi(y_w)
    - \frac{\beta}{|y_l|} \log \pi(y_l) - \gamma\Big)
    $$
    """
    check_same_shape(
        chosen_mean_log_prob=chosen_mean_log_prob, rejected_mean_log_prob=rejected_mean_log_prob
    )
    margin = beta * (chosen_mean_log_prob - rejected_mean_log_prob) - gamma
    return dpo_sigmoid_loss(margin, 1.0, label_smoothing)


def kto_reference_point(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    r"""KTO's reference point ``z_0 = max(0, mean_j (log pi(y'_j) - log pi_ref(y'_j)))``, the
    batch estimate of ``KL(pi || pi_ref)`` on mismatched responses ``y'_j`` (arXiv:2402.01306,
    sec. 4.1); a 0-dim tensor, no gradient.

    $$
    z_0 = \max\Big(0, \frac{1}{m} \sum_j \log \frac{\pi(y'_j)}{\pi_{\text{ref}}(y'_j)}\Big)
    $$
    """
    check_same_shape(log_prob=log_prob, ref_log_prob=ref_log_prob)
    return (log_prob.detach() - ref_log_prob.detach()).mean().clamp_min(0)


def kto_loss(
    log_ratio: torch.Tensor,
    desirable: torch.Tensor,
    reference_point: torch.Tensor,
    beta: Scalar,
    desirable_weight: Scalar = 1.0,
    undesirable_weight: Scalar = 1.0,
) -> torch.Tensor:
    """KTO's per-example loss (arXiv:2402.01306, eq. 7, without the constant ``lambda``):
    ``lambda_D (1 - sigmoid(beta (r - z_0)))`` for a desirable response,
    ``lambda_U (1 - sigmoid(beta (z_0 - r)))`` for an undesirable one, ``r = log pi(y) -
    log pi_ref(y)`` the example's log-ratio and ``z_0`` :func:`kto_reference_point`.

    Args:
        log_ratio: ``[*B]`` the log-ratios ``r``.
        desirable: ``[*B]`` boolean, which responses are desirable.
        reference_point: ``z_0``, a 0-dim tensor (detached here).
        beta: KTO's ``beta``.
        desirable_weight: ``lambda_D``.
        undesirable_weight: ``lambda_U``.
    """
    check_same_shape(log_ratio=log_ratio, desirable=desirable)
    z0 = reference_point.detach()
    good = desirable_weight * (1 - torch.sigmoid(beta * (log_ratio - z0)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - log_ratio)))
    return torch.where(desirable, good, bad)
