"""DreamerV1's losses: ``DreamerModelLoss``, ``DreamerActorLoss``, ``DreamerValueLoss``.

Hafner, Lillicrap, Ba and Norouzi, "Dream to Control: Learning Behaviors by Latent
Imagination", arXiv:1912.01603. A Gaussian recurrent state-space model learnt by reconstruction,
reward prediction and a KL with free nats (section 4); an actor maximising the lambda-returns of
imagined trajectories by their analytic gradient through the model, and a critic regressing
them (section 3, eq. 5-8).
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice
from rlloss._networks import NetworkCall
from rlloss.common import LossModule, accepts_tensor_arguments
from rlloss.functional.critic import DISTANCES
from rlloss.world_models.base import WorldModelLossBase, imagined_lambda_target
from rlloss.world_models.imagination import ImaginationLoss


class DreamerModelLoss(WorldModelLossBase):
    r"""DreamerV1's world-model loss on real sequences ``[B, T]``:

    $$
    \mathcal{L}_{\text{model\_kl}} = \lambda_{\text{kl}} \frac{1}{N} \sum
    \max\big(\mathrm{KL}(q \,\|\, p), \text{free\_nats}\big), \qquad
    \mathcal{L}_{\text{model\_reco}} = \lambda_{\text{reco}} \frac{1}{B T} \sum_{b, t}
    \sum_{c, h, w} L(o, \hat{o})
    $$

    in detail:

    - ``loss_model_kl = lambda_kl mean(max(KL(q || p), free_nats))`` for the Gaussian posterior
      ``q`` and prior ``p`` (KL summed over the state dims; with ``delayed_clamp`` the mean is
      clamped instead of each KL);
    - ``loss_model_reco = lambda_reco mean_{B,T} sum_{C,H,W} L(pixels, reco_pixels)``;
    - ``loss_model_reward = lambda_reward mean L(reward, predicted reward)``;

    ``L`` the ``reco_loss`` / ``reward_loss`` distance (``"l2"``, ``"l1"``, ``"smooth_l1"``);
    ``global_average`` averages over every dim instead of summing the event dims. ``forward``
    returns ``(losses, world_model_output.data)``, each loss of shape ``[1]``.

    TorchRL's ``DreamerModelLoss`` with the same keywords, keys and outputs (the real reward is
    moved to ``("next", true_reward)`` before the world model runs, as TorchRL does).

    Reference: Hafner et al., "Dream to Control: Learning Behaviors by Latent Imagination",
    arXiv:1912.01603.

    Args:
        world_model: TorchRL's ``WorldModelWrapper(world_modeler, reward_model)`` or any module
            writing the prior / posterior means and scales, ``reco_pixels`` and ``reward``
            under ``"next"``.
        lambda_kl: the KL term's weight (>= 0).
        lambda_reco: the reconstruction's weight (>= 0).
        lambda_reward: the reward prediction's weight (>= 0).
        reco_loss: the reconstruction's distance (``"l2"``, ``"l1"``, ``"smooth_l1"``).
        reward_loss: the reward prediction's distance.
        free_nats: the free-bits floor of the KL (3).
        delayed_clamp: clamp the batch-mean KL instead of each KL (``False``).
        global_average: average the KL over the state dims too, not sum (``False``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torchrl.modules import MLP, WorldModelWrapper
        >>> from rlloss import DreamerModelLoss
        >>> class Gaussian(
        ...     torch.nn.Module
        ... ):  # a mean and a positive scale of the state (5) from the latent
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.linear = torch.nn.Linear(5 + 6, 2 * 5)
        ...     def forward(self, state, belief):
        ...         mean, raw = self.linear(torch.cat([state, belief], -1)).chunk(2, -1)
        ...         return mean, torch.nn.functional.softplus(raw) + 0.1
        >>> latent = ["state", "belief"]
        >>> world_model = (
        ...     WorldModelWrapper(  # TorchRL's layout: the modeler ending in the decoder, reward
        ...         TensorDictSequential(
        ...             TensorDictModule(
        ...                 Gaussian(), latent, [("next", "prior_mean"), ("next", "prior_std")]
        ...             ),
        ...             TensorDictModule(
        ...                 Gaussian(),
        ...                 latent,
        ...                 [("next", "posterior_mean"), ("next", "posterior_std")],
        ...             ),
        ...             TensorDictModule(
        ...                 MLP(in_features=11, out_features=4, num_cells=[8]),
        ...                 latent,
        ...                 [("next", "reco_pixels")],
        ...             ),
        ...         ),
        ...         TensorDictModule(
        ...             MLP(in_features=11, out_features=1, num_cells=[8]),
        ...             latent,
        ...             [("next", "reward")],
        ...         ),
        ...     )
        ... )
        >>> sequences = TensorDict(
        ...     {
        ...         "state": torch.randn(2, 3, 5),
        ...         "belief": torch.randn(2, 3, 6),
        ...         "next": {"pixels": torch.rand(2, 3, 4), "reward": torch.randn(2, 3, 1)},
        ...     },
        ...     [2, 3],
        ... )
        >>> loss = DreamerModelLoss(world_model)
        >>> losses, posterior = loss(sequences)
        >>> (
        ...     losses["loss_model_kl"] + losses["loss_model_reco"] + losses["loss_model_reward"]
        ... ).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DreamerModelLoss, under "next"."""

        reward: NestedKey = "reward"  # the real reward, then the model's prediction, [*B, T, 1]
        true_reward: NestedKey = "true_reward"  # written: the real reward, moved aside, [*B, T, 1]
        prior_mean: NestedKey = "prior_mean"  # the prior's mean (the model's), [*B, T, S]
        prior_std: NestedKey = "prior_std"  # the prior's scale, [*B, T, S]
        posterior_mean: NestedKey = "posterior_mean"  # the posterior's mean, [*B, T, S]
        posterior_std: NestedKey = "posterior_std"  # the posterior's scale, [*B, T, S]
        pixels: NestedKey = "pixels"  # the observation, [*B, T, C, H, W]
        reco_pixels: NestedKey = "reco_pixels"  # its reconstruction, the model's, [*B, T, C, H, W]
    _choices = {**WorldModelLossBase._choices, "reco_loss": DISTANCES, "reward_loss": DISTANCES}

    def __init__(
        self,
        world_model: nn.Module,
        *,
        lambda_kl: float = 1.0,
        lambda_reco: float = 1.0,
        lambda_reward: float = 1.0,
        reco_loss: str | None = None,
        reward_loss: str | None = None,
        free_nats: int = 3,
        delayed_clamp: bool = False,
        global_average: bool = False,
    ) -> None:
        reco_loss, reward_loss = reco_loss or "l2", reward_loss or "l2"
        check_choice("reco_loss", reco_loss, DISTANCES)
        check_choice("reward_loss", reward_loss, DISTANCES)
        weights = {"lambda_kl": lambda_kl, "lambda_reco": lambda_reco}
        super().__init__(
            world_model, global_average=global_average, lambda_reward=lambda_reward, **weights
        )
        self.reco_loss, self.reward_loss = reco_loss, reward_loss
        self.free_nats, self.delayed_clamp = free_nats, delayed_clamp

    @property
    def decoder(self) -> nn.Module:
        """The observation decoder: the last module of the world modeler (TorchRL's layout)."""
        return self.world_model[0][-1]

    @property
    def reward_model(self) -> nn.Module:
        """The reward model: the second module of the world model (TorchRL's layout)."""
        return self.world_model[1]

    def kl_loss(self, prior_mean, prior_std, posterior_mean, posterior_std) -> torch.Tensor:
        """``mean(max(KL(q || p), free_nats))`` (0-dim), TorchRL's method of the same name."""
        kl = rlf.gaussian_kl(posterior_mean, posterior_std, prior_mean, prior_std)
        if not self.global_average:
            kl = kl.sum(-1)
        if self.delayed_clamp:
            return rlf.free_bits(kl.mean(), self.free_nats)
        return rlf.free_bits(kl, self.free_nats).mean()

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """The three losses and the world model's output (detached)."""
        output = self._run_world_model(tensordict, ("reward",))
        names = ("prior_mean", "prior_std", "posterior_mean", "posterior_std")
        kl = self.kl_loss(*(self._get(output, name, nested=True) for name in names))
        pixels = self._get(output, "pixels", nested=True)
        reco = rlf.distance(pixels, self._get(output, "reco_pixels", nested=True), self.reco_loss)
        if not self.global_average:
            reco = reco.sum((-3, -2, -1))
        true_reward = self._get(output, "true_reward", nested=True)
        reward = rlf.distance(
            true_reward, self._get(output, "reward", nested=True), self.reward_loss
        )
        if not self.global_average:
            reward = reward.squeeze(-1)
        out = {"loss_model_kl": self.lambda_kl * kl.unsqueeze(-1)}
        out["loss_model_reco"] = self.lambda_reco * reco.mean().unsqueeze(-1)
        out["loss_model_reward"] = self.lambda_reward * reward.mean().unsqueeze(-1)
        return TensorDict(out), output.data


class DreamerActorLoss(ImaginationLoss):
    r"""DreamerV1's actor loss over trajectories of ``imagination_horizon`` steps imagined from
    the batch's ``state`` / ``belief``:

    $$
    \mathcal{L}_{\text{actor}} = -\frac{1}{B} \sum_{b} \sum_t w_t R_t
    $$

    with $R_t$ the lambda-returns (:meth:`lambda_target`) and $w_t = \gamma^t$
    (``discount_loss``, default) or 1. Gradients reach the actor through the imagined dynamics
    (the environment's and the critic's parameters are held out). ``forward`` returns
    ``(losses, imagined)``, the imagined trajectories ``[N, H]`` with their ``lambda_target``
    (the value loss's input).

    TorchRL's ``DreamerActorLoss`` with the same keywords, keys and outputs; ``gamma`` and
    ``lmbda`` come from ``make_value_estimator`` (``TD0``, ``TD1``, ``TDLambda``).

    Differences from TorchRL: ``lambda_target`` is the lambda-return of eq. 6; TorchRL 0.14.1
    computes ``r_t + gamma v_{t+1}`` for every estimator (see docs/differences.md).

    Reference: Hafner et al., "Dream to Control: Learning Behaviors by Latent Imagination",
    arXiv:1912.01603.

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
        >>> from torchrl.modules import MLP, RSSMPrior, TanhNormal, WorldModelWrapper
        >>> from rlloss import DreamerActorLoss
        >>> prior = RSSMPrior(
        ...     action_spec=Bounded(-1, 1, (2,)),
        ...     hidden_dim=6,
        ...     rnn_hidden_dim=6,
        ...     state_dim=5,
        ...     action_dim=2,
        ... )  # latent: a state of 5, a belief of 6
        >>> dreamer_env = DreamerEnv(
        ...     WorldModelWrapper(
        ...         TensorDictModule(
        ...             prior, ["state", "belief", "action"], ["_", "_", "state", "belief"]
        ...         ),
        ...         TensorDictModule(
        ...             MLP(in_features=11, out_features=1, num_cells=[8]),
        ...             ["state", "belief"],
        ...             ["reward"],
        ...         ),
        ...     ),
        ...     prior_shape=(5,),
        ...     belief_shape=(6,),
        ... )
        >>> dreamer_env.observation_spec = Composite(state=Unbounded(5), belief=Unbounded(6))
        >>> dreamer_env.state_spec = dreamer_env.observation_spec.clone()
        >>> dreamer_env.action_spec, dreamer_env.reward_spec = Bounded(-1, 1, (2,)), Unbounded((1,))
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(
        ...         MLP(in_features=11, out_features=4, num_cells=[8]),
        ...         ["state", "belief"],
        ...         ["params"],
        ...     ),
        ...     TensorDictModule(NormalParamExtractor(), ["params"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(
        ...         in_keys=["loc", "scale"], out_keys=["action"], distribution_class=TanhNormal
        ...     ),
        ... )
        >>> value = TensorDictModule(
        ...     MLP(in_features=11, out_features=1, num_cells=[8]),
        ...     ["state", "belief"],
        ...     ["state_value"],
        ... )
        >>> actor_loss = DreamerActorLoss(actor, value, dreamer_env, imagination_horizon=15)
        >>> posterior_states = TensorDict(
        ...     state=torch.randn(4, 5), belief=torch.randn(4, 6), batch_size=[4]
        ... )  # [N] latent states of the world model
        >>> losses, imagined = actor_loss(posterior_states)
        >>> losses["loss_actor"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DreamerActorLoss (the start state is read under ``"state"``)."""

        belief: NestedKey = "belief"  # the latent belief, [*B, H]
        reward: NestedKey = "reward"  # the imagined reward, under "next", [*B, T, 1]
        value: NestedKey = "state_value"  # the critic's V(s), [*B, T, 1]
        done: NestedKey = "done"  # imagined episode end, [*B, T, 1]
        terminated: NestedKey = "terminated"  # imagined termination, [*B, T, 1]

    def _start_keys(self) -> list[NestedKey]:
        return ["state", self.tensor_keys.belief]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """The actor loss and the imagined trajectories."""
        fake_data, following = self._imagine(tensordict)
        reward = fake_data.get(("next", self.tensor_keys.reward))
        lambda_target = self.lambda_target(reward, following.get(self.tensor_keys.value))
        fake_data.set("lambda_target", lambda_target)
        weights = self._step_weights(torch.ones_like(lambda_target))
        loss = -(weights * lambda_target).sum((-2, -1)).mean()
        return TensorDict({"loss_actor": loss}, []), fake_data.data


class DreamerValueLoss(LossModule):
    r"""DreamerV1's value loss on the imagined states with their ``lambda_target`` $R_t$
    (written by :class:`DreamerActorLoss`):

    $$
    \mathcal{L}_{\text{value}} = \frac{1}{B} \sum_{b} \sum_t w_t L\big(v(s_t), R_t\big)
    $$

    with $w_t = \gamma^t$ (``discount_loss``, default) or 1, $L$ the ``value_loss`` distance
    (``"l2"``).

    TorchRL's ``DreamerValueLoss`` with the same keywords, keys and outputs; ``forward`` returns
    ``(losses, fake_data)``.

    Reference: Hafner et al., "Dream to Control: Learning Behaviors by Latent Imagination",
    arXiv:1912.01603.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MLP
        >>> from rlloss import DreamerValueLoss
        >>> value = TensorDictModule(
        ...     MLP(in_features=11, out_features=1, num_cells=[8]),
        ...     ["state", "belief"],
        ...     ["state_value"],
        ... )
        >>> imagined = TensorDict(  # what DreamerActorLoss returns: latent states and their targets
        ...     state=torch.randn(4, 15, 5),
        ...     belief=torch.randn(4, 15, 6),
        ...     lambda_target=torch.randn(4, 15, 1),
        ...     batch_size=[4, 15],
        ... )
        >>> value_loss = DreamerValueLoss(value, gamma=0.99)
        >>> losses, _ = value_loss(imagined.detach())
        >>> losses["loss_value"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DreamerValueLoss."""

        value: NestedKey = "state_value"  # written by the value network, [*B, T, 1]

    gamma = Coefficient(low=0.0, high=1.0)  # the estimators' range, on assignment too
    _choices = {**LossModule._choices, "value_loss": DISTANCES}

    def __init__(
        self,
        value_model: nn.Module,
        value_loss: str | None = None,
        discount_loss: bool = True,
        gamma: float = 0.99,
    ) -> None:
        super().__init__()
        value_loss = value_loss or "l2"
        check_choice("value_loss", value_loss, DISTANCES)
        self._register_coefficients(gamma=gamma)
        self.value_model = value_model
        self.value_loss, self.discount_loss = value_loss, discount_loss
        self._value_call = NetworkCall(value_model)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass

    @property
    def in_keys(self) -> list[NestedKey]:
        return [*self.value_model.in_keys, "lambda_target"]

    @accepts_tensor_arguments
    def forward(self, fake_data: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """The value loss on imagined states ``[N, H]`` with their ``lambda_target``."""
        target = imagined_lambda_target(self, fake_data, "DreamerActorLoss")
        value = self._value_call(fake_data)[self.tensor_keys.value]
        loss = rlf.distance(value, target, self.value_loss)
        if self.discount_loss:
            loss = rlf.imagination_weights(torch.ones_like(target), self.gamma) * loss
        return TensorDict({"loss_value": loss.sum((-1, -2)).mean()}), fake_data
