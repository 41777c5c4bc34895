"""rlloss: reinforcement-learning loss modules for PyTorch and TensorDict.

Drop-in replacements for the losses of ``torchrl.objectives`` (same class names, keywords, keys
and outputs), built on a small functional core (:mod:`rlloss.functional`).
"""

# The rest of ``torchrl.objectives``' namespace (its enum of estimators, its updaters' base, its
# helpers): TorchRL's own objects, importable from rlloss so that a script's one import line
# ``from torchrl.objectives import SACLoss, SoftUpdate, ValueEstimators`` can become
# ``from rlloss import ...`` whole. Not rlloss's API (not in ``__all__``, no API page).
from torchrl.objectives import (  # noqa: F401
    AUTO_LOSS_MASK_KEYS,
    TargetNetUpdater,
    ValueEstimators,
    add_random_module,
    categorical_kl_balanced,
    categorical_kl_terms,
    default_value_kwargs,
    distance_loss,
    group_optimizers,
    hold_out_net,
    hold_out_params,
    next_state_value,
    symexp,
    symlog,
    two_hot_cross_entropy,
    two_hot_decode,
    two_hot_encode,
)

from rlloss import data, functional, llm, world_models
from rlloss._checks import MissingKeyError
from rlloss._data_checks import set_checks
from rlloss.addons import ActorOutput, AttractionKL, BehaviorCloning, PolicyLossAddon
from rlloss.common import LossModule
from rlloss.estimators import (
    GAE,
    MultiAgentGAE,
    TD0Estimator,
    TD1Estimator,
    TDLambdaEstimator,
    ValueEstimator,
    ValueNormalizer,
    VTrace,
)
from rlloss.exploration import RNDLoss
from rlloss.imitation import ACTLoss, BCLoss, DiffusionBCLoss, DTLoss, GAILLoss, OnlineDTLoss
from rlloss.llm import *  # noqa: F403 (the family's names, listed once in its __all__)
from rlloss.multiagent import IPPOLoss, MAPPOLoss, QMixerLoss
from rlloss.offline import CQLLoss, DiscreteCQLLoss, DiscreteIQLLoss, IQLLoss, TD3BCLoss
from rlloss.offpolicy import (
    CrossQLoss,
    DDPGLoss,
    DDQNLoss,
    DiscreteMPOLoss,
    DiscreteSACLoss,
    DistributionalDQNLoss,
    DQNLoss,
    MPOLoss,
    REDQLoss,
    SACLoss,
    TD3Loss,
    TQCLoss,
)
from rlloss.onpolicy import A2CLoss, ClipPPOLoss, KLPENPPOLoss, PPOLoss, ReinforceLoss, RPOLoss
from rlloss.training import (
    HardUpdate,
    KLAdaptiveLR,
    KLEarlyStopping,
    PiecewiseSchedule,
    RewardNormalizer,
    SoftUpdate,
    Update,
    chunk_sequences,
    compile_update,
    kl_exceeds,
    recurrent_state_keys,
)
from rlloss.world_models import *  # noqa: F403 (the family's names, listed once in its __all__)

__all__ = [
    "A2CLoss",
    "ACTLoss",
    "ActorOutput",
    "AttractionKL",
    "BehaviorCloning",
    "BCLoss",
    "GAE",
    "GAILLoss",
    "HardUpdate",
    "IQLLoss",
    "ClipPPOLoss",
    "DDPGLoss",
    "DDQNLoss",
    "DTLoss",
    "DiffusionBCLoss",
    "DQNLoss",
    "DiscreteCQLLoss",
    "DiscreteIQLLoss",
    "DiscreteMPOLoss",
    "DiscreteSACLoss",
    "DistributionalDQNLoss",
    *world_models.__all__,  # the world-model family's names
    *llm.__all__,  # the LLM family's names
    "KLAdaptiveLR",
    "KLEarlyStopping",
    "KLPENPPOLoss",
    "LossModule",
    "MissingKeyError",
    "MPOLoss",
    "MultiAgentGAE",
    "PPOLoss",
    "PolicyLossAddon",
    "OnlineDTLoss",
    "QMixerLoss",
    "MAPPOLoss",
    "IPPOLoss",
    "RNDLoss",
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
