"""Value estimators: ``GAE``, ``TD0Estimator``, ``TD1Estimator``, ``TDLambdaEstimator``,
``VTrace``, ``MultiAgentGAE``, the value normaliser they share (``ValueNormalizer``), and the
builder behind ``make_value_estimator``. The shifted value call is :mod:`rlloss.estimators.shifted`,
the value-call options' checks :mod:`rlloss.estimators.options`.

The shared reading and writing of a batch is :class:`~rlloss.estimators.base.ValueEstimator`;
each estimator adds only its ``estimate`` (a call into :mod:`rlloss.functional.returns`).
"""

from rlloss.estimators.base import DEFAULT_GAMMA, DEFAULT_LMBDA, PADDING_MASK_KEY, ValueEstimator
from rlloss.estimators.gae import GAE, MultiAgentGAE
from rlloss.estimators.registry import (
    DEFAULT_VALUE_HYPERPARAMS,
    ESTIMATORS,
    build_value_estimator,
)
from rlloss.estimators.temporal_difference import TD0Estimator, TD1Estimator, TDLambdaEstimator
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.estimators.vtrace import VTrace

__all__ = [
    "DEFAULT_GAMMA",
    "DEFAULT_LMBDA",
    "DEFAULT_VALUE_HYPERPARAMS",
    "ESTIMATORS",
    "GAE",
    "MultiAgentGAE",
    "PADDING_MASK_KEY",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "VTrace",
    "ValueNormalizer",
    "ValueEstimator",
    "build_value_estimator",
]
