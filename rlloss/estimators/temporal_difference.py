"""Temporal-difference value targets: ``TD0Estimator``, ``TDLambdaEstimator``, ``TD1Estimator``."""

from __future__ import annotations

from rlloss import functional as rlf
from rlloss._checks import check_in_range
from rlloss.estimators.base import ValueEstimator


class TD0Estimator(ValueEstimator):
    """One-step TD: ``value_target = r + gamma (1 - terminated) V(s')``, ``advantage =
    value_target - V(s)``.

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

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim):
        value_target = rlf.td0_return(reward, next_value, terminated, gamma)
        return value_target - value, value_target


class TDLambdaEstimator(ValueEstimator):
    """TD(lambda) returns (:func:`rlloss.functional.td_lambda_return`); ``lmbda=1`` is TD(1).

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

    def __init__(self, *, gamma: float, lmbda: float, **kwargs) -> None:
        super().__init__(gamma=gamma, **kwargs)
        check_in_range("lmbda", lmbda, 0.0, 1.0)
        self.lmbda = float(lmbda)

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim):
        value_target = rlf.td_lambda_return(
            reward, next_value, done, terminated, gamma, self.lmbda, time_dim
        )
        return value_target - value, value_target


class TD1Estimator(TDLambdaEstimator):
    """TD(1): the discounted return to the end of the batch, bootstrapped there
    (:class:`TDLambdaEstimator` with ``lmbda=1``).

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

    def __init__(self, *, gamma: float, **kwargs) -> None:
        super().__init__(gamma=gamma, lmbda=1.0, **kwargs)
