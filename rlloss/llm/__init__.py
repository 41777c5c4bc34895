"""Language-model post-training losses, drop-ins for ``torchrl.objectives.llm``."""

# The output classes the losses return and TorchRL's KL helper: TorchRL's own objects, importable
# from here so that ``from torchrl.objectives.llm import ...`` lines swap whole (not in __all__)
from torchrl.objectives.llm import (  # noqa: F401
    CISPOLossOutput,
    DAPOLossOutput,
    DistillationLossOutput,
    GRPOLossOutput,
    LLMLossOutput,
    SFTLossOutput,
    k3_kl_token_estimate,
)

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
