"""Language-model post-training losses, drop-ins for ``torchrl.objectives.llm``."""

from rlloss.llm.advantage import MCAdvantage
from rlloss.llm.distillation import DistillationLoss
from rlloss.llm.grpo import DAPO, CISPOLoss, DrGRPOLoss, GRPOLoss, GSPOLoss
from rlloss.llm.selection import MCAdvantageSelector
from rlloss.llm.sft import SFTLoss

__all__ = [
    "CISPOLoss",
    "DAPO",
    "DistillationLoss",
    "DrGRPOLoss",
    "GRPOLoss",
    "GSPOLoss",
    "MCAdvantage",
    "MCAdvantageSelector",
    "SFTLoss",
]
