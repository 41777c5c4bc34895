"""Reward normalisation by the scale of discounted returns (PPO's "reward scaling").

Engstrom et al., "Implementation Matters in Deep Policy Gradients: A Case Study on PPO and TRPO"
(arXiv:2005.12729), as done by rl8 and gymnasium's ``NormalizeReward``: keep, per environment,
the discounted return ``R_t = gamma * R_{t-1} + r_t`` (reset after an episode ends) and divide the
rewards by the standard deviation of those returns. The rewards are scaled, never mean-centred.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rlloss._checks import (
    Coefficient,
    CoefficientOwner,
    check_choice,
    check_in_range,
    check_same_shape,
)
from rlloss._state_checks import state_dict_mismatch
from rlloss.functional import discounted_returns
from rlloss.training.distributed import all_moments, check_process_group
from rlloss.training.moments import (
    MOMENT_BUFFERS,
    masked_moments,
    merged_moments,
    moments_scale,
    upgraded_state,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

NORMALIZER_MODES = ("running", "buffer")


class RewardNormalizer(CoefficientOwner, nn.Module):
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
    environment continues from, 0 after an episode end), ``count``, ``mean`` and ``m2`` (shape
    ``[1]``, so that compiled updates stick; earlier 0-dim states load); all float64; and
    ``num_nonfinite``, the count of non-finite rewards seen.

    Non-finite rewards (NaN, inf) are ignored by the statistics: such a step counts as a reward of
    0 in its environment's running return and its own return is left out of the moments, so one
    bad reward cannot switch the scaling off for good; ``num_nonfinite`` counts them (no host
    sync). The reward itself comes out as it went in (NaN in, NaN out). In eval mode
    (``normalizer.eval()``) nothing is updated: rewards are divided by the current scale. No
    host sync: every step is tensor operations.

    Differences from rl8 and gymnasium: rl8 takes the std over the current buffer only (here: a
    running std over all returns, as gymnasium); gymnasium starts the statistics from a prior
    (count 1e-4, variance 1) and divides by ``sqrt(var + eps)``. Here the statistics start empty,
    and while every return seen is equal (std 0, e.g. the first step of identical environments)
    the rewards pass through unscaled instead of being multiplied by ``1 / eps``.

    ``mode="buffer"`` is rl8's rule instead: each call's rewards are divided by the (population)
    std of that call's returns ``R_t`` (the returns still continue across calls), with no
    running statistics: meant for one call per collected buffer ``[num_envs, T, 1]``.

    Data-parallel training: with a ``process_group``, or the default group when
    ``torch.distributed`` is initialised, each rank keeps the returns of its own environments
    and the moments (or, in ``"buffer"`` mode, the buffer's std) are those of every rank's
    returns (:func:`merged_moments` over the ranks): all ranks scale by the same std, the one a
    single process stepping every rank's environments would use. Every rank must call the
    normaliser the same number of times.

    Args:
        num_envs: number of environments (the leading dim of ``reward``), >= 1; on this rank.
        gamma: discount factor of the returns, in [0, 1].
        eps: added to the std, >= 0.
        mode: ``"running"`` (default: gymnasium's running std) or ``"buffer"`` (rl8's).
        process_group: the ``torch.distributed`` group whose returns are pooled (default: the
            default group when initialised, else none).

    Examples:
        >>> import torch
        >>> from rlloss import RewardNormalizer
        >>> normalizer = RewardNormalizer(num_envs=8, gamma=0.99)
        >>> for step in range(3):  # one call per env step, rewards of shape [num_envs, 1]
        ...     reward, done = torch.randn(8, 1), torch.zeros(8, 1, dtype=torch.bool)
        ...     scaled = normalizer(
        ...         reward, done
        ...     )  # divided by the running std of the discounted return
    """

    gamma = Coefficient(low=0.0, high=1.0)
    eps = Coefficient(low=0.0)

    def __init__(
        self,
        num_envs: int,
        gamma: float = 0.99,
        eps: float = 1e-8,
        mode: str = "running",
        process_group: ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        check_choice("mode", mode, NORMALIZER_MODES)
        self.mode = mode
        check_process_group("RewardNormalizer", process_group)
        self.process_group = process_group
        check_in_range("num_envs", num_envs, 1, integer=True)
        self._register_coefficients(gamma=gamma, eps=eps)  # checked on assignment too
        self.num_envs = int(num_envs)
        self.register_buffer("returns", torch.zeros(self.num_envs, dtype=torch.float64))
        # shape [1], not []: inductor (torch 2.13, CPU) drops in-place writes to 0-dim float64
        # buffers (see ValueNormalizer); 0-dim states saved earlier load as shape [1]
        for name in MOMENT_BUFFERS:
            self.register_buffer(name, torch.zeros(1, dtype=torch.float64))
        self.register_buffer("num_nonfinite", torch.zeros(1, dtype=torch.int64))

    @property
    def var(self) -> torch.Tensor:
        """Population variance of the returns seen (0 before any)."""
        return self.m2 / self.count.clamp(min=1.0)

    @property
    def scale(self) -> torch.Tensor:
        """The divisor of the rewards (``"running"`` mode): ``std(R) + eps``, or 1 while
        ``std(R) == 0``."""
        return moments_scale(self.var, self.eps)

    def forward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Update the state with this step or batch (in training mode) and return the rewards
        divided by :attr:`scale`, with the shape and dtype of ``reward``."""
        check_same_shape(reward=reward, done=done)
        sequence, flags = self._as_sequence(reward), self._as_sequence(done)
        if self.mode == "buffer":  # rl8: the std of this buffer's returns
            returns, finite = self._returns(sequence, flags, carry=self.training)
            count, _, m2 = all_moments(*masked_moments(returns, finite), self.process_group)
            return reward / moments_scale(m2 / count.clamp(min=1.0), self.eps).to(reward.dtype)
        if self.training:
            returns, finite = self._returns(sequence, flags, carry=True)
            for buffer, value in zip(
                (self.count, self.mean, self.m2),
                merged_moments(self.count, self.mean, self.m2, returns, finite, self.process_group),
                strict=True,
            ):
                buffer.copy_(value)
        return reward / self.scale.to(reward.dtype)  # as a 0-dim divisor would: in reward's dtype

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
        state = upgraded_state(dict(state_dict), "", self.num_nonfinite)
        message = state_dict_mismatch(self.state_dict(keep_vars=True), state, strict)
        if message:
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: {message}")
        return super().load_state_dict(state, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # as a submodule too: states saved before ``num_nonfinite`` existed, or with 0-dim moments
        state_dict.update(upgraded_state(state_dict, prefix, self.num_nonfinite))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"num_envs={self.num_envs}, gamma={self.gamma}, eps={self.eps}, mode={self.mode!r}"
