"""Off-policy losses: DQN (double DQN, C51), DDPG, TD3, the soft actor-critic family (SAC,
discrete SAC, REDQ, CrossQ, TQC) and MPO, on the shared base
:class:`~rlloss.offpolicy.base.TDTargetLoss` (``gamma``, value estimators, replay keys,
prioritized-replay weights, the ``td_error`` write, critic regression)."""

from rlloss._ensembles import ensemble_architecture
from rlloss.offpolicy.base import PRIORITY_WEIGHTINGS, TDTargetLoss
from rlloss.offpolicy.crossq import CrossQLoss
from rlloss.offpolicy.ddpg import DDPGLoss
from rlloss.offpolicy.discrete_mpo import DiscreteMPOLoss
from rlloss.offpolicy.discrete_sac import DiscreteSACLoss
from rlloss.offpolicy.dqn import ACTION_SPACES, DDQNLoss, DistributionalDQNLoss, DQNLoss
from rlloss.offpolicy.mpo import MPOLoss
from rlloss.offpolicy.redq import REDQLoss
from rlloss.offpolicy.sac import SACLoss
from rlloss.offpolicy.td3 import TD3Loss
from rlloss.offpolicy.tqc import TQCLoss

__all__ = [
    "ACTION_SPACES",
    "PRIORITY_WEIGHTINGS",
    "CrossQLoss",
    "DDPGLoss",
    "DDQNLoss",
    "DQNLoss",
    "DiscreteMPOLoss",
    "DiscreteSACLoss",
    "DistributionalDQNLoss",
    "MPOLoss",
    "REDQLoss",
    "SACLoss",
    "TD3Loss",
    "TDTargetLoss",
    "TQCLoss",
    "ensemble_architecture",
]
