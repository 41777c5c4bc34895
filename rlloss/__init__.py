"""rlloss: reinforcement-learning loss modules for PyTorch and TensorDict.

Drop-in replacements for the losses of ``torchrl.objectives`` (same class names, keywords, keys
and outputs), built on a small functional core (:mod:`rlloss.functional`).
"""

import importlib
import sys
import types

from rlloss import data, functional, llm, world_models
from rlloss._checks import MissingKeyError, set_checks
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

# Module paths of the flat layout (before the family folders), kept importable: each old module
# name is a module holding the public names of the modules its content moved to (``from
# rlloss.sac import CQLLoss`` still works). tests/test_layout.py checks every entry. (The old
# ``rlloss.onpolicy`` and ``rlloss.offpolicy`` are now packages that re-export their bases.)
MOVED_MODULES = {
    "a2c": ("rlloss.onpolicy.a2c",),
    "ppo": ("rlloss.onpolicy.ppo",),
    "dqn": ("rlloss.offpolicy.dqn", "rlloss.offline.discrete_cql"),
    "ddpg": ("rlloss.offpolicy.ddpg",),
    "td3": ("rlloss.offpolicy.twin_delayed", "rlloss.offpolicy.td3", "rlloss.offline.td3_bc"),
    "sac": (
        "rlloss.offpolicy.sac",
        "rlloss.offpolicy.discrete_sac",
        "rlloss.offline.cql",
        "rlloss.offpolicy.tqc",
        "rlloss.offpolicy.redq",
        "rlloss.offpolicy.crossq",
    ),
    "mpo": ("rlloss.offpolicy.mpo", "rlloss.offpolicy.discrete_mpo"),
    "iql": ("rlloss.offline.iql",),
    "distributed": ("rlloss.training.distributed",),
    "normalizers": (
        "rlloss.training.moments",
        "rlloss.training.normalizers",
        "rlloss.estimators.value_norm",
    ),
    "schedulers": ("rlloss.training.schedulers",),
    "sequences": ("rlloss.training.sequences",),
    "update": ("rlloss.training.update",),
    "updaters": ("rlloss.training.updaters",),
}


def _moved_module(old: str, new: tuple[str, ...]) -> types.ModuleType:
    """The module ``rlloss.<old>``: the public names of the ``new`` modules, in order."""
    module = types.ModuleType(f"{__name__}.{old}", f"Moved: see {', '.join(new)}.")
    for name in new:
        source = importlib.import_module(name)
        module.__dict__.update({k: v for k, v in vars(source).items() if not k.startswith("_")})
    return module


for _old, _new in MOVED_MODULES.items():
    sys.modules[f"{__name__}.{_old}"] = globals()[_old] = _moved_module(_old, _new)
del _old, _new

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
