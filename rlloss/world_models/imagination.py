"""Learning in imagination: the rollout of the policy in a learned model, its lambda-returns, and
DreamerV3's moving percentile range of the returns. Shared by DreamerV1's and DreamerV3's actor
losses (``ImaginationLoss``, ``ReturnPercentiles``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential
from tensordict.utils import NestedKey
from torch import nn
from torchrl.envs.model_based import DreamerEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type, step_mdp
from torchrl.modules import SafeProbabilisticModule
from torchrl.objectives.utils import ValueEstimators, hold_out_net

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import Coefficient, CoefficientOwner, next_key
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall, _plan, _run
from rlloss.common import LossModule

if TYPE_CHECKING:
    from torchrl.envs.model_based import ModelBasedEnvBase

GAMMA_LMBDA_ERROR = (
    "Passing gamma / lambda parameters through the loss constructor is a deprecated feature. "
    "To customize your value function, run "
    "`loss_module.make_value_estimator(ValueEstimators.<value_fun>, gamma=val)`."
)
# the estimators an imagination loss takes, and the lambda each one means
SUPPORTED_ESTIMATORS = (ValueEstimators.TD0, ValueEstimators.TD1, ValueEstimators.TDLambda)


def _dreamer_env_steps(env) -> list | None:
    """The planned world-model steps of a plain TorchRL ``DreamerEnv`` (its ``_step`` is the
    world model called on the step's entries), or ``None`` for any other environment."""
    if type(env) is not DreamerEnv or env.world_model_params is not None or env.batch_size:
        return None
    return _plan(env.world_model)


def _samples_plainly(actor, call: DistributionCall) -> bool:
    """Whether ``actor(td)`` under ``ExplorationType.RANDOM`` is exactly: the planned parameter
    modules, the head's distribution, one ``rsample`` (``sample`` without one) written to the
    head's one sample key, and its ``log_prob`` when the head returns it."""
    head = call.head
    if not call.direct or not isinstance(actor, ProbabilisticTensorDictSequential):
        return False
    plain_head = type(head) is ProbabilisticTensorDictModule or (
        type(head) is SafeProbabilisticModule and not head.return_log_prob
    )
    return (
        plain_head
        and type(actor).forward is ProbabilisticTensorDictSequential.forward
        and not (_compat.has_call_hooks(actor) or _compat.has_call_hooks(head))
        and not _compat.selects_out_keys(actor)
        and actor.inplace in (None, True)  # written into the step's entries
        and getattr(actor, "_requires_sample", True)
        and head.num_samples is None
        and getattr(head, "_generator", None) is None
        and getattr(head, "_generator_key", None) is None
        and len(head.dist_sample_keys) == 1
    )


class TensorImagination:
    """``env.rollout(horizon, policy=actor, auto_reset=False, tensordict=env.reset(start),
    break_when_any_done=False)`` (random exploration) run on tensors, for TorchRL's
    ``DreamerEnv`` and a planned actor: per step the actor's modules, one draw of its
    distribution, then the world model's modules, called in the rollout's order (so the same
    random numbers) on dicts of tensors; one TensorDict ``[*B, H]`` at the end, with the
    rollout's entries. ``enabled`` is ``False`` for any other environment or actor (the caller
    then runs ``env.rollout``)."""

    def __init__(self, env, actor) -> None:
        self.env_steps = _dreamer_env_steps(env)
        self.actor_call = DistributionCall(actor)
        self.enabled = self.env_steps is not None and _samples_plainly(actor, self.actor_call)
        if not self.enabled:
            return
        head = self.actor_call.head
        self.action_key = head.dist_sample_keys[0]
        self.log_prob_key = head.log_prob_key if head.return_log_prob else None
        self.done_specs = {key: env.full_done_spec[key] for key in env.done_keys}
        observed = list(env.observation_spec.keys(True, True))
        self.next_keys = [*observed, *env.done_keys, *env.reward_keys]
        self.dropped = {*env.action_keys, *env.reward_keys}  # step_mdp's exclusions
        self.device = env.device  # the rollout's TensorDicts are on the environment's device

    def _act(self, root: dict) -> dict:
        """The actor's entries on ``root``: its modules' outputs, the action (and log-prob)."""
        call = self.actor_call
        values = _run(call.steps, root, {})
        params = {key: values[key] if key in values else root[key] for key in call.head.in_keys}
        distribution = call.from_parameters(params)
        action = distribution.rsample() if distribution.has_rsample else distribution.sample()
        values[self.action_key] = action
        if self.log_prob_key is not None:
            values[self.log_prob_key] = distribution.log_prob(action)
        return values

    def __call__(self, start: TensorDictBase, horizon: int) -> tuple[TensorDict, TensorDict]:
        """The imagined trajectories ``[*B, H]`` and the following states (``step_mdp``'s)."""
        root = dict(start.items(include_nested=True, leaves_only=True))
        device = next(iter(root.values())).device  # the flags beside the start states
        for key, spec in self.done_specs.items():
            root[key] = torch.zeros(
                (*start.batch_size, *spec.shape), dtype=spec.dtype, device=device
            )
        roots, nexts = [], []
        for _ in range(horizon):
            root = {**root, **self._act(root)}
            model = _run(self.env_steps, root, {})
            following = {}
            for key in self.next_keys:
                value = model[key] if key in model else root.get(key)
                if value is not None:
                    following[key] = value
            roots.append(root)
            nexts.append(following)
            root = {key: v for key, v in root.items() if key not in self.dropped}
            root.update(following)
        return self._stacked(roots, nexts, start)

    def _stacked(self, roots: list, nexts: list, start: TensorDictBase) -> tuple:
        """The steps' entries stacked along a new dim after the batch dims."""
        dim, size = start.batch_dims, (*start.batch_size, len(roots))
        fake_data = TensorDict({}, batch_size=size, device=self.device)
        following = TensorDict({}, batch_size=size, device=self.device)
        for key in roots[0]:
            value = torch.stack([root[key] for root in roots], dim)
            fake_data.set(key, value)
            if key not in self.dropped:
                following.set(key, value)
        for key in nexts[0]:
            value = torch.stack([each[key] for each in nexts], dim)
            fake_data.set(next_key(key), value)
            following.set(key, value)
        return fake_data, following


class ImaginationLoss(LossModule):
    """An actor loss on trajectories imagined by ``model_based_env`` (TorchRL's ``DreamerEnv``)
    from the batch's latent states: ``imagination_horizon`` steps of ``actor_model``, with the
    environment's parameters held out of the graph (gradients reach the actor through the
    imagined states, as in Dreamer's analytic value gradients), and the values of the imagined
    next states from ``value_model`` (held out too).

    With TorchRL's ``DreamerEnv`` and an actor the planner reproduces, the rollout runs on
    tensors (:class:`TensorImagination`: the same entries, numbers and gradients as
    ``env.rollout``, without a TensorDict per step); otherwise through ``env.rollout``.

    The lambda-returns use the value estimator's ``gamma`` and ``lmbda`` (``make_value_estimator``
    with ``TD0``: ``lmbda = 0``; ``TD1``: 1; ``TDLambda``, the default: its ``lmbda``).
    """

    default_value_estimator = ValueEstimators.TDLambda
    actor_model: nn.Module
    value_model: nn.Module
    imagination_horizon = Coefficient(low=1, integer=True)  # checked on assignment too

    def __init__(
        self,
        actor_model: nn.Module,
        value_model: nn.Module,
        model_based_env: ModelBasedEnvBase,
        *,
        imagination_horizon: int = 15,
        discount_loss: bool = True,
        gamma: float | None = None,
        lmbda: float | None = None,
    ) -> None:
        if gamma is not None or lmbda is not None:
            raise TypeError(GAMMA_LMBDA_ERROR)
        ImaginationLoss.imagination_horizon.check(imagination_horizon)
        super().__init__()
        self.actor_model = actor_model
        self.__dict__["value_model"] = value_model  # trained by the value loss, not this one
        self.model_based_env = model_based_env
        self._register_coefficients(imagination_horizon=imagination_horizon)
        self.discount_loss = discount_loss
        self._value_call = NetworkCall(value_model)
        self._rollout = TensorImagination(model_based_env, actor_model)

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
        """The imagined lambda-returns ``[*B, H, 1]``
        (:func:`rlloss.functional.imagined_lambda_return`) from the rewards and next-state values
        ``[*B, H, 1]``, discounted by ``continuation``."""
        gamma, lmbda = self._return_parameters()
        return rlf.imagined_lambda_return(reward, value, continuation, gamma, lmbda)

    def _imagine(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """The imagined trajectories ``[*B, H]`` and their next steps with the value written."""
        start = tensordict.select(*self._start_keys()).data
        with hold_out_net(self.model_based_env), set_exploration_type(ExplorationType.RANDOM):
            if self._rollout.enabled:
                fake_data, following = self._rollout(start, self.imagination_horizon)
            else:
                fake_data, following = self._env_rollout(start)
            with hold_out_net(self.value_model):
                value = self._value_call(following)[self.tensor_keys.value]
        following.set(self.tensor_keys.value, value)
        return fake_data, following

    def _env_rollout(self, start: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """TorchRL's rollout of the environment (any environment and actor) and its next steps."""
        start = self.model_based_env.reset(start.copy())
        fake_data = self.model_based_env.rollout(
            max_steps=self.imagination_horizon,
            policy=self.actor_model,
            auto_reset=False,
            tensordict=start,
            break_when_any_done=False,  # imagination never ends: no per-step done check
        )
        return fake_data, step_mdp(fake_data, keep_other=True)

    def _step_weights(self, continuation: torch.Tensor) -> torch.Tensor:
        """``w_t = c_0 prod_{k<=t} gamma c_k`` (``discount_loss``), else ones; no gradient."""
        if not self.discount_loss:
            return torch.ones_like(continuation)
        gamma, _ = self._return_parameters()
        return rlf.imagination_weights(continuation, gamma).detach()


class ReturnPercentiles(CoefficientOwner, nn.Module):
    """Moving averages of the low and high percentiles of the imagined returns and the scale
    ``max(min_scale, high - low)`` (DreamerV3 eq. 12): buffers ``low`` and ``high`` (``[1]``),
    updated in place by :meth:`update` without a host sync. ``rate`` and ``min_scale`` are
    checked on assignment as at construction."""

    rate = Coefficient(low=0.0, high=1.0)
    min_scale = Coefficient(low=0.0, low_open=True)

    def __init__(
        self, quantiles: tuple[float, float] = (0.05, 0.95), rate: float = 0.01, min_scale=1.0
    ) -> None:
        super().__init__()
        low, high = quantiles
        if not 0 <= low < high <= 1:
            raise ValueError(f"quantiles must satisfy 0 <= low < high <= 1, got {quantiles}.")
        ReturnPercentiles.rate.check(rate, "return_normalization_rate")
        ReturnPercentiles.min_scale.check(min_scale, "return_normalization_min_scale")
        self._register_coefficients(rate=rate, min_scale=min_scale)
        self.quantiles = (float(low), float(high))
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
