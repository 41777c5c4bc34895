"""Generalized advantage estimation: ``GAE`` and ``MultiAgentGAE``."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._agent_dims import broadcast_to_agents
from rlloss._checks import Coefficient, MissingKeyError, check_in_range, missing_key_message
from rlloss.estimators.base import ValueEstimator
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.functional.returns import masked_standardize


class GAE(ValueEstimator):
    r"""Generalized advantage estimation (Schulman et al., arXiv:1506.02438).

    $$
    \delta_t = r_t + \gamma (1 - \text{terminated}_t) V(s_{t+1}) - V(s_t), \qquad
    A_t = \delta_t + \gamma \lambda (1 - \text{done}_t) A_{t+1}, \qquad
    A_T = 0
    $$

    ``advantage`` is $A_t$ (:func:`rlloss.functional.gae_advantage`), ``value_target`` is
    $A_t + V(s_t)$; ``average_gae=True`` standardises the advantage over the batch, or within
    the groups of the ids under ``group_key`` (e.g. a task id per batch element, TorchRL 0.14.1's
    keyword).

    The value call (every estimator, :class:`~rlloss.estimators.base.ValueEstimator`):
    ``shifted=True`` computes ``V(s)`` and ``V(s')`` in one call over ``[s_0 .. s_{T-1}]`` with
    each truncated step's next input inserted after it, in ``T + shifted_budget`` slots (a
    recurrent critic runs once along its sequence; no stored next input needed); steps that no
    longer fit are dropped: ``shifted_valid`` marks the kept ones, the dropped ones get 0.
    ``skip_existing`` keeps values already in the batch (``None``: tensordict's setting);
    ``value_chunk_size`` / ``num_chunks`` call the network on chunks along ``value_chunk_dim``.
    ``auto_reset_env=True`` (TorchRL's): truncated steps (``("next", "truncated")``) add
    ``gamma V(s)`` to their reward and are then not bootstrapped.

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

    lmbda = Coefficient(low=0.0, high=1.0)  # checked on assignment as at construction

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        lmbda: float | torch.Tensor,
        value_network: nn.Module | None = None,
        average_gae: bool = False,
        differentiable: bool = False,
        vectorized: bool | None = None,
        skip_existing: bool | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        shifted: bool = False,
        device: torch.device | None = None,
        time_dim: int | None = None,
        auto_reset_env: bool = False,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
        value_normalizer: ValueNormalizer | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma,
            value_network=value_network,
            shifted=shifted,
            differentiable=differentiable,
            skip_existing=skip_existing,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            value_key=value_key,
            device=device,
            deactivate_vmap=deactivate_vmap,
            value_chunk_size=value_chunk_size,
            num_chunks=num_chunks,
            num_chunk=num_chunk,
            value_chunk_dim=value_chunk_dim,
            shifted_budget=shifted_budget,
            group_key=group_key,
            time_dim=time_dim,
            vectorized=vectorized,
            value_normalizer=value_normalizer,
        )
        check_in_range("lmbda", lmbda, 0.0, 1.0)
        self.lmbda = float(lmbda)
        self.average_gae = average_gae
        self.auto_reset_env = auto_reset_env

    def _estimate_inputs(self, tensordict: TensorDictBase, value: torch.Tensor, valid) -> dict:
        groups = self._groups(tensordict) if self.average_gae else None
        truncated = None
        if self.auto_reset_env:  # TorchRL reads ("next", "truncated") for it
            truncated = tensordict.get(("next", "truncated"), None)
            if truncated is None:
                owner = type(self).__name__
                message = missing_key_message(owner, "truncated", ("next", "truncated"), tensordict)
                raise MissingKeyError(f"{message} (auto_reset_env=True reads it)")
        return {"groups": groups, "valid": valid, "truncated": truncated}

    def estimate(
        self,
        *,
        reward,
        value,
        next_value,
        done,
        terminated,
        gamma,
        time_dim,
        groups,
        valid=None,
        truncated=None,
    ):
        if truncated is not None:  # TorchRL's auto_reset_env: V(s) enters truncated rewards
            reward = reward + gamma * value * truncated
            terminated = done
        advantage = rlf.gae_advantage(
            reward, value, next_value, done, terminated, gamma, self.lmbda, time_dim
        )
        value_target = advantage + value
        if self.average_gae:
            advantage = self._standardized(advantage, groups, valid)
        return advantage, value_target

    def _standardized(self, advantage: torch.Tensor, groups, valid):
        """The advantage standardised over the batch, or within ``groups``; over the kept steps
        only when ``valid`` is given (a shifted estimator's, TorchRL's population std)."""
        if groups is not None:
            mask = None if valid is None else _expanded(valid, advantage)
            return rlf.group_standardize(advantage, groups, mask)
        if valid is not None:
            return masked_standardize(advantage, valid)
        return rlf.standardize(advantage)


def _expanded(valid: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``valid`` (``[*B, T]``) broadcast to ``like``'s shape."""
    while valid.ndim < like.ndim:
        valid = valid.unsqueeze(-1)
    return valid.expand(like.shape)


class MultiAgentGAE(GAE):
    r"""GAE for per-agent values ``[*B, T, n_agents, 1]`` with team-level reward, done and
    terminated ``[*B, T, 1]`` (broadcast along ``agent_dim`` of the values), as TorchRL's:
    for each agent $k$,

    $$
    \delta^k_t = r_t + \gamma (1 - \text{terminated}_t) V^k(s_{t+1}) - V^k(s_t), \qquad
    A^k_t = \delta^k_t + \gamma \lambda (1 - \text{done}_t) A^k_{t+1}
    $$

    ``average_gae=True`` standardises each agent's advantages on their own (over the other
    dims: TorchRL 0.14.1's rule), within the groups of ``group_key`` when it is set.

    ``agent_dim`` outside the values' dims (or on the time dim) raises an error naming it.

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

    def __init__(
        self,
        *,
        agent_dim: int = -2,
        gamma: float | torch.Tensor,
        lmbda: float | torch.Tensor,
        value_network: nn.Module | None = None,
        average_gae: bool = False,
        differentiable: bool = False,
        vectorized: bool | None = None,
        skip_existing: bool | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        shifted: bool = False,
        device: torch.device | None = None,
        time_dim: int | None = None,
        auto_reset_env: bool = False,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
        value_normalizer: ValueNormalizer | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma,
            lmbda=lmbda,
            value_network=value_network,
            average_gae=average_gae,
            differentiable=differentiable,
            vectorized=vectorized,
            skip_existing=skip_existing,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            value_key=value_key,
            shifted=shifted,
            device=device,
            time_dim=time_dim,
            auto_reset_env=auto_reset_env,
            deactivate_vmap=deactivate_vmap,
            value_chunk_size=value_chunk_size,
            num_chunks=num_chunks,
            num_chunk=num_chunk,
            value_chunk_dim=value_chunk_dim,
            shifted_budget=shifted_budget,
            group_key=group_key,
            value_normalizer=value_normalizer,
        )
        if isinstance(agent_dim, bool) or not isinstance(agent_dim, int):
            raise TypeError(f"MultiAgentGAE: agent_dim must be an integer, got {agent_dim!r}.")
        self.agent_dim = agent_dim

    def estimate(
        self,
        *,
        reward,
        value,
        next_value,
        done,
        terminated,
        gamma,
        time_dim,
        groups,
        valid=None,
        truncated=None,
    ):
        agent_dim = self._agent_dim(value)
        if isinstance(gamma, torch.Tensor) and gamma.ndim == value.ndim - 1:
            gamma = gamma.unsqueeze(agent_dim)
        reward, done, terminated = (
            self._broadcast_to_agents(x, value, agent_dim, name)
            for x, name in ((reward, "reward"), (done, "done"), (terminated, "terminated"))
        )
        if truncated is not None:
            truncated = self._broadcast_to_agents(truncated, value, agent_dim, "truncated")
        return super().estimate(
            reward=reward,
            value=value,
            next_value=next_value,
            done=done,
            terminated=terminated,
            gamma=gamma,
            time_dim=time_dim,
            groups=groups,
            valid=valid,
            truncated=truncated,
        )

    def _agent_dim(self, value: torch.Tensor) -> int:
        """``agent_dim`` as a non-negative dim of the values; outside them: an error naming it,
        the values' dims and the valid range."""
        ndim = value.ndim
        if not -ndim <= self.agent_dim < ndim:
            raise ValueError(
                f"MultiAgentGAE: agent_dim={self.agent_dim} is not a dim of the values, which "
                f"have {ndim} dims (shape {tuple(value.shape)}); pass an agent_dim in "
                f"[{-ndim}, {ndim}), the dim that indexes the agents (-2 for [*B, T, n_agents, 1])."
            )
        return self.agent_dim % ndim

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

    def _standardized(self, advantage: torch.Tensor, groups, valid):
        """Each agent's advantages standardised on their own: over every dim but ``agent_dim``,
        or within the groups of (group id, agent); over the kept steps only when ``valid`` is
        given (a shifted estimator's, TorchRL's population std without groups)."""
        agent_dim = self.agent_dim % advantage.ndim
        mask = None if valid is None else _expanded(valid, advantage)
        if groups is None and valid is not None:
            return masked_standardize(advantage, valid, keep_dims=(agent_dim,))
        agents = advantage.shape[agent_dim]
        agent = torch.arange(agents, device=advantage.device)
        agent = agent.reshape([-1 if d == agent_dim else 1 for d in range(advantage.ndim)])
        if groups is None:
            return rlf.group_standardize(advantage, agent.expand_as(advantage))
        while groups.ndim < advantage.ndim:
            groups = groups.unsqueeze(-1)
        groups = groups.expand(advantage.shape) * agents + agent
        return rlf.group_standardize(advantage, groups, mask)
