"""Learning in imagination: the rollout of the policy in a learned model, its lambda-returns, and
DreamerV3's moving percentile range of the returns. Shared by DreamerV1's and DreamerV3's actor
losses (``ImaginationLoss``, ``ReturnPercentiles``).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type, step_mdp
from torchrl.objectives.utils import ValueEstimators, hold_out_net

from rlloss import functional as rlf
from rlloss._checks import check_in_range
from rlloss._networks import NetworkCall
from rlloss.common import LossModule

GAMMA_LMBDA_ERROR = (
    "Passing gamma / lambda parameters through the loss constructor is a deprecated feature. "
    "To customize your value function, run "
    "`loss_module.make_value_estimator(ValueEstimators.<value_fun>, gamma=val)`."
)
# the estimators an imagination loss takes, and the lambda each one means
SUPPORTED_ESTIMATORS = (ValueEstimators.TD0, ValueEstimators.TD1, ValueEstimators.TDLambda)


class ImaginationLoss(LossModule):
    """An actor loss on trajectories imagined by ``model_based_env`` (TorchRL's ``DreamerEnv``)
    from the batch's latent states: ``imagination_horizon`` steps of ``actor_model``, with the
    environment's parameters held out of the graph (gradients reach the actor through the
    imagined states, as in Dreamer's analytic value gradients), and the values of the imagined
    next states from ``value_model`` (held out too).

    The lambda-returns use the value estimator's ``gamma`` and ``lmbda`` (``make_value_estimator``
    with ``TD0``: ``lmbda = 0``; ``TD1``: 1; ``TDLambda``, the default: its ``lmbda``).
    """

    default_value_estimator = ValueEstimators.TDLambda
    actor_model: nn.Module
    value_model: nn.Module

    def __init__(
        self,
        actor_model: nn.Module,
        value_model: nn.Module,
        model_based_env,
        *,
        imagination_horizon: int = 15,
        discount_loss: bool = True,
        gamma: float | None = None,
        lmbda: float | None = None,
    ) -> None:
        if gamma is not None or lmbda is not None:
            raise TypeError(GAMMA_LMBDA_ERROR)
        check_in_range("imagination_horizon", imagination_horizon, 1, integer=True)
        super().__init__()
        self.actor_model = actor_model
        self.__dict__["value_model"] = value_model  # trained by the value loss, not this one
        self.model_based_env = model_based_env
        self.imagination_horizon = int(imagination_horizon)
        self.discount_loss = discount_loss
        self._value_call = NetworkCall(value_model)

    def _start_keys(self) -> list[NestedKey]:
        """The latent-state entries imagination starts from."""
        return [self.tensor_keys.state, self.tensor_keys.belief]

    @property
    def in_keys(self) -> list[NestedKey]:
        return self._start_keys()

    def make_value_estimator(self, value_type=None, **hyperparams):
        """TorchRL's ``TD0``, ``TD1`` or ``TDLambda`` (default), or an estimator instance: it
        holds the ``gamma`` and ``lmbda`` of the imagined returns."""
        if isinstance(value_type, ValueEstimators) and value_type not in SUPPORTED_ESTIMATORS:
            raise NotImplementedError(
                f"Value type {value_type} is not implemented for loss {type(self)}; "
                f"{type(self).__name__} supports {[e.name for e in SUPPORTED_ESTIMATORS]}."
            )
        return super().make_value_estimator(value_type, **hyperparams)

    def _return_parameters(self) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        """``(gamma, lmbda)`` of the value estimator (``lmbda`` 0 for TD(0), 1 for TD(1))."""
        estimator = self.value_estimator
        if self.value_type == ValueEstimators.TD0:
            return estimator.gamma, 0.0
        return estimator.gamma, getattr(estimator, "lmbda", 1.0)

    def lambda_target(
        self, reward: torch.Tensor, value: torch.Tensor, continuation: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The imagined lambda-returns ``[*B, H, 1]`` (:func:`rlloss.functional.imagined_lambda_return`)
        from the rewards and next-state values ``[*B, H, 1]``, discounted by ``continuation``."""
        gamma, lmbda = self._return_parameters()
        return rlf.imagined_lambda_return(reward, value, continuation, gamma, lmbda)

    def _imagine(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """The imagined trajectories ``[*B, H]`` and their next steps with the value written."""
        start = tensordict.select(*self._start_keys()).data
        with hold_out_net(self.model_based_env), set_exploration_type(ExplorationType.RANDOM):
            start = self.model_based_env.reset(start.copy())
            fake_data = self.model_based_env.rollout(
                max_steps=self.imagination_horizon,
                policy=self.actor_model,
                auto_reset=False,
                tensordict=start,
                break_when_any_done=False,  # imagination never ends: no per-step done check
            )
            following = step_mdp(fake_data, keep_other=True)
            with hold_out_net(self.value_model):
                value = self._value_call(following)[self.tensor_keys.value]
        following.set(self.tensor_keys.value, value)
        return fake_data, following

    def _step_weights(self, continuation: torch.Tensor) -> torch.Tensor:
        """``w_t = c_0 prod_{k<=t} gamma c_k`` (``discount_loss``), else ones; no gradient."""
        if not self.discount_loss:
            return torch.ones_like(continuation)
        gamma, _ = self._return_parameters()
        return rlf.imagination_weights(continuation, gamma).detach()


class ReturnPercentiles(nn.Module):
    """Moving averages of the low and high percentiles of the imagined returns and the scale
    ``max(min_scale, high - low)`` (DreamerV3 eq. 12): buffers ``low`` and ``high`` (``[1]``),
    updated in place by :meth:`update` without a host sync."""

    def __init__(
        self, quantiles: tuple[float, float] = (0.05, 0.95), rate: float = 0.01, min_scale=1.0
    ) -> None:
        super().__init__()
        low, high = quantiles
        if not 0 <= low < high <= 1:
            raise ValueError(f"quantiles must satisfy 0 <= low < high <= 1, got {quantiles}.")
        check_in_range("return_normalization_rate", rate, 0.0, 1.0)
        check_in_range("return_normalization_min_scale", min_scale, 0.0, low_open=True)
        self.quantiles, self.rate, self.min_scale = (float(low), float(high)), rate, min_scale
        self.register_buffer("low", torch.zeros(1))
        self.register_buffer("high", torch.zeros(1))

    @torch.no_grad()
    def update(self, returns: torch.Tensor) -> None:
        low, high = rlf.percentile_range(returns, *self.quantiles)
        self.low.copy_(rlf.moving_average(self.low, low, self.rate))
        self.high.copy_(rlf.moving_average(self.high, high, self.rate))

    def scale(self) -> torch.Tensor:
        return rlf.return_scale(self.low, self.high, self.min_scale)


def trailing_like(source: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``source`` (a log-prob or entropy, ``[*B, H]`` or ``[*B, H, D]``) shaped as
    ``reference`` ``[*B, H, 1]``: a trailing dim added, or the action dims summed."""
    if source.ndim == reference.ndim:
        return source
    if source.ndim == reference.ndim - 1:
        return source.unsqueeze(-1)
    if source.ndim == reference.ndim + 1:
        return source.sum(-1, keepdim=True)
    raise ValueError(
        f"Cannot align source shape {tuple(source.shape)} to reference shape "
        f"{tuple(reference.shape)}: the policy's log-probability must be per step ([*B, H]) "
        "or per action dimension ([*B, H, D])."
    )
