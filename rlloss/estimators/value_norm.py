"""Value normalisation: ``ValueNormalizer``, the running standardisation of value targets that the
estimators and the on-policy losses share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rlloss._checks import Coefficient, CoefficientOwner, check_in_range
from rlloss.training.distributed import check_process_group
from rlloss.training.moments import (
    MOMENT_BUFFERS,
    merged_moments,
    moments_scale,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class ValueNormalizer(CoefficientOwner, nn.Module):
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

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ClipPPOLoss, ValueNormalizer
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> rollout = TensorDict(
        ...     {
        ...         "observation": torch.randn(4, 16, 3),
        ...         "action": torch.randint(2, (4, 16)),
        ...         "action_log_prob": torch.full((4, 16), -0.69),
        ...         "next": {
        ...             "observation": torch.randn(4, 16, 3),
        ...             "reward": torch.randn(4, 16, 1),
        ...             "done": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [4, 16],
        ... )  # [num_envs, T]
        >>> vn = ValueNormalizer()
        >>> loss = ClipPPOLoss(actor, critic, value_normalizer=vn)
        >>> with torch.no_grad():
        ...     loss.value_estimator(rollout)  # GAE on de-normalised values; vn learns the returns
        >>> for minibatch in rollout.reshape(-1).split(16):
        ...     out = loss(minibatch)  # critic regressed onto the normalised value targets
    """

    # checked on assignment as at construction (None: no clipping)
    eps = Coefficient(low=0.0)
    clip_threshold = Coefficient(low=0.0, low_open=True)

    def __init__(
        self,
        eps: float = 1e-8,
        clip_threshold: float | None = 5.0,
        process_group: ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        check_process_group("ValueNormalizer", process_group)
        self.process_group = process_group
        check_in_range("eps", eps, 0.0)
        if clip_threshold is not None:
            check_in_range("clip_threshold", clip_threshold, 0.0, low_open=True)
        self.eps = float(eps)
        self.clip_threshold = None if clip_threshold is None else float(clip_threshold)
        # shape [1], not []: inductor (torch 2.13, CPU) drops in-place writes to 0-dim float64
        # buffers, and the moments are written inside compiled losses
        for name in MOMENT_BUFFERS:
            self.register_buffer(name, torch.zeros(1, dtype=torch.float64))

    @property
    def var(self) -> torch.Tensor:
        """Population variance of the targets seen (0 before any)."""
        return self.m2 / self.count.clamp(min=1.0)

    @property
    def scale(self) -> torch.Tensor:
        """``sigma``: ``sqrt(var) + eps``, or 1 while ``var == 0``."""
        return moments_scale(self.var, self.eps)

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


def share_value_normalizer(owner: str, estimator, normalizer: ValueNormalizer) -> None:
    """Give ``estimator`` the loss's ``normalizer`` (it de-normalises the critic's outputs and
    feeds the moments with the value targets it computes); an error for an estimator that cannot
    hold one, or that holds another."""
    if not hasattr(estimator, "value_normalizer"):
        raise TypeError(
            f"{owner}: value_normalizer needs one of rlloss's value estimators (GAE, "
            f"TD0Estimator, ...), which de-normalise the critic's outputs; got "
            f"{type(estimator).__name__}."
        )
    if estimator.value_normalizer is None:
        estimator.value_normalizer = normalizer
    elif estimator.value_normalizer is not normalizer:
        raise ValueError(
            f"{owner}: the value estimator holds another ValueNormalizer than the loss's; "
            "pass the same one to both (or none to the estimator: the loss gives it its own)."
        )
