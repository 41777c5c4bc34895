"""The shifted value call of the estimators (TorchRL's ``shifted=True``): ``V(s)`` and ``V(s')``
from one value-network call over ``[s_0 .. s_{T-1}, s'_{T-1}]``, the next inputs of truncated
steps inserted after them (:func:`rlloss.functional.returns.shifted_layout`).

A recurrent critic runs once along the whole sequence: each step's hidden state is the one the
step before left (``is_init`` restarts it from the stored state where an episode starts, and at
an inserted next input, whose ``is_init`` is its step's own or the ``("next", "is_init")``
flag). No stored next input is needed where a step's successor is its next input: a batch
without ``("next", obs)`` uses the step's own input in its place (at the last step and at
truncations: an approximate bootstrap, TorchRL's fallback).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from rlloss.functional.returns import shifted_layout

SHIFTED_VALID_KEY = "shifted_valid"  # written: the steps kept by a shifted estimator


def step_flags(flag: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """A ``done`` / ``terminated`` entry as one boolean per step (``[*B, T]``): set where any
    of its trailing entries is set."""
    flag = flag.bool()
    if flag.ndim == batch_dims:
        return flag
    return flag.reshape(*flag.shape[:batch_dims], -1).any(-1)


def layout(tensordict: TensorDictBase, done, terminated, budget: int, time_dim: int):
    """:func:`~rlloss.functional.returns.shifted_layout` of the batch's flags."""
    batch_dims = tensordict.batch_dims
    return shifted_layout(
        step_flags(done, batch_dims), step_flags(terminated, batch_dims), budget, time_dim
    )


def _scatter(destination, source, slot, mask, time_dim: int, length: int):
    """``destination`` (``length + 1`` slots along ``time_dim``, the last a sink) with
    ``source[t]`` written at ``slot[t]`` where ``mask``."""
    index = torch.where(mask, slot, length)
    while index.ndim < source.ndim:
        index = index.unsqueeze(-1)
    return destination.scatter(time_dim, index.expand(source.shape), source)


def sequence_inputs(
    tensordict: TensorDictBase,
    keys: list[NestedKey],
    root_slot: torch.Tensor,
    insert: torch.Tensor,
    budget: int,
    time_dim: int,
) -> TensorDictBase:
    """The value network's inputs over ``T + budget`` slots: each root entry of ``keys`` at its
    slot, each inserted next entry after it (the root entry where ``"next"`` lacks one); slots
    left over are zeros. Entries the root lacks are left out (the network's call names them)."""
    steps = tensordict.shape[time_dim]
    length = steps + budget
    next_tensordict = tensordict.get("next")
    batch_size = list(tensordict.batch_size)
    batch_size[time_dim] = length
    sequence = tensordict.empty(batch_size=batch_size)
    root_fits = root_slot < length
    merge_init = "is_init" in keys
    for key in keys:
        root = tensordict.get(key, None)
        if root is None:
            continue
        following = next_tensordict.get(key, None)
        following = root if following is None else following
        if merge_init and key == "is_init":  # an inserted next input restarts where s_t did
            following = following | root
        shape = list(root.shape)
        shape[time_dim] = length + 1
        values = _scatter(root.new_zeros(shape), root, root_slot, root_fits, time_dim, length)
        values = _scatter(values, following, root_slot + 1, insert, time_dim, length)
        sequence.set(key, values.narrow(time_dim, 0, length))
    return sequence


def gather_steps(values: torch.Tensor, slot: torch.Tensor, time_dim: int) -> torch.Tensor:
    """``values[slot[t]]`` along ``time_dim`` for each step (slots past the end read the last
    one: those steps are invalid)."""
    index = slot.clamp_max(values.shape[time_dim] - 1)
    while index.ndim < values.ndim:
        index = index.unsqueeze(-1)
    shape = list(values.shape)
    shape[time_dim] = slot.shape[time_dim]
    return values.gather(time_dim, index.expand(shape))


def kept(tensor: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``tensor`` with 0 at the steps ``valid`` (``[*B, T]``) drops."""
    while valid.ndim < tensor.ndim:
        valid = valid.unsqueeze(-1)
    return tensor.masked_fill(~valid.expand(tensor.shape), 0)
