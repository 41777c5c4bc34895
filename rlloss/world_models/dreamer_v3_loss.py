"""``DreamerV3Loss``: one DreamerV3 update's objectives from real sequences.

Hafner et al., "Mastering Diverse Domains through World Models", arXiv:2301.04104, section 3:
the world model on real sequences, the actor and critic on trajectories imagined from every
posterior state, and (``replay_value_loss_weight``, 0.3 in the paper) the critic on the replayed
sequences, bootstrapped by the imagined returns.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss._checks import Coefficient, _readable_number, next_key
from rlloss.common import LossModule, accepts_tensor_arguments


class DreamerV3Loss(LossModule):
    r"""DreamerV3's model, actor, value and replay-value objectives, composed.

    $$
    \mathcal{L} = \mathcal{L}_{\text{model}} + \mathcal{L}_{\text{actor}}
    + \mathcal{L}_{\text{value}} + w_{\text{replay}} \mathcal{L}_{\text{replay\_value}}
    $$

    ``forward(sample)`` (real sequences ``[B, T]``) runs ``model_loss`` (its posterior
    features), ``actor_loss`` from the ``B T`` detached posterior states ``("next", state)`` /
    ``("next", belief)``, ``value_loss`` on the detached imagined trajectories and, with a
    nonzero ``replay_value_loss_weight``, ``value_loss.replay_value_loss`` on the posterior
    features with each state's first imagined return as bootstrap. The output holds every
    entry of the three losses (the model's squeezed to 0-dim), ``loss_replay_value`` (weighted),
    ``replay_value`` (unweighted, detached) and, under ``tensor_keys.replay_context``, the
    detached posterior ``state`` and ``belief`` ``[B, T]``; the objective is the sum of the
    ``loss_*`` entries.

    TorchRL's ``DreamerV3Loss`` with the same keywords, keys and outputs; the three losses may be
    rlloss's or TorchRL's.

    Reference: Hafner et al., "Mastering Diverse Domains through World Models",
    arXiv:2301.04104.

    Args:
        model_loss: a ``DreamerV3ModelLoss`` (``detach_output=False`` when the replay value
            weight is nonzero: the replay critic loss trains the representation).
        actor_loss: a ``DreamerV3ActorLoss``; value_loss: a ``DreamerV3ValueLoss``.
        replay_value_loss_weight: >= 0 (0.3); continuation_horizon: the replay returns' horizon
            (discount ``1 - 1 / horizon``, 333); lmbda: their lambda (0.95).

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
        >>> from torchrl.modules import (
        ...     MLP,
        ...     RSSMPriorV3,
        ...     SymExpTwoHot,
        ...     TanhNormal,
        ...     WorldModelWrapper,
        ... )
        >>> from torchrl.objectives import ValueEstimators
        >>> from rlloss import (
        ...     DreamerV3ActorLoss,
        ...     DreamerV3Loss,
        ...     DreamerV3ModelLoss,
        ...     DreamerV3ValueLoss,
        ... )
        >>> class WorldModel(torch.nn.Module):  # latent: 3 categoricals of 5 classes, a belief of 6
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.prior, self.posterior = (
        ...             torch.nn.Linear(21, 15),
        ...             torch.nn.Linear(21 + 4, 15),
        ...         )
        ...         self.decoder, self.reward = torch.nn.Linear(21, 4), torch.nn.Linear(21, 255)
        ...         self.decode, self.belief = SymExpTwoHot(255), torch.nn.Linear(21 + 4, 6)
        ...     def forward(self, td):
        ...         latent = torch.cat([td["state"], td["belief"]], -1)
        ...         seen = torch.cat([latent, td["next", "pixels"]], -1)
        ...         td["next", "prior_logits"] = self.prior(latent).unflatten(-1, (3, 5))
        ...         td["next", "posterior_logits"] = self.posterior(seen).unflatten(-1, (3, 5))
        ...         td["next", "reco_pixels"] = self.decoder(latent)
        ...         td["next", "reward_logits"] = self.reward(latent)
        ...         td["next", "reward"] = self.decode(td["next", "reward_logits"])
        ...         posterior = td["next", "posterior_logits"].softmax(-1)
        ...         td["next", "state"] = posterior.flatten(-2)  # the posterior features
        ...         td["next", "belief"] = torch.tanh(self.belief(seen))
        ...         return td
        >>> sequences = TensorDict(  # [B, T] real transitions
        ...     {
        ...         "state": torch.randn(2, 4, 15),
        ...         "belief": torch.randn(2, 4, 6),
        ...         "next": {
        ...             "pixels": torch.randn(2, 4, 4),
        ...             "reward": torch.randn(2, 4, 1),
        ...             "done": torch.zeros(2, 4, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(2, 4, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [2, 4],
        ... )
        >>> model_loss = DreamerV3ModelLoss(WorldModel(), num_reward_bins=255, detach_output=False)
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
        >>> value_loss = DreamerV3ValueLoss(value, actor_loss=actor_loss)
        >>> loss = DreamerV3Loss(model_loss, actor_loss, value_loss)
        >>> out = loss(
        ...     sequences
        ... )  # the model's, the actor's, the value's and the replay value's losses
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Posterior feature keys (under "next"), the reset marker and the returned context."""

        state: NestedKey = "state"  # the posterior's stochastic state, under "next", [*B, T, S]
        belief: NestedKey = "belief"  # the posterior's belief, under "next", [*B, T, H]
        is_init: NestedKey = "is_init"  # marks the first step of a sequence, [*B, T, 1]
        replay_context: NestedKey = "replay_context"  # written: detached state, belief, [*B, T]

    # checked at construction and on assignment
    replay_value_loss_weight = Coefficient(low=0.0)
    continuation_horizon = Coefficient(low=1.0)
    lmbda = Coefficient(low=0.0, high=1.0)  # the estimators' range

    def __init__(
        self,
        model_loss: nn.Module,
        actor_loss: nn.Module,
        value_loss: nn.Module,
        *,
        replay_value_loss_weight: float = 0.3,
        continuation_horizon: float = 333.0,
        lmbda: float = 0.95,
    ) -> None:
        super().__init__()
        if replay_value_loss_weight < 0:  # TorchRL's words
            raise ValueError(
                f"replay_value_loss_weight must be non-negative, got {replay_value_loss_weight}."
            )
        if replay_value_loss_weight and model_loss.detach_output:
            raise ValueError("Replay-value learning requires model_loss.detach_output=False.")
        self._register_coefficients(
            replay_value_loss_weight=replay_value_loss_weight,
            continuation_horizon=continuation_horizon,
            lmbda=lmbda,
        )
        self.model_loss, self.actor_loss, self.value_loss = model_loss, actor_loss, value_loss

    def __setattr__(self, name: str, value) -> None:
        if name == "replay_value_loss_weight":  # the constructor's rule, on assignment too
            check_replay_output(value, getattr(self, "model_loss", None))
        super().__setattr__(name, value)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass

    @property
    def in_keys(self) -> list[NestedKey]:
        """The world model's inputs, the reset marker and the real transition targets."""
        model_keys, value_keys = self.model_loss.tensor_keys, self.value_loss.tensor_keys
        observations = (
            model_keys.pixels if isinstance(model_keys.pixels, list) else [model_keys.pixels]
        )
        targets = [*observations, model_keys.reward, value_keys.reward]
        targets += [value_keys.done, value_keys.terminated]
        keys = [*self.model_loss.world_model.in_keys, self.tensor_keys.is_init]
        return list(dict.fromkeys([*keys, *(next_key(key) for key in targets)]))

    def _imagination_start(self, posterior: TensorDictBase, size: int) -> TensorDict:
        """The detached posterior states, flattened to ``[B T]``: the actor loss's batch."""
        keys = self.actor_loss.tensor_keys
        start = {}
        for own, theirs in (
            (self.tensor_keys.state, keys.state),
            (self.tensor_keys.belief, keys.belief),
        ):
            value = posterior.get(next_key(own)).detach()
            start[theirs] = value.reshape(-1, value.shape[-1])
        return TensorDict(start, [size])

    def _replay_value(self, sample, posterior, imagined) -> torch.Tensor:
        keys = self.value_loss.tensor_keys
        features = posterior.get("next").select(*self.value_loss.value_model.in_keys)
        bootstrap = imagined.get("lambda_target")[..., 0, 0].reshape(sample.batch_size)
        features.set(keys.bootstrap, bootstrap)
        features.set("next", sample.get("next").select(keys.reward, keys.done, keys.terminated))
        losses = self.value_loss.replay_value_loss(
            features, horizon=self.continuation_horizon, lmbda=self.lmbda
        )
        return losses["loss_replay_value"]

    @accepts_tensor_arguments
    def forward(self, sample: TensorDictBase) -> TensorDict:
        """Every objective of one DreamerV3 update and the detached posterior features."""
        model_losses, posterior = self.model_loss(sample)
        actor_losses, imagined = self.actor_loss(self._imagination_start(posterior, sample.numel()))
        value_losses, _ = self.value_loss(imagined.detach())
        replay_value = imagined.get("lambda_target").new_zeros(())
        if self.replay_value_loss_weight:
            check_replay_output(self.replay_value_loss_weight, self.model_loss)  # no tensor read
            replay_value = self._replay_value(sample, posterior, imagined)
        result = model_losses.apply(torch.squeeze)
        result.update(actor_losses).update(value_losses)
        result.set("loss_replay_value", self.replay_value_loss_weight * replay_value)
        result.set("replay_value", replay_value.detach())
        context = posterior.get("next").select(self.tensor_keys.state, self.tensor_keys.belief)
        result.set(self.tensor_keys.replay_context, context.detach())
        return result


def check_replay_output(weight, model_loss) -> None:
    """A positive ``replay_value_loss_weight`` needs the model loss's output with its graph
    (``detach_output=False``): refused otherwise, naming both settings and the fix. Python
    settings only (a device tensor weight is not read)."""
    if model_loss is None or not model_loss.detach_output or not _readable_number(weight):
        return
    if float(weight) > 0:
        raise ValueError(
            f"replay_value_loss_weight must be 0 while model_loss.detach_output is True, got "
            f"{float(weight)}: replay-value learning needs the world model's output with its "
            "graph; build the DreamerV3ModelLoss with detach_output=False (or set "
            "loss.model_loss.detach_output = False), or set replay_value_loss_weight = 0."
        )
