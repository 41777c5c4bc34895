"""The one place where rlloss touches private names of tensordict, torchrl and torch.

Each private name sits behind a small function saying why it is used; ``tests/test_compat.py``
checks every function against the installed releases, so an upstream change fails there, loudly
and in one place, instead of deep inside a loss. This module imports nothing from rlloss.
"""

from __future__ import annotations

import abc
import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictParams
from tensordict.utils import NestedKey, _unravel_key_to_tuple
from torch import distributions as D
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.samplers.base import _REPLACEMENT_DISPATCH
from torchrl.data.replay_buffers.storages.utils import _collate_id
from torchrl.modules import IndependentNormal, TanhNormal
from torchrl.objectives import LossModule as TorchRLLossModule
from torchrl.objectives.common import _updater_check_forward_prehook

# ----------------------------------------------------------------------------- tensordict


def output_tensordict(entries: dict[str, torch.Tensor]) -> TensorDict:
    """A TensorDict of batch size ``[]`` holding ``entries`` as they are.

    Why private: ``TensorDict(entries, batch_size=[])`` validates every entry (device, batch
    size, nesting), several microseconds per entry on each forward, for tensors a loss just
    computed and that are valid by construction. ``TensorDict._new_unsafe`` skips that.
    """
    return TensorDict._new_unsafe(entries, batch_size=torch.Size([]))


def output_tensorclass(cls, entries: dict[str, torch.Tensor]):
    """An instance of the tensorclass ``cls`` holding ``entries``, built from
    :func:`output_tensordict`.

    Why private: the tensorclass constructor checks every field (about 26 us a call against 4 us
    this way); ``cls._from_tensordict`` wraps a TensorDict as it is.
    """
    return cls._from_tensordict(output_tensordict(entries))


# ----------------------------------------------------------------------------- torch

# torch's reduction codes (``torch.nn._reduction.get_enum``)
_REDUCTION_CODES = {"none": 0, "mean": 1, "sum": 2}


def mse_loss(prediction: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    """``F.mse_loss(prediction, target, reduction=reduction)`` for two tensors of one shape (the
    caller checks it): the same operation, so the same numbers and gradients.

    Why private: ``F.mse_loss`` first broadcasts its inputs in Python (``broadcast_tensors``:
    two ``expand`` views and their autograd nodes, even for inputs of one shape) and maps the
    reduction's name through a helper, about as much Python as the rest of a small critic
    loss's reduction; ``torch._C._nn.mse_loss`` is the operation it then calls.
    """
    code = _REDUCTION_CODES.get(reduction)
    if code is None:  # torch's own error for an unknown reduction
        return nn.functional.mse_loss(prediction, target, reduction=reduction)
    return torch._C._nn.mse_loss(prediction, target, code)


def set_grad_mode(enabled: bool) -> None:
    """Switch autograd's recording on or off for the current thread, as entering and leaving
    ``torch.no_grad()`` do (a caller restores the previous mode in a ``finally``).

    Why private: ``torch.no_grad()`` is a context-manager object, four Python frames a use
    (``__new__``, ``__init__``, ``__enter__``, ``__exit__``), which is a visible share of a small
    loss's per-call overhead; ``torch._C._set_grad_enabled`` is the switch they flip (dynamo
    traces it as a grad-mode change, so ``fullgraph=True`` still holds).
    """
    torch._C._set_grad_enabled(enabled)


def unravel_key(key: NestedKey) -> tuple[str, ...]:
    """``("a", ("b", "c"))`` -> ``("a", "b", "c")``; ``"a"`` -> ``("a",)``.

    Why private: tensordict has no public function that returns the flat tuple of a key
    (``unravel_key`` returns a string for a one-element key); the loss caches it per key.
    """
    return _unravel_key_to_tuple(key)


def get_path(tensordict: TensorDictBase, path: tuple[str, ...], default=None):
    """``tensordict.get(path, default)`` for an already unravelled ``path``.

    Why private: ``get`` unravels (and validates) its key on every call; with the path unravelled
    once per key, ``_get_tuple`` is the lookup alone (a few microseconds per entry and forward).
    A plain ``TensorDict`` is read from its entries' dict directly: ``_get_tuple`` finds a
    missing entry by raising and catching a ``KeyError`` (about 1 us each; a loss looks for its
    optional entries, masks and replay weights, on every forward).
    """
    if type(tensordict) is not TensorDict:
        return tensordict._get_tuple(path, default)
    node = tensordict
    for key in path:  # a loop down the nested plain TensorDicts, no recursive call
        if type(node) is not TensorDict:  # another TensorDict type (or a leaf) on the way
            return tensordict._get_tuple(path, default)
        node = node._tensordict.get(key, default)
        if node is default:
            return default
    return node


def set_computed(tensordict: TensorDictBase, path: tuple[str, ...], value: torch.Tensor) -> None:
    """``tensordict.set(path, value)`` for a ``value`` computed from the batch's own entries (so
    of its batch shape and device).

    Why private: for a plain ``TensorDict``, ``_set_tuple(..., validated=True)`` stores the
    tensor without re-checking its batch shape and device; other TensorDict types take ``set``.
    """
    if type(tensordict) is TensorDict and len(path) == 1:  # without `_set_tuple`'s frame
        tensordict._set_str(path[0], value, inplace=False, validated=True, non_blocking=False)
    elif type(tensordict) is TensorDict and path:
        tensordict._set_tuple(path, value, inplace=False, validated=True, non_blocking=False)
    else:
        tensordict.set(path, value)


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


def distribution_builder(head: nn.Module, parameter_keys: dict):
    """A :class:`TanhNormalBuilder` or :class:`IndependentNormalBuilder` for a distribution head
    whose class is TorchRL's ``TanhNormal`` or ``IndependentNormal`` with exactly ``loc`` and
    ``scale`` read from the batch (``parameter_keys``: distribution keyword -> batch key);
    ``None`` for any other head."""
    builders = {TanhNormal: TanhNormalBuilder, IndependentNormal: IndependentNormalBuilder}
    builder = builders.get(getattr(head, "distribution_class", None))
    if builder is None or set(parameter_keys) != {"loc", "scale"}:
        return None
    keys = (parameter_keys["loc"], parameter_keys["scale"])
    return builder(dict(head.distribution_kwargs), keys)


class IndependentNormalBuilder:
    """``build(params)``: the ``IndependentNormal`` that ``head.get_dist(params)`` would give,
    without its constructors' Python (``get_dist``'s keyword plumbing, ``broadcast_all``, two
    ``Distribution.__init__`` and their shape checks: ~45 Python calls, as much as the policy's
    log-prob and entropy at batch 64).

    The first call builds the distribution with TorchRL's constructor and keeps its attributes
    but the shapes and the base distribution; each later call with ``loc`` and ``scale``
    tensors of one shape makes a new ``IndependentNormal`` with those attributes, a
    ``torch.distributions.Normal`` over ``(loc, scale)`` and the shapes the constructors would
    set (private: ``_batch_shape``, ``_event_shape``). Same class, same methods, same numbers.
    Any other call (broadcast shapes, a ``tanh_loc`` location, keywords for the ``Normal``,
    argument validation switched on, fewer dims than the event) goes through the constructor.
    """

    def __init__(self, kwargs: dict, keys: tuple) -> None:
        self.kwargs, self.keys, self.state = kwargs, keys, None

    def __call__(self, params) -> IndependentNormal:
        loc, scale = params[self.keys[0]], params[self.keys[1]]
        state = self.state
        if (
            state is None
            or D.Distribution._validate_args
            or type(scale) is not torch.Tensor
            or loc.shape != scale.shape
            or loc.ndim < state["reinterpreted_batch_ndims"]
        ):
            return self._constructed(loc, scale)
        normal = object.__new__(D.Normal)
        normal.loc, normal.scale = loc, scale
        normal._batch_shape, normal._event_shape = loc.shape, torch.Size()
        dist = object.__new__(IndependentNormal)
        dist.__dict__.update(state)
        split = loc.ndim - state["reinterpreted_batch_ndims"]
        dist.base_dist = normal
        dist._batch_shape, dist._event_shape = loc.shape[:split], loc.shape[split:]
        return dist

    def _constructed(self, loc, scale) -> IndependentNormal:
        dist = IndependentNormal(loc, scale, **self.kwargs)
        if self.state is None and not dist.tanh_loc and not dist._kwargs:
            shapes = ("base_dist", "_batch_shape", "_event_shape", "_validate_args")
            self.state = {k: v for k, v in vars(dist).items() if k not in shapes}
        return dist


class TanhNormalBuilder:
    """``build(params)``: the TanhNormal ``head.get_dist(params)`` would give, without the host
    synchronisations of ``TanhNormal.__init__`` on a GPU (it checks ``(high > low).all()`` and
    reads ``(high != 1).any()`` on the host, and copies Python-number bounds to the device, at
    every construction).

    The first call per device, dtype and rank builds a template with TorchRL's constructor (its
    checks run once, there), its ``non_trivial_max/min`` made Python bools; each call then takes
    a shallow copy of the template, drops the copy's base distribution, and lets TanhNormal's
    own ``update(loc, scale)`` build a fresh one. Same class, same methods, same numbers. The
    head's ``distribution_kwargs`` are read once, when the builder is made; the templates are
    not pickled (a loaded loss builds them again)."""

    def __init__(self, kwargs: dict, keys: tuple) -> None:
        self.kwargs, self.keys = kwargs, keys
        self.templates: dict = {}

    def __getstate__(self) -> dict:
        return {"kwargs": self.kwargs, "keys": self.keys, "templates": {}}

    def __call__(self, params) -> TanhNormal:
        loc, scale = params[self.keys[0]], params[self.keys[1]]
        key = (loc.device, loc.dtype, loc.ndim)
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = self._template(loc)
        dist = copy.copy(template)
        del dist.base_dist  # the copy's own: update() then builds a new base distribution
        dist.update(loc, scale)
        return dist

    def _template(self, loc: torch.Tensor) -> TanhNormal:
        zeros = loc.detach().new_zeros((1,) * loc.ndim)
        template = TanhNormal(zeros, torch.ones_like(zeros), **self.kwargs)
        template.non_trivial_max = bool(template.non_trivial_max)
        template.non_trivial_min = bool(template.non_trivial_min)
        return template


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


class TensorSlots:
    """Where ``module``'s tensors named ``names`` (dotted) live, found once, for :meth:`call`
    (~3x cheaper than ``functional_call``): each owner's private ``_parameters`` / ``_buffers``
    table and key (pinned in tests; ``.to()``, ``load_state_dict`` replace entries, not tables).
    A module holding a ``TensorDictParams`` goes through ``to_module``."""

    def __init__(self, module: nn.Module, names) -> None:
        self.module, self.names, self.slots = module, tuple(names), None
        if not holds_tensordict_params(module):
            owners = dict(module.named_modules(remove_duplicate=False))
            held = [(owners[o], a) for o, _, a in (name.rpartition(".") for name in self.names)]
            self.slots = [(m._parameters if a in m._parameters else m._buffers, a) for m, a in held]

    def call(self, tensors, function: Callable, *args):
        """``function(*args)`` with ``tensors`` (ordered as ``names``) there, restored after."""
        if self.slots is None:
            replaced = point_at(self.module, dict(zip(self.names, tensors, strict=True)))
            try:
                return function(*args)
            finally:
                replaced.to_module(self.module)
        originals = [table[attr] for table, attr in self.slots]
        for (table, attr), tensor in zip(self.slots, tensors, strict=True):
            table[attr] = tensor
        try:
            return function(*args)
        finally:
            for (table, attr), original in zip(self.slots, originals, strict=True):
                table[attr] = original
