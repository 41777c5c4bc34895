"""``DreamerV3ModelLoss``: DreamerV3's world-model loss, on real sequences.

Hafner, Pasukonis, Ba and Lillicrap, "Mastering Diverse Domains through World Models",
arXiv:2301.04104. The world model is trained on real sequences with symlog reconstruction,
two-hot reward prediction and balanced KL with free bits (eq. 4-5). The critic's loss is
:class:`rlloss.DreamerV3ValueLoss` (``world_models/dreamer_v3_value.py``), the actor's
:class:`rlloss.DreamerV3ActorLoss`. The maths is in :mod:`rlloss.functional.world_models`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, MissingKeyError, check_choice, next_key
from rlloss.common import accepts_tensor_arguments
from rlloss.world_models.base import (
    WorldModelLossBase,
    legacy_logits,
    reconstruction_error,
)

KL_MODES = ("balanced", "separate")


class DreamerV3ModelLoss(WorldModelLossBase):
    r"""DreamerV3's world-model loss on real sequences ``[B, T]``.

    $$
    \mathcal{L}_{\text{model\_kl}} = \lambda_{\text{kl}} \frac{1}{N} \sum
    \Big(\alpha \max\big(\mathrm{KL}(\mathrm{sg}(q) \,\|\, p), f_b\big) + (1 - \alpha)
    \max\big(\mathrm{KL}(q \,\|\, \mathrm{sg}(p)), f_b\big)\Big)
    $$

    $$
    \mathcal{L}_{\text{model\_reco}} = \lambda_{\text{reco}} \sum_{\text{heads}}
    \frac{1}{B T} \sum_{b, t} \sum_{\text{event}}
    \big|\operatorname{symlog}(x) - \operatorname{symlog}(\hat{x})\big|^p
    $$

    In detail:

    - ``loss_model_kl = lambda_kl mean(alpha max(KL(sg(q) || p), fb) + (1 - alpha) max(KL(q ||
      sg(p)), fb))`` per categorical (``kl_mode="balanced"``), or the two terms of the paper
      summed over the categoricals before the free bits, ``loss_model_dynamic`` (weight
      ``lambda_kl lambda_dynamic``) and ``loss_model_representation`` (``lambda_kl
      lambda_representation``), with ``kl_mode="separate"``;
    - ``loss_model_reco = lambda_reco sum_heads mean_{B,T} sum_event
      |symlog(x) - symlog(x_hat)|^p``;
    - ``loss_model_reward = lambda_reward mean twohot_ce(reward_logits, r)`` (``reward_two_hot``) or
      the symlog squared error of a scalar reward;
    - ``loss_model_continue`` (``lambda_continue > 0``): binary cross-entropy of the continuation
      logit against ``continue_target_scale (1 - terminated)``.

    TorchRL's ``DreamerV3ModelLoss`` with the same keywords, keys (``set_keys``: ``pixels`` and
    ``reco_pixels`` may be lists, one per reconstruction head) and outputs: ``forward`` returns
    ``(losses, world_model_output)``, each loss of shape ``[1]``; the ground-truth reward is moved
    to ``("next", true_reward)`` in the world model's input so that the model can write its
    prediction under ``("next", reward)``.

    Reference: Hafner et al., "Mastering Diverse Domains through World Models",
    arXiv:2301.04104.

    Args:
        world_model: a module called on a shallow copy of the batch, writing the prior and
            posterior logits ``[B, T, C, K]``, the reconstructions and the reward prediction under
            ``"next"``.
        lambda_kl: weights (>= 0).
        lambda_reco: weights (>= 0).
        lambda_reward: weights (>= 0).
        lambda_continue: weights (>= 0).
        kl_mode: ``"balanced"`` (default) or ``"separate"``.
        lambda_dynamic: the separate terms' weights (1.0, 0.1).
        lambda_representation: the separate terms' weights (1.0, 0.1).
        unimix: uniform mixture of the categoricals in the separate KL, in [0, 1) (default 0).
        continue_target_scale: in (0, 1].
        kl_alpha: balancing weight alpha (0.8); free_bits: the free-bits threshold (1.0 nat).
        reco_loss: ``"l2"`` or ``"l1"``; reco_symlog: a bool, or one per head.
        reward_two_hot: two-hot reward logits (default) or a scalar reward.
        num_reward_bins: the two-hot support size (255); global_average: average over every
            dim instead of summing the event dims; detach_output: detach the returned output.

    Differences from TorchRL: the KL terms are computed from log-softmax (no ``1e-8`` clamp of
    the probabilities), so a categorical with a probability under ``1e-8`` has a finite KL and
    gradient where TorchRL's separate mode gives NaN.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import SymExpTwoHot
        >>> from rlloss import DreamerV3ModelLoss
        >>> class WorldModel(torch.nn.Module):  # latent: 3 categoricals of 5 classes, a belief of 6
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.prior, self.posterior = (
        ...             torch.nn.Linear(21, 15),
        ...             torch.nn.Linear(21 + 4, 15),
        ...         )
        ...         self.decoder, self.reward = torch.nn.Linear(21, 4), torch.nn.Linear(21, 255)
        ...         self.decode = SymExpTwoHot(255)
        ...     def forward(self, td):
        ...         latent = torch.cat([td["state"], td["belief"]], -1)
        ...         seen = torch.cat([latent, td["next", "pixels"]], -1)
        ...         td["next", "prior_logits"] = self.prior(latent).unflatten(-1, (3, 5))
        ...         td["next", "posterior_logits"] = self.posterior(seen).unflatten(-1, (3, 5))
        ...         td["next", "reco_pixels"] = self.decoder(latent)
        ...         td["next", "reward_logits"] = self.reward(latent)
        ...         td["next", "reward"] = self.decode(td["next", "reward_logits"])
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
        >>> loss = DreamerV3ModelLoss(WorldModel(), num_reward_bins=255)
        >>> losses, posterior = loss(sequences)
        >>> sum(v for k, v in losses.items() if k.startswith("loss_")).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DreamerV3ModelLoss, under ``"next"``."""

        reward: NestedKey = "reward"  # the real reward, then the decoded prediction, [*B, T, 1]
        reward_logits: NestedKey = "reward_logits"  # the two-hot reward logits, [*B, T, bins]
        true_reward: NestedKey = "true_reward"  # written: the real reward, moved aside, [*B, T, 1]
        prior_logits: NestedKey = "prior_logits"  # the prior's logits, [*B, T, cats, classes]
        posterior_logits: NestedKey = "posterior_logits"  # the posterior's, [*B, T, cats, classes]
        pixels: NestedKey = "pixels"  # observations [*B, T, C, H, W]: a key or a list
        reco_pixels: NestedKey = "reco_pixels"  # their reconstructions, [*B, T, C, H, W]
        continue_pred: NestedKey = "continue_pred"  # the continuation logit, [*B, T, 1]
        done: NestedKey = "done"  # the episode ends, [*B, T, 1]
        terminated: NestedKey = "terminated"  # the continuation target's zeros, [*B, T, 1]

    # checked at construction and on assignment (the lambda_* weights: by the base)
    _choices = {**WorldModelLossBase._choices, "kl_mode": KL_MODES, "reco_loss": ("l1", "l2")}
    kl_alpha = Coefficient(low=0.0, high=1.0)  # 1 - kl_alpha weighs the other KL term
    unimix = Coefficient(low=0.0, high=1.0, high_open=True)
    continue_target_scale = Coefficient(low=0.0, high=1.0, low_open=True)

    def __init__(
        self,
        world_model: nn.Module,
        *,
        lambda_kl: float = 1.0,
        lambda_reco: float = 1.0,
        lambda_reward: float = 1.0,
        lambda_continue: float = 0.0,
        kl_mode: str = "balanced",
        lambda_dynamic: float = 1.0,
        lambda_representation: float = 0.1,
        unimix: float = 0.0,
        continue_target_scale: float = 1.0,
        kl_alpha: float = 0.8,
        free_bits: float = 1.0,
        reco_loss: str = "l2",
        reco_symlog: bool | list[bool] = True,
        reward_two_hot: bool = True,
        num_reward_bins: int = 255,
        global_average: bool = False,
        detach_output: bool = True,
    ) -> None:
        check_choice("kl_mode", kl_mode, KL_MODES)
        check_choice("reco_loss", reco_loss, ("l1", "l2"))
        if not 0 < continue_target_scale <= 1:  # TorchRL's words
            raise ValueError("continue_target_scale must be in (0, 1].")
        DreamerV3ModelLoss.unimix.check(unimix)
        DreamerV3ModelLoss.kl_alpha.check(kl_alpha)
        weights = {"lambda_kl": lambda_kl, "lambda_reco": lambda_reco}
        weights.update(lambda_reward=lambda_reward, lambda_continue=lambda_continue)
        weights.update(lambda_dynamic=lambda_dynamic, lambda_representation=lambda_representation)
        super().__init__(world_model, global_average=global_average, **weights)
        self.kl_mode = kl_mode
        self._register_coefficients(
            unimix=unimix,
            kl_alpha=kl_alpha,
            continue_target_scale=continue_target_scale,
        )
        self.free_bits = free_bits  # any number: a floor of 0 or below clamps nothing
        self.reco_loss, self.reco_symlog = reco_loss, reco_symlog
        self.reward_two_hot, self.num_reward_bins = reward_two_hot, num_reward_bins
        self.detach_output = detach_output
        self.register_buffer("reward_bins", rlf.symexp_bins(num_reward_bins))

    def _kl_losses(self, output: TensorDictBase) -> dict[str, torch.Tensor]:
        posterior = self._get(output, "posterior_logits", nested=True)
        prior = self._get(output, "prior_logits", nested=True)
        if self.kl_mode == "balanced":
            kl = rlf.balanced_kl(posterior, prior, self.kl_alpha, self.free_bits)
            return {"loss_model_kl": self.lambda_kl * kl.mean().unsqueeze(-1)}
        dynamics, representation = rlf.dynamics_and_representation_kl(posterior, prior, self.unimix)
        dynamics = rlf.free_bits(dynamics.sum(-1), self.free_bits).mean().unsqueeze(-1)
        representation = rlf.free_bits(representation.sum(-1), self.free_bits).mean().unsqueeze(-1)
        weight = self.lambda_kl
        return {
            "loss_model_dynamic": weight * self.lambda_dynamic * dynamics,
            "loss_model_representation": weight * self.lambda_representation * representation,
        }

    def _reconstruction_loss(self, output: TensorDictBase) -> torch.Tensor:
        """``sum_heads mean(per-step error)``, ``[1]``."""
        targets, predictions = self._heads()
        use_symlog = self.reco_symlog
        if isinstance(use_symlog, bool):
            use_symlog = [use_symlog] * len(targets)
        if not targets or not len(targets) == len(predictions) == len(use_symlog):
            raise ValueError(
                "pixels, reco_pixels and reco_symlog must describe the same nonzero number of "
                f"reconstruction heads, got {len(targets)}, {len(predictions)} and "
                f"{len(use_symlog)}; set the keys with set_keys(pixels=[...], reco_pixels=[...])."
            )
        total = 0.0
        for target_key, prediction_key, transform in zip(
            targets, predictions, use_symlog, strict=True
        ):
            target = self._get_next(output, target_key, "pixels")
            prediction = self._get_next(output, prediction_key, "reco_pixels")
            error = reconstruction_error(target, prediction, self.reco_loss, transform)
            total = total + self._per_step(error, output.batch_size).mean().unsqueeze(-1)
        return self.lambda_reco * total

    def _reward_loss(self, output: TensorDictBase) -> torch.Tensor:
        true_reward = self._get(output, "true_reward", nested=True)
        if not self.reward_two_hot:
            prediction = self._get(output, "reward", nested=True)
            loss = rlf.symlog_squared_error(prediction, true_reward).squeeze(-1)
            return self.lambda_reward * loss.mean().unsqueeze(-1)
        logits = legacy_logits(self, output, "reward_logits", "reward", nested=True)
        if logits.shape[-1] != self.num_reward_bins:
            raise ValueError(
                f"reward_two_hot=True expects the reward head to output logits over "
                f"{self.num_reward_bins} bins, got trailing dim {logits.shape[-1]}."
            )
        loss = rlf.two_hot_cross_entropy(logits, true_reward, self.reward_bins)
        return self.lambda_reward * loss.mean().unsqueeze(-1)

    def _continue_loss(self, output: TensorDictBase) -> dict[str, torch.Tensor]:
        if not self.lambda_continue > 0:
            return {}
        logit = self._read(output, "continue_pred", nested=True)
        if logit is None:  # TorchRL drops the continuation loss silently
            key = next_key(self.tensor_keys.continue_pred)
            raise MissingKeyError(
                f"{type(self).__name__}: lambda_continue={self.lambda_continue} asks for the "
                f"continuation loss, but the world model's output has no {key!r} (tensor_keys."
                f"continue_pred); keys present: {list(output.keys(True, True))}. Make the world "
                "model write its continuation logit there (or remap it with "
                "set_keys(continue_pred=...)), or pass lambda_continue=0."
            )
        ended = self._read(output, "terminated", nested=True)
        if ended is None:
            ended = self._read(output, "done", nested=True)
        if ended is None:
            self._get(output, "terminated", nested=True)  # the missing-key error
        target = (~ended.bool()).to(logit.dtype) * self.continue_target_scale
        loss = F.binary_cross_entropy_with_logits(logit.squeeze(-1), target.squeeze(-1))
        return {"loss_model_continue": self.lambda_continue * loss.unsqueeze(-1)}

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """The losses and the world model's output (detached unless ``detach_output=False``)."""
        output = self._run_world_model(tensordict, ("reward",))
        out = {"loss_model_reco": self._reconstruction_loss(output)}
        out["loss_model_reward"] = self._reward_loss(output)
        out.update(self._kl_losses(output))
        out.update(self._continue_loss(output))
        return TensorDict(out), (output.data if self.detach_output else output)
