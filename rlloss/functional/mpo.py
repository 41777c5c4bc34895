"""Maximum a posteriori policy optimisation (MPO): the E-step weights and temperature dual, the
decoupled Gaussian KLs, the Lagrange penalties and duals, and the categorical variant.

Abdolmaleki et al., "Maximum a Posteriori Policy Optimisation", arXiv:1806.06920, and "Relative
Entropy Regularized Policy Iteration", arXiv:1812.02256 (decoupled mean/covariance constraints);
DeepMind Acme (``acme/jax/losses/mpo.py``) is the reference implementation.

Shapes: ``N`` actions sampled per state lie along dim 0 (``[N, *B]``), states along ``*B``, action
dimensions along the last dim ``D``. Functions return per-state tensors (``[*B]``, or ``[*B, D]``
per action dimension); the batch mean of a per-state loss is Acme's loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlloss._checks import check_same_shape
from rlloss.functional.distributions import normal_log_prob
from rlloss.functional.policy import gaussian_kl

Scalar = float | torch.Tensor

DUAL_EPSILON = 1e-8  # added to softplus(param): a dual never reaches 0
MIN_LOG_DUAL = -18.0  # Acme's floor on the dual parameters


def dual_variable(parameter: torch.Tensor) -> torch.Tensor:
    """A Lagrange multiplier from its unconstrained parameter: ``softplus(param) + 1e-8``
    (Acme: softplus rather than exp for numerical stability)."""
    return F.softplus(parameter) + DUAL_EPSILON


def dual_parameter_bound(maximum: float) -> float:
    """The largest dual parameter whose :func:`dual_variable` is at most ``maximum`` (> 0):
    the inverse softplus of ``maximum - 1e-8``, for capping a multiplier (pytorchrl's
    ``alpha_mean_max`` and friends) by clamping its parameter."""
    target = maximum - DUAL_EPSILON
    return target + math.log(-math.expm1(-target))  # log(exp(t) - 1), stable for large t


def mpo_weights(q_values: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    r"""E-step weights ``w_ij = softmax_j(Q_ij / eta)`` over the sample dim 0, no gradient.

    $$
    w_{ij} = \frac{\exp(Q_{ij} / \eta)}{\sum_{j'} \exp(Q_{ij'} / \eta)}
    $$

    The non-parametric policy ``q(a_ij|s_i) ~ pi_target(a_ij|s_i) exp(Q_ij / eta)`` represented
    by the ``N`` actions sampled from the target policy (arXiv:1806.06920, eq. 7).

    Args:
        q_values: ``[N, *B]`` values of the sampled actions.
        temperature: the temperature ``eta`` (a scalar tensor).

    Returns:
        ``[N, *B]`` weights summing to one over dim 0 (detached).
    """
    return torch.softmax(q_values.detach() / temperature.detach(), dim=0)


def mpo_temperature_loss(
    q_values: torch.Tensor, temperature: torch.Tensor, epsilon: Scalar
) -> torch.Tensor:
    r"""The temperature dual ``eta (epsilon + logsumexp_j(Q_ij / eta) - log N)`` per state.

    $$
    \mathcal{L}_{\eta} = \eta \Big(\epsilon + \log \sum_j \exp(Q_{ij} / \eta) - \log N\Big)
    $$

    Minimising its batch mean over ``eta`` gives the temperature for which the E-step policy is
    ``epsilon`` away (in KL) from the target policy (arXiv:1806.06920, eq. 9, with the integral
    over actions estimated from the ``N`` samples). Only ``eta`` gets gradient.

    Args:
        q_values: ``[N, *B]`` values of the sampled actions (detached here).
        temperature: ``eta``, a scalar tensor.
        epsilon: the E-step KL bound.

    Returns:
        ``[*B]`` per-state dual losses.
    """
    log_num_samples = math.log(q_values.shape[0])
    tempered = q_values.detach() / temperature
    return temperature * (epsilon + torch.logsumexp(tempered, dim=0) - log_num_samples)


def mpo_sample_kl(weights: torch.Tensor) -> torch.Tensor:
    """``KL(q || pi_target) ~ sum_j w_j log(N w_j)``, the E-step policy's KL from the target
    policy estimated on the samples (Acme's ``kl_q`` diagnostic, with its ``+1e-8``), ``[*B]``."""
    num_samples = weights.shape[0]
    return (weights * torch.log(num_samples * weights + 1e-8)).sum(0)


def weighted_log_likelihood_loss(log_prob: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The M-step's weighted maximum likelihood, ``-sum_j w_ij log pi(a_ij|s_i)``, ``[*B]``
    (arXiv:1806.06920, eq. 10): the cross-entropy from the E-step policy to ``pi``."""
    check_same_shape(log_prob=log_prob, weights=weights)
    return -(weights.detach() * log_prob).sum(0)


def gaussian_samples(loc: torch.Tensor, scale: torch.Tensor, num_samples: int) -> torch.Tensor:
    """``num_samples`` reparameterised draws ``loc + scale * eps``, ``eps ~ N(0, I)``: the ``N``
    actions per state of the E-step (arXiv:1806.06920, sec. 4.1), differentiable in ``loc``
    and ``scale`` (Kingma & Welling, "Auto-Encoding Variational Bayes", arXiv:1312.6114).

    Args:
        loc: ``[*B, D]`` means (any shape).
        scale: standard deviations, broadcastable to ``loc``.
        num_samples: ``N``.

    Returns:
        ``[N, *B, D]`` draws; one ``torch.randn`` call of that shape.
    """
    noise = torch.randn((num_samples, *loc.shape), dtype=loc.dtype, device=loc.device)
    return loc + scale * noise


def gaussian_log_prob(value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``sum_d log N(value_d; loc_d, scale_d^2)`` over the last dim (a diagonal Gaussian)."""
    return normal_log_prob(value, loc, scale).sum(-1)


def decoupled_gaussian_kl(
    target_loc: torch.Tensor,
    target_scale: torch.Tensor,
    loc: torch.Tensor,
    scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The KLs of the decoupled M-step, per action dimension (arXiv:1812.02256, sec. 4.2).

    With the target policy ``N(mu_target, sigma_target)`` and the online one ``N(mu, sigma)``:
    ``KL_mean = KL(N(mu_target, sigma_target) || N(mu, sigma_target)) = (mu - mu_target)^2 /
    (2 sigma_target^2)`` and ``KL_stddev = KL(N(mu_target, sigma_target) || N(mu_target,
    sigma))``. Gradients reach ``mu`` through the first and ``sigma`` through the second only.

    Returns:
        ``(KL_mean, KL_stddev)``, each ``[*B, D]``.
    """
    check_same_shape(target_loc=target_loc, target_scale=target_scale, loc=loc, scale=scale)
    kl_mean = gaussian_kl(target_loc, target_scale, loc, target_scale)
    kl_stddev = gaussian_kl(target_loc, target_scale, target_loc, scale)
    return kl_mean, kl_stddev


def kl_penalty(kl: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``sum_d sg(alpha_d) KL_d``: the Lagrangian's KL term in the policy loss, ``[*B]``.

    Args:
        kl: ``[*B, K]`` KLs, one per constraint (``K`` is the action dim, or 1).
        alpha: ``[K]`` multipliers (no gradient reaches them here).
    """
    return (alpha.detach() * kl).sum(-1)


def lagrange_dual_loss(kl: torch.Tensor, alpha: torch.Tensor, epsilon: Scalar) -> torch.Tensor:
    r"""``sum_d alpha_d (epsilon - sg(KL_d))``, ``[*B]``: minimising its batch mean makes
    ``alpha_d`` grow while the KL exceeds ``epsilon`` and shrink otherwise. Only ``alpha`` gets
    gradient. Any constraint ``c <= epsilon`` takes the KL's place (CQL's Lagrangian form: the
    conservative penalty and its threshold ``tau``, Kumar et al., arXiv:2006.04779, appendix F).

    $$
    \mathcal{L}_{\alpha} = \sum_d \alpha_d \big(\epsilon - \mathrm{sg}(\mathrm{KL}_d)\big)
    $$
    """
    return (alpha * (epsilon - kl.detach())).sum(-1)


def action_penalty_cost(action: torch.Tensor, low: Scalar, high: Scalar) -> torch.Tensor:
    """MO-MPO's out-of-bounds cost ``-||a - clip(a, low, high)||_2`` over the last dim, ``[...]``
    (Abdolmaleki et al., "A Distributional View on Multi-Objective Policy Optimization",
    arXiv:2005.07513): zero inside the bounds."""
    return -torch.linalg.vector_norm(action - torch.clamp(action, low, high), dim=-1)


def categorical_mpo_log_weights(
    action_values: torch.Tensor, target_logits: torch.Tensor, temperature: torch.Tensor
) -> torch.Tensor:
    """Categorical E-step: ``log q(a|s) = log_softmax_a(log pi_target(a|s) + Q(s, a) / eta)``,
    ``[*B, A]``, no gradient (every action enumerated instead of sampled)."""
    check_same_shape(action_values=action_values, target_logits=target_logits)
    logits = target_logits.detach().log_softmax(-1) + action_values.detach() / temperature.detach()
    return logits.log_softmax(-1)


def categorical_mpo_temperature_loss(
    action_values: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    epsilon: Scalar,
) -> torch.Tensor:
    """Categorical temperature dual ``eta (epsilon + log sum_a pi_target(a|s) exp(Q(s, a) /
    eta))``, ``[*B]``; only ``eta`` gets gradient. With a uniform ``pi_target`` it is
    :func:`mpo_temperature_loss` over the actions."""
    check_same_shape(action_values=action_values, target_logits=target_logits)
    logits = target_logits.detach().log_softmax(-1) + action_values.detach() / temperature
    return temperature * (epsilon + torch.logsumexp(logits, dim=-1))


def categorical_cross_entropy(target_log_probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``-sum_a p(a) log pi(a)`` with ``p = exp(target_log_probs)`` (no gradient) and ``pi =
    softmax(logits)``, ``[*B]``: the categorical M-step's weighted log-likelihood."""
    check_same_shape(target_log_probs=target_log_probs, logits=logits)
    # Actions of target probability 0 (masked actions: -inf logits) are selected out before the
    # arithmetic, so 0 * log(0) reaches neither the value nor the gradient.
    possible = target_log_probs > -torch.inf
    log_probs = torch.where(possible, logits.log_softmax(-1), 0.0)
    return -torch.where(possible, target_log_probs.detach().exp() * log_probs, 0.0).sum(-1)
