"""Language-model post-training losses, drop-ins for ``torchrl.objectives.llm``."""

from rlloss.llm.distillation import DistillationLoss
from rlloss.llm.grpo import DAPO, CISPOLoss, DrGRPOLoss, GRPOLoss, GSPOLoss
from rlloss.llm.sft import SFTLoss

__all__ = ["CISPOLoss", "DAPO", "DistillationLoss", "DrGRPOLoss", "GRPOLoss", "GSPOLoss", "SFTLoss"]
