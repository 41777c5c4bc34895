"""Shape checks shared by the functional core.

They compare shapes only (Python ints), so they cost nothing measurable and never synchronise
host and device; under ``torch.compile`` they run once at trace time.
"""

from __future__ import annotations

import torch


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every tensor has the shape of the first one.

    Silent broadcasting between ``[B]`` and ``[B, 1]`` turns an elementwise loss into a ``[B, B]``
    matrix; this check refuses it and names both shapes.
    """
    names = list(tensors)
    reference = tensors[names[0]].shape
    for name in names[1:]:
        shape = tensors[name].shape
        if shape != reference:
            raise ValueError(
                f"shape mismatch: {names[0]} has shape {tuple(reference)} but {name} has shape "
                f"{tuple(shape)}; they must be equal (rlloss never broadcasts [B] against [B, 1]: "
                "reward, done, value and advantage tensors carry a trailing singleton dim, "
                "log-probs do not)."
            )
