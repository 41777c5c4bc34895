"""Naive reference implementations, written from the papers, slow on purpose.

Every function works on Python floats (double precision) with explicit loops, so it shares no
code, no vectorisation trick and no dtype with :mod:`rlloss.functional`. The sequence functions
take one trajectory as lists indexed by time ``t = 0 .. T-1``; :func:`per_sequence` and
:func:`elementwise` lift them to tensors.

Conventions: ``terminated_t`` stops bootstrapping from ``V(s_{t+1})``; ``done_t`` (terminated or
truncated) cuts traces; after the last step of a trajectory nothing is known, so traces stop
there and the bootstrap value is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

# --------------------------------------------------------------------------- tensor plumbing


def per_sequence(fn: Callable[..., list[float]], *tensors: torch.Tensor, time_dim: int = -2):
    """Apply a one-trajectory function ``fn(*lists) -> list`` to every trajectory of
    ``tensors`` (time along ``time_dim``); returns a float64 tensor of the inputs' shape."""
    moved = [t.detach().to(torch.float64).movedim(time_dim, -1) for t in tensors]
    shape = moved[0].shape
    rows = [m.reshape(-1, shape[-1]).tolist() for m in moved]
    out = [fn(*trajectory) for trajectory in zip(*rows, strict=True)]
    return torch.tensor(out, dtype=torch.float64).reshape(shape).movedim(-1, time_dim)


def elementwise(fn: Callable[..., float], *tensors: torch.Tensor) -> torch.Tensor:
    """Apply a scalar function ``fn(*floats) -> float`` to every element; float64 result."""
    flat = [t.detach().to(torch.float64).reshape(-1).tolist() for t in tensors]
    out = [fn(*values) for values in zip(*flat, strict=True)]
    return torch.tensor(out, dtype=torch.float64).reshape(tensors[0].shape)


def per_row(fn: Callable[..., float], *tensors: torch.Tensor) -> torch.Tensor:
    """Apply ``fn(*lists) -> float`` to every row (the last dim) of ``tensors``; returns a float64
    tensor of the inputs' leading shape."""
    rows = [t.detach().to(torch.float64).reshape(-1, t.shape[-1]).tolist() for t in tensors]
    out = [fn(*row) for row in zip(*rows, strict=True)]
    return torch.tensor(out, dtype=torch.float64).reshape(tensors[0].shape[:-1])


# --------------------------------------------------------------------------- returns


def td0_target(reward: float, next_value: float, terminated: float, gamma: float) -> float:
    """One-step TD target ``r + gamma * (1 - terminated) * V(s')`` (Sutton & Barto, eq. 6.2)."""
    if terminated:
        return reward
    return reward + gamma * next_value


def gae(
    reward: Sequence[float],
    value: Sequence[float],
    next_value: Sequence[float],
    done: Sequence[float],
    terminated: Sequence[float],
    gamma: float,
    lmbda: float,
) -> list[float]:
    """GAE (Schulman et al., arXiv:1506.02438, eq. 16), looping backwards over time:
    ``delta_t = r_t + gamma (1 - term_t) V'_t - V_t``,
    ``A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}``, ``A_T = 0``."""
    advantage = [0.0] * len(reward)
    next_advantage = 0.0
    for t in reversed(range(len(reward))):
        delta = td0_target(reward[t], next_value[t], terminated[t], gamma) - value[t]
        if done[t]:
            next_advantage = 0.0
        advantage[t] = delta + gamma * lmbda * next_advantage
        next_advantage = advantage[t]
    return advantage


def td_lambda(
    reward: Sequence[float],
    next_value: Sequence[float],
    done: Sequence[float],
    terminated: Sequence[float],
    gamma: float,
    lmbda: float,
) -> list[float]:
    """Recursive lambda-return (Sutton & Barto, section 12.1):
    ``G_t = r_t + gamma (1 - term_t) ((1 - lambda) V'_t + lambda X_t)`` with
    ``X_t = V'_t`` if ``done_t`` or ``t`` is the last step, else ``G_{t+1}``."""
    steps = len(reward)
    ret = [0.0] * steps
    for t in reversed(range(steps)):
        if terminated[t]:
            ret[t] = reward[t]
            continue
        cut = done[t] or t == steps - 1
        following = next_value[t] if cut else ret[t + 1]
        ret[t] = reward[t] + gamma * ((1 - lmbda) * next_value[t] + lmbda * following)
    return ret


def vtrace_advantage(
    reward: Sequence[float],
    value: Sequence[float],
    next_value: Sequence[float],
    done: Sequence[float],
    terminated: Sequence[float],
    log_rho: Sequence[float],
    gamma: float,
    rho_bar: float,
    c_bar: float,
) -> list[float]:
    """V-trace advantage (Espeholt et al., arXiv:1802.01561, section 4), looping backwards:
    ``v_t - V_t = rho_t delta_t + gamma (1 - done_t) c_t (v_{t+1} - V_{t+1})`` with
    ``delta_t = r_t + gamma (1 - term_t) V'_t - V_t``; ``A_t = rho_t (r_t + gamma (1 - term_t)
    v'_t - V_t)``, ``v'_t = v_{t+1}`` inside a trajectory, ``V'_t`` where it is cut."""
    steps = len(reward)
    rho = [min(rho_bar, math.exp(x)) for x in log_rho]
    c = [min(c_bar, math.exp(x)) for x in log_rho]
    vs = [0.0] * steps
    following = 0.0  # v_{t+1} - V_{t+1}
    for t in reversed(range(steps)):
        if done[t]:
            following = 0.0
        delta = td0_target(reward[t], next_value[t], terminated[t], gamma) - value[t]
        vs[t] = value[t] + rho[t] * delta + gamma * c[t] * following
        following = vs[t] - value[t]
    advantage = []
    for t in range(steps):
        cut = done[t] or t == steps - 1
        bootstrap = next_value[t] if cut else vs[t + 1]
        advantage.append(
            rho[t] * (td0_target(reward[t], bootstrap, terminated[t], gamma) - value[t])
        )
    return advantage


def monte_carlo_return(
    reward: Sequence[float],
    next_value: Sequence[float],
    done: Sequence[float],
    terminated: Sequence[float],
    gamma: float,
) -> list[float]:
    """Discounted return within the episode, summed forwards for each start ``t``:
    ``G_t = sum_{k=t}^{e} gamma^{k-t} r_k + gamma^{e-t+1} (1 - term_e) V'_e`` where ``e`` is the
    first step ``>= t`` that is done (or the last step of the trajectory)."""
    steps = len(reward)
    ret = []
    for t in range(steps):
        total, discount = 0.0, 1.0
        for k in range(t, steps):
            total += discount * reward[k]
            discount *= gamma
            if terminated[k]:
                break
            if done[k] or k == steps - 1:
                total += discount * next_value[k]
                break
        ret.append(total)
    return ret


def reverse_discounted_sum(x: Sequence[float], discount: Sequence[float]) -> list[float]:
    """``y_t = x_t + c_t y_{t+1}`` with ``y_T = 0``, looping backwards over time."""
    y = [0.0] * len(x)
    following = 0.0
    for t in reversed(range(len(x))):
        y[t] = x[t] + discount[t] * following
        following = y[t]
    return y


# --------------------------------------------------------------------------- policy


def surrogate(log_ratio: float, advantage: float) -> float:
    """The importance-weighted surrogate ``r A`` (Schulman et al., arXiv:1707.06347, eq. 6)."""
    return math.exp(log_ratio) * advantage


def kl_penalized_surrogate(log_ratio: float, advantage: float, kl: float, beta: float) -> float:
    """PPO's adaptive-KL objective ``r A - beta KL`` (arXiv:1707.06347, eq. 8)."""
    return math.exp(log_ratio) * advantage - beta * kl


def clipped_surrogate(
    log_ratio: float,
    advantage: float,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float | None = None,
) -> float:
    """PPO's clipped surrogate (Schulman et al., arXiv:1707.06347, eq. 7), with the dual clip of
    Ye et al. (arXiv:1912.09729, eq. 5) for negative advantages:
    ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, then ``max(., c A)`` where ``A < 0``."""
    ratio = math.exp(log_ratio)
    clipped_ratio = min(max(ratio, 1.0 - epsilon_low), 1.0 + epsilon_high)
    objective = min(ratio * advantage, clipped_ratio * advantage)
    if dual_clip is not None and advantage < 0:
        objective = max(objective, dual_clip * advantage)
    return objective


def is_clipped(log_ratio: float, epsilon_low: float, epsilon_high: float) -> float:
    """1 when the ratio lies outside ``[1 - eps_low, 1 + eps_high]``, else 0."""
    ratio = math.exp(log_ratio)
    return float(ratio < 1.0 - epsilon_low or ratio > 1.0 + epsilon_high)


def kl_k3(log_ratio: float) -> float:
    """k3 estimator of KL(old || new) (Schulman, "Approximating KL divergence", 2020):
    ``(r - 1) - log r``."""
    return (math.exp(log_ratio) - 1.0) - log_ratio


def gaussian_kl(loc_p: float, scale_p: float, loc_q: float, scale_q: float) -> float:
    """KL between univariate Gaussians:
    ``log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2``."""
    return (
        math.log(scale_q / scale_p) + (scale_p**2 + (loc_p - loc_q) ** 2) / (2 * scale_q**2) - 0.5
    )


def categorical_kl(logits_p: Sequence[float], logits_q: Sequence[float]) -> float:
    """``KL(p || q) = sum_a p(a) log(p(a) / q(a))`` with ``p, q = softmax(logits)``; actions
    with ``p(a) = 0`` contribute 0."""

    def softmax(logits: Sequence[float]) -> list[float]:
        top = max(logits)
        exps = [math.exp(x - top) for x in logits]
        return [e / sum(exps) for e in exps]

    total = 0.0
    for p_a, q_a in zip(softmax(logits_p), softmax(logits_q), strict=True):
        if p_a > 0:
            total += p_a * math.log(p_a / q_a)
    return total


def adaptive_kl_beta(
    beta: float,
    kl: float,
    dtarg: float,
    increment: float,
    decrement: float,
    beta_min: float | None = None,
    beta_max: float | None = None,
) -> float:
    """PPO's adaptive KL coefficient (Schulman et al., arXiv:1707.06347, sec. 4): if
    ``d > 1.5 d_targ`` then ``beta * increment``, else if ``d < d_targ / 1.5`` then
    ``beta * decrement``; then at least ``beta_min`` and at most ``beta_max``."""
    if kl > 1.5 * dtarg:
        beta = beta * increment
    elif kl < dtarg / 1.5:
        beta = beta * decrement
    if beta_min is not None:
        beta = max(beta, beta_min)
    if beta_max is not None:
        beta = min(beta, beta_max)
    return beta


def categorical_entropy(log_probs: Sequence[float]) -> float:
    """Shannon entropy ``H = -sum_a p(a) log p(a)`` with ``p = exp(log p)`` and ``0 log 0 = 0``."""
    total = 0.0
    for log_p in log_probs:
        p = math.exp(log_p)
        if p > 0:
            total -= p * log_p
    return total


def normal_log_density(value: float, loc: float, scale: float) -> float:
    """``log N(x; mu, sigma^2)``: the log of the normaliser ``1 / (sigma sqrt(2 pi))`` plus the
    exponent ``-(x - mu)^2 / (2 sigma^2)``."""
    return math.log(1 / (scale * math.sqrt(2 * math.pi))) - (value - loc) ** 2 / (2 * scale**2)


def normal_entropy(scale: float) -> float:
    """Differential entropy of ``N(mu, sigma^2)``: ``1/2 log(2 pi e sigma^2)``."""
    return 0.5 * math.log(2 * math.pi * math.e * scale**2)


def categorical_log_prob(logits: Sequence[float], action: int) -> float:
    """``log softmax(logits)[a]``, as ``log(exp(l_a) / sum_b exp(l_b))``."""
    top = max(logits)
    return math.log(math.exp(logits[action] - top) / sum(math.exp(x - top) for x in logits))


def gaussian_sample(loc: float, scale: float, noise: float) -> float:
    """The reparameterised draw ``loc + scale * eps`` for a standard normal ``eps``."""
    return loc + scale * noise


# --------------------------------------------------------------------------- critic


def distance(prediction: float, target: float, kind: str) -> float:
    """``l1 = |x|``, ``l2 = x^2``, ``smooth_l1`` = Huber with delta 1
    (``0.5 x^2`` if ``|x| < 1`` else ``|x| - 0.5``), with ``x = prediction - target``."""
    x = prediction - target
    if kind == "l1":
        return abs(x)
    if kind == "l2":
        return x * x
    if kind == "smooth_l1":
        return 0.5 * x * x if abs(x) < 1.0 else abs(x) - 0.5
    raise ValueError(kind)


def clipped_value_loss(value: float, old_value: float, target: float, clip: float, kind: str):
    """PPO value clipping: ``max(L(V, y), L(V_old + clamp(V - V_old, -clip, clip), y))``."""
    clipped_value = old_value + min(max(value - old_value, -clip), clip)
    return max(distance(value, target, kind), distance(clipped_value, target, kind))


def td_error(value: float, target: float, kind: str) -> float:
    """Replay priority from the TD error ``delta = V - y`` (Schaul et al., arXiv:1511.05952):
    ``delta^2`` ("squared") or ``|delta|`` ("absolute")."""
    delta = value - target
    if kind == "squared":
        return delta * delta
    if kind == "absolute":
        return abs(delta)
    raise ValueError(kind)


def ensemble_td_error(values: Sequence[float], target: float, kind: str) -> float:
    """The error of the worst-fitting ensemble member, ``max_i td_error(Q_i, y)``."""
    return max(td_error(value, target, kind) for value in values)


# --------------------------------------------------------------------------- quantile critics


def quantile_huber_loss(
    quantiles: Sequence[float], targets: Sequence[float], kappa: float
) -> float:
    """Quantile regression with the Huber loss (Dabney et al., arXiv:1710.10044): the
    ``m``-th of ``M`` atoms estimates the quantile at ``tau_m = (2m - 1) / 2M`` (m from 1);
    each pair ``(m, k)`` costs ``|tau_m - 1(u < 0)| L_kappa(u) / kappa``, ``u = y_k - theta_m``,
    ``L_kappa(u) = u^2 / 2`` if ``|u| <= kappa`` else ``kappa (|u| - kappa / 2)``; the mean over
    the ``M K`` pairs (TQC, Kuznetsov et al., arXiv:2005.04269)."""
    total = 0.0
    count = len(quantiles)
    for m, theta in enumerate(quantiles, start=1):
        tau = (2 * m - 1) / (2 * count)
        for y in targets:
            u = y - theta
            huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
            below = 1.0 if u < 0 else 0.0
            total += abs(tau - below) * huber / kappa
    return total / (count * len(targets))


def mean_absolute_pairwise_error(quantiles: Sequence[float], targets: Sequence[float]) -> float:
    """``1/(MK) sum_m sum_k |y_k - theta_m|``."""
    pairs = [abs(y - theta) for theta in quantiles for y in targets]
    return sum(pairs) / len(pairs)


def truncated_mixture(critics: Sequence[Sequence[float]], dropped_per_critic: int) -> list[float]:
    """TQC's target atoms (arXiv:2005.04269): the atoms of all ``N`` critics in one
    increasing list, without its ``d N`` largest."""
    pooled = sorted(atom for critic in critics for atom in critic)
    return pooled[: len(pooled) - dropped_per_critic * len(critics)]


# --------------------------------------------------------------------------- reductions


def masked_mean(loss: Sequence[float], mask: Sequence[bool]) -> float:
    """Mean over the valid elements (0 when there are none)."""
    valid = [x for x, keep in zip(loss, mask, strict=True) if keep]
    return sum(valid) / max(len(valid), 1)


def weighted_mean(loss: Sequence[float], weight: Sequence[float], mask: Sequence[bool]) -> float:
    """Prioritized replay (Schaul et al., arXiv:1511.05952): mean of ``w_i l_i`` over valid i."""
    return masked_mean([w * x for x, w in zip(loss, weight, strict=True)], mask)


def normalized_weighted_mean(
    loss: Sequence[float], weight: Sequence[float], mask: Sequence[bool]
) -> float:
    """TorchRL's PER reduction ``sum(w_i l_i) / sum(w_i)`` over valid i."""
    numerator = denominator = 0.0
    for x, w, keep in zip(loss, weight, mask, strict=True):
        if keep:
            numerator += w * x
            denominator += w
    return numerator / denominator


def standardize(x: Sequence[float], mask: Sequence[bool], eps: float = 1e-6) -> list[float]:
    """``(x - mean) / max(std, eps)`` with mean and unbiased std over the valid elements."""
    valid = [v for v, keep in zip(x, mask, strict=True) if keep]
    mean = sum(valid) / len(valid)
    variance = sum((v - mean) ** 2 for v in valid) / max(len(valid) - 1, 1)
    std = max(math.sqrt(variance), eps)
    return [(v - mean) / std for v in x]


def normalized_ess(log_weight: Sequence[float], mask: Sequence[bool]) -> float:
    """Normalised effective sample size ``(sum w)^2 / (N sum w^2)`` of ``w = exp(log_weight)``
    over the N valid elements (Kong 1992)."""
    weights = [math.exp(lw) for lw, keep in zip(log_weight, mask, strict=True) if keep]
    return sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))


def explained_variance(prediction: Sequence[float], target: Sequence[float]) -> float:
    """``1 - Var[y - p] / Var[y]`` with population variances."""

    def variance(values: list[float]) -> float:
        mean = sum(values) / len(values)
        return sum((v - mean) ** 2 for v in values) / len(values)

    residual = [y - p for p, y in zip(prediction, target, strict=True)]
    return 1.0 - variance(residual) / variance(list(target))


def group_standardize(
    x: Sequence[float], groups: Sequence[int], mask: Sequence[bool], eps: float = 1e-4
) -> list[float]:
    """Each element standardised by the mean and (Bessel) std of the valid elements that share
    its id: a loop over the distinct ids."""
    out = [0.0] * len(x)
    for gid in set(groups):
        members = [i for i, g in enumerate(groups) if g == gid]
        valid = [x[i] for i in members if mask[i]]
        mean = sum(valid) / max(len(valid), 1)
        var = sum((v - mean) ** 2 for v in valid) / max(len(valid) - 1, 1)
        for i in members:
            out[i] = (x[i] - mean) / max(math.sqrt(var), eps)
    return out


# --------------------------------------------------------------------------- world models


def symlog(x: float) -> float:
    """DreamerV3 eq. 9: ``sign(x) ln(|x| + 1)``."""
    return math.copysign(math.log(abs(x) + 1.0), x) if x else 0.0


def symexp(x: float) -> float:
    """The inverse of :func:`symlog`: ``sign(x) (e^|x| - 1)``."""
    return math.copysign(math.exp(abs(x)) - 1.0, x) if x else 0.0


def two_hot(x: float, bins: Sequence[float]) -> list[float]:
    """DreamerV3 eq. 10: the weights on the two bins around ``x`` (clipped to the support),
    inversely proportional to the distance, found by a linear scan."""
    x = min(max(x, bins[0]), bins[-1])
    out = [0.0] * len(bins)
    for k in range(len(bins) - 1):
        if bins[k] <= x <= bins[k + 1]:
            width = bins[k + 1] - bins[k]
            out[k] = (bins[k + 1] - x) / width
            out[k + 1] = (x - bins[k]) / width
            return out
    raise AssertionError("unreachable: x is clipped to the support")


def softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def two_hot_cross_entropy(logits: Sequence[float], target: float, bins: Sequence[float]) -> float:
    """DreamerV3 eq. 11: ``-sum_k twohot(y)_k log softmax(logits)_k``."""
    probs = softmax(logits)
    return -sum(w * math.log(p) for w, p in zip(two_hot(target, bins), probs, strict=True) if w)


def mixed_categorical(logits: Sequence[float], unimix: float) -> list[float]:
    """``(1 - unimix) softmax + unimix / K`` (DreamerV3's uniform mixture)."""
    return [(1 - unimix) * p + unimix / len(logits) for p in softmax(logits)]


def categorical_kl_probs(p: Sequence[float], q: Sequence[float]) -> float:
    """``KL(p || q) = sum_k p_k ln(p_k / q_k)``."""
    return sum(pk * math.log(pk / qk) for pk, qk in zip(p, q, strict=True) if pk > 0)


def lambda_return_imagined(
    reward: Sequence[float],
    next_value: Sequence[float],
    continuation: Sequence[float],
    gamma: float,
    lmbda: float,
) -> list[float]:
    """DreamerV3 eq. 7 by backward recursion: ``R_t = r_t + gamma c_t ((1 - lmbda) v_{t+1} +
    lmbda R_{t+1})`` with ``R_{H-1+1} = v_H`` (the last next value)."""
    horizon = len(reward)
    out = [0.0] * horizon
    following = next_value[-1]
    for t in reversed(range(horizon)):
        following = reward[t] + gamma * continuation[t] * (
            (1 - lmbda) * next_value[t] + lmbda * following
        )
        out[t] = following
    return out


def imagination_weights(continuation: Sequence[float], gamma: float) -> list[float]:
    """``w_t = c_0 prod_{k=1}^{t} gamma c_k``."""
    out, weight = [], 1.0
    for t, c in enumerate(continuation):
        weight *= c if t == 0 else gamma * c
        out.append(weight)
    return out


def quantile(values: Sequence[float], level: float) -> float:
    """The ``level`` quantile with linear interpolation between the sorted values (Hyndman and
    Fan's definition 7, numpy's and torch's default)."""
    ordered = sorted(values)
    position = level * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def expected_saturating_cost(
    mean: Sequence[float], covariance: Sequence[Sequence[float]], target, weights
) -> float:
    """PILCO eq. 24-25: ``1 - det(I + S W)^{-1/2} exp(-(m - t)^T W (I + S W)^{-1} (m - t) / 2)``,
    with the determinant and the solve of ``I + S W`` by Gaussian elimination on floats."""
    size = len(mean)
    s_w = [
        [sum(covariance[i][k] * weights[k][j] for k in range(size)) for j in range(size)]
        for i in range(size)
    ]
    matrix = [[(1.0 if i == j else 0.0) + s_w[i][j] for j in range(size)] for i in range(size)]
    diff = [m - t for m, t in zip(mean, target, strict=True)]
    solved, det = _solve(matrix, diff)
    w_diff = [sum(weights[i][j] * solved[j] for j in range(size)) for i in range(size)]
    quadratic = sum(d * v for d, v in zip(diff, w_diff, strict=True))
    return 1.0 - det**-0.5 * math.exp(-0.5 * quadratic)


def _solve(matrix: list[list[float]], rhs: list[float]) -> tuple[list[float], float]:
    """``matrix^{-1} rhs`` and ``det(matrix)`` by Gaussian elimination with partial pivoting."""
    size = len(rhs)
    a = [row[:] + [b] for row, b in zip(matrix, rhs, strict=True)]
    det = 1.0
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(a[r][col]))
        if pivot != col:
            a[col], a[pivot] = a[pivot], a[col]
            det = -det
        det *= a[col][col]
        for r in range(col + 1, size):
            factor = a[r][col] / a[col][col]
            a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    out = [0.0] * size
    for r in reversed(range(size)):
        out[r] = (a[r][size] - sum(a[r][c] * out[c] for c in range(r + 1, size))) / a[r][r]
    return out, det
# --------------------------------------------------------------------------- LLM post-training


def group_advantage(returns: Sequence[float], scale: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO's outcome advantage of the G completions of one prompt (Shao et al.,
    arXiv:2402.03300, sec. 4.1.2): ``(R_i - mean R) / std R`` (unbiased std, floored at eps);
    Dr. GRPO (Liu et al., arXiv:2503.20783): ``R_i - mean R``."""
    mean = sum(returns) / len(returns)
    if not scale:
        return [r - mean for r in returns]
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / max(len(returns) - 1, 1))
    return [(r - mean) / max(std, eps) for r in returns]


def cispo_value(log_ratio: float, advantage: float, eps_low: float, eps_high: float) -> float:
    """CISPO's objective value (MiniMax-M1, arXiv:2506.13585, eq. 4) with ``log pi`` replaced by
    its value's first-order term: ``clip(r, 1 - eps_low, 1 + eps_high) A``."""
    return min(max(math.exp(log_ratio), 1.0 - eps_low), 1.0 + eps_high) * advantage


def cispo_log_ratio_gradient(
    log_ratio: float, advantage: float, eps_low: float, eps_high: float
) -> float:
    """d/d(log pi) of ``sg(clip(r)) A log pi``: ``clip(r) A``, for every token, clipped or not."""
    return cispo_value(log_ratio, advantage, eps_low, eps_high)


def token_aggregate(
    rows: Sequence[Sequence[float]],
    masks: Sequence[Sequence[bool]],
    aggregation: str,
    max_tokens: int | None = None,
) -> float:
    """The per-token loss of sequences reduced as DAPO (token mean, arXiv:2503.14476, eq. 12),
    GRPO (sequence mean then batch mean, arXiv:2402.03300, eq. 3) or Dr. GRPO (sequence sum over
    a constant, then batch mean, arXiv:2503.20783)."""
    if aggregation == "token_mean":
        valid = [
            x for r, k in zip(rows, masks, strict=True) for x, m in zip(r, k, strict=True) if m
        ]
        return sum(valid) / max(len(valid), 1)
    means = []
    for row, mask in zip(rows, masks, strict=True):
        valid = [x for x, m in zip(row, mask, strict=True) if m]
        if aggregation == "prompt_mean":
            means.append(sum(valid) / max(len(valid), 1))
        else:
            means.append(sum(valid) / (len(row) if max_tokens is None else max_tokens))
    return sum(means) / len(means)


def gspo_sequence_objective(
    log_ratios: Sequence[float],
    mask: Sequence[bool],
    advantage: float,
    eps_low: float,
    eps_high: float,
) -> float:
    """GSPO's clipped sequence objective (Zheng et al., arXiv:2507.18071, eq. 5 and 7):
    ``s = exp(mean_t log r_t)`` over the valid tokens, ``min(s A, clip(s, 1-eps_low,
    1+eps_high) A)``."""
    valid = [x for x, m in zip(log_ratios, mask, strict=True) if m]
    ratio = math.exp(sum(valid) / max(len(valid), 1))
    return min(ratio * advantage, min(max(ratio, 1 - eps_low), 1 + eps_high) * advantage)


def kl_trust(log_prob: float, other: float, threshold: float) -> bool:
    """TorchRL's KL-mask: keep the token when ``0.5 (log pi - log pi_other)^2 <= threshold``."""
    return 0.5 * (log_prob - other) ** 2 <= threshold


def sequence_log_likelihood(log_probs: Sequence[float], mask: Sequence[bool], normalize: bool):
    """Sum of a sequence's valid token log-probs, over their number with ``normalize``."""
    valid = [x for x, m in zip(log_probs, mask, strict=True) if m]
    return sum(valid) / max(len(valid), 1) if normalize else sum(valid)


def minor_sft_loss(log_likelihood: float, ref_log_likelihood: float, beta: float) -> float:
    """MinorSFT (Xie et al., arXiv:2408.10642): ``-log sigmoid(beta (log p - log p_ref))``."""
    z = beta * (log_likelihood - ref_log_likelihood)
    return math.log1p(math.exp(-z)) if z > -30 else -z
