"""Learning from demonstrations: behaviour cloning (plain, diffusion, action-chunked), GAIL's
discriminator and the Decision Transformers, on the shared ``SupervisedLoss`` base."""

from rlloss.imitation.act import ACTLoss
from rlloss.imitation.base import SupervisedLoss
from rlloss.imitation.bc import BCLoss
from rlloss.imitation.decision_transformer import DTLoss, OnlineDTLoss
from rlloss.imitation.diffusion_bc import DiffusionBCLoss
from rlloss.imitation.gail import GAILLoss

__all__ = [
    "ACTLoss",
    "BCLoss",
    "DTLoss",
    "DiffusionBCLoss",
    "GAILLoss",
    "OnlineDTLoss",
    "SupervisedLoss",
]
