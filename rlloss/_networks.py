"""Calling the user's TensorDict networks on a batch without writing TensorDicts.

A loss only needs a network's output tensors; ``TensorDictModule.forward`` writes each output
into a TensorDict (tensordict 0.14's ``TensorDict.from_any`` even looks for pandas on disk each
call): more than a small MLP costs. For the common structures (``TensorDictModule`` with
positional ``in_keys``, ``TensorDictSequential`` of those,
``ProbabilisticTensorDictSequential`` ending in a ``ProbabilisticTensorDictModule``, which covers
TorchRL's ``ValueOperator``, ``QValueActor``'s backbone and ``ProbabilisticActor``),
:class:`NetworkCall` plans once which ``nn.Module`` to call on which entries and then runs the
inner modules directly on tensors. Anything else falls back to calling the module on a shallow
copy of the batch, so the caller's TensorDict is never written to. A policy's distribution is
:class:`rlloss._distribution_calls.DistributionCall`'s, on the same plans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tensordict.nn import (
    CompositeDistribution,
    ProbabilisticTensorDictModule,
    TensorDictSequential,
    set_composite_lp_aggregate,
)
from tensordict.utils import NestedKey
from torch import distributions as D
from torchrl.modules import DistributionalDQNnet

from rlloss import _compat, _distributions, _fast
from rlloss._call_errors import CALL_ERRORS, check_action_dtype, explained

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
    if type(batch) is TensorDict or isinstance(batch, TensorDictBase):
        return _fast.get_path(batch, (key,) if isinstance(key, str) else key)
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


def inputs_at_action(
    batch, network, key: NestedKey, action, samples_dim: int | None = None
) -> dict:
    """``network``'s inputs from ``batch`` with ``action`` as its input ``key`` (``Q(s, a)`` of
    a substituted action). With ``samples_dim``, ``action`` holds several actions per state
    along that dim and the other inputs are repeated (expanded, no copy) along it."""
    inputs = network_inputs(batch, network, exclude=key)
    if samples_dim is not None:
        count, dim = action.shape[samples_dim], samples_dim
        inputs = {
            k: v.unsqueeze(dim).expand(*v.shape[:dim], count, *v.shape[dim:])
            for k, v in inputs.items()
        }
    inputs[key] = action
    return inputs


def inputs_batch(inputs: Mapping, batch_size) -> TensorDictBase:
    """A TensorDict ``[*batch_size]`` of ``inputs`` (a network's entries, keyed by batch key)."""
    batch = TensorDict({}, batch_size=batch_size)
    for key, value in inputs.items():
        batch.set(key, value)
    return batch


def repeated_inputs(batch: TensorDictBase, network, repeats: int) -> TensorDictBase:
    """``network``'s inputs from ``batch`` ``[*B]``, each state ``repeats`` times in a row along
    the last batch dim: a TensorDict ``[*B[:-1], B[-1] * repeats]``."""
    dim, size = batch.ndim - 1, batch.batch_size
    inputs = network_inputs(batch, network)
    repeated = {key: value.repeat_interleave(repeats, dim=dim) for key, value in inputs.items()}
    return inputs_batch(repeated, (*size[:-1], size[-1] * repeats))


def stacked_inputs(batches: list, network, exclude: NestedKey | None = None) -> TensorDictBase:
    """``network``'s inputs (but ``exclude``) from each of ``batches`` ``[*B]``, stacked along a
    leading dim: a TensorDict ``[len(batches), *B]``."""
    inputs = [network_inputs(batch, network, exclude=exclude) for batch in batches]
    stacked = {key: torch.stack([each[key] for each in inputs]) for key in inputs[0]}
    return inputs_batch(stacked, (len(batches), *batches[0].batch_size))


def _run(steps: list[Step], batch: TensorDictBase, values: dict) -> dict:
    for call, in_keys, out_keys in steps:
        inputs = []
        for key in in_keys:
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


def explained_module_error(error: Exception, module, batch) -> Exception:
    """:func:`explained` for a TensorDict module called on the whole batch."""
    in_keys = list(getattr(module, "in_keys", []))
    inputs = [entry(batch, k) if isinstance(k, (str, tuple)) else None for k in in_keys]
    if isinstance(error, KeyError) and not any(value is None for value in inputs):
        return error
    return explained(error, module, in_keys, inputs, batch)


def _as_tensordict(batch: TensorDictBase | Mapping) -> TensorDictBase:
    """A shallow copy of ``batch`` as a TensorDict (the input of a module the loss cannot plan,
    e.g. an ensemble member called on a mapping of inputs)."""
    if isinstance(batch, TensorDictBase):
        return batch.copy()
    return inputs_batch(batch, [])


class NetworkCall:
    """``NetworkCall(module)(batch)`` returns ``module``'s outputs on ``batch`` as a mapping.

    With ``until``, only the part of a sequence that produces that key runs.
    """

    def __init__(self, module, until: NestedKey | None = None) -> None:
        self.module = module
        self.steps = _plan(module, until)
        self.in_keys = tuple(getattr(module, "in_keys", ()))

    def __call__(self, batch: TensorDictBase | Mapping) -> Mapping[NestedKey, torch.Tensor]:
        if self.steps is None:
            try:
                return self.module(_as_tensordict(batch))
            except (*CALL_ERRORS, KeyError) as error:
                raise explained_module_error(error, self.module, batch) from error
        return _run(self.steps, batch, {})

    def at_action(
        self, batch, key: NestedKey, action, samples_dim: int | None = None
    ) -> Mapping[NestedKey, torch.Tensor]:
        """The outputs on ``batch`` with ``action`` (``[*S, D]``) as the input ``key``
        (:func:`inputs_at_action`); a module the plan cannot run gets a TensorDict ``[*S]`` of
        the inputs (``[*B]`` of a TensorDict ``batch`` ``[*B]`` without ``samples_dim``: an agent
        dim's action ``[*B, n_agents, D]`` beside a centralised critic's outputs ``[*B, 1]``)."""
        inputs = inputs_at_action(batch, self.module, key, action, samples_dim)
        if self.steps is None:  # the module's own call, on a TensorDict of the inputs
            dims = len(action.shape) - 1
            if samples_dim is None and isinstance(batch, TensorDictBase):
                dims = min(dims, batch.batch_dims)
            return self(inputs_batch(inputs, action.shape[:dims]))
        return self(inputs)

    def on_inputs(self, inputs: dict, batch_size) -> Mapping[NestedKey, torch.Tensor]:
        """The outputs on ``inputs`` by key: the plan on the dict, else the module on a
        TensorDict."""
        return self(inputs if self.steps is not None else inputs_batch(inputs, batch_size))


def reparameterised_sample(distribution, batch_size: torch.Size):
    """A reparameterised action of ``distribution`` and its log-prob ``[*B]`` (summed over the
    heads of a ``CompositeDistribution``, whose action is a TensorDict; the distribution's own
    ``rsample_and_log_prob`` when it has one, as TorchRL calls it)."""
    if isinstance(distribution, CompositeDistribution):
        with set_composite_lp_aggregate(False):
            action = distribution.rsample()
            return action, sum_heads(distribution.log_prob(action), batch_size)
    if hasattr(distribution, "rsample_and_log_prob"):
        # TorchRL's protocol (its TanhNormal): the log-prob of the latent draw itself, not of
        # the rounded action (a saturated tanh cannot be inverted exactly)
        return distribution.rsample_and_log_prob()
    action = distribution.rsample()
    return action, _distributions.log_prob(distribution, action)


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


def stored_log_prob(batch: TensorDictBase, key, owner: str, shape=None) -> torch.Tensor:
    """A log-prob stored in the batch, ``[*B]`` (or ``shape``): summed over heads for a list of
    keys or an entry holding one log-prob per head."""
    shape = batch.batch_size if shape is None else shape
    if isinstance(key, list):
        return sum_heads(_select(batch, key, owner), shape)
    value = _select(batch, [key], owner).get(key)
    return sum_heads(value, shape) if is_tensor_collection(value) else value


def action_log_prob(distribution, batch: TensorDictBase, key, owner: str, shape=None):
    """``log pi(a|s)`` of the batch's action (``key``: one key, or one per head), ``[*B]``;
    summed over the heads of a composite distribution (to ``shape``, default ``[*B]``)."""
    if not isinstance(distribution, CompositeDistribution):
        return log_prob_of(distribution, _select(batch, [key], owner).get(key), key, owner)
    actions, shape = _select(batch, as_list(key), owner), shape or batch.batch_size
    with set_composite_lp_aggregate(False):
        return sum_heads(distribution.log_prob(actions), shape)


def log_prob_of(distribution: D.Distribution, action: torch.Tensor, key, owner: str):
    """``distribution.log_prob(action)`` (by formula for TorchRL's standard distributions:
    :mod:`rlloss._distributions`); when it raises, an error naming the action entry, its
    shape and dtype, and what the distribution expects."""
    if action.dtype == torch.float64:  # a float64 batch for float32 networks promotes silently
        check_action_dtype(distribution, action, key, owner)
    try:
        return _distributions.log_prob(distribution, action)
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


def parameter_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the CPU for a module without any)."""
    for tensor in module.parameters():
        return tensor.device
    return torch.device("cpu")
