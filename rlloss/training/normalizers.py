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
from rlloss.training.distributed import all_moments


def merged_moments(
    count: torch.Tensor,
    mean: torch.Tensor,
    m2: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor | None = None,
    process_group=None,
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

    With a ``process_group`` (or the default group when ``torch.distributed`` is initialised),
    the batch is the union of every rank's ``values``: the ranks' batch moments are merged first
    (:func:`rlloss.distributed.all_moments`), so ranks that start from the same running moments
    end with the same ones.

    Returns:
        The merged ``(count, mean, M2)``, 0-dim tensors.
    """
    if valid is None:
        batch_count = values.numel()
        batch_var, batch_mean = torch.var_mean(values, correction=0)
        batch_m2 = batch_var * batch_count
    else:
        batch_count, batch_mean, batch_m2 = _masked_moments(values, valid)
    batch_count, batch_mean, batch_m2 = all_moments(
        batch_count, batch_mean, batch_m2, process_group
    )
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
_MOMENTS = ("count", "mean", "m2")  # the running-moment buffers of both normalizers


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
    environment continues from, 0 after an episode end), ``count``, ``mean`` and ``m2`` (shape
    ``[1]``, so that compiled updates stick; earlier 0-dim states load); all float64; and
    ``num_nonfinite``, the count of non-finite rewards seen.

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

    Example:
        >>> normalizer = RewardNormalizer(num_envs=8, gamma=0.99)
        >>> batch["next", "reward"] = normalizer(batch["next", "reward"], batch["next", "done"])
    """

    def __init__(
        self,
        num_envs: int,
        gamma: float = 0.99,
        eps: float = 1e-8,
        mode: str = "running",
        process_group=None,
    ) -> None:
        super().__init__()
        check_choice("mode", mode, NORMALIZER_MODES)
        self.mode = mode
        self.process_group = process_group
        check_in_range("num_envs", num_envs, 1, integer=True)
        check_in_range("gamma", gamma, 0.0, 1.0)
        check_in_range("eps", eps, 0.0)
        self.num_envs = int(num_envs)
        self.gamma = float(gamma)
        self.eps = float(eps)
        self.register_buffer("returns", torch.zeros(self.num_envs, dtype=torch.float64))
        # shape [1], not []: inductor (torch 2.13, CPU) drops in-place writes to 0-dim float64
        # buffers (see ValueNormalizer); 0-dim states saved earlier load as shape [1]
        for name in _MOMENTS:
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
        return _scale(self.var, self.eps)

    def forward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Update the state with this step or batch (in training mode) and return the rewards
        divided by :attr:`scale`, with the shape and dtype of ``reward``."""
        check_same_shape(reward=reward, done=done)
        sequence, flags = self._as_sequence(reward), self._as_sequence(done)
        if self.mode == "buffer":  # rl8: the std of this buffer's returns
            returns, finite = self._returns(sequence, flags, carry=self.training)
            count, _, m2 = all_moments(*_masked_moments(returns, finite), self.process_group)
            return reward / _scale(m2 / count.clamp(min=1.0), self.eps).to(reward.dtype)
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
        state = _upgraded_state(dict(state_dict), "", self.num_nonfinite)
        message = state_dict_mismatch(self.state_dict(keep_vars=True), state, strict)
        if message:
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: {message}")
        return super().load_state_dict(state, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # as a submodule too: states saved before ``num_nonfinite`` existed, or with 0-dim moments
        state_dict.update(_upgraded_state(state_dict, prefix, self.num_nonfinite))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"num_envs={self.num_envs}, gamma={self.gamma}, eps={self.eps}, mode={self.mode!r}"


def _upgraded_state(state: dict, prefix: str, num_nonfinite: torch.Tensor) -> dict:
    """``state`` with the layouts of earlier versions made current: 0-dim moments and count as
    shape ``[1]``, a missing ``num_nonfinite`` as 0."""
    state = dict(state)
    state.setdefault(prefix + "num_nonfinite", torch.zeros_like(num_nonfinite))
    for name in (*_MOMENTS, "num_nonfinite"):
        value = state.get(prefix + name)
        if isinstance(value, torch.Tensor) and value.ndim == 0:
            state[prefix + name] = value.reshape(1)
    return state


def _scale(var: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(var) + eps``, or 1 where ``var == 0`` (rewards then pass unscaled)."""
    return torch.where(var > 0, var.sqrt() + eps, torch.ones_like(var))


class ValueNormalizer(nn.Module):
    """Running standardisation of value targets: the critic learns in normalised units (skrl's
    ``value_preprocessor=RunningStandardScaler`` for PPO).

    The critic outputs ``v_hat``, a value in standard units. The value estimator turns it back
    into return units, ``V = clip(v_hat, -c, c) * sigma + mu`` (:meth:`denormalize`), computes
    the advantages and value targets ``R`` (GAE...) from those values, then merges the targets
    into the running moments (:meth:`update`: in training mode only, once per estimator call, so
    once per rollout when the advantages are computed over the whole rollout). The critic loss
    compares ``v_hat`` with ``clip((R - mu) / sigma, -c, c)`` (:meth:`normalize`), with the moments
    as they are after that update (skrl's order); value clipping reads the stored ``V_old`` in
    return units and normalises it the same way.

    ``mu`` and ``sigma^2`` are the mean and population variance of every target seen (count,
    mean and ``M2`` merged with :func:`merged_moments`), ``sigma = sqrt(sigma^2) + eps``, or 1
    while ``sigma^2 == 0`` (nothing seen yet: the transform is the identity). Non-finite targets
    and padded steps (``("collector", "mask")`` false) are left out of the moments.

    State (float64 buffers of shape ``[1]``, in ``state_dict()``): ``count``, ``mean``, ``m2``. No
    host sync: the update is tensor operations written in place (a compiled loss does not
    recompile).

    Usage: pass the same normaliser to the loss and to any estimator built outside it,
    ``ClipPPOLoss(actor, critic, value_normalizer=vn)`` and ``GAE(..., value_network=critic,
    value_normalizer=vn)``; the loss hands it to the estimators it builds itself
    (``make_value_estimator``). Values already stored in a batch (``state_value`` read, not
    computed, by an estimator; ``V_old`` for value clipping) are in return units.

    Data-parallel training: with a ``process_group``, or the default group when
    ``torch.distributed`` is initialised, :meth:`update` merges every rank's targets (an
    all-reduce of their moments), so the ranks keep equal moments; every rank must update it the
    same number of times (e.g. once per rollout through the loss's estimator).

    Args:
        eps: added to the standard deviation, >= 0 (default 1e-8, skrl's).
        clip_threshold: ``c``, the bound of normalised values (default 5.0, skrl's), > 0, or
            ``None`` for no bound.
        process_group: the ``torch.distributed`` group whose targets are pooled (default: the
            default group when initialised, else none).

    Differences from skrl: the moments start empty (skrl starts from a prior, mean 0, variance 1,
    count 1); only the returns enter them (skrl also merges the rollout's de-normalised values);
    :meth:`denormalize` is the exact inverse of :meth:`normalize` within the bounds (skrl's
    omits ``eps``).

    Example:
        >>> vn = ValueNormalizer()
        >>> loss = ClipPPOLoss(actor, critic, value_normalizer=vn)
        >>> loss.value_estimator(rollout)  # GAE on de-normalised values; vn learns the returns
        >>> out = loss(minibatch)  # critic regressed onto the normalised value targets
    """

    def __init__(
        self, eps: float = 1e-8, clip_threshold: float | None = 5.0, process_group=None
    ) -> None:
        super().__init__()
        self.process_group = process_group
        check_in_range("eps", eps, 0.0)
        if clip_threshold is not None:
            check_in_range("clip_threshold", clip_threshold, 0.0, low_open=True)
        self.eps = float(eps)
        self.clip_threshold = None if clip_threshold is None else float(clip_threshold)
        # shape [1], not []: inductor (torch 2.13, CPU) drops in-place writes to 0-dim float64
        # buffers, and the moments are written inside compiled losses
        for name in _MOMENTS:
            self.register_buffer(name, torch.zeros(1, dtype=torch.float64))

    @property
    def var(self) -> torch.Tensor:
        """Population variance of the targets seen (0 before any)."""
        return self.m2 / self.count.clamp(min=1.0)

    @property
    def scale(self) -> torch.Tensor:
        """``sigma``: ``sqrt(var) + eps``, or 1 while ``var == 0``."""
        return _scale(self.var, self.eps)

    def _clip(self, value: torch.Tensor) -> torch.Tensor:
        if self.clip_threshold is None:
            return value
        return value.clamp(-self.clip_threshold, self.clip_threshold)

    def normalize(self, value: torch.Tensor) -> torch.Tensor:
        """``clip((value - mu) / sigma, -c, c)``, in ``value``'s dtype (gradients pass within the
        bounds)."""
        mean, scale = self.mean.to(value.dtype), self.scale.to(value.dtype)
        return self._clip((value - mean) / scale)

    def denormalize(self, value: torch.Tensor) -> torch.Tensor:
        """``clip(value, -c, c) * sigma + mu``: a normalised value in return units."""
        mean, scale = self.mean.to(value.dtype), self.scale.to(value.dtype)
        return self._clip(value) * scale + mean

    forward = normalize

    @torch.no_grad()
    def update(self, target: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Merge the finite ``target`` values (where ``valid``, a boolean mask broadcastable to
        ``target``, holds) into the moments; nothing in eval mode."""
        if not self.training:
            return
        target = target.to(torch.float64)
        finite = torch.isfinite(target)
        if valid is not None:
            finite = finite & valid.reshape(*valid.shape, *(1,) * (target.ndim - valid.ndim))
        target = torch.where(finite, target, 0.0)
        merged = merged_moments(self.count, self.mean, self.m2, target, finite, self.process_group)
        for buffer, value in zip((self.count, self.mean, self.m2), merged, strict=True):
            buffer.copy_(value)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, clip_threshold={self.clip_threshold}"


def check_value_normalizer(owner: str, normalizer) -> None:
    """A ``TypeError`` unless ``normalizer`` is ``None`` or a :class:`ValueNormalizer`."""
    if normalizer is not None and not isinstance(normalizer, ValueNormalizer):
        raise TypeError(
            f"{owner}: value_normalizer must be an rlloss.ValueNormalizer, got "
            f"{type(normalizer).__name__}."
        )
