"""On-policy losses: the PPO family (``PPOLoss``, ``ClipPPOLoss``, ``KLPENPPOLoss``, ``RPOLoss``),
``A2CLoss`` and ``ReinforceLoss``, on the shared base
:class:`~rlloss.onpolicy.base.OnPolicyLoss`."""

from rlloss.onpolicy.a2c import A2CLoss, ReinforceLoss
from rlloss.onpolicy.base import OnPolicyLoss, as_scalar_output
from rlloss.onpolicy.klpen import KLPENPPOLoss
from rlloss.onpolicy.ppo import ClipPPOLoss, PPOLoss
from rlloss.onpolicy.rpo import RPOLoss

__all__ = [
    "A2CLoss",
    "ClipPPOLoss",
    "KLPENPPOLoss",
    "OnPolicyLoss",
    "PPOLoss",
    "RPOLoss",
    "ReinforceLoss",
    "as_scalar_output",
]
