"""rlloss: reinforcement-learning loss modules for PyTorch and TensorDict.

Drop-in replacements for the losses of ``torchrl.objectives`` (same class names, keywords, keys
and outputs), built on a small functional core (:mod:`rlloss.functional`).
"""

from rlloss import data, functional
from rlloss._checks import MissingKeyError, set_checks
from rlloss.a2c import A2CLoss, ReinforceLoss
from rlloss.addons import ActorOutput, AttractionKL, BehaviorCloning, PolicyLossAddon
from rlloss.common import LossModule
from rlloss.ddpg import DDPGLoss
from rlloss.dqn import DDQNLoss, DiscreteCQLLoss, DistributionalDQNLoss, DQNLoss
from rlloss.estimators import (
    GAE,
    MultiAgentGAE,
    TD0Estimator,
    TD1Estimator,
    TDLambdaEstimator,
    ValueEstimator,
    VTrace,
)
from rlloss.iql import DiscreteIQLLoss, IQLLoss
from rlloss.mpo import DiscreteMPOLoss, MPOLoss
from rlloss.normalizers import RewardNormalizer, ValueNormalizer
from rlloss.ppo import ClipPPOLoss, KLPENPPOLoss, PPOLoss, RPOLoss
from rlloss.sac import CQLLoss, CrossQLoss, DiscreteSACLoss, REDQLoss, SACLoss, TQCLoss
from rlloss.schedulers import KLAdaptiveLR, KLEarlyStopping, PiecewiseSchedule, kl_exceeds
from rlloss.sequences import chunk_sequences, recurrent_state_keys
from rlloss.td3 import TD3BCLoss, TD3Loss
from rlloss.update import Update, compile_update
from rlloss.updaters import HardUpdate, SoftUpdate

__all__ = [
    "A2CLoss",
    "ActorOutput",
    "AttractionKL",
    "BehaviorCloning",
    "GAE",
    "HardUpdate",
    "IQLLoss",
    "ClipPPOLoss",
    "DDPGLoss",
    "DDQNLoss",
    "DQNLoss",
    "DiscreteCQLLoss",
    "DiscreteIQLLoss",
    "DiscreteMPOLoss",
    "DiscreteSACLoss",
    "DistributionalDQNLoss",
    "KLAdaptiveLR",
    "KLEarlyStopping",
    "KLPENPPOLoss",
    "LossModule",
    "MissingKeyError",
    "MPOLoss",
    "MultiAgentGAE",
    "PPOLoss",
    "PolicyLossAddon",
    "PiecewiseSchedule",
    "REDQLoss",
    "RPOLoss",
    "ReinforceLoss",
    "RewardNormalizer",
    "SACLoss",
    "CQLLoss",
    "CrossQLoss",
    "SoftUpdate",
    "TD3BCLoss",
    "TD3Loss",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "TQCLoss",
    "VTrace",
    "ValueNormalizer",
    "ValueEstimator",
    "Update",
    "compile_update",
    "chunk_sequences",
    "data",
    "functional",
    "kl_exceeds",
    "recurrent_state_keys",
    "set_checks",
]

__version__ = "0.1.0"
