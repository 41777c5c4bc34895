"""The checks of a state dict being loaded: its type, its entries, the shapes of its tensors.

Used by ``LossModule.load_state_dict`` (``rlloss.common``), the reward normaliser
(``rlloss.training.normalizers``) and the KL schedulers (``rlloss.training.schedulers``), so that
a state saved from another class or with other sizes is refused with every mismatch named. A
leaf: this module imports nothing from rlloss.
"""

from __future__ import annotations

import torch


def check_state_entries(owner: str, state_dict: dict, expected) -> None:
    """Refuse a state dict whose entries are not exactly ``expected``, naming the missing and
    the unexpected ones."""
    missing = [name for name in expected if name not in state_dict]
    unexpected = [name for name in state_dict if name not in expected]
    if missing or unexpected:
        raise ValueError(
            f"{owner}.load_state_dict: the state has missing entries {missing} and unexpected "
            f"entries {unexpected}; pass the output of {owner}.state_dict()."
        )


def state_dict_mismatch(own: dict, given, strict: bool, shown: int = 5) -> str:
    """What keeps ``given`` from loading into a module whose state dict is ``own``: entries of
    another shape, and (``strict``) missing and unexpected names; ``""`` when it fits."""

    def listed(items: list) -> str:
        more = f" and {len(items) - shown} more" if len(items) > shown else ""
        return "; ".join(items[:shown]) + more

    shapes = [
        f"{name!r}: saved {tuple(value.shape)}, here {tuple(own[name].shape)}"
        for name, value in given.items()
        if name in own
        and isinstance(value, torch.Tensor)
        and isinstance(own[name], torch.Tensor)
        and value.shape != own[name].shape
    ]
    problems = [f"{len(shapes)} entries have another shape ({listed(shapes)})"] if shapes else []
    if strict:
        missing = [repr(name) for name in own if name not in given]
        unexpected = [repr(name) for name in given if name not in own]
        problems += [f"{len(missing)} missing ({listed(missing)})"] if missing else []
        problems += [f"{len(unexpected)} unexpected ({listed(unexpected)})"] if unexpected else []
    if not problems:
        return ""
    return (
        "the state dict does not fit this module: " + ", ".join(problems) + ". Was it saved "
        "from another class, or with other sizes? (strict=False skips the missing and "
        "unexpected names, never the shapes.)"
    )


def check_is_dict(owner: str, state_dict) -> None:
    """Refuse a state that is not a mapping (``load_state_dict(None)``)."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            f"{owner}.load_state_dict expects a dict (the output of state_dict()), got "
            f"{type(state_dict).__name__}."
        )
