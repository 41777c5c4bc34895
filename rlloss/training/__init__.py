"""Training helpers around the losses: schedules and the KL-adaptive learning rate, reward and
value normalisation, target-network updaters, the compiled update, ``torch.distributed``
reductions and sequence chunking."""

from rlloss.training.normalizers import RewardNormalizer
from rlloss.training.piecewise import PiecewiseSchedule
from rlloss.training.schedulers import KLAdaptiveLR, KLEarlyStopping, kl_exceeds
from rlloss.training.sequences import chunk_sequences, recurrent_state_keys
from rlloss.training.update import Update, compile_update
from rlloss.training.updaters import HardUpdate, SoftUpdate

__all__ = [
    "HardUpdate",
    "KLAdaptiveLR",
    "KLEarlyStopping",
    "PiecewiseSchedule",
    "RewardNormalizer",
    "SoftUpdate",
    "Update",
    "chunk_sequences",
    "compile_update",
    "kl_exceeds",
    "recurrent_state_keys",
]
