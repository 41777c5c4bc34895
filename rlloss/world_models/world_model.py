"""``WorldModelLoss``: supervised losses of a learned model on real transitions.

The model-learning step of model-based RL (e.g. Sutton's Dyna, Janner et al.'s MBPO,
arXiv:1906.08253): a model predicting the reward, the episode end, the observation (through a
decoder) or the next latent state is regressed on the replayed transitions.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import check_choice
from rlloss.common import accepts_tensor_arguments
from rlloss.functional.critic import DISTANCES
from rlloss.world_models.base import WorldModelLossBase

SUB_LOSSES = ("reward", "done", "reconstruction", "latent")


class WorldModelLoss(WorldModelLossBase):
    r"""The world model's losses on real transitions, each

    $$
    \mathcal{L}_k = w_k \frac{1}{N} \sum L_k(\hat{x}_k, x_k)
    $$

    with $L_k$ its distance (``"l2"``, ``"l1"`` or ``"smooth_l1"``) and $w_k$ its weight:

    - ``loss_reward``: the predicted ``("next", reward)`` against the real reward;
    - ``loss_done``: the predicted ``("next", done)`` against the real done flag (as floats);
    - ``loss_reconstruction``: ``reconstructed_observation`` against ``observation``;
    - ``loss_latent``: ``predicted_latent`` against ``target_latent``.

    The real ``("next", reward)``, ``("next", done)`` and ``("next", terminated)`` are moved to
    ``("next", true_<name>)`` in a copy of the batch before the model runs (only for the active
    losses), so the model writes its predictions under the original keys.

    TorchRL's ``WorldModelLoss`` with the same keywords, keys and outputs.

    Reference: Ha and Schmidhuber, "World Models", arXiv:1803.10122.

    Args:
        world_model: a module called on the batch (TorchRL's ``WorldModel``).
        losses: which of ``"reward"``, ``"done"``, ``"reconstruction"``, ``"latent"`` (default
            ``["reward"]``).
        reward_loss: distances (``"l2"``).
        done_loss: distances (``"l2"``).
        reconstruction_loss: distances (``"l2"``).
        latent_loss: distances (``"l2"``).
        reward_weight: weights (1.0, >= 0).
        done_weight: weights (1.0, >= 0).
        reconstruction_weight: weights (1.0, >= 0).
        latent_weight: weights (1.0, >= 0).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torchrl.modules import MLP
        >>> from rlloss import WorldModelLoss
        >>> world_model = TensorDictSequential(  # predicts the next reward and done of (s, a)
        ...     TensorDictModule(
        ...         MLP(in_features=4, out_features=1, num_cells=[8]),
        ...         ["observation", "action"],
        ...         [("next", "reward")],
        ...     ),
        ...     TensorDictModule(
        ...         MLP(in_features=4, out_features=1, num_cells=[8]),
        ...         ["observation", "action"],
        ...         [("next", "done")],
        ...     ),
        ... )
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.randn(8, 1),
        ...         "next": {
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = WorldModelLoss(world_model, losses=["reward", "done"])
        >>> out = loss(batch)
        >>> (out["loss_reward"] + out["loss_done"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by WorldModelLoss (``reward``, ``done``, ``terminated`` and their ``true_``
        forms under "next")."""

        reward: NestedKey = "reward"  # the real reward, then the model's prediction, [*B, 1]
        true_reward: NestedKey = "true_reward"  # written: the real reward, moved aside, [*B, 1]
        done: NestedKey = "done"  # the real done flag, then the model's prediction, [*B, 1]
        true_done: NestedKey = "true_done"  # written: the real done flag, moved aside, [*B, 1]
        terminated: NestedKey = "terminated"  # the real flag, then the model's prediction, [*B, 1]
        true_terminated: NestedKey = "true_terminated"  # written: the real flag, aside, [*B, 1]
        observation: NestedKey = "observation"  # the observation, [*B, *O]
        reconstructed_observation: NestedKey = "reconstructed_observation"  # the model's, [*B, *O]
        predicted_latent: NestedKey = "predicted_latent"  # the model's next latent, [*B, Z]
        target_latent: NestedKey = "target_latent"  # the encoder's next latent, [*B, Z]
    _choices = {
        **WorldModelLossBase._choices,
        **{f"{name}_loss": DISTANCES for name in SUB_LOSSES},
    }

    def __init__(
        self,
        world_model: nn.Module,
        *,
        losses: list[str] | None = None,
        reward_loss: str = "l2",
        done_loss: str = "l2",
        reconstruction_loss: str = "l2",
        latent_loss: str = "l2",
        reward_weight: float = 1.0,
        done_weight: float = 1.0,
        reconstruction_weight: float = 1.0,
        latent_weight: float = 1.0,
    ) -> None:
        losses = ["reward"] if losses is None else list(losses)
        unknown = set(losses) - set(SUB_LOSSES)
        if unknown:
            raise ValueError(
                f"Unknown loss type(s): {unknown}. Valid choices are {sorted(SUB_LOSSES)}."
            )
        distances = {"reward_loss": reward_loss, "done_loss": done_loss}
        distances.update(reconstruction_loss=reconstruction_loss, latent_loss=latent_loss)
        for name, kind in distances.items():
            check_choice(name, kind, DISTANCES)
        weights = {"reward_weight": reward_weight, "done_weight": done_weight}
        weights.update(reconstruction_weight=reconstruction_weight, latent_weight=latent_weight)
        super().__init__(world_model, **weights)
        self.losses = losses
        self.__dict__.update(distances)

    @property
    def out_keys(self) -> list[str]:
        return [f"loss_{name}" for name in self.losses]

    def _term(self, output, name: str, prediction: str, target: str, nested: bool) -> torch.Tensor:
        predicted = self._get(output, prediction, nested=nested)
        real = self._get(output, target, nested=nested)
        if name == "done":
            predicted, real = predicted.float(), real.float()
        kind, weight = getattr(self, f"{name}_loss"), getattr(self, f"{name}_weight")
        return weight * rlf.distance(predicted, real, kind).mean()

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The active losses, each a 0-dim tensor."""
        labels = ("reward",) if "reward" in self.losses else ()
        if "done" in self.losses:  # the real done is required (TorchRL's rename), terminated not
            labels, optional = (*labels, "done"), ("terminated",)
        else:
            optional = ()
        output = self._run_world_model(tensordict, labels, optional)
        entries = {
            "reward": ("reward", "true_reward", True),
            "done": ("done", "true_done", True),
            "reconstruction": ("reconstructed_observation", "observation", False),
            "latent": ("predicted_latent", "target_latent", False),
        }
        out = {f"loss_{name}": self._term(output, name, *entries[name]) for name in self.losses}
        return TensorDict(out)
