"""Calling the user's policy for its distribution, without writing TensorDicts.

:class:`DistributionCall` is :class:`rlloss._networks.NetworkCall`'s counterpart for a policy
(a ``ProbabilisticTensorDictSequential`` ending in a ``ProbabilisticTensorDictModule``, such as
TorchRL's ``ProbabilisticActor``): its distribution, the distribution's parameters, a
reparameterised sample with its log-prob, and the distribution stored at collection time. One
class per case of actor, behind one factory (``DistributionCall(actor)``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    CompositeDistribution,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
)
from tensordict.utils import NestedKey
from torch import distributions as D
from torchrl.modules import TanhNormal

from rlloss import _fast
from rlloss import functional as rlf
from rlloss._call_errors import CALL_ERRORS
from rlloss._networks import (
    Step,
    _plan,
    _run,
    entry,
    explained_module_error,
    reparameterised_sample,
    repeated_inputs,
    stacked_inputs,
)


class DistributionCall:
    """``DistributionCall(actor)(batch)`` returns ``actor.get_dist(batch)`` without writing the
    distribution parameters into ``batch``.

    ``DistributionCall(actor)`` is the factory: it returns an instance of the class for the
    actor's case (:func:`distribution_call_case`), each of which runs the actor its own way:

    - :class:`OpaqueDistributionCall`: the actor's own ``get_dist`` on a shallow copy of the
      batch (an actor whose parameters cannot be taken apart from its distribution);
    - :class:`SplitDistributionCall`: the parameters through the actor's ``get_dist_params``
      (TorchRL's ``LSTMModule`` / ``GRUModule``), the distribution from its head;
    - :class:`PlannedDistributionCall`: the parameters from the actor's modules run on tensors
      (as :class:`NetworkCall` does);
    - :class:`SquashedDistributionCall`: planned, with TorchRL's ``TanhNormal`` over one event
      dim from ``loc`` / ``scale`` (``tanh_loc=False``): its reparameterised samples and their
      log-probs through :func:`rlloss.functional.tanh_normal_sample_and_log_prob` (no
      ``torch.distributions`` transforms, no host sync), the same maths as ``rsample`` and
      ``log_prob``.

    ``perturb``, when given, receives the parameters (a dict keyed by batch key, see
    :attr:`parameter_keys`) and returns the ones to build the distribution with (an actor whose
    parameters come before its distribution head: :attr:`splittable`). :meth:`stored` builds the
    distribution from parameters stored in a batch at collection time (TorchRL's
    ``build_dist_from_params``). :attr:`bounds` is ``(low, high)`` for a distribution that has
    them.
    """

    splittable = False  # the parameters come before the distribution head
    direct = False  # the parameters are computed by the planned modules, on tensors
    squashes = False  # samples and log-probs by TanhNormal's formula
    steps: list[Step] | None = None  # the planned modules

    def __new__(cls, actor=None):
        if cls is DistributionCall:  # the factory: the actor's case
            cls = distribution_call_case(actor)
        return super().__new__(cls)

    def __init__(self, actor) -> None:
        self.actor = actor
        self.head = _distribution_head(actor)
        self._head_in_keys = () if self.head is None else tuple(self.head.in_keys)
        self.bounds = _distribution_bounds(self.head)
        self.unit_box = self.bounds is not None and rlf.distributions._is_unit_box(*self.bounds)

    @property
    def parameter_keys(self) -> dict[str, NestedKey]:
        """Distribution keyword -> batch key of the distribution's parameters."""
        return {_last(d): k for d, k in zip(self.head.dist_keys, self.head.in_keys, strict=True)}

    def distribution_parameters(self, batch: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        """The distribution's parameters on ``batch``, keyed by batch key: for losses that use
        them without building the distribution (the actor's own ``get_dist_params`` here)."""
        try:
            values = self.actor.get_dist_params(batch.copy())
        except (*CALL_ERRORS, KeyError) as error:
            raise explained_module_error(error, self.actor, batch) from error
        return {k: values.get(k) for k in self.head.in_keys}

    def __call__(
        self, batch: TensorDictBase, perturb: Callable[[dict], dict] | None = None
    ) -> D.Distribution:
        """The actor's distribution on ``batch`` (its own ``get_dist``: ``perturb`` needs a
        :attr:`splittable` actor)."""
        try:
            return self.actor.get_dist(batch.copy())
        except (*CALL_ERRORS, KeyError) as error:
            raise explained_module_error(error, self.actor, batch) from error

    def from_parameters(self, params: Mapping) -> D.Distribution:
        """``head.get_dist(params)``."""
        return self.head.get_dist(params)

    def sample_with_log_prob(
        self, batch, low=None, high=None, repeats: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action ``[*B, D]`` and its log-prob ``[*B]`` (summed over the heads
        of a composite distribution); with ``repeats``, ``repeats`` actions per state in a row
        along the last batch dim (``[*B[:-1], B[-1] * repeats, D]``). ``low``, ``high``: the
        loss's copies of :attr:`bounds` on its device (needed when the actor :attr:`squashes`)."""
        if repeats > 1:
            batch = repeated_inputs(batch, self.actor, repeats)
        return reparameterised_sample(self(batch), batch.batch_size)

    def sample_with_distribution(self, batch: TensorDictBase, low=None, high=None):
        """:meth:`sample_with_log_prob`'s action and log-prob, and the distribution drawn from
        (the actor run once)."""
        distribution = self(batch)
        return (*reparameterised_sample(distribution, batch.batch_size), distribution)

    def paired_sample_with_log_prob(
        self, batch: TensorDictBase, other: TensorDictBase, low=None, high=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions and log-probs at ``batch``'s states and at ``other``'s, stacked along a
        leading ``[2]`` dim, in one draw (the actor on the stacked inputs)."""
        return self.sample_with_log_prob(stacked_inputs([batch, other], self.actor))

    def stored(self, batch: TensorDictBase) -> D.Distribution:
        """The distribution whose parameters the batch stores (e.g. ``loc``/``scale``)."""
        self._stored_parameters(batch)
        return self.head.get_dist(batch)

    def _stored_parameters(self, batch: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        params, missing = {}, []
        for key in self._head_in_keys:
            value = params[key] = entry(batch, key)
            missing += [key] if value is None else []
        if missing:
            raise KeyError(
                f"the batch does not hold the distribution parameters {missing} of the policy "
                "that collected it; store them at collection time (a TorchRL ProbabilisticActor "
                "writes them into the rollout TensorDict)."
            )
        return params


def distribution_call_case(actor) -> type[DistributionCall]:
    """The :class:`DistributionCall` class for ``actor``'s case."""
    head = _distribution_head(actor)
    splittable = (
        head is not None
        and type(actor).get_dist is ProbabilisticTensorDictSequential.get_dist
        and not actor.return_composite
        and not _is_composite(head)
        and actor.module[-1] is head
    )
    if not splittable:
        return OpaqueDistributionCall
    if _planned_parameters(actor) is None:
        return SplitDistributionCall
    if _is_plain_tanh_normal(head):
        return SquashedDistributionCall
    return PlannedDistributionCall


def _planned_parameters(actor: ProbabilisticTensorDictSequential) -> list[Step] | None:
    """The steps of the modules before ``actor``'s distribution head, or ``None`` when one of
    them cannot be planned."""
    steps = [_plan(child) for child in actor.module[:-1]]
    if any(step is None for step in steps):
        return None
    return [s for step in steps for s in step]


class OpaqueDistributionCall(DistributionCall):
    """An actor whose parameters do not come before its distribution head (or without a
    standard head): the actor's own ``get_dist`` (see :class:`DistributionCall`)."""


class SplitDistributionCall(DistributionCall):
    """An actor whose parameters come before its distribution head, from modules the planner
    does not know (TorchRL's ``LSTMModule`` / ``GRUModule``): the actor's ``get_dist_params``,
    then the head's distribution (see :class:`DistributionCall`)."""

    splittable = True

    def __init__(self, actor) -> None:
        super().__init__(actor)
        self._builder = _fast.distribution_builder(self.head, self.parameter_keys)

    def __call__(
        self, batch: TensorDictBase, perturb: Callable[[dict], dict] | None = None
    ) -> D.Distribution:
        """The actor's distribution on ``batch``, built from the parameters ``perturb``
        returns when given."""
        if perturb is None:
            return super().__call__(batch)
        return self.from_parameters(perturb(self.distribution_parameters(batch)))

    def from_parameters(self, params: Mapping) -> D.Distribution:
        """``head.get_dist(params)``; TanhNormal's and IndependentNormal's through
        :func:`rlloss._fast.distribution_builder` in eager calls (compiled code traces TorchRL's
        constructor, whose checks dynamo skips)."""
        if self._builder is None or torch.compiler.is_dynamo_compiling():
            return self.head.get_dist(params)
        return self._builder(params)

    def stored(self, batch: TensorDictBase) -> D.Distribution:
        return self.from_parameters(self._stored_parameters(batch))


class PlannedDistributionCall(SplitDistributionCall):
    """An actor whose modules before its distribution head the planner runs on tensors (see
    :class:`DistributionCall`)."""

    direct = True

    def __init__(self, actor) -> None:
        super().__init__(actor)
        self.steps = _planned_parameters(actor)

    def distribution_parameters(self, batch: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        values = _run(self.steps, batch, {})
        return {k: values[k] if k in values else entry(batch, k) for k in self._head_in_keys}

    def __call__(
        self, batch: TensorDictBase, perturb: Callable[[dict], dict] | None = None
    ) -> D.Distribution:
        params = self.distribution_parameters(batch)
        return self.from_parameters(params if perturb is None else perturb(params))


class SquashedDistributionCall(PlannedDistributionCall):
    """A planned actor building TorchRL's ``TanhNormal`` over one event dim from ``loc`` and
    ``scale`` (``tanh_loc=False``): reparameterised samples and their log-probs by
    :func:`rlloss.functional.tanh_normal_sample_and_log_prob` from the parameters (see
    :class:`DistributionCall`)."""

    squashes = True

    def sample_with_log_prob(
        self, batch, low=None, high=None, repeats: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # the actor runs once per state, its parameters are repeated
        return self._squashed_sample(self.distribution_parameters(batch), low, high, repeats)

    def sample_with_distribution(self, batch: TensorDictBase, low=None, high=None):
        params = self.distribution_parameters(batch)
        action, log_prob = self._squashed_sample(params, low, high)
        return action, log_prob, self.from_parameters(params)

    def paired_sample_with_log_prob(
        self, batch: TensorDictBase, other: TensorDictBase, low=None, high=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor on each batch (``other`` without gradient), the parameters stacked before
        the draw: the numbers of the stacked draw, without a backward through ``other``."""
        now = self.distribution_parameters(batch)
        with torch.no_grad():
            following = self.distribution_parameters(other)
        params = {key: torch.stack([now[key], following[key]]) for key in now}
        return self._squashed_sample(params, low, high)

    def _squashed_sample(self, params: Mapping, low, high, repeats: int = 1):
        keys = self.parameter_keys
        loc, scale = params[keys["loc"]], params[keys["scale"]]
        if repeats > 1:
            loc, scale = (x.repeat_interleave(repeats, dim=loc.ndim - 2) for x in (loc, scale))
        low, high = (-1.0, 1.0) if self.unit_box else (low, high)  # the unit box: tanh(u)
        return rlf.tanh_normal_sample_and_log_prob(loc, scale, low, high)


def _is_composite(head: ProbabilisticTensorDictModule) -> bool:
    """Whether ``head`` builds a ``CompositeDistribution`` (its parameters are nested
    TensorDicts: the generic ``get_dist`` path reads them)."""
    cls = getattr(head.distribution_class, "func", head.distribution_class)
    return isinstance(cls, type) and issubclass(cls, CompositeDistribution)


def _is_plain_tanh_normal(head: ProbabilisticTensorDictModule) -> bool:
    """Whether ``head`` builds TorchRL's ``TanhNormal`` from ``loc`` and ``scale`` over one event
    dim with an unsquashed location: :func:`rlloss.functional.tanh_normal_sample_and_log_prob`'s
    distribution."""
    kwargs = dict(head.distribution_kwargs)
    return (
        head.distribution_class is TanhNormal
        and not kwargs.get("tanh_loc", False)
        and kwargs.get("event_dims", 1) == 1
        and {_last(key) for key in head.dist_keys} == {"loc", "scale"}
    )


def _distribution_bounds(head: ProbabilisticTensorDictModule | None) -> tuple | None:
    """``(low, high)`` of the distribution ``head`` builds when its class takes them as keywords
    (TorchRL's ``TanhNormal``, ``TruncatedNormal``, ``TanhDelta``): the head's
    ``distribution_kwargs``, else the class's defaults; ``None`` for any other."""
    if head is None or _is_composite(head):
        return None
    cls = head.distribution_class
    kwargs = {**getattr(cls, "keywords", {}), **head.distribution_kwargs}  # a partial's too
    try:
        parameters = inspect.signature(getattr(cls, "func", cls)).parameters
    except (TypeError, ValueError):  # no signature to read
        return None
    if "low" not in parameters or "high" not in parameters:
        return None
    bounds = tuple(kwargs.get(name, parameters[name].default) for name in ("low", "high"))
    return None if inspect.Parameter.empty in bounds else bounds


def _last(key: NestedKey) -> str:
    return key[-1] if isinstance(key, tuple) else key


def _distribution_head(actor) -> ProbabilisticTensorDictModule | None:
    """The last ``ProbabilisticTensorDictModule`` of ``actor`` (whose ``get_dist`` is standard)."""
    heads = [m for m in actor.modules() if isinstance(m, ProbabilisticTensorDictModule)]
    if not heads or type(heads[-1]).get_dist is not ProbabilisticTensorDictModule.get_dist:
        return None
    return heads[-1]
