"""Reward normalisation by the scale of discounted returns (PPO's "reward scaling").

Engstrom et al., "Implementation Matters in Deep Policy Gradients: A Case Study on PPO and TRPO"
(arXiv:2005.12729), as done by rl8 and gymnasium's ``NormalizeReward``: keep, per environment,
the discounted return ``R_t = gamma * R_{t-1} + r_t`` (reset after an episode ends) and divide the
rewards by the standard deviation of those returns. The rewards are scaled, never mean-centred.
"""

from __future__ import annotations

import torch
from torch import nn

from rlloss._checks import check_choice, check_in_range, check_same_shape, state_dict_mismatch
from rlloss.functional import discounted_returns


def merged_moments(
    count: torch.Tensor,
    mean: torch.Tensor,
    m2: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Running ``(count, mean, M2)`` merged with a batch of ``values`` (Chan, Golub & LeVeque,
    "Updating formulae and a pairwise algorithm for computing sample variances", 1979)::

        delta = mean_b - mean,  n = count + n_b
        mean' = mean + delta * n_b / n
        M2'   = M2 + M2_b + delta^2 * count * n_b / n

    ``M2`` is the sum of squared deviations, so the population variance is ``M2 / count``. The
    batch moments come from ``torch.var_mean`` (Welford), so equal values give ``M2 = 0`` exactly.
    With ``valid`` (a boolean mask of ``values``' shape), only those values enter, without a host
    sync: their moments are taken on the values shifted by a valid one (equal values still give
    ``M2 = 0`` exactly), and a batch with no valid value leaves the moments unchanged.

    Returns:
        The merged ``(count, mean, M2)``, 0-dim tensors.
    """
    if valid is None:
        batch_count = values.numel()
        batch_var, batch_mean = torch.var_mean(values, correction=0)
        batch_m2 = batch_var * batch_count
    else:
        batch_count, batch_mean, batch_m2 = _masked_moments(values, valid)
    total = count + batch_count
    share = batch_count / torch.as_tensor(total).clamp_min(1)
    delta = batch_mean - mean
    merged_mean = mean + delta * share
    merged_m2 = m2 + batch_m2 + delta.square() * count * share
    return total, merged_mean, merged_m2


def _masked_moments(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(count, mean, M2)`` of the valid values (the shifted-data algorithm, shifted by the
    first valid value, 0 when there is none)."""
    flat, ok = values.reshape(-1), valid.reshape(-1)
    first = flat.index_select(0, ok.to(torch.uint8).argmax().reshape(1)).squeeze(0)
    shift = torch.where(ok.any(), first, 0.0)
    shifted = torch.where(ok, flat - shift, 0.0)
    count = ok.sum().to(values.dtype)
    total = shifted.sum()
    mean = shift + total / count.clamp_min(1)
    m2 = (shifted.square().sum() - total.square() / count.clamp_min(1)).clamp_min(0.0)
    return count, mean, m2


NORMALIZER_MODES = ("running", "buffer")


class RewardNormalizer(nn.Module):
    """Divide rewards by the running standard deviation of per-environment discounted returns.

    For each environment ``R_t = gamma * R_{t-1} + r_t``, restarted from 0 after the step where
    ``done`` is set. Every ``R_t`` seen enters running statistics (count, mean and ``M2``, merged
    with :func:`merged_moments`, as gymnasium's ``NormalizeReward``), and the rewards come out as
    ``r_t / (std(R) + eps)``, with the population std over all returns seen so far, this call's
    included. Rewards are divided only, never mean-centred (a shift would change the task).

    Two usages, told apart by the shape of ``reward``:

    - in a collector, one step at a time: ``reward`` and ``done`` of shape ``[num_envs]`` or
      ``[num_envs, 1]``;
    - on a collected batch: ``[num_envs, T, 1]`` (time second to last, ``done`` the flag after
      each step). Every ``R_t`` of the batch updates the statistics, then all rewards of the batch
      are divided by the resulting std. The returns carried from the previous call start the
      sequence, so consecutive batches continue each other's episodes.

    Step by step and batch mode leave the same state after the same data; their outputs differ
    only in that each step is scaled by the std known at that step.

    State (buffers, so in ``state_dict()``): ``returns`` (``[num_envs]``, the return each
    environment continues from, 0 after an episode end), ``count``, ``mean`` and ``m2``; all
    float64; and ``num_nonfinite``, the count of non-finite rewards seen.

    Non-finite rewards (NaN, inf) are ignored by the statistics: such a step counts as a reward of
    0 in its environment's running return and its own return is left out of the moments, so one
    bad reward cannot switch the scaling off for good; ``num_nonfinite`` counts them (no host
    sync). The reward itself comes out as it went in (NaN in, NaN out). In eval mode (``normalizer.eval()``) nothing is updated: rewards are divided by the
    current scale. No host sync: every step is tensor operations.

    Differences from rl8 and gymnasium: rl8 takes the std over the current buffer only (here: a
    running std over all returns, as gymnasium); gymnasium starts the statistics from a prior
    (count 1e-4, variance 1) and divides by ``sqrt(var + eps)``. Here the statistics start empty,
    and while every return seen is equal (std 0, e.g. the first step of identical environments)
    the rewards pass through unscaled instead of being multiplied by ``1 / eps``.

    ``mode="buffer"`` is rl8's rule instead: each call's rewards are divided by the (population)
    std of that call's returns ``R_t`` (the returns still continue across calls), with no
    running statistics: meant for one call per collected buffer ``[num_envs, T, 1]``.

    Args:
        num_envs: number of environments (the leading dim of ``reward``), >= 1.
        gamma: discount factor of the returns, in [0, 1].
        eps: added to the std, >= 0.
        mode: ``"running"`` (default: gymnasium's running std) or ``"buffer"`` (rl8's).

    Example:
        >>> normalizer = RewardNormalizer(num_envs=8, gamma=0.99)
        >>> batch["next", "reward"] = normalizer(batch["next", "reward"], batch["next", "done"])
    """

    def __init__(
        self, num_envs: int, gamma: float = 0.99, eps: float = 1e-8, mode: str = "running"
    ) -> None:
        super().__init__()
        check_choice("mode", mode, NORMALIZER_MODES)
        self.mode = mode
        check_in_range("num_envs", num_envs, 1, integer=True)
        check_in_range("gamma", gamma, 0.0, 1.0)
        check_in_range("eps", eps, 0.0)
        self.num_envs = int(num_envs)
        self.gamma = float(gamma)
        self.eps = float(eps)
        self.register_buffer("returns", torch.zeros(self.num_envs, dtype=torch.float64))
        for name in ("count", "mean", "m2"):
            self.register_buffer(name, torch.zeros((), dtype=torch.float64))
        self.register_buffer("num_nonfinite", torch.zeros((), dtype=torch.int64))

    @property
    def var(self) -> torch.Tensor:
        """Population variance of the returns seen (0 before any)."""
        return self.m2 / self.count.clamp(min=1.0)

    @property
    def scale(self) -> torch.Tensor:
        """The divisor of the rewards (``"running"`` mode): ``std(R) + eps``, or 1 while
        ``std(R) == 0``."""
        return _scale(self.var, self.eps)

    def forward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Update the state with this step or batch (in training mode) and return the rewards
        divided by :attr:`scale`, with the shape and dtype of ``reward``."""
        check_same_shape(reward=reward, done=done)
        sequence, flags = self._as_sequence(reward), self._as_sequence(done)
        if self.mode == "buffer":  # rl8: the std of this buffer's returns
            returns, finite = self._returns(sequence, flags, carry=self.training)
            count, _, m2 = _masked_moments(returns, finite)
            return reward / _scale(m2 / count.clamp(min=1.0), self.eps)
        if self.training:
            returns, finite = self._returns(sequence, flags, carry=True)
            for buffer, value in zip(
                (self.count, self.mean, self.m2),
                merged_moments(self.count, self.mean, self.m2, returns, finite),
                strict=True,
            ):
                buffer.copy_(value)
        return reward / self.scale

    @torch.no_grad()
    def _returns(
        self, reward: torch.Tensor, done: torch.Tensor, carry: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The returns ``R_t`` of ``[num_envs, T, 1]`` rewards continuing the carried ones, and
        the finite-reward mask; with ``carry``, the carried returns and the non-finite count
        are updated."""
        finite = torch.isfinite(reward)
        reward = torch.where(finite, reward, 0.0)
        returns = discounted_returns(reward, done, self.returns[:, None, None], self.gamma)
        if carry:
            self.num_nonfinite.add_((~finite).sum())
            self.returns.copy_(returns[:, -1, 0] * (1.0 - done[:, -1, 0].to(returns.dtype)))
        return returns, finite

    def _as_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as ``[num_envs, T, 1]`` (a single step has ``T = 1``)."""
        n = self.num_envs
        if x.shape in ((n,), (n, 1)):
            return x.reshape(n, 1, 1)
        if x.ndim == 3 and x.shape[0] == n and x.shape[-1] == 1:
            return x
        raise ValueError(
            f"RewardNormalizer: reward has shape {tuple(x.shape)}; expected [num_envs] or "
            f"[num_envs, 1] for one step, or [num_envs, T, 1] for a batch, with num_envs={n}."
        )

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``; a state of another ``num_envs`` (or another module)
        raises one short ``RuntimeError`` naming the shapes, before anything is copied."""
        state = dict(state_dict)
        state.setdefault("num_nonfinite", self.num_nonfinite)  # saved before the count existed
        message = state_dict_mismatch(self.state_dict(keep_vars=True), state, strict)
        if message:
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: {message}")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # state dicts saved before ``num_nonfinite`` existed load as they did
        state_dict.setdefault(prefix + "num_nonfinite", torch.zeros_like(self.num_nonfinite))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"num_envs={self.num_envs}, gamma={self.gamma}, eps={self.eps}, mode={self.mode!r}"


def _scale(var: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(var) + eps``, or 1 where ``var == 0`` (rewards then pass unscaled)."""
    return torch.where(var > 0, var.sqrt() + eps, torch.ones_like(var))
