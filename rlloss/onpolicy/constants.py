"""Constants the PPO family derives from its hyperparameters, kept between forwards.

Each is computed again only when what it derives from changes, so a forward at a small batch
does not redo the same arithmetic (or the same conversion of Python numbers into tensors) on
every call; compiled code computes them in its graph, where they cost nothing at run time.
"""

from __future__ import annotations

import torch

from rlloss import functional as rlf


class LogClipBounds:
    """``log(1 - eps_low), log(1 + eps_high)`` (:func:`rlloss.functional.clip_bounds`) of a loss's
    clip buffers, computed again when a buffer is replaced (``loss.clip_epsilon = tensor``,
    ``.to(device)``) or written in place (a schedule's ``loss.clip_epsilon = 0.1``,
    ``load_state_dict``, ``fill_``), which bumps its version counter."""

    def __init__(self) -> None:
        self._cache: tuple = ()

    def __call__(self, low: torch.Tensor, high: torch.Tensor) -> tuple:
        if torch.compiler.is_dynamo_compiling():  # one frame a call, not is_compiling's two
            return rlf.clip_bounds(low, high)
        cached = self._cache
        if cached and cached[0] is low and cached[1] is high:
            if cached[2] == low._version and cached[3] == high._version:
                return cached[4]
        bounds = rlf.clip_bounds(low, high)
        if low.requires_grad or high.requires_grad:
            return bounds  # bounds that carry a gradient: a graph of their own each call
        try:
            self._cache = (low, high, low._version, high._version, bounds)
        except RuntimeError:  # inference-mode or functorch tensors keep no version counter
            pass
        return bounds


class KLAdaptationConstants:
    """``(increment, decrement, thresholds)`` for :func:`rlloss.functional.adaptive_kl_beta`
    (the thresholds :func:`rlloss.functional.adaptive_kl_thresholds`): 0-d tensors beside beta
    (filled on its device, no copy from the host), made again when a hyperparameter or beta's
    device or dtype changes: a Python number would be made a tensor in every comparison and
    product of the update. Hyperparameters assigned as tensors are passed as they are."""

    def __init__(self) -> None:
        self._key, self._constants = None, ()

    def __call__(self, beta: torch.Tensor, dtarg, increment, decrement) -> tuple:
        tensors = (torch.Tensor, torch.Tensor, torch.Tensor)
        if torch.compiler.is_dynamo_compiling() or any(
            map(isinstance, (dtarg, increment, decrement), tensors)
        ):
            return increment, decrement, None  # the thresholds computed in the update
        key = (dtarg, increment, decrement, beta.device, beta.dtype)
        if self._key != key:
            values = (increment, decrement, *rlf.adaptive_kl_thresholds(dtarg))
            full = [torch.full((), v, dtype=beta.dtype, device=beta.device) for v in values]
            self._key, self._constants = key, (full[0], full[1], (full[2], full[3]))
        return self._constants
