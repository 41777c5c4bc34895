"""rlloss's speed paths: each replaces a plain call by a cheaper one with the same result.

Every path below names the plain code it replaces. The plain code is the specification: each path
is tested against it (``tests/test_fast.py``), and it is what to go back to if a path breaks on an
upstream release. Why each one exists, with its measured gain at batch 64, is in
``docs/guides/performance.md``; a path that gains under 1% of a step is not kept.

The paths reach into private names of tensordict, torchrl and torch (as :mod:`rlloss._compat`
does for compatibility): the TensorDict's entries' dict, ``_get_tuple``, ``_set_str``,
``torch._C`` calls, the distributions' ``_batch_shape``, modules' ``_parameters`` tables. This
module imports nothing from rlloss but :mod:`rlloss._compat`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch import distributions as D
from torch import nn
from torchrl.modules import IndependentNormal, TanhNormal

from rlloss import _compat

# ----------------------------------------------------------------------------- TensorDicts


def get_path(tensordict: TensorDictBase, path: tuple[str, ...], default=None):
    """``tensordict.get(path, default)`` for an already unravelled ``path``.

    Replaces ``get``, which unravels and validates its key on every call; ``_get_tuple`` is the
    lookup alone. A plain ``TensorDict`` is read from its entries' dict directly:
    ``_get_tuple`` finds a missing entry by raising and catching a ``KeyError`` (a loss looks
    for its optional entries, masks and replay weights, on every forward).
    """
    if type(tensordict) is not TensorDict:
        return tensordict._get_tuple(path, default)
    node = tensordict
    for key in path:  # down the nested plain TensorDicts
        if type(node) is not TensorDict:  # another TensorDict type (or a leaf) on the way
            return tensordict._get_tuple(path, default)
        node = node._tensordict.get(key, default)
        if node is default:
            return default
    return node


def set_computed(tensordict: TensorDictBase, path: tuple[str, ...], value: torch.Tensor) -> None:
    """``tensordict.set(path, value)`` for a ``value`` computed from the batch's own entries (so
    of its batch shape and device).

    Replaces ``set``, which checks the value's batch shape and device: for a plain
    ``TensorDict``, ``_set_str`` / ``_set_tuple(..., validated=True)`` store it as it is; other
    TensorDict types take ``set``.
    """
    if type(tensordict) is TensorDict and len(path) == 1:
        tensordict._set_str(path[0], value, inplace=False, validated=True, non_blocking=False)
    elif type(tensordict) is TensorDict and path:
        tensordict._set_tuple(path, value, inplace=False, validated=True, non_blocking=False)
    else:
        tensordict.set(path, value)


# ----------------------------------------------------------------------------- torch

# torch's reduction codes (``torch.nn._reduction.get_enum``)
_REDUCTION_CODES = {"none": 0, "mean": 1, "sum": 2}


def mse_loss(prediction: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    """``F.mse_loss(prediction, target, reduction=reduction)`` for two tensors of one shape (the
    caller checks it): the same operation, so the same numbers and gradients.

    Replaces ``F.mse_loss``, which first broadcasts its inputs in Python (two ``expand`` views
    and their autograd nodes, even for inputs of one shape) and maps the reduction's name
    through a helper; ``torch._C._nn.mse_loss`` is the operation it then calls.
    """
    code = _REDUCTION_CODES.get(reduction)
    if code is None:  # torch's own error for an unknown reduction
        return nn.functional.mse_loss(prediction, target, reduction=reduction)
    return torch._C._nn.mse_loss(prediction, target, code)


class TensorSlots:
    """Where ``module``'s tensors named ``names`` (dotted) live, found once, for :meth:`call`.

    Replaces ``torch.func.functional_call(module, dict(zip(names, tensors)), args)``: each
    owner's private ``_parameters`` / ``_buffers`` table and key are found once (``.to()``,
    ``load_state_dict`` replace entries, not tables) and the tensors swapped in and back. A
    module holding a ``TensorDictParams`` goes through tensordict's ``to_module``.
    """

    def __init__(self, module: nn.Module, names) -> None:
        self.module, self.names, self.slots = module, tuple(names), None
        if not _compat.holds_tensordict_params(module):
            owners = dict(module.named_modules(remove_duplicate=False))
            held = [(owners[o], a) for o, _, a in (name.rpartition(".") for name in self.names)]
            self.slots = [(m._parameters if a in m._parameters else m._buffers, a) for m, a in held]

    def call(self, tensors, function: Callable, *args):
        """``function(*args)`` with ``tensors`` (ordered as ``names``) there, restored after."""
        if self.slots is None:
            replaced = _compat.point_at(self.module, dict(zip(self.names, tensors, strict=True)))
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


# ----------------------------------------------------------------------------- distributions


def distribution_builder(head: nn.Module, parameter_keys: dict):
    """A :class:`TanhNormalBuilder` or :class:`IndependentNormalBuilder` for a distribution head
    whose class is TorchRL's ``TanhNormal`` or ``IndependentNormal`` with exactly ``loc`` and
    ``scale`` read from the batch (``parameter_keys``: distribution keyword -> batch key);
    ``None`` for any other head (whose ``get_dist`` is then called)."""
    builders = {TanhNormal: TanhNormalBuilder, IndependentNormal: IndependentNormalBuilder}
    builder = builders.get(getattr(head, "distribution_class", None))
    if builder is None or set(parameter_keys) != {"loc", "scale"}:
        return None
    keys = (parameter_keys["loc"], parameter_keys["scale"])
    return builder(dict(head.distribution_kwargs), keys)


class IndependentNormalBuilder:
    """``build(params)``: the ``IndependentNormal`` that ``head.get_dist(params)`` would give.

    Replaces ``head.get_dist(params)``: its keyword plumbing, ``broadcast_all`` and two
    ``Distribution.__init__`` with their shape checks. The first call builds the distribution
    with TorchRL's constructor and keeps its attributes but the shapes and the base
    distribution; each later call with ``loc`` and ``scale`` tensors of one shape makes a new
    ``IndependentNormal`` with those attributes, a ``torch.distributions.Normal`` over ``(loc,
    scale)`` and the shapes the constructors would set (private: ``_batch_shape``,
    ``_event_shape``). Same class, same methods, same numbers. Any other call (broadcast shapes,
    a ``tanh_loc`` location, keywords for the ``Normal``, argument validation switched on,
    fewer dims than the event) goes through the constructor.
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
    synchronisations of ``TanhNormal.__init__`` on a GPU.

    Replaces ``head.get_dist(params)``, whose ``TanhNormal.__init__`` checks ``(high >
    low).all()`` and reads ``(high != 1).any()`` on the host, and copies Python-number bounds to
    the device, at every construction. The first call per device, dtype and rank builds a
    template with TorchRL's constructor (its checks run once, there), its
    ``non_trivial_max/min`` made Python bools; each call then takes a shallow copy of the
    template, drops the copy's base distribution, and lets TanhNormal's own ``update(loc,
    scale)`` build a fresh one. Same class, same methods, same numbers. The head's
    ``distribution_kwargs`` are read once, when the builder is made; the templates are not
    pickled (a loaded loss builds them again). Kept for the host syncs it removes (a loss's
    forward makes none), whatever its gain on a CPU.
    """

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
