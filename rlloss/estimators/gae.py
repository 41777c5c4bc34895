"""Generalized advantage estimation: ``GAE`` and ``MultiAgentGAE``."""

from __future__ import annotations

import torch

from rlloss import functional as rlf
from rlloss._checks import check_in_range
from rlloss.estimators.base import ValueEstimator


class GAE(ValueEstimator):
    """Generalized advantage estimation (Schulman et al., arXiv:1506.02438).

    ``advantage`` is :func:`rlloss.functional.gae_advantage`, ``value_target = advantage +
    V(s)``; ``average_gae=True`` standardises the advantage over the batch.

    Example:
        >>> gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
        >>> rollout = gae(rollout)  # rollout: [num_envs, T]
    """

    def __init__(self, *, gamma: float, lmbda: float, average_gae: bool = False, **kwargs) -> None:
        super().__init__(gamma=gamma, **kwargs)
        check_in_range("lmbda", lmbda, 0.0, 1.0)
        self.lmbda = float(lmbda)
        self.average_gae = average_gae

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim):
        advantage = rlf.gae_advantage(
            reward, value, next_value, done, terminated, gamma, self.lmbda, time_dim
        )
        value_target = advantage + value
        if self.average_gae:
            advantage = rlf.standardize(advantage)
        return advantage, value_target


class MultiAgentGAE(GAE):
    """GAE for per-agent values ``[*B, T, n_agents, 1]`` with team-level reward, done and
    terminated ``[*B, T, 1]`` (broadcast along ``agent_dim`` of the values), as TorchRL's.

    Example:
        >>> gae = MultiAgentGAE(gamma=0.99, lmbda=0.95, value_network=critic)
    """

    def __init__(self, *, agent_dim: int = -2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.agent_dim = agent_dim

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim):
        if value.ndim > reward.ndim:  # team signals: one copy per agent
            dim = self.agent_dim % value.ndim
            reward, done, terminated = (
                x.unsqueeze(dim).expand_as(value) for x in (reward, done, terminated)
            )
            gamma = gamma.unsqueeze(dim) if isinstance(gamma, torch.Tensor) else gamma
        return super().estimate(
            reward=reward,
            value=value,
            next_value=next_value,
            done=done,
            terminated=terminated,
            gamma=gamma,
            time_dim=time_dim,
        )
