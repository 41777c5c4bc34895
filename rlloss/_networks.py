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
from tensordict import TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

Step = tuple[Callable, list[NestedKey], list[NestedKey]]


def _plan(module, until: NestedKey | None = None) -> list[Step] | None:
    """The (callable, in_keys, out_keys) steps equivalent to ``module(td)``, or ``None``.

    With ``until``, a sequence is planned only up to the first child that writes that key (e.g.
    a ``QValueActor`` up to its ``action_value``, before the greedy-action module).
    """
    if isinstance(module, ProbabilisticTensorDictModule):
        return None
    if isinstance(module, TensorDictSequential):
        if (until is None and type(module).forward is not TensorDictSequential.forward) or getattr(
            module, "partial_tolerant", False
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
        if until is not None or getattr(module, "_selected_out_keys", None):
            return None
        return steps
    if (
        isinstance(module, TensorDictModule)
        and type(module).forward is TensorDictModule.forward
        and module._kwargs is None
        and module.method is None
        and not module.method_kwargs
        and not module._get_kwargs
        and not module._forward_hooks
        and not module._forward_pre_hooks
    ):
        return [(module.module, list(module.in_keys), list(module.out_keys))]
    return None


def entry(batch: TensorDictBase | Mapping, key: NestedKey) -> torch.Tensor | TensorDictBase | None:
    """``batch.get(key, None)`` for a key already unravelled (a string or a flat tuple of strings,
    as ``TensorDictModule`` stores its keys). For a TensorDict, the lookup ``get`` makes after
    unravelling its key, which it would otherwise do again on every call."""
    if isinstance(batch, TensorDictBase):
        return batch._get_tuple((key,) if isinstance(key, str) else key, None)
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
        if getattr(mlp, "_reshape_out", False) or (len(in_keys) > 1 and not _is_mlp(mlp)):
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
