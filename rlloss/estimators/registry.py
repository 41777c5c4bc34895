"""TorchRL's ``ValueEstimators`` members mapped to rlloss's estimators, the builder behind
every loss's ``make_value_estimator``, and the one behind the off-policy losses' (which build
their targets from replayed transitions)."""

from __future__ import annotations

from torch import nn
from torchrl.objectives.utils import ValueEstimators

from rlloss.estimators.base import DEFAULT_GAMMA, DEFAULT_LMBDA, ValueEstimator
from rlloss.estimators.gae import GAE, MultiAgentGAE
from rlloss.estimators.temporal_difference import TD0Estimator, TD1Estimator, TDLambdaEstimator
from rlloss.estimators.vtrace import VTrace

# TorchRL's ValueEstimators members -> rlloss's estimator classes and their default keywords.
ESTIMATORS = {
    ValueEstimators.TD0: TD0Estimator,
    ValueEstimators.TD1: TD1Estimator,
    ValueEstimators.TDLambda: TDLambdaEstimator,
    ValueEstimators.GAE: GAE,
    ValueEstimators.MAGAE: MultiAgentGAE,
    ValueEstimators.VTrace: VTrace,
}
# the estimators that need a state-value baseline and on-policy data
ON_POLICY_ESTIMATORS = (ValueEstimators.GAE, ValueEstimators.VTrace, ValueEstimators.MAGAE)
DEFAULT_VALUE_HYPERPARAMS = {
    ValueEstimators.TD0: {"gamma": DEFAULT_GAMMA},
    ValueEstimators.TD1: {"gamma": DEFAULT_GAMMA},
    ValueEstimators.TDLambda: {"gamma": DEFAULT_GAMMA, "lmbda": DEFAULT_LMBDA},
    ValueEstimators.GAE: {"gamma": DEFAULT_GAMMA, "lmbda": DEFAULT_LMBDA},
    ValueEstimators.MAGAE: {"gamma": DEFAULT_GAMMA, "lmbda": DEFAULT_LMBDA},
    ValueEstimators.VTrace: {"gamma": DEFAULT_GAMMA},
}


def build_value_estimator(loss: nn.Module, value_type, hyperparams: dict) -> tuple:
    """``(estimator, value_type)`` for ``loss.make_value_estimator(value_type, **hyperparams)``:
    an estimator instance is used as is; a ``ValueEstimators`` member (``None``: the loss's
    ``default_value_estimator``) builds rlloss's estimator over TorchRL's default keywords, with
    the loss's value network (its ``_value_network_name`` attribute) when it has one."""
    if isinstance(value_type, nn.Module):
        return value_type, type(value_type)
    value_type = loss.default_value_estimator if value_type is None else value_type
    estimator_class = value_type if isinstance(value_type, type) else ESTIMATORS.get(value_type)
    if estimator_class is not None and issubclass(estimator_class, VTrace):
        hyperparams = {"actor_network": loss.actor_network, **hyperparams}
    if isinstance(value_type, type) and issubclass(value_type, ValueEstimator):
        member = {cls: m for m, cls in ESTIMATORS.items()}.get(value_type)
        defaults = DEFAULT_VALUE_HYPERPARAMS.get(member, {"gamma": DEFAULT_GAMMA})
        name = loss._value_network_name
        value_network = getattr(loss, name) if name else None
        kwargs = {"value_network": value_network, **defaults, **hyperparams}
        return value_type(**kwargs), value_type
    if value_type not in ESTIMATORS:
        raise ValueError(
            f"{type(loss).__name__}.make_value_estimator: unsupported value_type "
            f"{value_type!r}; expected one of {list(ESTIMATORS)} or an estimator instance."
        )
    hyperparams = {**DEFAULT_VALUE_HYPERPARAMS[value_type], **hyperparams}
    name = loss._value_network_name
    value_network = getattr(loss, name) if name else None
    return ESTIMATORS[value_type](value_network=value_network, **hyperparams), value_type


def build_target_estimator(loss: nn.Module, value_type, hyperparams: dict, one_step: bool):
    """:func:`build_value_estimator` for an off-policy loss (``value_type`` ``None``: its
    default): the on-policy estimators (GAE, V-trace, multi-agent GAE) raise TorchRL's
    ``NotImplementedError``, and so do TD(1) / TD(lambda) when the loss takes ``one_step``
    targets only."""
    owner = type(loss).__name__
    value_type = loss.default_value_estimator if value_type is None else value_type
    if value_type in ON_POLICY_ESTIMATORS:
        raise NotImplementedError(
            f"{owner} builds targets from replayed transitions; "
            f"{value_type!r} is not supported: use ValueEstimators.TD0, TD1 or TDLambda."
        )
    estimator, value_type = build_value_estimator(loss, value_type, hyperparams)
    if one_step and getattr(estimator, "lmbda", None) is not None:
        raise NotImplementedError(
            f"{owner} supports only one-step targets (ValueEstimators.TD0, "
            f"n-step through steps_to_next_obs), got {value_type!r}."
        )
    return estimator, value_type
