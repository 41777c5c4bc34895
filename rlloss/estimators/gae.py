"""Generalized advantage estimation: ``GAE`` and ``MultiAgentGAE``."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rlloss import functional as rlf
from rlloss._agent_dims import broadcast_to_agents
from rlloss._checks import check_in_range
from rlloss.estimators.base import ValueEstimator


class GAE(ValueEstimator):
    """Generalized advantage estimation (Schulman et al., arXiv:1506.02438).

    ``advantage`` is :func:`rlloss.functional.gae_advantage`, ``value_target = advantage +
    V(s)``; ``average_gae=True`` standardises the advantage over the batch, or within the groups
    of the ids under ``group_key`` (e.g. a task id per batch element, TorchRL 0.14.1's keyword).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import ValueOperator
        >>> from rlloss import GAE
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(4, 16, 3),
        ...         "next": {
        ...             "observation": torch.randn(4, 16, 3),
        ...             "reward": torch.randn(4, 16, 1),
        ...             "done": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [4, 16],
        ... )  # [num_envs, T]
        >>> estimator = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
        >>> batch = estimator(batch)
        >>> print(batch["advantage"].shape, batch["value_target"].shape)  # [4, 16, 1] each
    """

    def __init__(self, *, gamma: float, lmbda: float, average_gae: bool = False, **kwargs) -> None:
        super().__init__(gamma=gamma, **kwargs)
        check_in_range("lmbda", lmbda, 0.0, 1.0)
        self.lmbda = float(lmbda)
        self.average_gae = average_gae

    def _estimate_inputs(self, tensordict: TensorDictBase, value: torch.Tensor) -> dict:
        return {"groups": self._groups(tensordict) if self.average_gae else None}

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim, groups):
        advantage = rlf.gae_advantage(
            reward, value, next_value, done, terminated, gamma, self.lmbda, time_dim
        )
        value_target = advantage + value
        if self.average_gae:
            advantage = self._standardized(advantage, groups)
        return advantage, value_target

    def _standardized(self, advantage: torch.Tensor, groups: torch.Tensor | None):
        """The advantage standardised over the batch, or within ``groups``."""
        if groups is None:
            return rlf.standardize(advantage)
        return rlf.group_standardize(advantage, groups)


class MultiAgentGAE(GAE):
    """GAE for per-agent values ``[*B, T, n_agents, 1]`` with team-level reward, done and
    terminated ``[*B, T, 1]`` (broadcast along ``agent_dim`` of the values), as TorchRL's.
    ``average_gae=True`` standardises each agent's advantages on their own (over the other
    dims: TorchRL 0.14.1's rule), within the groups of ``group_key`` when it is set.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from rlloss import MultiAgentGAE
        >>> critic = TensorDictModule(
        ...     torch.nn.Linear(3, 1), [("agents", "observation")], [("agents", "state_value")]
        ... )
        >>> def step():
        ...     return {
        ...         "agents": TensorDict(
        ...             observation=torch.randn(4, 16, 2, 3),
        ...             reward=torch.randn(4, 16, 2, 1),
        ...             batch_size=[4, 16, 2],
        ...         )
        ...     }
        >>> batch = TensorDict(
        ...     {
        ...         **step(),
        ...         "next": {
        ...             **step(),
        ...             "done": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [4, 16],
        ... )
        >>> gae = MultiAgentGAE(gamma=0.99, lmbda=0.95, value_network=critic)
        >>> gae.set_keys(
        ...     value=("agents", "state_value"),
        ...     reward=("agents", "reward"),
        ...     advantage=("agents", "advantage"),
        ...     value_target=("agents", "value_target"),
        ... )
        >>> batch = gae(batch)  # one advantage per agent, the env's done broadcast over the agents
        >>> print(batch["agents", "advantage"].shape)  # [4, 16, 2, 1]
    """

    def __init__(self, *, agent_dim: int = -2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.agent_dim = agent_dim

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim, groups):
        if isinstance(gamma, torch.Tensor) and gamma.ndim == value.ndim - 1:
            gamma = gamma.unsqueeze(self.agent_dim % value.ndim)
        reward, done, terminated = (
            self._broadcast_to_agents(x, value, self.agent_dim, name)
            for x, name in ((reward, "reward"), (done, "done"), (terminated, "terminated"))
        )
        return super().estimate(
            reward=reward,
            value=value,
            next_value=next_value,
            done=done,
            terminated=terminated,
            gamma=gamma,
            time_dim=time_dim,
            groups=groups,
        )

    @staticmethod
    def _broadcast_to_agents(
        tensor: torch.Tensor, target: torch.Tensor, agent_dim: int, name: str = "reward"
    ) -> torch.Tensor:
        """``tensor`` (a reward, done or terminated flag) as one entry per agent of the values
        ``target``: a per-agent one (``target``'s shape, or singleton dims of it) as it is, a
        team one (``target``'s shape without ``agent_dim``) copied along ``agent_dim``; any
        other shape is refused with the shapes and the fix (TorchRL's method of this name; the
        rule is :func:`rlloss._agent_dims.broadcast_to_agents`, shared with the off-policy
        losses)."""
        return broadcast_to_agents(tensor, target.shape, agent_dim, name=name)

    def _standardized(self, advantage: torch.Tensor, groups: torch.Tensor | None):
        """Each agent's advantages standardised on their own: over every dim but ``agent_dim``,
        or within the groups of (group id, agent)."""
        agent_dim = self.agent_dim % advantage.ndim
        agents = advantage.shape[agent_dim]
        agent = torch.arange(agents, device=advantage.device)
        agent = agent.reshape([-1 if d == agent_dim else 1 for d in range(advantage.ndim)])
        if groups is None:
            return rlf.group_standardize(advantage, agent.expand_as(advantage))
        while groups.ndim < advantage.ndim:
            groups = groups.unsqueeze(-1)
        return rlf.group_standardize(advantage, groups.expand(advantage.shape) * agents + agent)
