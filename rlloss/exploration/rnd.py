"""``RNDLoss``: the predictor's loss of Random Network Distillation (Burda et al., "Exploration
by Random Network Distillation", arXiv:1810.12894), and the intrinsic reward it gives."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._call_errors import CALL_ERRORS, explained
from rlloss._checks import Coefficient
from rlloss.common import accepts_tensor_arguments
from rlloss.imitation.base import SupervisedLoss


class RNDLoss(SupervisedLoss):
    r"""Random Network Distillation: a trainable predictor ``f_hat`` regresses the features of a
    frozen, randomly initialised target ``f`` on the observations the agent visits:

    $$
    \mathcal{L}_{\text{predictor}} = \frac{1}{K} \big\lVert \hat{f}(s') - f(s') \big\rVert^2
    $$

    (:func:`rlloss.functional.distillation_error`, $K$ features), reduced over a random
    ``update_fraction`` of the batch (the paper's 25%, sec. A.2). Where the predictor has not
    learned the target (states seldom visited) the error is large: :meth:`intrinsic_reward`
    gives it, detached, as the exploration bonus to add to the reward of any loss (PPO's in the
    paper).

    TorchRL's ``RNDLoss`` with the same keywords, key and output. The networks are plain
    ``nn.Module`` s on the observation tensor, kept as given (the objects an ``RNDTransform``
    also holds, so training here lowers the bonus it writes); the target's parameters are
    frozen (``requires_grad_(False)``) at construction, as TorchRL does.

    Keys (``set_keys``): ``observation`` (default ``("next", "observation")``).

    Reference: Burda et al., "Exploration by Random Network Distillation", arXiv:1810.12894.

    Args:
        predictor_network: the trained network, observation ``[*B, O]`` -> features ``[*B, K]``.
        target_network: the random network, same signature, frozen.
        obs_rms: running observation statistics (TorchRL's ``RunningMeanStd``, e.g. an
            ``RNDTransform``'s ``obs_rms``): observations are normalised with them and clipped
            to ``[-obs_clip, obs_clip]`` (default ``None``: used as they are).
        obs_clip: the clip of normalised observations (default 5.0, the paper's).
        reduction: ``"mean"`` (default: over the selected samples), ``"sum"`` or ``"none"``
            (``[*B]``, zero where a sample is not selected).
        update_fraction: the probability that a sample enters the loss, in [0, 1] (default
            0.25); drawn on the device, without a host sync.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ClipPPOLoss, RewardNormalizer, RNDLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> ppo = ClipPPOLoss(actor, ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"]))
        >>> rnd = RNDLoss(torch.nn.Linear(3, 8), torch.nn.Linear(3, 8))  # predictor, random target
        >>> normalizer = RewardNormalizer(num_envs=4, gamma=0.99)
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(4, 3),
        ...         "action": torch.randint(2, (4,)),
        ...         "action_log_prob": torch.full((4,), -0.69),
        ...         "next": {
        ...             "observation": torch.randn(4, 3),
        ...             "reward": torch.randn(4, 1),
        ...             "done": torch.zeros(4, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(4, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [4],
        ... )
        >>> done = batch["next", "done"]
        >>> batch["next", "reward"] += 0.5 * normalizer(rnd.intrinsic_reward(batch), done)
        >>> (ppo(batch)["loss_objective"] + rnd(batch)["loss_predictor"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by RNDLoss."""

        observation: NestedKey = ("next", "observation")  # the states the bonus scores, [*B, *O]

    out_keys = ["loss_predictor"]
    update_fraction = Coefficient(low=0.0, high=1.0)
    obs_clip = Coefficient(low=0.0, low_open=True)  # checked on assignment too

    def __init__(
        self,
        predictor_network: nn.Module,
        target_network: nn.Module,
        *,
        obs_rms: nn.Module | None = None,
        obs_clip: float = 5.0,
        reduction: str | None = "mean",
        update_fraction: float = 0.25,
    ) -> None:
        if not 0.0 <= update_fraction <= 1.0:
            raise ValueError(
                f"update_fraction must be in the [0, 1] interval, got {update_fraction}."
            )
        super().__init__(reduction)
        self._register_networks(
            plain=True, predictor_network=predictor_network, target_network=target_network
        )
        self.target_network.requires_grad_(False)
        self.obs_rms = obs_rms
        self._register_coefficients(obs_clip=obs_clip, update_fraction=update_fraction)

    @property
    def in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.observation]

    def _observation(self, tensordict: TensorDictBase) -> torch.Tensor:
        observation = self._get(tensordict, "observation").float()
        if self.obs_rms is not None:
            observation = self.obs_rms.normalize(observation).clamp(-self.obs_clip, self.obs_clip)
        return observation

    def _error(self, observation: torch.Tensor) -> torch.Tensor:
        try:
            with torch.no_grad():
                target = self.target_network(observation)
            prediction = self.predictor_network(observation)
        except CALL_ERRORS as error:  # an observation of another size: name it and both sizes
            key = self.tensor_keys.observation
            raise explained(error, self.predictor_network, [key], [observation], {}) from error
        return rlf.distillation_error(prediction, target)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``{"loss_predictor": ...}`` on a batch of (next) observations."""
        tensordict = self._without_padding(tensordict)
        error = self._error(self._observation(tensordict))
        fraction = self.update_fraction
        if fraction >= 1.0:
            return TensorDict(
                {"loss_predictor": self._reduce_valid(error, tensordict)}, batch_size=[]
            )
        selected = torch.rand(error.shape, device=error.device) < fraction
        if self.reduction == "none":  # TorchRL's: the unselected samples as zeros
            loss = self._reduce_valid(torch.where(selected, error, 0.0), tensordict)
        else:
            loss = self._reduce_valid(error, tensordict, selected, "update_fraction mask")
        return TensorDict({"loss_predictor": loss}, batch_size=[])

    @torch.no_grad()
    def intrinsic_reward(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The exploration bonus ``1/K ||f_hat(s') - f(s')||^2`` of each sample, ``[*B, 1]``
        (the reward's shape), without gradient, before any normalisation: Burda et al. divide
        it by a running std of the intrinsic returns (sec. 2.4), which
        :class:`rlloss.RewardNormalizer` keeps (``RewardNormalizer(gamma=0.99)(bonus, done)``)."""
        return self._error(self._observation(tensordict)).unsqueeze(-1)
