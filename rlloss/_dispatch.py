"""TorchRL's keyword-tensor call style (tensordict's ``@dispatch``) for rlloss's modules: losses
and value estimators accept ``module(observation=..., next_reward=...)`` as well as a
TensorDict."""

from __future__ import annotations

import functools

from tensordict import TensorDict, TensorDictBase, is_tensor_collection, make_tensordict

from rlloss import _compat
from rlloss._data_checks import check_finite, checks_enabled


def accepts_tensor_arguments(forward):
    """Let ``forward(tensordict)`` also be called with tensors, as TorchRL's ``@dispatch`` does.

    ``loss(observation=obs, next_reward=r, ...)``: keyword names are the ``in_keys`` with nested
    keys joined by ``_`` (positional tensors follow the ``in_keys`` order); the call returns the
    ``out_keys`` entries, a tuple in their order (one tensor when there is one). A TensorDict
    argument takes the direct path.
    """

    @functools.wraps(forward)
    def forward_with_tensors(self, tensordict=None, *args, **kwargs):
        # a plain TensorDict first, then the abstract-class check
        direct = type(tensordict) is TensorDict or isinstance(tensordict, TensorDictBase)
        if not args and not kwargs and direct:
            check_batch(self, tensordict)
            return forward(self, tensordict)
        if is_tensor_collection(tensordict):  # a TensorDict with keywords of the call
            if isinstance(tensordict, TensorDictBase):
                check_batch(self, tensordict)
            return forward(self, tensordict, *args, **kwargs)
        values = {}
        positional = list(args) if tensordict is None else [tensordict, *args]
        for key in self.in_keys:
            name = "_".join(_compat.unravel_key(key))
            if positional:
                values[key] = positional.pop(0)
            elif name in kwargs:
                values[key] = kwargs.pop(name)
        if kwargs or positional:
            names = ["_".join(_compat.unravel_key(k)) for k in self.in_keys]
            raise TypeError(
                f"{type(self).__name__}: unexpected tensor arguments "
                f"{sorted(kwargs) or f'({len(positional)} positional)'}; a call with tensors "
                f"takes the in_keys, nested keys joined by '_': {names}."
            )
        tensordict = make_tensordict(values, auto_batch_size=True)
        check_batch(self, tensordict)
        out = forward(self, tensordict)
        outputs = tuple(out[key] for key in self.out_keys)
        return outputs[0] if len(outputs) == 1 else outputs

    return forward_with_tensors


def check_batch(module, tensordict: TensorDictBase) -> None:
    """What every call checks first: a batch with elements (shapes only, no sync); with
    ``rlloss.set_checks(True)``, finite entries outside padding (syncs)."""
    if 0 in tensordict.batch_size:
        raise_empty(module, tensordict)
    if checks_enabled():
        check_finite(type(module).__name__, tensordict, module._padding_mask(tensordict))


def raise_empty(module, tensordict: TensorDictBase) -> None:
    """The error for a batch without elements: a mean over nothing is NaN, not a loss."""
    raise ValueError(
        f"{type(module).__name__}: the batch is empty (batch_size={list(tensordict.batch_size)}); "
        "a loss needs at least one element: skip the update when the replay buffer or the "
        "rollout has no data."
    )
