"""Exploration bonuses: Random Network Distillation's predictor loss and intrinsic reward."""

from rlloss.exploration.rnd import RNDLoss

__all__ = ["RNDLoss"]
