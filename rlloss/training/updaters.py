"""Target-network updaters: TorchRL's ``SoftUpdate`` and ``HardUpdate``, with one fused call.

TorchRL's updaters walk the loss's target and source TensorDicts and update them entry by entry
on every ``step()``, often more than the rest of a small-batch update's overhead on a CPU
(``docs/guides/performance.md``). These subclasses keep TorchRL's
construction, ``init_()``, checks and counters, and do the update in one fused multi-tensor
``lerp_`` (``copy_`` for the hard update) over tensor lists gathered once. They accept any
TorchRL-style loss (rlloss's or TorchRL's); for rlloss losses the lists are gathered again after
the loss moves (``.to(device)``, ``.double()``), for other losses that case runs TorchRL's step.
"""

from __future__ import annotations

import torch
from torchrl.objectives import HardUpdate as _TorchRLHardUpdate
from torchrl.objectives import SoftUpdate as _TorchRLSoftUpdate

from rlloss import _compat
from rlloss._checks import Coefficient, check_in_range


class _FusedPairs:
    """The (target, source) tensor lists of an initialised TorchRL updater."""

    def __init__(self, updater) -> None:
        self.updater = updater
        self.version = None
        self.targets: list[torch.Tensor] = []
        self.sources: list[torch.Tensor] = []

    def current(self) -> bool:
        """Refresh the lists if the loss moved; ``False`` when that cannot be told (then the
        caller runs TorchRL's step)."""
        version = getattr(self.updater.loss_module, "_moves", None)
        if version is None:
            return False
        if version != self.version:
            loss, targets, sources = self.updater.loss_module, [], []
            for name, key in _compat.updater_pairs(self.updater):
                # read from the loss itself: its tensors change when it moves
                targets.append(getattr(loss, name)[key].data)
                sources.append(getattr(loss, name[len("target_") :])[key].data)
            self.targets, self.sources, self.version = targets, sources, version
        return True


class _FusedStep:
    """``init_`` and ``step`` of a TorchRL updater whose update is one fused call over the
    (target, source) lists (:meth:`_fused_update`), or TorchRL's own step when the lists cannot
    be kept current."""

    def init_(self) -> None:
        super().init_()
        self._fused = _FusedPairs(self)

    @torch.no_grad()
    def step(self) -> None:
        if not self._fused.current():
            return super().step()
        self._fused_update(self._fused.targets, self._fused.sources)

    def prepare(self) -> None:
        """Gather the (target, source) lists now, eagerly: a compiled update that steps this
        updater then traces the fused call alone (gathered inside the trace, each parameter's
        lookup recompiled tensordict's ``__getitem__``, 8 times on the first call)."""
        self._fused.current()


class SoftUpdate(_FusedStep, _TorchRLSoftUpdate):
    """Polyak averaging of the target networks, ``target <- (1 - tau) target + tau source``
    (``eps = 1 - tau``): TorchRL's ``SoftUpdate`` (same arguments) in one fused call.

    ``tau`` must lie in (0, 1] (``eps`` in [0, 1)): 0 would never move the targets.

    Examples:
        >>> import torch
        >>> from torchrl.data import Categorical
        >>> from torchrl.modules import QValueActor
        >>> from rlloss import DQNLoss, SoftUpdate
        >>> loss = DQNLoss(
        ...     QValueActor(torch.nn.Linear(3, 2), in_keys=["observation"], spec=Categorical(2)),
        ...     delay_value=True,
        ... )
        >>> optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> optimizer.step()
        >>> updater.step()  # target <- (1 - tau) target + tau online, after each step
    """

    eps = Coefficient(low=0.0, high=1.0, high_open=True)  # checked on assignment too

    def __init__(
        self, loss_module: torch.nn.Module, *, eps: float | None = None, tau: float | None = None
    ) -> None:
        if tau is not None:
            check_in_range("tau", tau, 0.0, 1.0, low_open=True)
        if eps is not None:
            check_in_range("eps", eps, 0.0, 1.0, high_open=True)
        super().__init__(loss_module, eps=eps, tau=tau)

    def _fused_update(self, targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        _compat.lerp_(targets, sources, 1.0 - self.eps)


class HardUpdate(_FusedStep, _TorchRLHardUpdate):
    """A copy of the online networks into the targets every ``value_network_update_interval``
    steps: TorchRL's ``HardUpdate`` (same arguments and counter) in one fused call.
    ``value_network_update_interval`` is a whole number >= 1."""

    value_network_update_interval = Coefficient(low=1, integer=True)  # on assignment too

    def __init__(
        self, loss_module: torch.nn.Module, *, value_network_update_interval: int = 1000
    ) -> None:
        interval = value_network_update_interval
        check_in_range("value_network_update_interval", interval, 1, integer=True)
        super().__init__(loss_module, value_network_update_interval=interval)

    def _fused_update(self, targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        if self.counter == self.value_network_update_interval:
            _compat.copy_(targets, sources)
            self.counter = 0
        else:
            self.counter += 1
