"""rlloss: reinforcement-learning loss modules for PyTorch and TensorDict.

Drop-in replacements for the losses of ``torchrl.objectives`` (same class names, keywords, keys
and outputs), built on a small functional core (:mod:`rlloss.functional`).
"""

from rlloss import functional
from rlloss.common import LossModule
from rlloss.estimators import GAE, TD0Estimator, TDLambdaEstimator, ValueEstimator
from rlloss.ppo import ClipPPOLoss, KLPENPPOLoss, PPOLoss, RPOLoss

__all__ = [
    "GAE",
    "ClipPPOLoss",
    "KLPENPPOLoss",
    "LossModule",
    "PPOLoss",
    "RPOLoss",
    "TD0Estimator",
    "TDLambdaEstimator",
    "ValueEstimator",
    "functional",
]

__version__ = "0.1.0"
