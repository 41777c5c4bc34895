"""Naive references for :mod:`rlloss.functional.imitation`, written from the papers on Python
floats with explicit loops (see :mod:`tests.reference` for the conventions)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def absolute_error(a: float, b: float) -> float:
    return abs(a - b)


def squared_error(a: float, b: float) -> float:
    return (a - b) ** 2


def huber(a: float, b: float) -> float:
    """Huber's loss with delta 1: ``0.5 x^2`` for ``|x| < 1``, ``|x| - 0.5`` beyond."""
    x = abs(a - b)
    return 0.5 * x * x if x < 1.0 else x - 0.5


def cross_entropy(logits: Sequence[float], index: int) -> float:
    """``-log softmax(logits)[index]`` = ``log sum_j exp(l_j) - l_index``."""
    top = max(logits)
    return top + math.log(sum(math.exp(v - top) for v in logits)) - logits[index]


def discriminator_cross_entropy(d_expert: float, d_policy: float) -> float:
    """``-log D(expert) - log(1 - D(policy))``, each log at least -100 (as BCELoss)."""
    return -max(_log(d_expert), -100.0) - max(_log(1.0 - d_policy), -100.0)


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def gradient_penalty(gradient: Sequence[float], coefficient: float) -> float:
    norm = math.sqrt(sum(g * g for g in gradient))
    return coefficient * (norm - 1.0) ** 2


def gail_reward(d: float, form: str, eps: float = 1e-8) -> float:
    d = min(max(d, eps), 1.0 - eps)
    if form == "positive":
        return -math.log(1.0 - d)
    if form == "negative":
        return math.log(d)
    return math.log(d) - math.log(1.0 - d)


def linear_beta_schedule(steps: int, beta_start: float, beta_end: float):
    """``beta_t = beta_start + t (beta_end - beta_start) / (steps - 1)``, ``alpha_bar_t =
    prod_{s <= t} (1 - beta_s)``."""
    betas = [beta_start + t * (beta_end - beta_start) / max(steps - 1, 1) for t in range(steps)]
    alpha_bars, product = [], 1.0
    for beta in betas:
        product *= 1.0 - beta
        alpha_bars.append(product)
    return betas, alpha_bars


def diffuse(action: float, alpha_bar: float, noise: float) -> float:
    return math.sqrt(alpha_bar) * action + math.sqrt(1.0 - alpha_bar) * noise


def chunk_l1(
    prediction: Sequence[Sequence[float]],
    chunk: Sequence[Sequence[float]],
    valid: Sequence[bool] | None = None,
) -> float:
    """The mean absolute error over the valid steps of one chunk (all its action dims)."""
    total, count = 0.0, 0
    for t, (row, target) in enumerate(zip(prediction, chunk, strict=True)):
        if valid is not None and not valid[t]:
            continue
        for a, b in zip(row, target, strict=True):
            total += abs(a - b)
            count += 1
    return total / max(count, 1)


def standard_normal_kl(mu: Sequence[float], log_var: Sequence[float]) -> float:
    """``KL(N(mu, sigma^2) || N(0, 1))`` summed over independent dims: ``log(1/sigma) +
    (sigma^2 + mu^2) / 2 - 1/2`` each."""
    total = 0.0
    for m, lv in zip(mu, log_var, strict=True):
        sigma = math.exp(0.5 * lv)
        total += math.log(1.0 / sigma) + (sigma * sigma + m * m) / 2.0 - 0.5
    return total


def distillation_error(prediction: Sequence[float], target: Sequence[float]) -> float:
    return sum((p - t) ** 2 for p, t in zip(prediction, target, strict=True)) / len(target)
