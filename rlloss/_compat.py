"""The one place where rlloss touches private names of tensordict, torchrl and torch.

Each private name sits behind a small function saying why it is used; ``tests/test_compat.py``
checks every function against the installed releases, so an upstream change fails there, loudly
and in one place, instead of deep inside a loss. This module imports nothing from rlloss. The
private names used for speed alone are in :mod:`rlloss._fast`.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictParams
from tensordict.utils import NestedKey, _unravel_key_to_tuple
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.samplers.base import _REPLACEMENT_DISPATCH
from torchrl.data.replay_buffers.storages.utils import _collate_id
from torchrl.objectives import LossModule as TorchRLLossModule
from torchrl.objectives.common import _updater_check_forward_prehook

# ----------------------------------------------------------------------------- tensordict


def unravel_key(key: NestedKey) -> tuple[str, ...]:
    """``("a", ("b", "c"))`` -> ``("a", "b", "c")``; ``"a"`` -> ``("a",)``.

    Why private: tensordict has no public function that returns the flat tuple of a key
    (``unravel_key`` returns a string for a one-element key); the loss caches it per key.
    """
    return _unravel_key_to_tuple(key)


def is_plain_tensordict_module(module: nn.Module) -> bool:
    """Whether ``module(td)`` of a ``TensorDictModule`` is exactly ``module.module(*inputs)`` on
    its ``in_keys`` with the outputs written to its ``out_keys`` (no keyword inputs, no method
    redirection, no hooks), so a loss may call the inner module on tensors directly.

    Why private: ``TensorDictModule`` keeps its keyword-input and ``get`` options in private
    fields (``_kwargs``, ``_get_kwargs``); no public accessor says "this module is a plain call".
    """
    return (
        isinstance(module, TensorDictModule)
        and type(module).forward is TensorDictModule.forward
        and module._kwargs is None
        and module.method is None
        and not module.method_kwargs
        and not module._get_kwargs
        and not has_call_hooks(module)
    )


def has_call_hooks(module: nn.Module) -> bool:
    """Whether ``module`` has forward hooks or pre-hooks (e.g. tensordict's ``select_out_keys``
    registers one), which a direct call of its children would skip.

    Why private: ``nn.Module`` keeps them in ``_forward_hooks`` and ``_forward_pre_hooks``.
    """
    return bool(module._forward_hooks or module._forward_pre_hooks)


def selects_out_keys(module: nn.Module) -> bool:
    """Whether a ``TensorDictSequential`` was narrowed with ``select_out_keys`` (it then writes
    fewer entries than its children do).

    Why private: tensordict 0.14 records the selection in ``_select_before_return`` only (the
    ``_selected_out_keys`` that rlloss read before no longer exists).
    """
    return bool(getattr(module, "_select_before_return", False))


# ----------------------------------------------------------------------------- torchrl


def mlp_reshapes_output(mlp: nn.Module) -> bool:
    """Whether a TorchRL ``MLP`` reshapes its output (``out_features`` given as a shape), which
    a batched ensemble evaluation must not bypass.

    Why private: ``MLP`` keeps that flag in ``_reshape_out`` only.
    """
    return bool(getattr(mlp, "_reshape_out", False))


class LossMeta(type(TorchRLLossModule)):
    """TorchRL's loss metaclass without its per-call wrapping.

    TorchRL's metaclass wraps ``forward`` (and every public ``*loss`` method) in two context
    managers on each call; rlloss losses never sample through ``actor(td)`` in a forward, so
    they keep only the class-level bookkeeping TorchRL's ``__setattr__`` reads.

    Why private: TorchRL's metaclass is private. Its other bookkeeping, the merged
    ``_all_schedulable_buffers`` set, is built by ``rlloss.LossModule.__init_subclass__`` from
    the classes' coefficients. It also sets TorchRL's ``default_keys`` to the class's
    ``_AcceptedKeys``, as every TorchRL loss does by hand.
    """

    def __init__(cls, name, bases, attr_dict):
        abc.ABCMeta.__init__(cls, name, bases, attr_dict)
        cls.default_keys = cls._AcceptedKeys


def expect_updater(loss: nn.Module, name: str) -> None:
    """Record that the target network ``name`` of ``loss`` has no updater yet (TorchRL's
    updaters mark it when they are built on the loss).

    Why private: TorchRL's ``LossModule`` and updaters share this through
    ``_has_update_associated``.
    """
    loss._has_update_associated[name] = False


def every_target_has_updater(loss: nn.Module) -> bool:
    """Whether an updater was built for every target network of ``loss`` (see
    :func:`expect_updater`)."""
    return all(loss._has_update_associated.values())


def warn_without_updater(loss: nn.Module, args: tuple) -> None:
    """TorchRL's warning that a loss with target networks is run without a target updater.

    Why private: TorchRL registers it as ``_updater_check_forward_prehook``.
    """
    _updater_check_forward_prehook(loss, *args)


def stored_value_estimator(loss: nn.Module):
    """The value estimator a TorchRL ``LossModule`` holds, or ``None``.

    Why private: TorchRL's ``LossModule`` stores it as ``_value_estimator`` (its own methods and
    ``value_estimator`` property read it there).
    """
    return loss._value_estimator


def store_value_estimator(loss: nn.Module, estimator) -> None:
    """Store ``estimator`` where TorchRL's ``LossModule`` keeps it (see
    :func:`stored_value_estimator`)."""
    loss._value_estimator = estimator


def updater_pairs(updater) -> Iterator[tuple[str, NestedKey]]:
    """``(attribute, key)`` of each distinct target tensor of an initialised TorchRL target
    updater: the tensor is ``getattr(loss, attribute)[key]`` and its source
    ``getattr(loss, attribute[len("target_"):])[key]``.

    Why private: TorchRL's ``SoftUpdate``/``HardUpdate`` list them in ``_distinct_and_params``.
    """
    for (name, *rest), distinct in updater._distinct_and_params.items():
        if distinct:
            yield name, tuple(rest) if len(rest) > 1 else rest[0]


def dispatch_without_replacement(sampler_class: type, without: type) -> None:
    """Make ``sampler_class(replacement=False, **kwargs)`` build ``without(**kwargs)``, as
    TorchRL's ``RandomSampler(replacement=False)`` builds a ``SamplerWithoutReplacement``.

    Why private: TorchRL's samplers' metaclass dispatches through its ``_REPLACEMENT_DISPATCH``
    registry, which knows TorchRL's classes only (a subclass is refused with a ``TypeError``).
    """
    _REPLACEMENT_DISPATCH[sampler_class] = without


# ----------------------------------------------------------------------------- torch


def clear_forward_pre_hooks(module: nn.Module) -> None:
    """Remove every forward pre-hook of ``module``.

    Why private: a hook registered without keeping its handle (TorchRL's ``LossModule`` does so
    for its updater warning) can only be removed through ``_forward_pre_hooks``.
    """
    module._forward_pre_hooks.clear()


def remove_forward_pre_hook(module: nn.Module, hook: Callable) -> None:
    """Remove ``hook`` from ``module``'s forward pre-hooks (see :func:`clear_forward_pre_hooks`)."""
    hooks = module._forward_pre_hooks
    for hook_id in [i for i, registered in hooks.items() if registered is hook]:
        del hooks[hook_id]


def has_forward_pre_hook(module: nn.Module, hook: Callable) -> bool:
    """Whether ``hook`` is one of ``module``'s forward pre-hooks."""
    return any(registered is hook for registered in module._forward_pre_hooks.values())


def lerp_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float) -> None:
    """``target += weight * (source - target)`` for every pair, in one fused call.

    Why private: ``torch._foreach_lerp_`` is the multi-tensor kernel behind the fused optimizers;
    a Python loop of ``lerp_`` costs a dispatch per tensor.
    """
    torch._foreach_lerp_(targets, sources, weight)


def copy_(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target.copy_(source)`` for every pair, in one fused call (``torch._foreach_copy_``, as
    :func:`lerp_`)."""
    torch._foreach_copy_(targets, sources)


def assert_all(condition: torch.Tensor, message: str) -> None:
    """Raise ``RuntimeError(message)`` unless the boolean 0-d ``condition`` is true, without
    reading it back to the host.

    Why private: ``torch._assert_async`` is the one check that needs no host sync: on CPU it
    raises at once with ``message``, on a GPU it is a device-side assert; it also compiles
    without a graph break (a ``bool(condition)`` would sync and break the graph).
    """
    torch._assert_async(condition, message)


@contextlib.contextmanager
def whole_storage(storage) -> Iterator[None]:
    """While inside, ``storage`` reports itself full.

    TorchRL's ``TensorStorage.get`` gathers from ``storage[:len(storage)]`` until the storage is
    full. A CUDA graph that records a sample bakes that slice in: items written after the
    recording lie outside it, and a later draw of one is an out-of-bounds gather (a device-side
    assert). Recorded as full, the gather reads the whole allocation (a ``LazyTensorStorage``
    allocates its capacity at the first write), and the sampler's own count or priorities keep
    the draws on written items. A storage without TorchRL's ``_len`` is left as it is."""
    if not isinstance(getattr(type(storage), "_len", None), property) or not isinstance(
        getattr(storage, "max_size", None), int
    ):
        yield
        return
    length = storage._len
    storage._len = storage.max_size
    try:
        yield
    finally:
        storage._len = length


def sample_is_a_gather(replay_buffer) -> bool:
    """Whether ``replay_buffer.sample()`` is, for this buffer, exactly: the sampler's draw
    (flat indices and info, from a sampler with ``draw``), one gather of those indices from the
    storage's TensorDict (:func:`stored_items`), and the info and ``"index"`` set in the batch.

    Why private: what TorchRL's ``TensorDictReplayBuffer.sample`` does around the draw (locks,
    a sample unit, generation tracking, collate, transforms, prefetch, pinned memory) is read off
    its private attributes; only a buffer with none of them qualifies. A compiled update then
    traces the gather with the loss (inductor fuses it into the loss's first kernels) instead of
    calling ``sample()``, which dynamo cannot trace (a lock, ``len(storage)``).
    """
    sampler, storage = (
        getattr(replay_buffer, "sampler", None),
        getattr(replay_buffer, "storage", None),
    )
    transform = getattr(replay_buffer, "transform", None)
    return (
        isinstance(replay_buffer, TensorDictReplayBuffer)
        and type(replay_buffer).sample is TensorDictReplayBuffer.sample
        and type(replay_buffer)._sample is TensorDictReplayBuffer._sample
        and callable(getattr(sampler, "draw", None))
        and callable(getattr(sampler, "check_storage", None))
        and type(storage) in (TensorStorage, LazyTensorStorage)
        and storage.ndim == 1
        and isinstance(replay_buffer.batch_size, int)
        and replay_buffer._collate_fn is _collate_id
        and replay_buffer._sample_unit is None
        and not getattr(replay_buffer._writer, "tracks_generations", False)
        and not replay_buffer._prefetch
        and not replay_buffer._pin_memory
        and (transform is None or len(transform) == 0)
    )


def stored_items(storage, index: torch.Tensor) -> TensorDictBase:
    """``storage.get(index)`` for a full ``TensorStorage`` of TensorDicts: the items at the flat
    ``index`` of the whole allocation.

    Why private: ``TensorStorage.get`` slices the storage to ``len(storage)`` first, a host int
    (a ``torch.compiler.disable``-d ``__len__``, so a graph break, and a graph recorded before the
    buffer fills would keep the slice: see :func:`whole_storage`); the allocation is
    ``storage._storage``. The sampler's draws keep ``index`` on written items.
    """
    return storage._storage[index]


def holds_tensordict_params(module: nn.Module) -> bool:
    """Whether ``module`` keeps weights in a ``TensorDictParams`` (TorchRL's ``MultiAgentMLP``,
    ``MultiAgentConvNet``): its parameter names hold dots below their owner (``params.0.weight``:
    owner ``params``, name ``0.weight``), which ``register_buffer``, ``get_submodule`` and
    ``torch.func.functional_call`` cannot take; tensordict's ``to_module`` can."""
    return any(isinstance(m, TensorDictParams) for m in module.modules())


def frozen_tensordict_params(module: nn.Module) -> None:
    """Make every ``TensorDictParams`` of ``module`` hold detached buffers (``no_convert``), in
    place: the frozen copy of a multi-agent network."""
    for name, submodule in list(module.named_modules()):
        if isinstance(submodule, TensorDictParams):
            owner_name, _, attribute = name.rpartition(".")
            frozen = TensorDictParams(submodule.data.detach().clone(), no_convert=True)
            setattr(module.get_submodule(owner_name), attribute, frozen)


def point_at(module: nn.Module, tensors: Mapping[str, torch.Tensor]):
    """Make ``module``'s tensors named in ``tensors`` (dotted names) the given ones, through
    tensordict's ``to_module`` (which knows ``TensorDictParams``); returns what it replaced, a
    TensorDict whose ``to_module`` restores it. The module's own structure is the template, so
    the sub-TensorDicts keep their batch sizes (``MultiAgentMLP`` maps over its agents' dim)."""
    params = TensorDict.from_module(module).copy()
    for name, tensor in tensors.items():
        params.set(tuple(name.split(".")), tensor)
    return params.to_module(module)
