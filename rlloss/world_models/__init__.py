"""World-model losses: DreamerV1, DreamerV3, the general world-model loss, PILCO's cost."""

from rlloss.world_models.dreamer import DreamerActorLoss, DreamerModelLoss, DreamerValueLoss
from rlloss.world_models.dreamer_v3 import DreamerV3ModelLoss
from rlloss.world_models.dreamer_v3_actor import DreamerV3ActorLoss
from rlloss.world_models.dreamer_v3_loss import DreamerV3Loss
from rlloss.world_models.dreamer_v3_value import DreamerV3ValueLoss
from rlloss.world_models.pilco import ExponentialQuadraticCost
from rlloss.world_models.world_model import WorldModelLoss

__all__ = [
    "DreamerActorLoss",
    "DreamerModelLoss",
    "DreamerValueLoss",
    "DreamerV3ActorLoss",
    "DreamerV3Loss",
    "DreamerV3ModelLoss",
    "DreamerV3ValueLoss",
    "ExponentialQuadraticCost",
    "WorldModelLoss",
]
