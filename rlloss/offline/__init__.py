"""Offline losses: IQL (continuous and discrete), CQL (continuous and discrete) and TD3+BC, each
built on the off-policy base of the algorithm it regularises."""

from rlloss.offline.cql import CQLLoss
from rlloss.offline.discrete_cql import DiscreteCQLLoss
from rlloss.offline.iql import DiscreteIQLLoss, IQLLoss
from rlloss.offline.td3_bc import TD3BCLoss

__all__ = ["CQLLoss", "DiscreteCQLLoss", "DiscreteIQLLoss", "IQLLoss", "TD3BCLoss"]
