"""The value network's calls that every estimator shares (:class:`ValueEstimator`'s
``_values``): whether values already in the batch are used, the network's inputs at ``s'`` for a
recurrent network, its value read back from what it wrote, and other weights swapped in.

Functions of what they are given (the batch, the network, the key), used by
:mod:`rlloss.estimators.base` for every estimator (GAE, TD(0), TD(1), TD(lambda), V-trace,
multi-agent GAE).
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDictBase
from tensordict.nn import skip_existing
from tensordict.utils import NestedKey
from torch import nn

from rlloss._checks import MissingKeyError


def uses_existing_values(tensordict: TensorDictBase, key: NestedKey, setting: bool | None) -> bool:
    """Whether ``skip_existing`` applies: ``setting`` on (``None``: tensordict.nn's
    ``skip_existing()``), and the values ``key`` present now and under ``"next"``."""
    skip = skip_existing() if setting is None else setting
    if not skip:
        return False
    next_tensordict = tensordict.get("next", None)
    return (
        tensordict.get(key, None) is not None
        and next_tensordict is not None
        and next_tensordict.get(key, None) is not None
    )


def next_inputs(tensordict: TensorDictBase, recurrent_modules: list) -> TensorDictBase:
    """The value network's inputs at ``s'``: ``tensordict["next"]``; for a recurrent value
    network (TorchRL's ``LSTMModule`` / ``GRUModule``, its ``recurrent_modules``) in recurrent
    mode, a shallow copy whose ``is_init`` also marks the steps where the root's ``is_init`` does.

    In recurrent mode the module runs along ``("next", ...)`` from the state stored at the
    first step and restarts from the stored state where ``is_init`` is set; the successor of a
    trajectory's first step is where the ``"next"`` sequence of a new trajectory starts (its
    stored state is the one after that first step), so it must restart there too (TorchRL
    merges the markers the same way). In sequential mode each step starts from its own stored
    state, zeroed where ``is_init`` is set, so the ``"next"`` markers are left as they are.
    """
    next_tensordict = tensordict.get("next")
    markers = [m.in_keys[-1] for m in recurrent_modules if m.recurrent_mode]
    if not markers:
        return next_tensordict
    next_tensordict = next_tensordict.copy()
    for key in dict.fromkeys(markers):
        root = tensordict.get(key, None)
        if root is None:  # the network's own call names the missing entry
            continue
        following = next_tensordict.get(key, None)
        next_tensordict.set(key, root if following is None else following | root)
    return next_tensordict


def network_value(outputs, key: NestedKey, owner: str, network: nn.Module) -> torch.Tensor:
    """The value ``key`` (``tensor_keys.value``) among the ``outputs`` of ``owner``'s value
    ``network``; a network that writes it elsewhere raises a ``MissingKeyError`` naming the
    network, what it wrote and the ``set_keys`` call."""
    value = outputs.get(key, None)
    if value is not None:
        return value
    written = getattr(network, "out_keys", None)
    if isinstance(outputs, TensorDictBase):
        outputs = outputs.keys(include_nested=True, leaves_only=True)
    present = sorted(str(k) for k in outputs)
    raise MissingKeyError(
        f"{owner}: the value network {type(network).__name__} (out_keys {written}) wrote no "
        f"entry {key!r} (tensor_keys.value). Entries present after its call: {present}. If it "
        f"writes the value under another key, remap it with "
        f"estimator.set_keys(value=<its key>) (through a loss: "
        "loss.set_keys(value=<its key>), which the loss's estimator follows)."
    )


def weights(network: nn.Module, params):
    """Call ``network`` with ``params`` in place of its weights (nothing when ``None``)."""
    return contextlib.nullcontext() if params is None else params.to_module(network)
