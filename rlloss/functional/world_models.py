"""World-model quantities: DreamerV3's transforms and objectives, imagined returns, PILCO's cost.

Hafner et al., "Mastering Diverse Domains through World Models" (DreamerV3), arXiv:2301.04104:
symlog / symexp (eq. 9), the two-hot encoding over an exponentially spaced support and its
cross-entropy (eq. 10-11), KL balancing with free bits (eq. 5), the continuation-weighted
lambda-return of imagined trajectories (eq. 7) and the 5th-95th percentile return scale with
its moving average (eq. 12). Hafner et al., "Dream to Control" (DreamerV1), arXiv:1912.01603:
free nats. Deisenroth and Rasmussen, "PILCO: A Model-Based and Data-Efficient Approach to
Policy Search" (ICML 2011), eq. 24-25: the expected saturating cost of a Gaussian state.

Tensors in, per-element tensors out: no reduction over batch or time.
"""

from __future__ import annotations

import math

import torch

from rlloss._checks import check_in_range, check_same_shape
from rlloss.functional.returns import td_lambda_return

Scalar = float | torch.Tensor

SYMLOG_BIN_RANGE = 20.0  # the support spans symexp([-20, 20]) (DreamerV3's)


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``symlog(x) = sign(x) log(1 + |x|)`` (DreamerV3 eq. 9): the identity near 0, a logarithm
    for large magnitudes of either sign."""
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    """``symexp(x) = sign(x) (exp(|x|) - 1)``, the inverse of :func:`symlog`."""
    return torch.sign(x) * torch.expm1(x.abs())


def symlog_squared_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``(symlog(prediction) - symlog(target))^2`` elementwise (DreamerV3's symlog regression)."""
    check_same_shape(prediction=prediction, target=target)
    return (symlog(prediction) - symlog(target)).square()


def symexp_bins(num_bins: int = 255, *, dtype=None, device=None) -> torch.Tensor:
    """The two-hot support: ``symexp`` of ``num_bins`` evenly spaced points of ``[-20, 20]``,
    ``[num_bins]`` ascending and exactly antisymmetric (``bins[k] = -bins[-1 - k]``; an odd count
    holds 0). TorchRL's default support (``torchrl.modules.models.model_based``)."""
    check_in_range("num_bins", num_bins, 2, integer=True)
    dtype = dtype or torch.get_default_dtype()
    half = num_bins // 2
    if num_bins % 2:  # [-20, 0] in half + 1 points, mirrored without repeating 0
        negative = symexp(
            torch.linspace(-SYMLOG_BIN_RANGE, 0, half + 1, dtype=dtype, device=device)
        )
        return torch.cat((negative, -negative[:-1].flip(0)))
    step = 2 * SYMLOG_BIN_RANGE / (num_bins - 1)
    grid = -SYMLOG_BIN_RANGE + step * torch.arange(half, dtype=dtype, device=device)
    negative = symexp(grid)
    return torch.cat((negative, -negative.flip(0)))


def _check_bins(bins: torch.Tensor) -> None:
    if bins.ndim != 1 or bins.numel() < 2:
        raise ValueError(
            f"bins must be a 1-D ascending support of at least 2 values, got shape "
            f"{tuple(bins.shape)}; build one with rlloss.functional.symexp_bins(num_bins)."
        )


def _two_hot_parts(x: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The index ``k`` of the bin below each ``x`` (clamped to the support) and the weight
    ``(x - bins[k]) / (bins[k + 1] - bins[k])`` of the bin above, both ``[*x.shape]``."""
    _check_bins(bins)
    bins = bins.to(device=x.device, dtype=x.dtype)
    x = x.clamp(bins[0], bins[-1])
    lower = torch.searchsorted(bins, x.detach().contiguous(), right=True) - 1
    lower = lower.clamp(0, bins.shape[0] - 2)
    low, high = bins[lower], bins[lower + 1]
    return lower, (x - low) / (high - low)


def two_hot_encode(x: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """The two-hot encoding of ``x`` over ``bins`` (DreamerV3 eq. 10), ``[*x.shape, K]``.

    ``x`` clamped to ``[bins[0], bins[-1]]`` lies between ``bins[k]`` and ``bins[k + 1]``; the
    encoding puts ``(bins[k + 1] - x) / (bins[k + 1] - bins[k])`` on ``k`` and the rest on
    ``k + 1`` (linear interpolation in raw value space), so ``sum_k enc_k bins[k] = x``.
    """
    lower, upper_weight = _two_hot_parts(x, bins)
    upper_weight = upper_weight.unsqueeze(-1)
    count = bins.shape[0]
    # one-hot rows by comparison (F.one_hot checks the indices' range on the host)
    positions = torch.arange(count, device=x.device)
    lower = lower.unsqueeze(-1)
    at_low, at_high = (positions == lower).to(x.dtype), (positions == lower + 1).to(x.dtype)
    return at_low * (1 - upper_weight) + at_high * upper_weight


def two_hot_decode(logits: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """The expected value ``sum_k softmax(logits)_k bins[k]`` of a categorical over ``bins``,
    ``[*logits.shape[:-1]]``."""
    _check_bins(bins)
    if logits.shape[-1] != bins.shape[0]:
        raise ValueError(
            f"logits have {logits.shape[-1]} categories in their last dim but the support has "
            f"{bins.shape[0]} bins; they must match."
        )
    return torch.softmax(logits, dim=-1) @ bins.to(device=logits.device, dtype=logits.dtype)


def two_hot_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, bins: torch.Tensor
) -> torch.Tensor:
    """``-sum_k twohot(target)_k log softmax(logits)_k`` (DreamerV3 eq. 11), ``[*B]``.

    Args:
        logits: ``[*B, K]`` over the ``K`` bins.
        target: raw scalar targets ``[*B]`` or ``[*B, 1]`` (no gradient flows to them).
        bins: the support ``[K]`` (:func:`symexp_bins`).
    """
    if target.shape == (*logits.shape[:-1], 1):
        target = target.squeeze(-1)
    if target.shape != logits.shape[:-1]:
        raise ValueError(
            f"two-hot targets must have shape {tuple(logits.shape[:-1])} or "
            f"{(*logits.shape[:-1], 1)} for logits of shape {tuple(logits.shape)}, got "
            f"{tuple(target.shape)}."
        )
    lower, upper_weight = _two_hot_parts(target.detach(), bins)
    log_probs = torch.log_softmax(logits, dim=-1)  # the two bins' log-probs, gathered
    at_low = log_probs.gather(-1, lower.unsqueeze(-1)).squeeze(-1)
    at_high = log_probs.gather(-1, (lower + 1).unsqueeze(-1)).squeeze(-1)
    return -((1 - upper_weight) * at_low + upper_weight * at_high)


def unimix_log_probs(logits: torch.Tensor, unimix: Scalar) -> torch.Tensor:
    """``log((1 - unimix) softmax(logits) + unimix / K)`` over the last dim (DreamerV3's 1%
    uniform mixture), computed in log space (no ``log(0)``)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    if isinstance(unimix, (int, float)) and unimix == 0:
        return log_probs
    uniform = math.log(unimix / logits.shape[-1])
    return torch.logaddexp(log_probs + math.log1p(-unimix), torch.full_like(log_probs, uniform))


def categorical_kl_from_log_probs(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_k p_k (log p_k - log q_k)`` over the last dim, from log-probabilities."""
    check_same_shape(log_p=log_p, log_q=log_q)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def dynamics_and_representation_kl(
    posterior_logits: torch.Tensor, prior_logits: torch.Tensor, unimix: Scalar = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """DreamerV3's two KL terms per categorical (eq. 5), each ``[*B, C]`` for logits
    ``[*B, C, K]`` (``C`` categoricals of ``K`` classes):

    - dynamics ``KL(sg(posterior) || prior)``: its gradient trains the prior only;
    - representation ``KL(posterior || sg(prior))``: its gradient trains the posterior only.

    Both have the same value. ``unimix``: uniform mixture of each distribution (see
    :func:`unimix_log_probs`).
    """
    check_same_shape(posterior_logits=posterior_logits, prior_logits=prior_logits)
    log_posterior = unimix_log_probs(posterior_logits, unimix)
    log_prior = unimix_log_probs(prior_logits, unimix)
    dynamics = categorical_kl_from_log_probs(log_posterior.detach(), log_prior)
    representation = categorical_kl_from_log_probs(log_posterior, log_prior.detach())
    return dynamics, representation


def free_bits(kl: torch.Tensor, threshold: Scalar) -> torch.Tensor:
    """``max(kl, threshold)``: free bits / free nats (DreamerV1 section 5, DreamerV3 eq. 5). Below
    the threshold the KL has no gradient, so the model stops squeezing an already small KL."""
    return kl.clamp_min(threshold)


def balanced_kl(
    posterior_logits: torch.Tensor,
    prior_logits: torch.Tensor,
    alpha: Scalar = 0.8,
    threshold: Scalar = 1.0,
) -> torch.Tensor:
    """KL balancing with free bits per categorical, ``[*B, C]``:
    ``alpha max(KL(sg(q) || p), fb) + (1 - alpha) max(KL(q || sg(p)), fb)`` with ``q`` the
    posterior, ``p`` the prior (DreamerV2, arXiv:2010.02193, alg. 2; DreamerV3's weights 0.5 /
    0.1 are ``separate`` terms, see :func:`dynamics_and_representation_kl`)."""
    dynamics, representation = dynamics_and_representation_kl(posterior_logits, prior_logits)
    return alpha * free_bits(dynamics, threshold) + (1 - alpha) * free_bits(
        representation, threshold
    )


def imagined_lambda_return(
    reward: torch.Tensor,
    next_value: torch.Tensor,
    continuation: torch.Tensor | None,
    gamma: Scalar,
    lmbda: Scalar,
    time_dim: int = -2,
) -> torch.Tensor:
    """The lambda-return of an imagined trajectory (DreamerV3 eq. 7),
    ``R_t = r_t + gamma c_t ((1 - lmbda) v_{t+1} + lmbda R_{t+1})`` with ``R_H = v_H``.

    Args:
        reward: ``[*B, H, 1]`` imagined rewards ``r_t`` (of the step from ``s_t`` to ``s_{t+1}``).
        next_value: ``[*B, H, 1]`` values ``v_{t+1}`` of the imagined next states.
        continuation: ``[*B, H, 1]`` predicted continuation probabilities ``c_t`` of the next
            states, or ``None`` (every step continues).
        gamma: scalars or tensors broadcastable to ``reward``.
        lmbda: scalars or tensors broadcastable to ``reward``.

    Returns:
        ``[*B, H, 1]``: :func:`rlloss.functional.td_lambda_return` with the per-step discount
        ``gamma c_t`` and no episode end.
    """
    no_end = torch.zeros(reward.shape, dtype=torch.bool, device=reward.device)
    discount = gamma if continuation is None else gamma * continuation
    return td_lambda_return(reward, next_value, no_end, no_end, discount, lmbda, time_dim)


def imagination_weights(
    continuation: torch.Tensor, gamma: Scalar, time_dim: int = -2
) -> torch.Tensor:
    """The weight of each imagined step, ``w_t = c_0 prod_{k=1}^{t} gamma c_k``, ``[*B, H, 1]``
    for continuations ``c_t`` of the states ``s_t`` (``c_0``: the start state's): the probability
    of reaching step ``t``, discounted (DreamerV1 / V3's discounted actor and critic losses)."""
    first = continuation.narrow(time_dim, 0, 1)
    rest = gamma * continuation.narrow(time_dim, 1, continuation.shape[time_dim] - 1)
    return torch.cat((first, rest), dim=time_dim).cumprod(dim=time_dim)


def percentile_range(
    returns: torch.Tensor, low: float = 0.05, high: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``low`` and ``high`` quantiles of every element of ``returns`` (linear interpolation
    between order statistics, ``torch.quantile``'s definition), two 0-dim tensors: the range
    DreamerV3 normalises returns by (5th and 95th percentiles, eq. 12).

    The order statistics are read from a sort at positions known from the shape, without
    ``torch.quantile``'s device-to-host check of the levels.
    """
    check_in_range("low", low, 0.0, 1.0)
    check_in_range("high", high, low, 1.0)
    ordered = returns.detach().reshape(-1).sort().values
    return _order_statistic(ordered, low), _order_statistic(ordered, high)


def _order_statistic(ordered: torch.Tensor, level: float) -> torch.Tensor:
    position = level * (ordered.shape[0] - 1)
    below = math.floor(position)
    above = min(below + 1, ordered.shape[0] - 1)
    return torch.lerp(ordered[below], ordered[above], position - below)


def moving_average(average: torch.Tensor, value: torch.Tensor, rate: Scalar) -> torch.Tensor:
    """``average + rate (value - average)``: one step of an exponential moving average
    (DreamerV3 tracks the return percentiles with ``rate = 0.01``)."""
    return torch.lerp(average, value.to(average.dtype), rate)


def return_scale(low: torch.Tensor, high: torch.Tensor, min_scale: Scalar = 1.0) -> torch.Tensor:
    """``max(min_scale, high - low)`` (DreamerV3 eq. 12): returns are divided by the percentile
    range only when it exceeds ``min_scale``, so small returns are not amplified."""
    return (high - low).clamp_min(min_scale)


def expected_saturating_cost(
    mean: torch.Tensor,
    covariance: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    jitter: float = 1e-5,
) -> torch.Tensor:
    """``E[1 - exp(-(x - t)^T W (x - t) / 2)]`` for ``x ~ N(m, S)`` in closed form (PILCO,
    Deisenroth and Rasmussen 2011, eq. 24-25):

    ``1 - det(I + S W)^{-1/2} exp(-(m - t)^T W (I + S W)^{-1} (m - t) / 2)``,

    computed as ``1 - det(A)^{-1/2} exp(-v^T A^{-1} v / 2)`` with ``U = W^{1/2}`` (the
    eigen-decomposition's, negative eigenvalues clipped to 0), ``A = I + U S U + jitter I`` (a
    Cholesky factor) and ``v = U (m - t)``: the same numbers for a symmetric ``W``.

    Args:
        mean: ``[*B, D]`` state means ``m``.
        covariance: ``[*B, D, D]`` state covariances ``S``.
        target: ``[D]`` or ``[*B, D]`` target state ``t``.
        weights: ``[D, D]`` symmetric positive semi-definite weight (precision) matrix ``W``.
        jitter: added to the diagonal of ``A`` (TorchRL's 1e-5).

    Returns:
        ``[*B]`` expected costs in ``[0, 1]``.
    """
    size = mean.shape[-1]
    if covariance.shape != (*mean.shape, size):
        raise ValueError(
            f"the state covariance must have shape {(*mean.shape, size)} for a mean of shape "
            f"{tuple(mean.shape)}, got {tuple(covariance.shape)}."
        )
    eigenvalues, eigenvectors = torch.linalg.eigh(weights)
    root = eigenvectors @ torch.diag_embed(eigenvalues.clamp_min(0).sqrt()) @ eigenvectors.mT
    identity = torch.eye(size, dtype=mean.dtype, device=mean.device)
    spread = identity * (1 + jitter) + root @ covariance @ root
    cholesky = torch.linalg.cholesky(spread)
    offset = root @ (mean - target).unsqueeze(-1)
    quadratic = (offset * torch.cholesky_solve(offset, cholesky)).sum((-2, -1))
    log_det = 2 * cholesky.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return 1 - torch.exp(-0.5 * (log_det + quadratic))
