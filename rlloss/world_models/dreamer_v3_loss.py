"""``DreamerV3Loss``: one DreamerV3 update's objectives from real sequences.

Hafner et al., "Mastering Diverse Domains through World Models", arXiv:2301.04104, section 3:
the world model on real sequences, the actor and critic on trajectories imagined from every
posterior state, and (``replay_value_loss_weight``, 0.3 in the paper) the critic on the replayed
sequences, bootstrapped by the imagined returns.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss._checks import check_in_range, next_key
from rlloss.common import LossModule, accepted_keys, accepts_tensor_arguments


class DreamerV3Loss(LossModule):
    """DreamerV3's model, actor, value and replay-value objectives, composed.

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

    Args:
        model_loss: a ``DreamerV3ModelLoss`` (``detach_output=False`` when the replay value
            weight is nonzero: the replay critic loss trains the representation).
        actor_loss: a ``DreamerV3ActorLoss``; value_loss: a ``DreamerV3ValueLoss``.
        replay_value_loss_weight: >= 0 (0.3); continuation_horizon: the replay returns' horizon
            (discount ``1 - 1 / horizon``, 333); lmbda: their lambda (0.95).

    Examples:
        >>> loss = DreamerV3Loss(model_loss, actor_loss, value_loss)
        >>> out = loss(sequences)
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    """

    _AcceptedKeys = accepted_keys(
        """Posterior feature keys (under "next"), the reset marker and the returned context;
        each defaults to its name.""",
        "state belief is_init replay_context",
    )

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
        if replay_value_loss_weight < 0:
            raise ValueError("replay_value_loss_weight must be non-negative.")
        if replay_value_loss_weight and model_loss.detach_output:
            raise ValueError("Replay-value learning requires model_loss.detach_output=False.")
        check_in_range("continuation_horizon", continuation_horizon, 1.0)
        self.model_loss, self.actor_loss, self.value_loss = model_loss, actor_loss, value_loss
        self.replay_value_loss_weight = replay_value_loss_weight
        self.continuation_horizon, self.lmbda = continuation_horizon, lmbda

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
            replay_value = self._replay_value(sample, posterior, imagined)
        result = model_losses.apply(torch.squeeze)
        result.update(actor_losses).update(value_losses)
        result.set("loss_replay_value", self.replay_value_loss_weight * replay_value)
        result.set("replay_value", replay_value.detach())
        context = posterior.get("next").select(self.tensor_keys.state, self.tensor_keys.belief)
        result.set(self.tensor_keys.replay_context, context.detach())
        return result
