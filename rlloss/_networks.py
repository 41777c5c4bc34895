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

import copy
from collections.abc import Callable, Mapping

import torch
from tensordict import TensorDictBase, is_tensor_collection
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

from rlloss import _compat

Step = tuple[Callable, list[NestedKey], list[NestedKey]]


def _plan(module, until: NestedKey | None = None) -> list[Step] | None:
    """The (callable, in_keys, out_keys) steps equivalent to ``module(td)``, or ``None``.

    With ``until``, a sequence is planned only up to the first child that writes that key (e.g.
    a ``QValueActor`` up to its ``action_value``, before the greedy-action module).
    """
    if isinstance(module, ProbabilisticTensorDictModule):
        return None
    if isinstance(module, TensorDictSequential):
        if (
            (until is None and type(module).forward is not TensorDictSequential.forward)
            or getattr(module, "partial_tolerant", False)
            or _compat.has_call_hooks(module)
            or _compat.selects_out_keys(module)
        ):
            return None
        steps = []
        for child in module.module:
            child_steps = _plan(child)
            if child_steps is None:
                return None
            steps += child_steps
            if until is not None and until in child.out_keys:
                return steps
        return None if until is not None else steps
    if _compat.is_plain_tensordict_module(module):
        return [(module.module, list(module.in_keys), list(module.out_keys))]
    return None


def entry(batch: TensorDictBase | Mapping, key: NestedKey) -> torch.Tensor | TensorDictBase | None:
    """``batch.get(key, None)`` for a key already unravelled (a string or a flat tuple of strings,
    as ``TensorDictModule`` stores its keys). For a TensorDict, the lookup ``get`` makes after
    unravelling its key, which it would otherwise do again on every call."""
    if isinstance(batch, TensorDictBase):
        return _compat.get_path(batch, (key,) if isinstance(key, str) else key)
    return batch.get(key, None)


def _run(steps: list[Step], batch: TensorDictBase, values: dict) -> dict:
    for call, in_keys, out_keys in steps:
        inputs = [values[k] if k in values else entry(batch, k) for k in in_keys]
        outputs = call(*inputs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        values.update(zip(out_keys, outputs, strict=True))
    return values


class NetworkCall:
    """``NetworkCall(module)(batch)`` returns ``module``'s outputs on ``batch`` as a mapping.

    With ``until``, only the part of a sequence that produces that key runs.
    """

    def __init__(self, module, until: NestedKey | None = None) -> None:
        self.module = module
        self.steps = _plan(module, until)

    def __call__(self, batch: TensorDictBase) -> Mapping[NestedKey, torch.Tensor]:
        if self.steps is None:
            return self.module(batch.copy())
        return _run(self.steps, batch, {})


class DistributionCall:
    """``DistributionCall(actor)(batch)`` returns ``actor.get_dist(batch)`` without writing the
    distribution parameters into ``batch``.

    ``perturb``, when given, receives the parameters (a dict keyed by batch key, see
    :attr:`parameter_keys`) and returns the ones to build the distribution with; it needs the
    direct path (``self.direct``). :meth:`stored` builds the distribution from parameters stored in a
    batch at collection time (TorchRL's ``build_dist_from_params``).
    """

    def __init__(self, actor) -> None:
        self.actor = actor
        self.steps = None
        self.head = _distribution_head(actor)
        if (
            self.head is not None
            and type(actor).get_dist is ProbabilisticTensorDictSequential.get_dist
            and not actor.return_composite
            and not _is_composite(self.head)
            and actor.module[-1] is self.head
        ):
            steps = [_plan(child) for child in actor.module[:-1]]
            if all(step is not None for step in steps):
                self.steps = [s for step in steps for s in step]

    @property
    def direct(self) -> bool:
        return self.steps is not None

    @property
    def parameter_keys(self) -> dict[str, NestedKey]:
        """Distribution keyword -> batch key of the distribution's parameters."""
        return {_last(d): k for d, k in zip(self.head.dist_keys, self.head.in_keys, strict=True)}

    def distribution_parameters(self, batch: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        """The distribution's parameters on ``batch``, keyed by batch key (direct path only):
        for losses that use them without building the distribution."""
        values = _run(self.steps, batch, {})
        return {k: values[k] if k in values else entry(batch, k) for k in self.head.in_keys}

    def __call__(
        self, batch: TensorDictBase, perturb: Callable[[dict], dict] | None = None
    ) -> D.Distribution:
        if self.steps is None:
            return self.actor.get_dist(batch.copy())
        params = self.distribution_parameters(batch)
        if perturb is not None:
            params = perturb(params)
        return self.head.get_dist(params)

    def stored(self, batch: TensorDictBase) -> D.Distribution:
        """The distribution whose parameters the batch stores (e.g. ``loc``/``scale``)."""
        missing = [k for k in self.parameter_keys.values() if batch.get(k, None) is None]
        if missing:
            raise KeyError(
                f"the batch does not hold the distribution parameters {missing} of the policy "
                "that collected it; store them at collection time (a TorchRL ProbabilisticActor "
                "writes them into the rollout TensorDict)."
            )
        return self.head.get_dist(batch)


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
        return distribution.log_prob(_select(batch, [key], owner).get(key))
    actions = _select(batch, as_list(key), owner)
    with set_composite_lp_aggregate(False):
        return sum_heads(distribution.log_prob(actions), batch.batch_size)


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


# Modules applied elementwise (or along the feature dim only): they act on stacked members as is.
_ELEMENTWISE = (
    nn.ReLU,
    nn.Tanh,
    nn.ELU,
    nn.SiLU,
    nn.GELU,
    nn.LeakyReLU,
    nn.Sigmoid,
    nn.Softplus,
    nn.Mish,
    nn.Identity,
)


class StackedMLP:
    """An ensemble of MLPs (``nn.Linear`` layers and elementwise activations) evaluated on
    stacked parameters with one batched matrix product per layer.

    ``torch.vmap(functional_call(...))`` computes the same, but its batching layer adds a
    dispatch cost to every operation of the forward and the backward (about a millisecond per
    SAC update at batch 256 on one CPU thread, as much as the separate networks' whole
    overhead). ``StackedMLP.of(network, until)`` returns ``None`` when ``network`` is not such
    an MLP behind a single ``TensorDictModule`` (the caller then falls back to ``vmap``).
    """

    def __init__(self, in_keys, out_key, layers) -> None:
        self.in_keys = in_keys
        self.out_key = out_key
        self.layers = layers  # ("linear", weight key, bias key or None) | ("apply", module)

    @classmethod
    def of(cls, network, until: NestedKey | None = None, key_prefix: str = "") -> StackedMLP | None:
        steps = _plan(network, until)
        if steps is None or len(steps) != 1:
            return None
        mlp, in_keys, out_keys = steps[0]
        if len(out_keys) != 1 or not isinstance(mlp, nn.Sequential):
            return None
        if type(mlp).forward not in (nn.Sequential.forward, _MLP_FORWARD):
            return None
        if _compat.mlp_reshapes_output(mlp) or (len(in_keys) > 1 and not _is_mlp(mlp)):
            return None
        prefix = next(name for name, module in network.named_modules() if module is mlp)
        prefix = key_prefix + (f"{prefix}." if prefix else "")
        layers = []
        for index, layer in enumerate(mlp):
            if type(layer) is nn.Linear:
                bias = f"{prefix}{index}.bias" if layer.bias is not None else None
                layers.append(("linear", f"{prefix}{index}.weight", bias))
            elif type(layer) in _ELEMENTWISE:
                layers.append(("apply", layer))
            else:
                return None
        return cls(list(in_keys), out_keys[0], layers)

    def __call__(self, params: Mapping[str, torch.Tensor], inputs: Mapping) -> torch.Tensor:
        """``[size, *B, out]`` outputs of every member; ``params`` holds ``[size, ...]`` stacked
        tensors under the member network's parameter names."""
        values = [inputs[k] for k in self.in_keys]
        x = torch.cat(values, -1) if len(values) > 1 else values[0]
        batch_shape = x.shape[:-1]
        h = x.reshape(1, -1, x.shape[-1])  # the same input for every member
        for kind, *layer in self.layers:
            if kind == "apply":
                h = layer[0](h)
                continue
            weight, bias = params[layer[0]], params[layer[1]] if layer[1] else None
            h = h.expand(weight.shape[0], *h.shape[1:])
            if bias is None:
                h = torch.bmm(h, weight.mT)
            else:
                h = torch.baddbmm(bias.unsqueeze(-2), h, weight.mT)
        return h.reshape(h.shape[0], *batch_shape, h.shape[-1])


def _is_mlp(module) -> bool:
    from torchrl.modules import MLP

    return isinstance(module, MLP)


def _mlp_forward():
    from torchrl.modules import MLP

    return MLP.forward


_MLP_FORWARD = _mlp_forward()


# ----------------------------------------------------------------------------- copies


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters are buffers (detached, never trained)."""
    module = copy.deepcopy(module)
    for submodule in module.modules():
        for name, parameter in list(submodule.named_parameters(recurse=False)):
            delattr(submodule, name)
            submodule.register_buffer(name, parameter.detach())
    return module


def reinitialised(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every ``reset_parameters`` submodule re-initialised."""
    module = copy.deepcopy(module)
    for submodule in module.modules():
        if hasattr(submodule, "reset_parameters"):
            submodule.reset_parameters()
    return module


class FrozenCopy:
    """A copy of a network whose tensors are not its own parameters: a target network (its
    tensors are the loss's ``target_<name>_params``) or a detached view (its tensors are
    detached views of the online parameters). Called like :class:`NetworkCall`.

    Held as a plain attribute, outside the module tree, so its tensors appear once in
    ``state_dict`` (under the loss's own names) and never in ``loss.parameters()``.
    """

    def __init__(self, module: nn.Module, until: NestedKey | None = None) -> None:
        self.module = frozen_copy(module)
        self.call = NetworkCall(self.module, until)

    def use(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Point the copy at ``tensors`` (dotted parameter names, as ``named_parameters``)."""
        for name, tensor in tensors.items():
            owner, _, attribute = name.rpartition(".")
            self.module.get_submodule(owner).register_buffer(attribute, tensor)

    def __call__(self, batch: TensorDictBase | Mapping) -> Mapping[NestedKey, torch.Tensor]:
        return self.call(batch)


class _MemberCall(nn.Module):
    """A module whose forward is a :class:`NetworkCall`, so ``torch.func.functional_call`` can
    run it with other tensors (its network is the ``network`` submodule)."""

    def __init__(self, call: NetworkCall) -> None:
        super().__init__()
        self.network = call.module
        self.call = call

    def forward(self, inputs: Mapping) -> Mapping:
        return self.call(inputs)


class Ensemble:
    """``size`` copies of one network architecture evaluated in one batched call on stacked
    parameters: batched matrix products for MLPs (:class:`StackedMLP`), else ``torch.vmap``.

    The stacked tensors are the loss's (``<name>_params`` and ``target_<name>_params``); call
    :meth:`use` after they are created or replaced (``.to()``, deep copies).
    """

    def __init__(self, template: nn.Module, until: NestedKey | None = None) -> None:
        self.template = frozen_copy(template)
        self.in_keys = list(template.in_keys)
        self.stacked = StackedMLP.of(self.template, until, key_prefix="network.")
        self.member = _MemberCall(NetworkCall(self.template, until))
        self.online: dict[str, torch.Tensor] = {}
        self.target: dict[str, torch.Tensor] = {}

    def use(self, online: TensorDictBase, target: TensorDictBase | None) -> None:
        """Point the ensemble at the stacked ``online`` and ``target`` tensors."""
        self.online = _flat_member_tensors(online)
        self.target = {} if target is None else _flat_member_tensors(target)

    def __call__(
        self,
        inputs: Mapping,
        *,
        target: bool = False,
        detach: bool = False,
        members: int | None = None,
    ) -> Mapping:
        """Every member's outputs on ``inputs`` (shared by all members), stacked along a leading
        ``[size]`` dim. ``target``: the target tensors (no gradient); ``detach``: the online
        tensors without gradient; ``members``: only the first ``members`` members."""
        params = self.target if target else self.online
        if members is not None:
            params = {k: v[:members] for k, v in params.items()}
        if detach:
            params = {k: v.detach() for k, v in params.items()}
        with torch.set_grad_enabled(torch.is_grad_enabled() and not target):
            if self.stacked is not None:  # an MLP: one batched matrix product per layer
                return {self.stacked.out_key: self.stacked(params, inputs)}

            def member(member_params):
                return torch.func.functional_call(self.member, member_params, (inputs,))

            return torch.vmap(member, randomness="different")(params)


def _flat_member_tensors(params: TensorDictBase) -> dict[str, torch.Tensor]:
    """``network.<dotted name>`` -> stacked tensor, the names :class:`Ensemble` calls with."""
    return {f"network.{k}": v for k, v in params.flatten_keys(".").items()}
