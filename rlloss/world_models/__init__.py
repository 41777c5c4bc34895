"""World-model losses: DreamerV1, DreamerV3, the general world-model loss, PILCO's cost."""

from rlloss.world_models.pilco import ExponentialQuadraticCost

__all__ = ["ExponentialQuadraticCost"]
