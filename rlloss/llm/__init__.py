"""Language-model post-training losses, drop-ins for ``torchrl.objectives.llm``."""

from rlloss.llm.advantage import MCAdvantage
from rlloss.llm.distillation import DistillationLoss
from rlloss.llm.dpo import DPOLoss
from rlloss.llm.grpo import GRPOLoss
from rlloss.llm.grpo_variants import DAPO, CISPOLoss, DrGRPOLoss, GSPOLoss
from rlloss.llm.kto import KTOLoss
from rlloss.llm.selection import MCAdvantageSelector
from rlloss.llm.sft import SFTLoss
from rlloss.llm.simpo import SimPOLoss

__all__ = [
    "CISPOLoss",
    "DAPO",
    "DistillationLoss",
    "DPOLoss",
    "DrGRPOLoss",
    "GRPOLoss",
    "GSPOLoss",
    "KTOLoss",
    "MCAdvantage",
    "MCAdvantageSelector",
    "SFTLoss",
    "SimPOLoss",
]
