"""World-model losses: DreamerV1, DreamerV3, the general world-model loss, PILCO's cost."""

from rlloss.world_models.dreamer_v3 import DreamerV3ModelLoss, DreamerV3ValueLoss
from rlloss.world_models.dreamer_v3_actor import DreamerV3ActorLoss
from rlloss.world_models.dreamer_v3_loss import DreamerV3Loss
from rlloss.world_models.pilco import ExponentialQuadraticCost

__all__ = [
    "DreamerV3ActorLoss",
    "DreamerV3Loss",
    "DreamerV3ModelLoss",
    "DreamerV3ValueLoss",
    "ExponentialQuadraticCost",
]
