"""Temporal-difference value targets: ``TD0Estimator``, ``TDLambdaEstimator``, ``TD1Estimator``."""

from __future__ import annotations

import torch
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_in_range
from rlloss.estimators.base import ValueEstimator
from rlloss.estimators.value_norm import ValueNormalizer


class TD0Estimator(ValueEstimator):
    r"""One-step TD targets and advantages.

    $$
    \hat{V}_t = r_t + \gamma (1 - \text{terminated}_t) V(s_{t+1}), \qquad
    A_t = \hat{V}_t - V(s_t)
    $$

    (``value_target`` and ``advantage``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import ValueOperator
        >>> from rlloss import TD0Estimator
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
        >>> estimator = TD0Estimator(gamma=0.99, value_network=critic)
        >>> batch = estimator(batch)
        >>> print(batch["advantage"].shape, batch["value_target"].shape)  # [4, 16, 1] each
    """

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        value_network: nn.Module | None = None,
        shifted: bool = False,
        average_rewards: bool = False,
        differentiable: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        skip_existing: bool | None = None,
        device: torch.device | None = None,
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
            average_rewards=average_rewards,
            value_normalizer=value_normalizer,
        )

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim):
        value_target = rlf.td0_return(reward, next_value, terminated, gamma)
        return value_target - value, value_target


class TDLambdaEstimator(ValueEstimator):
    r"""TD(lambda) returns (:func:`rlloss.functional.td_lambda_return`); ``lmbda=1`` is TD(1).

    $$
    G_t = r_t + \gamma (1 - \text{terminated}_t)
    \big((1 - \lambda) V(s_{t+1}) + \lambda G_{t+1}\big), \qquad A_t = G_t - V(s_t)
    $$

    where the trace is cut (``done``, and at the batch's last step) $G_{t+1}$ is $V(s_{t+1})$;
    ``value_target`` is $G_t$, ``advantage`` is $A_t$.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import ValueOperator
        >>> from rlloss import TDLambdaEstimator
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
        >>> estimator = TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=critic)
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
        average_rewards: bool = False,
        differentiable: bool = False,
        vectorized: bool = True,
        skip_existing: bool | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        shifted: bool = False,
        device: torch.device | None = None,
        time_dim: int | None = None,
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
            average_rewards=average_rewards,
            vectorized=vectorized,
            value_normalizer=value_normalizer,
        )
        check_in_range("lmbda", lmbda, 0.0, 1.0)
        self.lmbda = float(lmbda)

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim):
        value_target = rlf.td_lambda_return(
            reward, next_value, done, terminated, gamma, self.lmbda, time_dim
        )
        return value_target - value, value_target


class TD1Estimator(TDLambdaEstimator):
    r"""TD(1): the discounted return to the end of the batch, bootstrapped there
    (:class:`TDLambdaEstimator` with ``lmbda=1``).

    $$
    G_t = r_t + \gamma (1 - \text{terminated}_t) G_{t+1}, \qquad A_t = G_t - V(s_t)
    $$

    with $G_{t+1} = V(s_{t+1})$ where the trajectory is cut (``done``, the batch's last step).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import ValueOperator
        >>> from rlloss import TD1Estimator
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
        >>> estimator = TD1Estimator(gamma=0.99, value_network=critic)
        >>> batch = estimator(batch)
        >>> print(batch["advantage"].shape, batch["value_target"].shape)  # [4, 16, 1] each
    """

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        value_network: nn.Module | None = None,
        average_rewards: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        shifted: bool = False,
        device: torch.device | None = None,
        time_dim: int | None = None,
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
            lmbda=1.0,
            value_network=value_network,
            average_rewards=average_rewards,
            differentiable=differentiable,
            skip_existing=skip_existing,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            value_key=value_key,
            shifted=shifted,
            device=device,
            time_dim=time_dim,
            deactivate_vmap=deactivate_vmap,
            value_chunk_size=value_chunk_size,
            num_chunks=num_chunks,
            num_chunk=num_chunk,
            value_chunk_dim=value_chunk_dim,
            shifted_budget=shifted_budget,
            group_key=group_key,
            value_normalizer=value_normalizer,
        )
