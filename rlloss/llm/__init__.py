"""Language-model post-training losses, drop-ins for ``torchrl.objectives.llm``."""

from rlloss.llm.grpo import DAPO, CISPOLoss, DrGRPOLoss, GRPOLoss, GSPOLoss

__all__ = ["CISPOLoss", "DAPO", "DrGRPOLoss", "GRPOLoss", "GSPOLoss"]
