"""Calling the user's TensorDict networks on a batch without writing TensorDicts.

A loss only needs a network's output tensors. ``TensorDictModule.forward`` writes each output
into a TensorDict through ``TensorDict.from_any``, which in tensordict 0.14 runs an
``importlib.util.find_spec("pandas")`` file-system lookup on every call when pandas is not
installed: tens of microseconds per network call, more than a small MLP costs. For the common
structures (``TensorDictModule`` with positional ``in_keys``, ``TensorDictSequential`` of those,
``ProbabilisticTensorDictSequential`` ending in a ``ProbabilisticTensorDictModule``, which covers
TorchRL's ``ValueOperator``, ``QValueActor``'s backbone and ``ProbabilisticActor``),
:class:`NetworkCall` plans once which ``nn.Module`` to call on which entries and then runs the
inner modules directly on tensors. Anything else falls back to calling the module on a shallow
copy of the batch, so the caller's TensorDict is never written to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tensordict.nn import (
    CompositeDistribution,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictSequential,
    set_composite_lp_aggregate,
)
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn
from torchrl.modules import DistributionalDQNnet

from rlloss import _compat
from rlloss._checks import MissingKeyError

Step = tuple[Callable, list[NestedKey], list[NestedKey]]


def _plan(module, until: NestedKey | None = None) -> list[Step] | None:
    """The (callable, in_keys, out_keys) steps equivalent to ``module(td)``, or ``None``.

    With ``until``, a sequence is planned only up to the plannable children that write that key
    (e.g. a ``QValueActor`` up to its ``action_value``, before the greedy-action module; a
    ``DistributionalQValueActor`` up to the log-softmax that rewrites its ``action_value``).
    """
    if isinstance(module, ProbabilisticTensorDictModule):
        return None
    if isinstance(module, DistributionalDQNnet) and not _compat.has_call_hooks(module):
        # TorchRL's log-softmax over the atoms (dim -2) of each of its keys
        return [
            (_log_softmax_over_atoms, [in_key], [out_key])
            for in_key, out_key in zip(module.in_keys, module.out_keys, strict=True)
        ]
    if isinstance(module, TensorDictSequential):
        if (
            (until is None and type(module).forward is not TensorDictSequential.forward)
            or getattr(module, "partial_tolerant", False)
            or _compat.has_call_hooks(module)
            or _compat.selects_out_keys(module)
        ):
            return None
        steps, reached = [], False
        for child in module.module:
            writes = until is not None and until in child.out_keys
            if reached and not writes:
                return steps
            child_steps = _plan(child)
            if child_steps is None:  # after the key is written: a head that passes it through
                return steps if reached else None
            steps += child_steps
            reached = reached or writes
        return steps if until is None or reached else None
    if _compat.is_plain_tensordict_module(module):
        return [(module.module, list(module.in_keys), list(module.out_keys))]
    return None


def _log_softmax_over_atoms(logits: torch.Tensor) -> torch.Tensor:
    if logits.ndim < 2:
        raise ValueError(
            f"a distributional Q network must write [*B, atoms, actions] logits, got shape "
            f"{tuple(logits.shape)}."
        )
    return torch.log_softmax(logits, dim=-2)


def entry(batch: TensorDictBase | Mapping, key: NestedKey) -> torch.Tensor | TensorDictBase | None:
    """``batch.get(key, None)`` for a key already unravelled (a string or a flat tuple of strings,
    as ``TensorDictModule`` stores its keys). For a TensorDict, the lookup ``get`` makes after
    unravelling its key, which it would otherwise do again on every call."""
    if type(batch) is TensorDict or isinstance(batch, TensorDictBase):  # the ABC check: slower
        return _compat.get_path(batch, (key,) if isinstance(key, str) else key)
    return batch.get(key, None)


def network_inputs(batch, network, exclude: NestedKey | None = None) -> dict:
    """``{key: batch entry}`` for the ``in_keys`` of ``network`` (but ``exclude``, an input the
    loss supplies itself, e.g. the action); a missing entry raises ``MissingKeyError`` naming
    the network, the key and the entries present."""
    in_keys = [key for key in network.in_keys if key != exclude]
    inputs = {key: entry(batch, key) for key in in_keys}
    for key, value in inputs.items():
        if value is None:
            raise explained(KeyError(key), network, in_keys, list(inputs.values()), batch)
    return inputs


def _run(steps: list[Step], batch: TensorDictBase, values: dict) -> dict:
    for call, in_keys, out_keys in steps:
        inputs = []
        for key in in_keys:  # a loop, not a comprehension (a frame of its own before 3.12)
            inputs.append(values[key] if key in values else entry(batch, key))
        try:
            outputs = call(*inputs)
        except CALL_ERRORS as error:  # free until raised: the diagnosis runs on failure only
            raise explained(error, call, in_keys, inputs, batch) from error
        if type(outputs) is not tuple and len(out_keys) == 1:
            values[out_keys[0]] = outputs  # the common case, without zip's strict check
            continue
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        values.update(zip(out_keys, outputs, strict=True))
    return values


CALL_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


def explained(error: Exception, network, in_keys: list, inputs: list, batch) -> Exception:
    """The error to raise when calling ``network`` on ``inputs`` (the entries ``in_keys`` of
    ``batch``, ``None`` where absent) raised ``error``: a missing input, a dtype or an input
    size that does not match the network's, named with the key, the expected and the actual
    value and the fix; otherwise ``error``'s type with the inputs' shapes added. An error
    already explained by an inner call is returned as it is."""
    if getattr(error, "rlloss_explained", False):
        return error
    network = getattr(network, "template", network)  # an Ensemble: its members' architecture
    name = f"the network {type(network).__name__} (in_keys {list(in_keys)})"
    missing = [key for key, value in zip(in_keys, inputs, strict=True) if value is None]
    given = {k: v for k, v in zip(in_keys, inputs, strict=True) if isinstance(v, torch.Tensor)}
    if missing:
        present = sorted(str(k) for k in _keys(batch))
        new = MissingKeyError(
            f"{name} cannot be called: the TensorDict it reads has no entry {missing[0]!r} (for "
            "a next-state value, the batch's ('next', ...) entry). Entries present there: "
            f"{present}. Store it in the batch, or rename the network's in_keys (or the batch "
            "entry) so they agree."
        )
    else:
        new = _dtype_error(name, network, given) or _size_error(name, network, given, error)
    new.rlloss_explained = True
    return new


def explained_module_error(error: Exception, module, batch) -> Exception:
    """:func:`explained` for a TensorDict module called on the whole batch."""
    in_keys = list(getattr(module, "in_keys", []))
    inputs = [entry(batch, k) if isinstance(k, (str, tuple)) else None for k in in_keys]
    if isinstance(error, KeyError) and not any(value is None for value in inputs):
        return error
    return explained(error, module, in_keys, inputs, batch)


def _keys(batch) -> list:
    if isinstance(batch, TensorDictBase):
        return list(batch.keys(include_nested=True, leaves_only=True))
    return [key for key, value in batch.items() if value is not None]


def _dtype_error(name: str, network, given: dict) -> Exception | None:
    if not isinstance(network, nn.Module):
        return None
    tensors = [*network.parameters(), *network.buffers()]  # a target copy holds buffers only
    parameter = next((t for t in tensors if t.is_floating_point()), None)
    if parameter is None:
        return None
    for key, value in given.items():
        if value.is_floating_point() and value.dtype != parameter.dtype:
            return TypeError(
                f"{name}: the entry {key!r} has dtype {value.dtype}, but the network's "
                f"parameters are {parameter.dtype}. Cast the batch (batch.to({parameter.dtype})) "
                f"or the loss and its networks (loss.to({value.dtype}))."
            )
    return None


def _size_error(name: str, network, given: dict, error: Exception) -> Exception:
    shapes = {key: tuple(value.shape) for key, value in given.items()}
    first = _first_linear(network)
    features = sum(value.shape[-1] for value in given.values() if value.ndim)
    if first is not None and features != first.in_features:
        return ValueError(
            f"{name}: its first layer takes {first.in_features} input features, but the batch's "
            f"entries {shapes} give {features} (their last dims). Check the entry sizes against "
            f"the network's (e.g. the action size of the batch). The call raised: {error}"
        )
    message = f"{name} failed on the batch's entries of shapes {shapes}: {error}"
    try:
        return type(error)(message)
    except Exception:  # an exception type with another signature
        return RuntimeError(message)


def _first_linear(network) -> nn.Linear | None:
    if not isinstance(network, nn.Module):
        return None
    for module in network.modules():
        if isinstance(module, nn.Linear) and not isinstance(module, nn.LazyLinear):
            return module
    return None


def _as_tensordict(batch: TensorDictBase | Mapping) -> TensorDictBase:
    """A shallow copy of ``batch`` as a TensorDict (the input of a module the loss cannot plan,
    e.g. an ensemble member called on a mapping of inputs)."""
    if isinstance(batch, TensorDictBase):
        return batch.copy()
    inputs = TensorDict({}, batch_size=[])
    for key, value in batch.items():
        inputs.set(key, value)
    return inputs


class NetworkCall:
    """``NetworkCall(module)(batch)`` returns ``module``'s outputs on ``batch`` as a mapping.

    With ``until``, only the part of a sequence that produces that key runs.
    """

    def __init__(self, module, until: NestedKey | None = None) -> None:
        self.module = module
        self.steps = _plan(module, until)

    def __call__(self, batch: TensorDictBase | Mapping) -> Mapping[NestedKey, torch.Tensor]:
        if self.steps is None:
            try:
                return self.module(_as_tensordict(batch))
            except (*CALL_ERRORS, KeyError) as error:
                raise explained_module_error(error, self.module, batch) from error
        return _run(self.steps, batch, {})


class DistributionCall:
    """``DistributionCall(actor)(batch)`` returns ``actor.get_dist(batch)`` without writing the
    distribution parameters into ``batch``.

    ``perturb``, when given, receives the parameters (a dict keyed by batch key, see
    :attr:`parameter_keys`) and returns the ones to build the distribution with; it needs an
    actor whose parameters come before its distribution head (``self.splittable``): planned
    modules (``self.direct``), or others (TorchRL's ``LSTMModule`` / ``GRUModule``) run through
    the actor's ``get_dist_params`` on a shallow copy of the batch. :meth:`stored` builds the
    distribution from parameters stored in a batch at collection time (TorchRL's
    ``build_dist_from_params``).
    """

    def __init__(self, actor) -> None:
        self.actor = actor
        self.steps = None
        self.head = _distribution_head(actor)
        self.splittable = (
            self.head is not None
            and type(actor).get_dist is ProbabilisticTensorDictSequential.get_dist
            and not actor.return_composite
            and not _is_composite(self.head)
            and actor.module[-1] is self.head
        )
        if self.splittable:
            steps = [_plan(child) for child in actor.module[:-1]]
            if all(step is not None for step in steps):
                self.steps = [s for step in steps for s in step]
        # TorchRL's TanhNormal built without its constructor's host syncs (eager GPU calls)
        self._tanh_normal = (
            _compat.tanh_normal_builder(self.head, self.parameter_keys) if self.splittable else None
        )

    @property
    def direct(self) -> bool:
        return self.steps is not None

    @property
    def parameter_keys(self) -> dict[str, NestedKey]:
        """Distribution keyword -> batch key of the distribution's parameters."""
        return {_last(d): k for d, k in zip(self.head.dist_keys, self.head.in_keys, strict=True)}

    def distribution_parameters(self, batch: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        """The distribution's parameters on ``batch``, keyed by batch key (a splittable actor):
        for losses that use them without building the distribution."""
        if self.steps is None:  # modules the planner does not know: the actor's own call
            try:
                values = self.actor.get_dist_params(batch.copy())
            except (*CALL_ERRORS, KeyError) as error:
                raise explained_module_error(error, self.actor, batch) from error
            return {k: values.get(k) for k in self.head.in_keys}
        values = _run(self.steps, batch, {})
        return {k: values[k] if k in values else entry(batch, k) for k in self.head.in_keys}

    def __call__(
        self, batch: TensorDictBase, perturb: Callable[[dict], dict] | None = None
    ) -> D.Distribution:
        if self.steps is None and (perturb is None or not self.splittable):
            try:
                return self.actor.get_dist(batch.copy())
            except (*CALL_ERRORS, KeyError) as error:
                raise explained_module_error(error, self.actor, batch) from error
        params = self.distribution_parameters(batch)
        if perturb is not None:
            params = perturb(params)
        return self.from_parameters(params)

    def from_parameters(self, params: Mapping) -> D.Distribution:
        """``head.get_dist(params)``; a TanhNormal head's without a host sync (eager calls:
        compiled code traces TorchRL's constructor, whose checks dynamo skips)."""
        if self._tanh_normal is None or torch.compiler.is_compiling():
            return self.head.get_dist(params)
        return self._tanh_normal(params)

    def stored(self, batch: TensorDictBase) -> D.Distribution:
        """The distribution whose parameters the batch stores (e.g. ``loc``/``scale``)."""
        params = {}
        for key in self.head.in_keys:  # each entry read once (a loop: no comprehension frame)
            params[key] = entry(batch, key)
        missing = [key for key, value in params.items() if value is None]
        if missing:
            raise KeyError(
                f"the batch does not hold the distribution parameters {missing} of the policy "
                "that collected it; store them at collection time (a TorchRL ProbabilisticActor "
                "writes them into the rollout TensorDict)."
            )
        return self.from_parameters(params) if self.splittable else self.head.get_dist(batch)


def as_list(key) -> list:
    """A key, or a list of keys (one per head of a composite action), as a list."""
    return key if isinstance(key, list) else [key]


def _select(batch: TensorDictBase, keys: list, owner: str) -> TensorDictBase:
    missing = [k for k in keys if batch.get(k, None) is None]
    if missing:
        raise KeyError(
            f"{owner}: the batch has no {missing} (keys present: {list(batch.keys(True))})."
        )
    return batch.select(*keys)


def stored_log_prob(batch: TensorDictBase, key, owner: str) -> torch.Tensor:
    """A log-prob stored in the batch, ``[*B]``: summed over heads for a list of keys or an
    entry holding one log-prob per head."""
    if isinstance(key, list):
        return sum_heads(_select(batch, key, owner), batch.batch_size)
    value = _select(batch, [key], owner).get(key)
    return sum_heads(value, batch.batch_size) if is_tensor_collection(value) else value


def action_log_prob(distribution, batch: TensorDictBase, key, owner: str) -> torch.Tensor:
    """``log pi(a|s)`` of the batch's action (``key``: one key, or one per head), ``[*B]``;
    summed over the heads of a composite distribution."""
    if not isinstance(distribution, CompositeDistribution):
        return log_prob_of(distribution, _select(batch, [key], owner).get(key), key, owner)
    actions = _select(batch, as_list(key), owner)
    with set_composite_lp_aggregate(False):
        return sum_heads(distribution.log_prob(actions), batch.batch_size)


def log_prob_of(distribution: D.Distribution, action: torch.Tensor, key, owner: str):
    """``distribution.log_prob(action)``; when it raises, an error naming the action entry, its
    shape and dtype, and what the distribution expects."""
    try:
        return distribution.log_prob(action)
    except CALL_ERRORS as error:
        expected = tuple(distribution.batch_shape + distribution.event_shape)
        kind = type(distribution).__name__
        support = ""
        if isinstance(distribution, D.Categorical):
            support = (
                f"; a Categorical takes integer indices in [0, {distribution.logits.shape[-1]})"
            )
        raise ValueError(
            f"{owner}: the policy ({kind}) cannot score the batch's action {key!r} of shape "
            f"{tuple(action.shape)} and dtype {action.dtype}: it expects shape {expected}"
            f"{support}. Store the actions the policy samples (their size, dtype and range). "
            f"The distribution raised: {error}"
        ) from error


def sum_heads(values, batch_shape: torch.Size) -> torch.Tensor:
    """The sum over the leaves of a TensorDict of per-head values (each ``[*B, ...]``), summing
    their feature dimensions: ``[*B]``."""
    if not is_tensor_collection(values):
        return values.reshape(*batch_shape, -1).sum(-1)
    return sum(v.reshape(*batch_shape, -1).sum(-1) for v in values.values(True, True))


def _is_composite(head: ProbabilisticTensorDictModule) -> bool:
    """Whether ``head`` builds a ``CompositeDistribution`` (its parameters are nested
    TensorDicts: the generic ``get_dist`` path reads them)."""
    cls = getattr(head.distribution_class, "func", head.distribution_class)
    return isinstance(cls, type) and issubclass(cls, CompositeDistribution)


def _last(key: NestedKey) -> str:
    return key[-1] if isinstance(key, tuple) else key


def _distribution_head(actor) -> ProbabilisticTensorDictModule | None:
    """The last ``ProbabilisticTensorDictModule`` of ``actor`` (whose ``get_dist`` is standard)."""
    heads = [m for m in actor.modules() if isinstance(m, ProbabilisticTensorDictModule)]
    if not heads or type(heads[-1]).get_dist is not ProbabilisticTensorDictModule.get_dist:
        return None
    return heads[-1]
