"""Policy-gradient quantities: importance ratios, (dual-)clipped surrogates, KL estimators and
PPO's adaptive KL coefficient, entropies.

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347; Ye et al.,
"Mastering Complex Control in MOBA Games with Deep Reinforcement Learning", arXiv:1912.09729
(dual clip). All functions are elementwise: ``log_ratio`` and ``advantage`` share one shape.
"""

from __future__ import annotations

import math

import torch
from torch import distributions as D

from rlloss._checks import check_same_shape
from rlloss.functional.imitation import action_error

Scalar = float | torch.Tensor
CATEGORICALS = (D.Categorical, D.OneHotCategorical)


def log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """``log r = log pi_new(a|s) - log pi_old(a|s)``; the old log-prob carries no gradient."""
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob)
    if old_log_prob.requires_grad:  # a stored log-prob has none: no detach op per call
        old_log_prob = old_log_prob.detach()
    return log_prob - old_log_prob


def clip_bounds(epsilon_low: Scalar, epsilon_high: Scalar) -> tuple[Scalar, Scalar]:
    """Log-space clip bounds ``(log(1 - eps_low), log(1 + eps_high))`` of the ratio."""
    if isinstance(epsilon_low, torch.Tensor):
        return torch.log1p(-epsilon_low), torch.log1p(epsilon_high)
    return math.log1p(-epsilon_low), math.log1p(epsilon_high)


def policy_gradient_objective(log_prob: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    r"""The policy-gradient objective (to maximise), elementwise: ``log pi(a|s) A``, whose
    gradient is ``grad log pi(a|s) A`` (Williams, "Simple statistical gradient-following
    algorithms for connectionist reinforcement learning", 1992; with a learned baseline in ``A``,
    Mnih et al., arXiv:1602.01783, A2C/A3C). ``advantage`` is a constant (no gradient).

    $$
    L = \log \pi(a \mid s) A, \qquad \nabla L = \nabla \log \pi(a \mid s) A
    $$

    Args:
        log_prob: ``log pi(a|s)``, any shape.
        advantage: same shape as ``log_prob``.
    """
    check_same_shape(log_prob=log_prob, advantage=advantage)
    return log_prob * advantage.detach()


def advantage_weights(
    advantage: torch.Tensor, temperature: Scalar, max_weight: float = 100.0
) -> torch.Tensor:
    r"""Advantage-weighted regression's weights ``min(exp(temperature * A), max_weight)``, no
    gradient (Peng et al., arXiv:1910.00177; IQL's policy extraction, Kostrikov et al.,
    arXiv:2110.06169, eq. 7, with ``temperature`` their ``beta`` and TorchRL's cap of 100).

    $$
    w = \min\big(\exp(\beta A), w_{\max}\big)
    $$
    """
    return (advantage.detach() * temperature).exp().clamp_max(max_weight)


def surrogate(log_ratio: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    r"""The importance-weighted surrogate objective (to maximise), elementwise: ``r A`` with
    ``r = pi(a|s) / pi_old(a|s) = exp(log_ratio)`` (Schulman et al., "Proximal Policy
    Optimization Algorithms", arXiv:1707.06347, eq. 6: the objective of conservative policy
    iteration).

    $$
    L = r A, \qquad r = \frac{\pi(a \mid s)}{\pi_{\text{old}}(a \mid s)}
    $$

    Args:
        log_ratio: ``log r``, any shape.
        advantage: same shape as ``log_ratio``.

    Returns:
        The per-element surrogate, same shape as the inputs.
    """
    check_same_shape(log_ratio=log_ratio, advantage=advantage)
    return log_ratio.exp() * advantage


def kl_penalized_surrogate(surrogate: torch.Tensor, kl: torch.Tensor, beta: Scalar) -> torch.Tensor:
    r"""PPO's KL-penalised objective (to maximise), elementwise: ``r A - beta KL(pi_old || pi)``
    (arXiv:1707.06347, eq. 8).

    $$
    L = r A - \beta \, \mathrm{KL}(\pi_{\text{old}} \,\|\, \pi)
    $$

    Args:
        surrogate: ``r A``, see :func:`surrogate`.
        kl: the per-element ``KL(pi_old || pi)``, same shape as ``surrogate``.
        beta: the penalty coefficient (a scalar or a 0-d tensor).
    """
    check_same_shape(surrogate=surrogate, kl=kl)
    return surrogate - beta * kl


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantage: torch.Tensor,
    log_low: Scalar,
    log_high: Scalar,
    dual_clip: Scalar | None = None,
    log_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""PPO's clipped surrogate objective (to maximise), elementwise.

    $$
    L = \min\big(r A,\; \operatorname{clip}(r, 1 - \epsilon_{\text{low}},
    1 + \epsilon_{\text{high}}) A\big), \qquad
    L_{\text{dual}} = \max(L, c A) \ \text{where}\ A < 0
    $$

    the ratio clipped in log space (``log_low = log(1 - eps_low)``,
    ``log_high = log(1 + eps_high)``, see :func:`clip_bounds`); the second with
    ``dual_clip = c > 1``, which bounds the objective of negative advantages below (Ye et al.
    2020). With ``log_weight = log w`` (a decoupled
    proximal policy, :func:`decoupled_log_weight`), every term is weighted by ``w``:
    ``min(w r A, w clip(r) A)`` (and ``max(., c w A)``), ``r`` the ratio to the proximal policy
    (Hilton et al., "Batch size-invariance for policy optimization", arXiv:2110.00641, eq. 3).

    Args:
        log_ratio: ``log r``, any shape.
        advantage: same shape as ``log_ratio``.
        log_low: log-space clip bounds.
        log_high: log-space clip bounds.
        dual_clip: the dual-clip constant ``c``, or ``None``.
        log_weight: ``log w``, same shape, no gradient; ``None``: ``w = 1``.

    Returns:
        The per-element surrogate, same shape as the inputs.
    """
    clamped = log_ratio.clamp(log_low, log_high)
    if log_weight is not None:
        check_same_shape(log_ratio=log_ratio, log_weight=log_weight)
        log_ratio, clamped = log_ratio + log_weight, clamped + log_weight
    objective = torch.minimum(surrogate(log_ratio, advantage), clamped.exp() * advantage)
    if dual_clip is None:
        return objective
    bound = (
        dual_clip * advantage if log_weight is None else dual_clip * log_weight.exp() * advantage
    )
    return torch.where(advantage < 0, torch.maximum(objective, bound), objective)


def decoupled_log_weight(
    proximal_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor
) -> torch.Tensor:
    """``log(pi_prox(a|s) / pi_behav(a|s))``, no gradient: the weight that turns the ratio to a
    proximal policy ``r = pi / pi_prox`` into the behaviour ratio ``pi / pi_behav = w r``
    (Hilton et al., "Batch size-invariance for policy optimization", arXiv:2110.00641: PPO-EWMA,
    the proximal policy an exponential moving average of the policy).

    Args:
        proximal_log_prob: ``log pi_prox(a|s)``, any shape.
        behaviour_log_prob: ``log pi_behav(a|s)`` stored at collection, same shape.
    """
    check_same_shape(proximal_log_prob=proximal_log_prob, behaviour_log_prob=behaviour_log_prob)
    return (proximal_log_prob - behaviour_log_prob).detach()


def capped_log_weight(
    log_weight: torch.Tensor, log_ratio: torch.Tensor, max_ratio: Scalar
) -> torch.Tensor:
    """``min(log w, log(max_ratio) - log r)``, no gradient: the weight ``w`` lowered so that the
    behaviour ratio ``w r`` is at most ``max_ratio``. The cap lifts the behaviour log-prob
    instead of clamping the ratio, so a capped sample keeps a (rescaled) policy gradient, as the
    reference PPO-EWMA code does (Hilton et al., arXiv:2110.00641; its cap is 100).

    Args:
        log_weight: ``log w`` (:func:`decoupled_log_weight`, or zeros without a proximal
            policy), any shape.
        log_ratio: ``log r``, same shape.
        max_ratio: the cap (> 0), a scalar or a 0-d tensor.
    """
    check_same_shape(log_weight=log_weight, log_ratio=log_ratio)
    log_max = math.log(max_ratio) if not isinstance(max_ratio, torch.Tensor) else max_ratio.log()
    return torch.minimum(log_weight, log_max - log_ratio.detach()).detach()


def clipped(log_ratio: torch.Tensor, log_low: Scalar, log_high: Scalar) -> torch.Tensor:
    """Indicator (as the ratio's dtype) of the ratios that fall outside the clip range."""
    return ((log_ratio < log_low) | (log_ratio > log_high)).to(log_ratio.dtype)


def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    r"""Non-negative estimator of KL(old || new) from samples of the old policy:
    ``(r - 1) - log r`` (Schulman, "Approximating KL divergence", 2020, the "k3" estimator).

    $$
    \mathrm{k3}(r) = (r - 1) - \log r, \qquad
    \mathbb{E}_{a \sim \pi_{\text{old}}}[\mathrm{k3}(r)]
    = \mathrm{KL}(\pi_{\text{old}} \,\|\, \pi), \qquad r = \frac{\pi(a)}{\pi_{\text{old}}(a)}
    $$
    """
    return torch.expm1(log_ratio) - log_ratio


def distribution_entropy(distribution: D.Distribution, samples: int = 1) -> torch.Tensor:
    """Entropy of ``distribution``: analytic when it has one, else the Monte-Carlo estimate
    ``-mean_k log pi(a_k)`` over ``samples`` draws (reparameterised when possible).

    Returns:
        The entropy with the distribution's batch shape.
    """
    if has_analytic_entropy(distribution):
        return distribution.entropy()
    draw = distribution.rsample if distribution.has_rsample else distribution.sample
    return -distribution.log_prob(draw((samples,))).mean(0)


def gaussian_kl(
    loc_p: torch.Tensor, scale_p: torch.Tensor, loc_q: torch.Tensor, scale_q: torch.Tensor
) -> torch.Tensor:
    r"""``KL(N(loc_p, scale_p^2) || N(loc_q, scale_q^2))`` per dimension:
    ``log(scale_q / scale_p) + (scale_p^2 + (loc_p - loc_q)^2) / (2 scale_q^2) - 1/2``.

    $$
    \mathrm{KL}\big(N(\mu_p, \sigma_p^2) \,\|\, N(\mu_q, \sigma_q^2)\big)
    = \log \frac{\sigma_q}{\sigma_p} + \frac{\sigma_p^2 + (\mu_p - \mu_q)^2}{2 \sigma_q^2}
    - \frac{1}{2}
    $$
    """
    variance_ratio = (scale_p / scale_q).square()
    return 0.5 * (variance_ratio + ((loc_p - loc_q) / scale_q).square() - 1 - variance_ratio.log())


def categorical_kl(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    r"""``KL(Cat(p) || Cat(q)) = sum_a p(a) (log p(a) - log q(a))`` over the last dim; actions
    with ``p(a) = 0`` contribute 0.

    $$
    \mathrm{KL}(p \,\|\, q) = \sum_a p(a) \big(\log p(a) - \log q(a)\big)
    $$
    """
    log_p, log_q = logits_p.log_softmax(-1), logits_q.log_softmax(-1)
    possible = log_p > -torch.inf
    # Select before the arithmetic so that impossible actions reach neither value nor gradient.
    log_p, log_q = torch.where(possible, log_p, 0.0), torch.where(possible, log_q, 0.0)
    return torch.where(possible, log_p.exp() * (log_p - log_q), 0.0).sum(-1)


def kl_divergence(
    p: D.Distribution, q: D.Distribution, samples: int = 1, reparameterized: bool = False
) -> torch.Tensor:
    """``KL(p || q)`` with the distributions' batch shape.

    Closed form for (independent) Gaussians (:func:`gaussian_kl`, summed over the reinterpreted
    dims) and categoricals (:func:`categorical_kl`); otherwise (e.g. TanhNormal) the Monte-Carlo
    estimate ``mean_k [log p(x_k) - log q(x_k)]`` over ``samples`` draws ``x_k ~ p``: without
    gradient through the draws (right when only ``q`` is trained), or, with
    ``reparameterized``, drawn with ``rsample`` so that the gradient reaches ``p``'s parameters
    through them (needed when ``p`` is the trained policy: with detached draws the expected
    gradient of ``log p(x_k)`` is 0). Detached draws also come from ``rsample`` (under
    ``no_grad``) where ``p`` has one: ``sample`` of a Normal goes through ``torch.normal``, whose
    ``std >= 0`` check synchronises with the host on a GPU. The family is read from the Python
    types, so the choice costs nothing and compiles without a graph break.
    """
    base_p, base_q, event_dims = p, q, 0
    while isinstance(base_p, D.Independent) and isinstance(base_q, D.Independent):
        event_dims += base_p.reinterpreted_batch_ndims
        base_p, base_q = base_p.base_dist, base_q.base_dist
    if type(base_p) is D.Normal and type(base_q) is D.Normal:
        kl = gaussian_kl(base_p.loc, base_p.scale, base_q.loc, base_q.scale)
        return kl.sum(tuple(range(-event_dims, 0))) if event_dims else kl
    if event_dims == 0 and isinstance(p, CATEGORICALS) and type(p) is type(q):
        return categorical_kl(p.logits, q.logits)
    if reparameterized:
        draws = p.rsample((samples,))
    else:  # rsample where there is one: Normal.sample's torch.normal checks std >= 0 on the host
        with torch.no_grad():
            draws = p.rsample((samples,)) if p.has_rsample else p.sample((samples,))
    return (p.log_prob(draws) - q.log_prob(draws)).mean(0)


def unit_gaussian_kl(loc_p: torch.Tensor, loc_q: torch.Tensor) -> torch.Tensor:
    """``KL(N(loc_p, I) || N(loc_q, I)) = 1/2 sum_d (loc_p - loc_q)_d^2`` over the last dim: the
    KL between deterministic actions read as unit-variance Gaussians around them (PyTorchRL's
    ``AttractionKL`` treatment of deterministic policies). Symmetric.

    Args:
        loc_p: ``[*B, D]`` actions.
        loc_q: ``[*B, D]`` actions.

    Returns:
        ``[*B]``.
    """
    check_same_shape(loc_p=loc_p, loc_q=loc_q)
    return 0.5 * (loc_p - loc_q).square().sum(-1)


def action_squared_error(action: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1/D sum_d (a_d - a*_d)^2``: the squared error of the policy's action against a target
    action (behaviour cloning of a deterministic policy; its mean over the batch is TD3+BC's
    ``(pi(s) - a)^2`` term, Fujimoto & Gu, arXiv:2106.06860, eq. 3).

    Args:
        action: ``[*B, D]`` the policy's action (with gradient).
        target: ``[*B, D]`` the dataset's or expert's action.

    Returns:
        ``[*B]``.
    """
    return action_error(action, target, "l2").mean(-1)  # BCLoss's error, averaged over D


def adaptive_kl_thresholds(dtarg: Scalar) -> tuple[Scalar, Scalar]:
    """The KL band of PPO's adaptive penalty, ``(1.5 dtarg, dtarg / 1.5)``: above it beta grows,
    below it beta shrinks (Schulman et al., arXiv:1707.06347, sec. 4)."""
    return 1.5 * dtarg, dtarg / 1.5


def adaptive_kl_beta(
    beta: torch.Tensor,
    kl: torch.Tensor,
    dtarg: Scalar,
    increment: Scalar,
    decrement: Scalar,
    beta_min: Scalar | None = None,
    beta_max: Scalar | None = None,
    thresholds: tuple[Scalar, Scalar] | None = None,
) -> torch.Tensor:
    """PPO's adaptive KL-penalty coefficient: the next beta from the measured KL.

    ``beta * increment`` where ``kl > 1.5 dtarg``, ``beta * decrement`` where ``kl < dtarg /
    1.5``, else ``beta``; then clamped to ``[beta_min, beta_max]`` (either bound may be ``None``)
    (Schulman et al., arXiv:1707.06347, sec. 4, with factors 2 and 1/2; TorchRL's
    ``KLPENPPOLoss`` names them ``increment`` and ``decrement``). A ``torch.where``, no host sync.

    Args:
        beta: the current coefficient, a 0-d tensor.
        kl: the measured KL, a 0-d tensor (or any shape that broadcasts with ``beta``).
        dtarg: the target KL.
        increment: the factor when the KL is high (``>= 1``).
        decrement: the factor when the KL is low (``<= 1``).
        beta_min: an optional lower bound.
        beta_max: an optional upper bound.
        thresholds: :func:`adaptive_kl_thresholds` computed beforehand (e.g. 0-d tensors beside
            ``beta``, with ``increment`` and ``decrement``: a Python number costs a conversion
            to a tensor in each comparison and product); ``None``: from ``dtarg``.

    Returns:
        The new beta, of the broadcast shape of ``beta`` and ``kl``.
    """
    high, low = adaptive_kl_thresholds(dtarg) if thresholds is None else thresholds
    lowered = torch.where(kl < low, beta * decrement, beta)
    beta = torch.where(kl > high, beta * increment, lowered)
    if beta_min is None and beta_max is None:
        return beta
    return beta.clamp(beta_min, beta_max)


def rpo_perturbation(loc: torch.Tensor, alpha: Scalar) -> torch.Tensor:
    """Robust Policy Optimization's location noise: ``loc + z``, ``z ~ U(-alpha, alpha)`` drawn
    fresh per element (Rahman & Xue, "Robust Policy Optimization in Deep Reinforcement
    Learning", arXiv:2212.07536).
    """
    return loc + (2 * torch.rand_like(loc) - 1) * alpha


def has_analytic_entropy(distribution: D.Distribution) -> bool:
    """Whether the distribution's class has a closed-form entropy (``Independent`` resolved
    through its base). A class-level check: no data-dependent branch, nothing to synchronise.
    """
    while isinstance(distribution, D.Independent):
        distribution = distribution.base_dist
    return type(distribution).entropy is not D.Distribution.entropy
