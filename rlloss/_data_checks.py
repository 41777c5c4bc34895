"""rlloss's data checks: the opt-in scan of every batch for NaNs and infinities.

:func:`set_checks` (public: ``rlloss.set_checks``) turns the scan on or off; the value estimators
and every loss call (``rlloss._dispatch``) run :func:`check_finite` when :func:`checks_enabled`
says so, and a few losses (BC, PILCO's cost) run their own host-side data checks under it. The
scan reads a flag from the device, one host sync per entry and call: it is off by default and
skipped under ``torch.compile``. A leaf: this module imports nothing from rlloss.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

_CHECKS = {"enabled": False}


def set_checks(enabled: bool) -> ChecksSetting:
    """Turn rlloss's data checks on or off (off by default); returns the previous setting, which
    is also a context manager restoring it on exit.

    With checks on, every loss and value estimator scans its input batch before computing
    anything and raises a ``ValueError`` naming the first entry that holds a NaN or an infinity
    outside padding, with the index of the first bad element. The scan reads a flag from the
    device: **one host sync per entry and call**, which is why it is off by default. Under
    ``torch.compile`` the scan is skipped (a sync would break the graph): debug in eager mode.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Categorical
        >>> from torchrl.modules import QValueActor
        >>> import rlloss
        >>> loss = rlloss.DQNLoss(
        ...     QValueActor(torch.nn.Linear(3, 2), in_keys=["observation"], spec=Categorical(2))
        ... )
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.randint(2, (8,)),
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.full((8, 1), float("nan")),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> with rlloss.set_checks(
        ...     True
        ... ):  # on for this block only; set_checks(True) alone: from now on
        ...     try:
        ...         loss(batch)
        ...     except ValueError as error:
        ...         print(error)  # ... ('next', 'reward') holds nan at index (0, 0) ...
    """
    previous = _CHECKS["enabled"]
    _CHECKS["enabled"] = bool(enabled)
    return ChecksSetting(previous)


class ChecksSetting:
    """What :func:`set_checks` returns: the previous setting (``bool()`` of it, ``.previous``,
    ``==`` with a bool) and a context manager that restores it on exit."""

    def __init__(self, previous: bool) -> None:
        self.previous = previous

    def __bool__(self) -> bool:
        return self.previous

    def __eq__(self, other) -> bool:
        if isinstance(other, (bool, ChecksSetting)):
            return self.previous == bool(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.previous)

    def __repr__(self) -> str:
        return f"ChecksSetting(previous={self.previous})"

    def __enter__(self) -> ChecksSetting:
        return self

    def __exit__(self, *exc_info) -> None:
        _CHECKS["enabled"] = self.previous


def checks_enabled() -> bool:
    """Whether :func:`set_checks` turned the data checks on."""
    return _CHECKS["enabled"] and not torch.compiler.is_compiling()


def check_finite(owner: str, tensordict: TensorDictBase, valid: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming the first floating entry of ``tensordict`` with a NaN or an
    infinity in a valid step (``valid``: ``[*B]`` boolean, ``None`` for all), and the index of
    its first bad element. Syncs: one read per entry (see :func:`set_checks`)."""
    for key, value in tensordict.items(include_nested=True, leaves_only=True):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        bad = ~torch.isfinite(value)
        if valid is not None:
            bad &= valid.reshape(*valid.shape, *(1,) * (value.ndim - valid.ndim))
        if bad.any():
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{owner}: the batch entry {key!r} holds {value[index].item()} at index {index} "
                "(outside padding). Find where it was produced (the environment, the reward "
                "function, a normaliser) or drop those steps; rlloss.set_checks(False) turns "
                "this check off."
            )
