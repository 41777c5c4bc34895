"""``rlloss.LossModule``: the base every rlloss loss derives from.

It subclasses :class:`torchrl.objectives.LossModule`, so TorchRL's ``SoftUpdate``,
``HardUpdate``, trainers and ``isinstance`` checks accept rlloss losses unchanged. What it adds:

- key handling: each loss declares its keys in an ``_AcceptedKeys`` dataclass; ``set_keys``
  rejects unknown names with the list of valid ones; :meth:`_get` raises a ``KeyError`` that
  names the loss, the missing key, the keys present and the ``set_keys`` call that remaps it;
- reduction through :func:`rlloss.functional.reduce` (masks and importance weights in one place);
- online networks held as ordinary submodules and called directly (no functional parameter
  swapping in the hot path), target networks as ``target_<name>_params`` buffers, found by
  TorchRL's updaters;
- value estimators: :meth:`make_value_estimator` takes TorchRL's ``ValueEstimators`` members
  and builds rlloss's own estimators.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey, _unravel_key_to_tuple
from torch import nn
from torchrl.objectives import LossModule as TorchRLLossModule
from torchrl.objectives.common import _updater_check_forward_prehook
from torchrl.objectives.utils import ValueEstimators

from rlloss import functional as F
from rlloss._networks import NetworkCall, StackedMLP
from rlloss.functional.reduce import REDUCTIONS

DEFAULT_VALUE_HYPERPARAMS = {
    ValueEstimators.TD0: {"gamma": 0.99},
    ValueEstimators.TD1: {"gamma": 0.99},
    ValueEstimators.TDLambda: {"gamma": 0.99, "lmbda": 0.95},
    ValueEstimators.GAE: {"gamma": 0.99, "lmbda": 0.95},
}


class _LossMeta(type(TorchRLLossModule)):
    """TorchRL's metaclass wraps ``forward`` (and every public ``*loss`` method) in two context
    managers on each call. rlloss losses never sample through ``actor(td)`` in a forward, so
    they keep only the class-level bookkeeping (schedulable buffers) and skip the wrapping.
    """

    def __init__(cls, name, bases, attr_dict):
        abc.ABCMeta.__init__(cls, name, bases, attr_dict)
        merged = set()
        for base in cls.__mro__:
            merged |= getattr(base, "_schedulable_buffers", frozenset())
        cls._all_schedulable_buffers = frozenset(merged)


def check_in_range(name: str, value, low=None, high=None, *, low_open=False, high_open=False):
    """Raise ``ValueError`` naming ``name`` and the accepted range if ``value`` is outside it."""
    value = float(value)
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        low_text = "-inf" if low is None else low
        high_text = "inf" if high is None else high
        raise ValueError(f"{name} must be in {left}{low_text}, {high_text}{right}, got {value}.")


def check_choice(name: str, value, choices) -> None:
    """Raise ``ValueError`` naming ``name`` and the accepted values if ``value`` is not one."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")


class LossModule(TorchRLLossModule, metaclass=_LossMeta):
    """Base class of rlloss losses (see the module docstring).

    Subclasses declare ``_AcceptedKeys`` (a dataclass: one field per key, with its default and a
    line of doc), ``default_value_estimator`` and, if they use one, ``_value_network_name`` (the
    attribute holding the network a value estimator should call).
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        pass

    default_keys = _AcceptedKeys
    _value_network_name: str | None = None

    def __init__(self) -> None:
        super().__init__()
        # TorchRL registers a pre-hook warning about target networks without an updater; it is
        # re-registered (as `_warn_without_updater`) with a target network, the only case where
        # it can fire.
        self._forward_pre_hooks.clear()
        self._source_names: list[str] = []
        self._ensemble_names: list[str] = []
        self._detached_names: list[str] = []
        self._key_paths: dict[tuple[str, bool], tuple] = {}  # see `_read`

    # ----------------------------------------------------------------------------- keys
    def set_keys(self, **kwargs) -> None:
        """Remap input/output keys: ``loss.set_keys(advantage=("my", "adv"))``.

        ``None`` restores a key's default. Unknown names raise ``ValueError`` listing the valid
        ones.
        """
        valid = [field.name for field in dataclasses.fields(self._AcceptedKeys)]
        unknown = [name for name in kwargs if name not in valid]
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.set_keys got unknown key name(s) {unknown}; "
                f"valid names are {valid}."
            )
        defaults = self._AcceptedKeys()
        for name, key in kwargs.items():
            setattr(self.tensor_keys, name, getattr(defaults, name) if key is None else key)
        self._forward_value_estimator_keys(**kwargs)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        estimator = self._value_estimator
        if estimator is None:
            return
        shared = {
            field.name: getattr(self.tensor_keys, field.name)
            for field in dataclasses.fields(estimator._AcceptedKeys)
            if hasattr(self.tensor_keys, field.name)
        }
        estimator.set_keys(**shared)

    def _get(self, tensordict: TensorDictBase, name: str, *, nested: bool = False) -> torch.Tensor:
        """The entry ``tensor_keys.<name>`` of ``tensordict`` (of ``tensordict["next"]`` when
        ``nested``); a clear ``KeyError`` if absent."""
        value = self._read(tensordict, name, nested=nested)
        if value is None:
            key = _full_key(getattr(self.tensor_keys, name), nested)
            raise MissingKeyError(missing_key_message(type(self).__name__, name, key, tensordict))
        return value

    def _read(
        self, tensordict: TensorDictBase, name: str, *, nested: bool = False
    ) -> torch.Tensor | None:
        """The entry ``tensor_keys.<name>`` of ``tensordict`` (under ``"next"`` when ``nested``),
        or ``None`` if absent.

        ``tensordict.get`` unravels its key on every call; in eager mode the unravelled key is
        kept per name and reused while ``tensor_keys.<name>`` is the same object.
        """
        key = getattr(self.tensor_keys, name)
        if torch.compiler.is_compiling():
            return tensordict.get(_full_key(key, nested), None)
        cached = self._key_paths.get((name, nested))
        if cached is None or cached[0] is not key:
            value = tensordict.get(_full_key(key, nested), None)  # tensordict checks the key
            self._key_paths[name, nested] = (key, _unravel_key_to_tuple(_full_key(key, nested)))
            return value
        return tensordict._get_tuple(cached[1], None)

    def _write(self, tensordict: TensorDictBase, name: str, value: torch.Tensor) -> None:
        """``tensordict.set(tensor_keys.<name>, value)`` for a ``value`` computed from the batch's
        own entries (so of its batch shape and device): a plain ``TensorDict`` takes it without
        re-validating it."""
        key = getattr(self.tensor_keys, name)
        path = _unravel_key_to_tuple(key)
        if type(tensordict) is TensorDict and path:
            tensordict._set_tuple(path, value, inplace=False, validated=True, non_blocking=False)
        else:
            tensordict.set(key, value)

    # ----------------------------------------------------------------------------- replay
    def _reduce_replayed(self, loss: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        """Reduce a per-transition loss ``[*B, 1]``, weighted by ``priority_weight`` when the
        batch has it (``use_prioritized_weights``), as ``priority_weighting`` says; ``"none"``
        gives ``[*B]`` as TorchRL does."""
        weights = None
        if self.use_prioritized_weights is not False:
            weights = self._read(tensordict, "priority_weight")
            if weights is None and self.use_prioritized_weights is True:
                self._get(tensordict, "priority_weight")  # raises: weights asked for, none given
        loss = F.reduce(
            loss,
            self.reduction,
            weights=weights,
            normalize_weights=self.priority_weighting == "normalized",
        )
        return loss.squeeze(-1) if self.reduction == "none" else loss

    def _bootstrap_discount(self, tensordict: TensorDictBase, reward: torch.Tensor):
        """``gamma ** steps_to_next_obs`` when the batch has it (n-step), else ``gamma``."""
        steps = self._read(tensordict, "steps_to_next_obs")
        steps = None if steps is None else steps.view_as(reward)
        return F.bootstrap_discount(self.gamma, steps, reward.dtype)

    # ----------------------------------------------------------------------------- targets
    def _register_target_network(self, name: str, until: NestedKey | None = None) -> None:
        """Give the submodule ``name`` a target copy whose tensors are ``target_<name>_params``.

        The copy is the network with its parameters turned into buffers, held outside the
        module tree (so its tensors appear once in ``state_dict``, under
        ``target_<name>_params``, and never in ``loss.parameters()``) and called directly.
        ``<name>_params`` exposes the online parameters to TorchRL's ``SoftUpdate`` and
        ``HardUpdate``, which update the target tensors in place. ``until``: the output key the
        loss needs (see :class:`rlloss._networks.NetworkCall`).
        """
        self._has_update_associated[name] = False
        target = _frozen_copy(getattr(self, name))
        self.__dict__[f"_{name}_target"] = target
        self.__dict__[f"_{name}_target_call"] = NetworkCall(target, until)
        setattr(
            self,
            f"target_{name}_params",
            TensorDictParams(TensorDict.from_module(target), no_convert=True),
        )
        self._source_names.append(name)
        self._refresh_source_params()
        if _warn_without_updater not in self._forward_pre_hooks.values():
            self.register_forward_pre_hook(_warn_without_updater)

    def _refresh_source_params(self) -> None:
        """Point ``<name>_params`` at the online tensors and the target copies at the tensors of
        ``target_<name>_params`` (after ``.to()`` or ``.double()`` replaced them)."""
        for name in self._source_names:
            self.__dict__[f"{name}_params"] = TensorDict.from_module(getattr(self, name))
            target = self.__dict__[f"_{name}_target"]
            for key, tensor in self._modules[f"target_{name}_params"].flatten_keys(".").items():
                owner, _, attribute = key.rpartition(".")
                target.get_submodule(owner)._buffers[attribute] = tensor

    def _register_detached_view(self, name: str, until: NestedKey | None = None) -> None:
        """A copy of the submodule ``name`` whose tensors are detached views of its parameters:
        always current, never trained, free to call (e.g. the critic inside an actor loss)."""
        self.__dict__[f"_{name}_detached"] = _frozen_copy(getattr(self, name))
        self.__dict__[f"_{name}_detached_call"] = NetworkCall(
            self.__dict__[f"_{name}_detached"], until
        )
        self._detached_names.append(name)
        self._refresh_detached_views()

    def _refresh_detached_views(self) -> None:
        for name in self._detached_names:
            view = self.__dict__[f"_{name}_detached"]
            for key, parameter in getattr(self, name).named_parameters():
                owner, _, attribute = key.rpartition(".")
                view.get_submodule(owner)._buffers[attribute] = parameter.detach()

    def _detached_outputs(self, name: str, inputs) -> Mapping:
        """The outputs of the submodule ``name`` with its parameters detached (gradients still
        flow to the inputs)."""
        return self.__dict__[f"_{name}_detached_call"](inputs)

    _moves = 0  # counts ``_apply`` calls (``.to``, ``.double``...): rlloss's updaters re-read

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._moves += 1
        self._refresh_views()
        return out

    def __setstate__(self, state) -> None:
        """After ``copy.deepcopy`` or unpickling, the views (source parameters, target copies,
        ensemble and detached views) point at this copy's tensors, not the original's."""
        super().__setstate__(state)
        self._refresh_views()

    def _refresh_views(self) -> None:
        self._refresh_source_params()
        self._refresh_ensembles()
        self._refresh_detached_views()

    def _target_outputs(self, name: str, tensordict: TensorDictBase) -> Mapping:
        """The outputs of the submodule ``name`` run with its target tensors, no gradient."""
        call = self.__dict__[f"_{name}_target_call"]
        if not torch.is_grad_enabled():  # already inside the caller's no_grad block
            return call(tensordict)
        with torch.no_grad():
            return call(tensordict)

    # ----------------------------------------------------------------------------- ensembles
    def _register_ensemble(
        self, name: str, networks, size: int, *, target: bool, until: NestedKey | None = None
    ) -> None:
        """Hold ``size`` copies of a network as stacked tensors, evaluated in one batched call
        (batched matrix products for MLPs, else ``vmap``).

        ``networks`` is one module (its copies are re-initialised with ``reset_parameters``, so
        they differ) or a list of ``size`` modules (their weights are kept). The stacked
        parameters, ``<name>_params`` (``[size, ...]``), are the loss's trainable parameters; with
        ``target``, ``target_<name>_params`` holds stacked target buffers for TorchRL's updaters.
        The given modules themselves are not trained: read the trained weights from the loss.
        """
        modules = list(networks) if isinstance(networks, (list, tuple)) else [networks]
        if len(modules) == 1:
            modules += [_reinitialised(modules[0]) for _ in range(size - 1)]
        if len(modules) != size:
            raise ValueError(
                f"{type(self).__name__}: got {len(modules)} {name} modules for "
                f"num_qvalue_nets={size}; pass one module or a list of num_qvalue_nets modules."
            )
        parameter_names = {n for n, _ in modules[0].named_parameters()}
        stacked = TensorDict.from_modules(*modules).flatten_keys(".")
        stacked = TensorDict(
            {
                k: nn.Parameter(v.detach().clone()) if k in parameter_names else v.detach().clone()
                for k, v in stacked.items()
            },
            batch_size=[size],
        ).unflatten_keys(".")
        self.__dict__[name] = _frozen_copy(modules[0])
        self.__dict__[f"_{name}_direct"] = _Direct(NetworkCall(self.__dict__[name], until))
        self.__dict__[f"_{name}_stacked"] = StackedMLP.of(
            self.__dict__[name], until, key_prefix="network."
        )
        setattr(self, f"{name}_params", TensorDictParams(stacked, no_convert=True))
        self._ensemble_names.append(name)
        if target:
            self._has_update_associated[name] = False
            setattr(
                self,
                f"target_{name}_params",
                TensorDictParams(stacked.detach().clone(), no_convert=True),
            )
            if _warn_without_updater not in self._forward_pre_hooks.values():
                self.register_forward_pre_hook(_warn_without_updater)
        self._refresh_ensembles()

    def _refresh_ensembles(self) -> None:
        for name in self._ensemble_names:
            for prefix in ("", "target_"):
                params = self._modules.get(f"{prefix}{name}_params")
                if params is not None:
                    flat = params.flatten_keys(".").items()
                    self.__dict__[f"_{prefix}{name}_flat"] = {f"network.{k}": v for k, v in flat}

    def _ensemble_outputs(
        self,
        name: str,
        inputs: Mapping,
        *,
        target: bool = False,
        detach: bool = False,
        members: int | None = None,
    ) -> Mapping:
        """Every member's outputs on ``inputs`` (a mapping of input tensors, shared by all
        members), stacked along a leading ``[size]`` dim. ``target``: the target tensors (no
        gradient); ``detach``: the online tensors without gradient (an actor's loss must not
        train the critics); ``members``: only the first ``members`` members (``[members]``
        leading dim)."""
        params = self.__dict__[f"_{'target_' if target else ''}{name}_flat"]
        if members is not None:
            params = {k: v[:members] for k, v in params.items()}
        if detach:
            params = {k: v.detach() for k, v in params.items()}
        stacked = self.__dict__[f"_{name}_stacked"]
        if stacked is not None:  # an MLP: one batched matrix product per layer
            with torch.set_grad_enabled(torch.is_grad_enabled() and not target):
                return {stacked.out_key: stacked(params, inputs)}
        direct = self.__dict__[f"_{name}_direct"]

        def member(member_params):
            return torch.func.functional_call(direct, member_params, (inputs,))

        with torch.set_grad_enabled(torch.is_grad_enabled() and not target):
            return torch.vmap(member, randomness="different")(params)

    # ----------------------------------------------------------------------------- estimators
    def make_value_estimator(self, value_type=None, **hyperparams):
        """Build the value estimator the loss uses when the batch has no advantage.

        Args:
            value_type: a TorchRL ``ValueEstimators`` member (``TD0``, ``TD1``, ``TDLambda``,
                ``GAE``), or an estimator instance to use as is. Defaults to the loss's
                ``default_value_estimator``.
            **hyperparams: estimator keywords (``gamma``, ``lmbda``...), over TorchRL's defaults
                (``gamma=0.99``, ``lmbda=0.95``).
        """
        from rlloss.estimators import GAE, TD0Estimator, TDLambdaEstimator

        if isinstance(value_type, nn.Module):
            self._value_estimator = value_type
            self.value_type = type(value_type)
            self._forward_value_estimator_keys()
            return self
        value_type = self.default_value_estimator if value_type is None else value_type
        if value_type not in DEFAULT_VALUE_HYPERPARAMS:
            raise ValueError(
                f"{type(self).__name__}.make_value_estimator: unsupported value_type "
                f"{value_type!r}; expected one of {list(DEFAULT_VALUE_HYPERPARAMS)} or an "
                "estimator instance."
            )
        hyperparams = {**DEFAULT_VALUE_HYPERPARAMS[value_type], **hyperparams}
        value_network = (
            getattr(self, self._value_network_name) if self._value_network_name else None
        )
        if value_type == ValueEstimators.TD1:
            hyperparams["lmbda"] = 1.0
        cls = {
            ValueEstimators.TD0: TD0Estimator,
            ValueEstimators.TD1: TDLambdaEstimator,
            ValueEstimators.TDLambda: TDLambdaEstimator,
            ValueEstimators.GAE: GAE,
        }[value_type]
        self._value_estimator = cls(value_network=value_network, **hyperparams)
        self.value_type = value_type
        self._forward_value_estimator_keys()
        return self

    def make_gamma_estimator(self, value_type=None, **hyperparams):
        """Set the discount of a loss that builds one-step targets itself (n-step through
        ``steps_to_next_obs``): ``make_value_estimator(ValueEstimators.TD0, gamma=0.99)``."""
        if value_type not in (None, ValueEstimators.TD0):
            raise ValueError(
                f"{type(self).__name__} builds one-step targets (n-step through "
                f"steps_to_next_obs); value_type must be ValueEstimators.TD0, got {value_type!r}."
            )
        unknown = set(hyperparams) - {"gamma", "differentiable", "device"}
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.make_value_estimator got unexpected keywords "
                f"{sorted(unknown)}"
            )
        gamma = hyperparams.get("gamma", 0.99)
        check_in_range("gamma", gamma, 0.0, 1.0)
        self.gamma = gamma
        return self

    @property
    def value_estimator(self):
        if self._value_estimator is None:
            self.make_value_estimator()
        return self._value_estimator

    @value_estimator.setter
    def value_estimator(self, value) -> None:
        self._value_estimator = value

    # ----------------------------------------------------------------------------- checks
    @staticmethod
    def _check_reduction(reduction: str | None) -> str:
        reduction = "mean" if reduction is None else reduction
        check_choice("reduction", reduction, REDUCTIONS)
        return reduction


class _Direct(nn.Module):
    """A module whose forward is a :class:`NetworkCall`, so ``torch.func.functional_call`` can
    run it with other tensors (its network is the ``network`` submodule)."""

    def __init__(self, call: NetworkCall) -> None:
        super().__init__()
        self.network = call.module
        self.call = call

    def forward(self, inputs: Mapping) -> Mapping:
        return self.call(inputs)


def _reinitialised(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every ``reset_parameters`` submodule re-initialised."""
    module = copy.deepcopy(module)
    for submodule in module.modules():
        if hasattr(submodule, "reset_parameters"):
            submodule.reset_parameters()
    return module


def _frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters are buffers (detached, never trained)."""
    module = copy.deepcopy(module)
    for submodule in module.modules():
        for name, parameter in list(submodule._parameters.items()):
            del submodule._parameters[name]
            if parameter is not None:
                submodule.register_buffer(name, parameter.detach())
    return module


def _warn_without_updater(loss: LossModule, args) -> None:
    """TorchRL's forward pre-hook (a warning while a target network has no updater), removed in
    eager mode once every target network has one: an updater stays associated, so the check
    would pass on every later call, and a module with a hook takes ``nn.Module``'s slower call
    path."""
    _updater_check_forward_prehook(loss, *args)
    if all(loss._has_update_associated.values()) and not torch.compiler.is_compiling():
        hooks = loss._forward_pre_hooks
        for hook_id in [i for i, hook in hooks.items() if hook is _warn_without_updater]:
            del hooks[hook_id]


def _full_key(key: NestedKey, nested: bool) -> NestedKey:
    """``key``, or ``("next", *key)`` when ``nested``."""
    if not nested:
        return key
    return ("next", *((key,) if isinstance(key, str) else key))


class MissingKeyError(KeyError):
    """A ``KeyError`` whose message prints as written (``KeyError`` quotes its argument)."""

    def __str__(self) -> str:
        return str(self.args[0])


def missing_key_message(owner: str, name: str, key, tensordict: TensorDictBase) -> str:
    """The text of the ``KeyError`` raised for a missing input entry."""
    present = sorted(str(k) for k in tensordict.keys(include_nested=True, leaves_only=True))
    return (
        f"{owner}: the input TensorDict has no entry {key!r} (tensor_keys.{name}). "
        f"Entries present: {present}. If the data is stored under another key, remap it with "
        f"loss.set_keys({name}=<your key>)."
    )
