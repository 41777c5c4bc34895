"""``DreamerV3ActorLoss``: DreamerV3's actor, trained on imagined trajectories.

Hafner et al., "Mastering Diverse Domains through World Models", arXiv:2301.04104, section 3
("actor learning", eq. 11-12): the returns of imagined trajectories, scaled down by the moving
5th-95th percentile range, are maximised by their gradient through the imagined dynamics (or by
REINFORCE with the critic as baseline), with an entropy bonus.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.objectives.utils import hold_out_net

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall
from rlloss.common import accepts_tensor_arguments
from rlloss.world_models.imagination import ImaginationLoss, ReturnPercentiles, trailing_like

if TYPE_CHECKING:
    from torchrl.envs.model_based import ModelBasedEnvBase


class DreamerV3ActorLoss(ImaginationLoss):
    r"""DreamerV3's actor loss.

    From the batch's latent states (``state``, ``belief``), ``model_based_env`` imagines
    ``imagination_horizon`` steps of the actor; with ``R_t`` the lambda-returns
    (``continuation_model`` giving the continuation probabilities ``c_t``, else 1),
    ``w_t = c_0 prod gamma c_k`` the step weights (``discount_loss``) and
    ``S = max(min_scale, EMA(P95(R)) - EMA(P5(R)))``:

    $$
    \mathcal{L}_{\text{actor}} = -\frac{1}{N} \sum_t \frac{w_t R_t}{S}
    - \eta \frac{1}{N} \sum_t w_t H[\pi(\cdot \mid s_t)], \qquad
    S = \max\big(s_{\min}, \mathrm{EMA}(P_{95}(R)) - \mathrm{EMA}(P_{5}(R))\big)
    $$

    (reparameterised; the second form below with ``use_reinforce=True``):

    - ``loss_actor = -mean(w_t R_t / S) - eta mean(w_t H[pi(.|s_t)])`` (reparameterised), or
    - ``loss_actor = -mean(w_t log pi(a_t|s_t) sg(R_t - v(s_t)) / S) - eta mean(w_t H)``
      (``use_reinforce=True``: the action and state are detached, the critic is the baseline).

    Outputs ``loss_actor``, ``actor_entropy`` (detached, weighted), ``return_low``,
    ``return_high``, ``return_scale`` and ``continuation_mean``; ``forward`` returns
    ``(losses, imagined)`` where ``imagined`` (``[*B, H]``) holds ``lambda_target`` and
    ``discount_weight``, the value loss's inputs. The percentiles are updated in training mode
    only (``loss.eval()`` freezes them); they are ``retnorm.low`` / ``retnorm.high`` in the state
    dict (older ``return_low`` / ``return_high`` entries are read too).

    TorchRL's ``DreamerV3ActorLoss`` with the same keywords, keys and outputs.

    Reference: Hafner et al., "Mastering Diverse Domains through World Models",
    arXiv:2301.04104.

    Args:
        actor_model: a probabilistic actor over ``state`` and ``belief``.
        value_model: the critic (writes ``state_value``), shared with the value loss.
        model_based_env: the imagination environment (TorchRL's ``DreamerEnv``).
        continuation_model: writes ``continuation`` probabilities of a state, or ``None``.
        imagination_horizon: H (15); discount_loss: weight the steps (``True``).
        entropy_bonus: eta (3e-4); use_reinforce: REINFORCE instead of the pathwise gradient.
        return_normalization: scale by the percentile range (``True``), with its EMA ``rate``
            (0.01), ``quantiles`` ((0.05, 0.95)) and ``min_scale`` (1.0).

    Differences from TorchRL: without a continuation model the targets are the lambda-returns
    of eq. 7 (TorchRL 0.14.1 computes ``r_t + gamma v_{t+1}`` there, see docs/differences.md);
    the percentiles are read from a sort (no ``torch.quantile`` host-side check of its levels).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import (
        ...     NormalParamExtractor,
        ...     ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential,
        ...     TensorDictModule,
        ... )
        >>> from torchrl.data import Bounded, Composite, Unbounded
        >>> from torchrl.envs.model_based import DreamerEnv
        >>> from torchrl.modules import MLP, RSSMPriorV3, TanhNormal, WorldModelWrapper
        >>> from torchrl.objectives import ValueEstimators
        >>> from rlloss import DreamerV3ActorLoss
        >>> prior = RSSMPriorV3(
        ...     action_shape=(2,),
        ...     hidden_dim=8,
        ...     rnn_hidden_dim=6,
        ...     num_categoricals=3,
        ...     num_classes=5,
        ...     action_dim=2,
        ... )  # latent: 3 x 5 categoricals, a belief of 6
        >>> dreamer_env = DreamerEnv(
        ...     WorldModelWrapper(
        ...         TensorDictModule(
        ...             prior, ["state", "belief", "action"], ["_", "state", "belief"]
        ...         ),
        ...         TensorDictModule(
        ...             MLP(in_features=21, out_features=1, num_cells=[8]),
        ...             ["state", "belief"],
        ...             ["reward"],
        ...         ),
        ...     ),
        ...     prior_shape=(15,),
        ...     belief_shape=(6,),
        ... )
        >>> dreamer_env.observation_spec = Composite(state=Unbounded(15), belief=Unbounded(6))
        >>> dreamer_env.state_spec = dreamer_env.observation_spec.clone()
        >>> dreamer_env.action_spec, dreamer_env.reward_spec = Bounded(-1, 1, (2,)), Unbounded((1,))
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(
        ...         MLP(in_features=21, out_features=4, num_cells=[8]),
        ...         ["state", "belief"],
        ...         ["params"],
        ...     ),
        ...     TensorDictModule(NormalParamExtractor(), ["params"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(
        ...         in_keys=["loc", "scale"],
        ...         out_keys=["action"],
        ...         distribution_class=TanhNormal,
        ...         return_log_prob=True,
        ...         log_prob_key="action_log_prob",
        ...     ),
        ... )
        >>> value = TensorDictModule(
        ...     MLP(in_features=21, out_features=1, num_cells=[8]),
        ...     ["state", "belief"],
        ...     ["state_value"],
        ... )
        >>> actor_loss = DreamerV3ActorLoss(actor, value, dreamer_env, imagination_horizon=15)
        >>> actor_loss.make_value_estimator(ValueEstimators.TDLambda, gamma=0.997, lmbda=0.95)
        >>> posterior_states = TensorDict(
        ...     state=torch.randn(5, 15), belief=torch.randn(5, 6), batch_size=[5]
        ... )  # [N] latent states of the world model
        >>> losses, imagined = actor_loss(posterior_states)
        >>> losses["loss_actor"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read and written by DreamerV3ActorLoss."""

        state: NestedKey = "state"  # the latent state, [*B, S]
        belief: NestedKey = "belief"  # the latent belief, [*B, H]
        reward: NestedKey = "reward"  # the imagined reward, under "next", [*B, T, 1]
        value: NestedKey = "state_value"  # the critic's V(s), [*B, T, 1]
        action: NestedKey = "action"  # the actor's output, [*B, T, A]
        action_log_prob: NestedKey = "action_log_prob"  # the actor's output, [*B, T]
        done: NestedKey = "done"  # imagined episode end, [*B, T, 1]
        terminated: NestedKey = "terminated"  # imagined termination, [*B, T, 1]
        continuation: NestedKey = "continuation"  # written by continuation_model, [*B, T, 1]
        discount_weight: NestedKey = "discount_weight"  # written into the imagined data, [*B, T, 1]

    entropy_bonus = Coefficient(low=0.0)

    def __init__(
        self,
        actor_model: nn.Module,
        value_model: nn.Module,
        model_based_env: ModelBasedEnvBase,
        *,
        continuation_model: nn.Module | None = None,
        imagination_horizon: int = 15,
        discount_loss: bool = True,
        entropy_bonus: float = 3e-4,
        use_reinforce: bool = False,
        return_normalization: bool = True,
        return_normalization_rate: float = 0.01,
        return_normalization_quantiles: tuple[float, float] = (0.05, 0.95),
        return_normalization_min_scale: float = 1.0,
        gamma: float | None = None,
        lmbda: float | None = None,
    ) -> None:
        horizon = {"imagination_horizon": imagination_horizon, "discount_loss": discount_loss}
        super().__init__(
            actor_model, value_model, model_based_env, gamma=gamma, lmbda=lmbda, **horizon
        )
        self.__dict__["continuation_model"] = continuation_model
        self._register_coefficients(entropy_bonus=entropy_bonus)  # checked: >= 0
        self.use_reinforce = use_reinforce
        self.return_normalization = return_normalization
        self.retnorm = ReturnPercentiles(
            return_normalization_quantiles,
            return_normalization_rate,
            return_normalization_min_scale,
        )
        self._actor_call = DistributionCall(actor_model)
        self._continuation_call = NetworkCall(continuation_model) if continuation_model else None

    return_normalization_rate = property(lambda self: self.retnorm.rate)
    return_normalization_quantiles = property(lambda self: self.retnorm.quantiles)
    return_normalization_min_scale = property(lambda self: self.retnorm.min_scale)

    @property
    def return_low(self) -> torch.Tensor:
        """The moving low percentile (a 0-dim view of ``retnorm.low``)."""
        return self.retnorm.low.squeeze(-1)

    @property
    def return_high(self) -> torch.Tensor:
        """The moving high percentile (a 0-dim view of ``retnorm.high``)."""
        return self.retnorm.high.squeeze(-1)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``; the entries ``return_low`` / ``return_high`` of older
        checkpoints are read as ``retnorm.low`` / ``retnorm.high``."""
        state_dict = dict(state_dict)
        for legacy, current in (("return_low", "retnorm.low"), ("return_high", "retnorm.high")):
            if legacy in state_dict and current not in state_dict:
                state_dict[current] = state_dict.pop(legacy).reshape(self.retnorm.low.shape)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _return_scale(self, returns: torch.Tensor) -> torch.Tensor:
        """The return scale ``S`` (0-dim); updates the percentiles in training mode."""
        if not self.return_normalization:
            return torch.ones((), dtype=returns.dtype, device=returns.device)
        if self.training:
            self.retnorm.update(returns)
        return self.retnorm.scale().squeeze(-1)

    def _continuations(self, fake_data, following) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(c_1..c_H, c_0..c_{H-1})``: the continuation probabilities of the next states and of
        the states (``None`` and ones without a continuation model); written into the data."""
        if self._continuation_call is None:
            return None, torch.ones_like(fake_data.get(("next", self.tensor_keys.reward)))
        key = self.tensor_keys.continuation
        with hold_out_net(self.__dict__["continuation_model"]):
            first = self._continuation_call(fake_data[..., :1])[key]
            continuation = self._continuation_call(following)[key]
        root = torch.cat([first, continuation[..., :-1, :]], dim=-2)
        fake_data.set(key, root)
        fake_data.set(("next", key), continuation)
        return continuation, root

    def _objective(self, fake_data, lambda_target, weights, distribution) -> tuple:
        """``(-loss term of the returns, S)``: pathwise or REINFORCE."""
        if not self.use_reinforce:
            scale = self._return_scale(lambda_target)
            return (weights * lambda_target / scale).mean(), scale
        action = fake_data.get(self.tensor_keys.action).detach()
        log_prob = trailing_like(distribution.log_prob(action), lambda_target)
        with hold_out_net(self.value_model):
            baseline = self._value_call(fake_data)[self.tensor_keys.value]
        advantage = (lambda_target - baseline).detach()
        scale = self._return_scale(lambda_target)
        objective = rlf.policy_gradient_objective(log_prob, advantage / scale)
        return (weights * objective).mean(), scale

    def _entropy(self, distribution, weights: torch.Tensor) -> torch.Tensor:
        """``mean(w_t H[pi(.|s_t)])`` (analytic, else ``-log pi`` of one reparameterised draw)."""
        if rlf.has_analytic_entropy(distribution):
            entropy = distribution.entropy()
        else:
            entropy = -distribution.log_prob(distribution.rsample())
        return (weights * trailing_like(entropy, weights)).mean()

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """The actor loss and diagnostics, and the imagined trajectories."""
        fake_data, following = self._imagine(tensordict)
        continuation, root = self._continuations(fake_data, following)
        reward = fake_data.get(("next", self.tensor_keys.reward))
        lambda_target = self.lambda_target(
            reward, following.get(self.tensor_keys.value), continuation
        )
        fake_data.set("lambda_target", lambda_target)
        weights = self._step_weights(root)
        fake_data.set(self.tensor_keys.discount_weight, weights)
        distribution = None
        if self.use_reinforce or self.entropy_bonus > 0:
            inputs = fake_data.select(*self.actor_model.in_keys, strict=False).detach()
            distribution = self._actor_call(inputs)
        objective, scale = self._objective(fake_data, lambda_target, weights, distribution)
        loss = -objective
        entropy = loss.new_zeros(())
        if self.entropy_bonus > 0:
            entropy = self._entropy(distribution, weights)
            loss = loss - self.entropy_bonus * entropy
        mean_continuation = torch.ones((), device=loss.device)
        if continuation is not None:
            mean_continuation = continuation.mean().detach()
        out = {"loss_actor": loss, "actor_entropy": entropy.detach()}
        out.update(
            return_low=self.return_low.detach().clone(),
            return_high=self.return_high.detach().clone(),
        )
        out.update(return_scale=scale.detach().clone(), continuation_mean=mean_continuation)
        return TensorDict(out, []), fake_data.data
