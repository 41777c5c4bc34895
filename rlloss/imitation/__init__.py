"""Learning from demonstrations: behaviour cloning (plain, diffusion, action-chunked), GAIL's
discriminator and the Decision Transformers, on the shared ``DemonstrationLoss`` base."""

from rlloss.imitation.base import DemonstrationLoss
from rlloss.imitation.bc import BCLoss

__all__ = ["BCLoss", "DemonstrationLoss"]
