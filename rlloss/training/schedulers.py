"""The KL-driven controls of a PPO update: the learning rate adapted to the KL, and KL early
stopping (the piecewise schedules are in ``training/piecewise.py``).

- :class:`KLAdaptiveLR`: skrl's KL-adaptive learning rate, a PyTorch ``LRScheduler`` that updates
  tensor learning rates in place without host synchronisation;
- :class:`KLEarlyStopping` and :func:`kl_exceeds`: rl8's rule that stops a PPO update once a
  minibatch's approximate KL exceeds ``1.5 * target_kl``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch.optim.lr_scheduler import LRScheduler

from rlloss._checks import (
    Coefficient,
    check_bounds_order,
    check_in_range,
)
from rlloss._state_checks import check_is_dict, check_state_entries
from rlloss.training.distributed import all_mean, check_process_group

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def _one_element(owner: str, kl: float | torch.Tensor) -> float | torch.Tensor:
    """``kl`` as a Python number or a detached 0-dim tensor; a clear error for more elements."""
    if not isinstance(kl, torch.Tensor):
        return float(kl)
    if kl.numel() != 1:
        raise ValueError(
            f"{owner}: kl must be a float or a one-element tensor, got a tensor of shape "
            f"{tuple(kl.shape)}; pass its mean (kl.mean())."
        )
    return kl.detach().reshape(())


def set_group_lr(group: dict, lr: float | torch.Tensor) -> None:
    """Set a param group's lr; in place (``fill_``) when it is a tensor, so optimizers and compiled
    steps that hold the tensor see the new value."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = float(lr)


def _current_lrs(optimizer: torch.optim.Optimizer) -> list[float | torch.Tensor]:
    """Every param group's lr; tensors are cloned so the list never aliases the optimizer."""
    return [
        group["lr"].clone() if isinstance(group["lr"], torch.Tensor) else group["lr"]
        for group in optimizer.param_groups
    ]


def kl_adaptive_lr(
    lr: torch.Tensor,
    kl: torch.Tensor,
    kl_threshold: float,
    min_lr: float,
    max_lr: float,
    kl_factor: float,
    lr_factor: float,
) -> torch.Tensor:
    """skrl's KL-adaptive learning rate (rl_games' rule), on tensors, with no host sync::

        lr' = max(lr / lr_factor, min_lr)   if kl > kl_factor * kl_threshold
        lr' = min(lr * lr_factor, max_lr)   if kl < kl_threshold / kl_factor
        lr' = lr                            otherwise (strict inequalities)

    Source: skrl ``skrl.resources.schedulers.torch.KLAdaptiveLR``. The comparisons happen in
    ``kl``'s dtype, the arithmetic in ``lr``'s.

    Args:
        lr: ``[]`` current learning rate.
        kl: ``[]`` KL estimate (e.g. the mean k3 estimate of a learning epoch).

    Returns:
        ``[]`` the new learning rate.
    """
    decreased = torch.clamp(lr / lr_factor, min=min_lr)
    increased = torch.clamp(lr * lr_factor, max=max_lr)
    unchanged_or_increased = torch.where(kl < kl_threshold / kl_factor, increased, lr)
    return torch.where(kl > kl_factor * kl_threshold, decreased, unchanged_or_increased)


class KLAdaptiveLR(LRScheduler):
    """Learning rate that follows the policy's KL divergence (skrl's ``KLAdaptiveLR``).

    Each :meth:`step` applies :func:`kl_adaptive_lr` to every param group: divide the lr by
    ``lr_factor`` (not below ``min_lr``) when ``kl > kl_factor * kl_threshold``, multiply it by
    ``lr_factor`` (not above ``max_lr``) when ``kl < kl_threshold / kl_factor``. skrl steps it once
    per learning epoch with the mean of the per-minibatch k3 KL estimates
    (:func:`rlloss.functional.kl_k3`).

    Host synchronisation: when a group's lr is a tensor (``Adam(params, lr=torch.tensor(3e-4))``,
    capturable or compiled optimizers) and ``kl`` is a tensor on the same device, the lr tensor is
    updated in place with ``torch.where`` and nothing waits for the device. A Python float lr needs
    the KL on the host: one device-to-host copy of ``kl`` per such group.

    ``last_epoch`` counts the calls to :meth:`step`. :meth:`state_dict` holds the hyperparameters
    and the last learning rates; :meth:`load_state_dict` writes those learning rates back into the
    optimizer.

    Data-parallel training: with a ``process_group``, or the default group when
    ``torch.distributed`` is initialised, the KL is first averaged over the ranks (an all-reduce,
    :func:`rlloss.training.distributed.all_mean`), so every rank applies the same rule to the same
    KL and the learning rates stay equal on all ranks.

    TorchRL 0.14 has a class of the same name (``torchrl.objectives.KLAdaptiveLR``, rsl_rl's
    rule): constructed with its keywords, ``KLAdaptiveLR(optimizer, target_kl=0.01, factor=1.5,
    min_lr=1e-5, max_lr=1e-2)``, this class follows TorchRL's rule: the same band (``kl_factor=2``)
    but a KL <= 0 leaves the lr unchanged and every lr is clamped to ``[min_lr, max_lr]`` at each
    step; ``target_kl``, ``factor`` and ``last_kl`` are then TorchRL's attributes.

    Args:
        optimizer: the wrapped optimizer.
        kl_threshold: target KL, > 0.
        min_lr: lower bound of the lr, >= 0 (default 1e-6, skrl's; 1e-5 with TorchRL's keywords).
        max_lr: upper bound of the lr, >= ``min_lr``.
        kl_factor: width of the KL band around ``kl_threshold``, > 1.
        lr_factor: multiplicative lr change, > 1.
        last_epoch: as in every PyTorch scheduler.
        process_group: the ``torch.distributed`` group to average the KL over (default: the
            default group when initialised, else none).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ClipPPOLoss, KLAdaptiveLR
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
        >>> loss = ClipPPOLoss(actor, critic)
        >>> optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
        >>> scheduler = KLAdaptiveLR(optimizer, kl_threshold=0.01)
        >>> for epoch in range(4):
        ...     kls = []
        ...     for batch in rollout.reshape(-1).split(16):
        ...         losses = loss(batch)
        ...         optimizer.zero_grad()
        ...         (losses["loss_objective"] + losses["loss_critic"]).backward()
        ...         optimizer.step()
        ...         kls.append(losses["kl_k3"].detach())
        ...     scheduler.step(
        ...         torch.stack(kls).mean()
        ...     )  # lr / 1.5 above 2 * 0.01, * 1.5 below 0.5 * 0.01
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        kl_threshold: float = 0.008,
        min_lr: float | None = None,
        max_lr: float = 1e-2,
        kl_factor: float = 2.0,
        lr_factor: float = 1.5,
        last_epoch: int = -1,
        *,
        target_kl: float | None = None,
        factor: float | None = None,
        process_group: ProcessGroup | None = None,
    ) -> None:
        check_process_group("KLAdaptiveLR", process_group)
        self.process_group = process_group
        self.torchrl_rule = target_kl is not None or factor is not None
        if self.torchrl_rule:  # TorchRL's signature: KLAdaptiveLR(optimizer, target_kl=, factor=)
            kl_threshold = kl_threshold if target_kl is None else target_kl
            lr_factor = 1.5 if factor is None else factor
        if min_lr is None:  # skrl's default; TorchRL's is 1e-5
            min_lr = 1e-5 if self.torchrl_rule else 1e-6
        # the names the user typed: TorchRL's keywords or skrl's
        threshold_name, factor_name = (
            ("target_kl", "factor")
            if self.torchrl_rule
            else (
                "kl_threshold",
                "lr_factor",
            )
        )
        check_in_range(threshold_name, kl_threshold, 0.0, math.inf, low_open=True, high_open=True)
        check_in_range("min_lr", min_lr, 0.0)
        check_in_range("max_lr", max_lr, min_lr)
        check_in_range("kl_factor", kl_factor, 1.0, math.inf, low_open=True, high_open=True)
        check_in_range(factor_name, lr_factor, 1.0, math.inf, low_open=True, high_open=True)
        self.kl_threshold = float(kl_threshold)
        self.min_lr = float(min_lr)
        self.max_lr = float(max_lr)
        self.kl_factor = float(kl_factor)
        self.lr_factor = float(lr_factor)
        self.last_kl: float | torch.Tensor | None = None
        self.num_nonfinite = torch.zeros((), dtype=torch.int64)
        super().__init__(optimizer, last_epoch)

    # the constructor's ranges, checked on assignment too (min_lr <= max_lr included); plain
    # attributes, as LRScheduler.state_dict / load_state_dict read and write them
    _RANGES = {
        "kl_threshold": {"low": 0.0, "high": math.inf, "low_open": True, "high_open": True},
        "min_lr": {"low": 0.0},
        "max_lr": {"low": 0.0},
        "kl_factor": {"low": 1.0, "high": math.inf, "low_open": True, "high_open": True},
        "lr_factor": {"low": 1.0, "high": math.inf, "low_open": True, "high_open": True},
    }

    def __setattr__(self, name: str, value) -> None:
        if name in self._RANGES:
            check_in_range(name, value, **self._RANGES[name])
            if name == "min_lr":
                check_bounds_order("min_lr", value, "max_lr", getattr(self, "max_lr", None), name)
            if name == "max_lr":
                check_bounds_order("min_lr", getattr(self, "min_lr", None), "max_lr", value, name)
        super().__setattr__(name, value)

    @property
    def target_kl(self) -> float:
        """TorchRL's name of ``kl_threshold``."""
        return self.kl_threshold

    @property
    def factor(self) -> float:
        """TorchRL's name of ``lr_factor``."""
        return self.lr_factor

    def step(self, kl: float | torch.Tensor | None = None) -> None:
        """Adapt every param group's lr to ``kl`` (a float or a one-element tensor).

        ``None`` leaves the learning rates unchanged (as skrl does). A tensor with more than one
        element raises ``ValueError``: pass its mean. A non-finite KL (NaN, inf) is ignored: every
        learning rate stays as it is, and ``num_nonfinite`` (a 0-dim tensor on the KL's device)
        counts it, without a host sync.
        """
        self.last_epoch += 1
        if kl is not None:
            kl = _one_element(type(self).__name__, kl)
            if not isinstance(kl, torch.Tensor):
                kl = torch.tensor(kl, dtype=torch.float64)
            kl = all_mean(kl, self.process_group)  # the mean over ranks (itself on one process)
            if self.num_nonfinite.device != kl.device:  # a CPU count: read here, no device sync
                count = int(self.num_nonfinite)
                self.num_nonfinite = torch.full((), count, dtype=torch.int64, device=kl.device)
            self.num_nonfinite = self.num_nonfinite + (~torch.isfinite(kl)).long()
            for group in self.optimizer.param_groups:
                group["lr"] = self._adapted(group["lr"], kl)
            self.last_kl = kl
        self._last_lr = _current_lrs(self.optimizer)

    def _adapted(self, lr: float | torch.Tensor, kl: torch.Tensor) -> float | torch.Tensor:
        if isinstance(lr, torch.Tensor):
            return lr.copy_(self._rule(lr, kl.to(lr.device)))
        # A Python float lr: the one device-to-host copy (kl.cpu()) of this path.
        return self._rule(torch.tensor(lr, dtype=torch.float64), kl.cpu()).item()

    def _rule(self, lr: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
        rule = (self.kl_threshold, self.min_lr, self.max_lr, self.kl_factor, self.lr_factor)
        adapted = kl_adaptive_lr(lr, kl, *rule)
        if self.torchrl_rule:
            adapted = torch.where(kl > 0, adapted, lr).clamp(self.min_lr, self.max_lr)
        return torch.where(torch.isfinite(kl), adapted, lr)  # a non-finite KL changes nothing

    _HYPERPARAMETERS = ("kl_threshold", "min_lr", "max_lr", "kl_factor", "lr_factor", "_last_lr")

    def state_dict(self) -> dict:
        """``LRScheduler.state_dict`` without the process group (a handle of this run, not
        state: it cannot be saved)."""
        state = super().state_dict()
        state.pop("process_group")
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load the scheduler state and set the optimizer's learning rates to the saved ones. A
        state saved for another number of param groups, or without the hyperparameters, raises
        ``ValueError`` before anything changes."""
        check_is_dict(type(self).__name__, state_dict)
        missing = [name for name in self._HYPERPARAMETERS if name not in state_dict]
        if missing:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state has no {missing}; pass the "
                "output of KLAdaptiveLR.state_dict()."
            )
        groups, saved = len(self.optimizer.param_groups), len(state_dict["_last_lr"])
        if saved != groups:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state holds learning rates for "
                f"{saved} param group(s), the optimizer has {groups}; load it into a scheduler "
                "over an optimizer with the same param groups."
            )
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "process_group"})
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            set_group_lr(group, lr)
        self._last_lr = _current_lrs(self.optimizer)


def kl_exceeds(
    kl: float | torch.Tensor, target_kl: float, factor: float = 1.5
) -> bool | torch.Tensor:
    """``kl > factor * target_kl`` (rl8's early-stopping test), elementwise and on ``kl``'s device:
    no host sync for a tensor ``kl``, a ``bool`` for a Python float. A non-finite KL (NaN, inf)
    exceeds every threshold: the policy it measures is broken, so the update stops."""
    threshold = factor * target_kl
    if isinstance(kl, torch.Tensor):
        return ~(torch.isfinite(kl) & (kl <= threshold))
    return not (math.isfinite(kl) and kl <= threshold)


class KLEarlyStopping:
    """rl8's KL early stopping: stop the whole PPO update (every remaining epoch and minibatch)
    as soon as a minibatch's approximate KL exceeds ``factor * target_kl`` (``factor = 1.5``).

    Compute the KL under ``torch.no_grad()`` before the minibatch's backward, with the k3
    estimator ``mean((r - 1) - log r)`` (Schulman, "Approximating KL divergence", 2020): e.g. the
    ``kl_k3`` output of an rlloss PPO loss, or ``rlloss.functional.kl_k3(log_ratio).mean()``.

    :meth:`should_stop` costs one host sync per call (the KL is read as a Python float); once
    stopped it answers ``True`` without reading the KL until :meth:`reset`. For a sync-free test
    on the device, use :func:`kl_exceeds`. A non-finite KL (NaN, inf) stops the update (it is
    rejected, not ignored) and is counted in ``num_nonfinite``. :meth:`state_dict` /
    :meth:`load_state_dict` save and restore the settings, the stop and the count.

    Data-parallel training: with a ``process_group``, or the default group when
    ``torch.distributed`` is initialised, :meth:`should_stop` tests the mean of the ranks' KLs
    (an all-reduce): every rank gets the same answer at the same minibatch, so all run the same
    number of backward passes (a rank that stopped alone would hang the others' gradient
    all-reduce). Every rank must call :meth:`should_stop` at the same points.

    Args:
        target_kl: target KL, > 0.
        factor: the stop threshold is ``factor * target_kl``, > 0.
        process_group: the ``torch.distributed`` group that decides together (default: the
            default group when initialised, else none).

    Attributes:
        stopped: whether the current update has been stopped.
        stop_kl: the KL (a float) that triggered the stop, ``None`` until then.
        num_nonfinite: how many non-finite KLs were seen (over every update).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ClipPPOLoss, KLEarlyStopping
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
        >>> loss = ClipPPOLoss(actor, critic)
        >>> optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
        >>> early_stopping = KLEarlyStopping(target_kl=0.01)
        >>> for epoch in range(4):
        ...     for batch in rollout.reshape(-1).split(16):
        ...         losses = loss(batch)
        ...         if early_stopping.should_stop(losses["kl_k3"]):
        ...             break
        ...         optimizer.zero_grad()
        ...         (losses["loss_objective"] + losses["loss_critic"]).backward()
        ...         optimizer.step()
    """

    # checked on assignment as at construction
    target_kl = Coefficient(low=0.0, high=math.inf, low_open=True, high_open=True)
    factor = Coefficient(low=0.0, high=math.inf, low_open=True, high_open=True)

    def __init__(
        self, target_kl: float, factor: float = 1.5, process_group: ProcessGroup | None = None
    ) -> None:
        check_process_group("KLEarlyStopping", process_group)
        self.process_group = process_group
        check_in_range("target_kl", target_kl, 0.0, math.inf, low_open=True, high_open=True)
        check_in_range("factor", factor, 0.0, math.inf, low_open=True, high_open=True)
        self.target_kl, self.factor = float(target_kl), float(factor)
        self.num_nonfinite = 0
        self.reset()

    def should_stop(self, kl: float | torch.Tensor) -> bool:
        """Whether to stop the update: ``kl > factor * target_kl`` now or earlier in this update.

        ``kl`` is a float or a one-element tensor; with a process group, the mean over the ranks
        is tested (and is ``stop_kl``).
        """
        if not self.stopped:
            kl = torch.as_tensor(_one_element(type(self).__name__, kl), dtype=torch.float64)
            value = float(all_mean(kl, self.process_group))  # the one host sync
            self.num_nonfinite += not math.isfinite(value)
            if kl_exceeds(value, self.target_kl, self.factor):
                self.stopped, self.stop_kl = True, value
        return self.stopped

    def reset(self) -> None:
        """Forget the stop, for the next update."""
        self.stopped = False
        self.stop_kl: float | None = None

    _STATE = ("target_kl", "factor", "stopped", "stop_kl", "num_nonfinite")

    def state_dict(self) -> dict:
        """The settings, the current stop and the non-finite count."""
        return {name: getattr(self, name) for name in self._STATE}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`'s output; a dict with other entries raises ``ValueError``
        naming them (checked before anything changes)."""
        check_is_dict(type(self).__name__, state_dict)
        check_state_entries(type(self).__name__, state_dict, self._STATE)
        check_in_range("target_kl", state_dict["target_kl"], 0.0, low_open=True)
        check_in_range("factor", state_dict["factor"], 0.0, low_open=True)
        for name in self._STATE:
            setattr(self, name, state_dict[name])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target_kl={self.target_kl}, factor={self.factor})"
