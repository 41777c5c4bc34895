"""PPO losses: ``PPOLoss`` (unclipped surrogate) and ``ClipPPOLoss`` (clipped, dual clip).

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347. The modules read
keys, call :mod:`rlloss.functional` and write ``loss_*`` entries plus detached diagnostics;
summing every ``loss_*`` entry gives the training objective.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn
from torchrl.objectives.utils import ValueEstimators

from rlloss import functional as F
from rlloss._networks import DistributionCall, NetworkCall
from rlloss.common import LossModule, check_choice, check_in_range
from rlloss.functional.critic import DISTANCES


def _as_scalar_output(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    return loss.squeeze(-1) if reduction == "none" else loss


class PPOLoss(LossModule):
    """PPO with the plain importance-weighted surrogate ``r A`` (no clipping, no penalty).

    ``loss_objective = -mean(r A)`` with ``r = pi(a|s) / pi_old(a|s)``, ``loss_entropy =
    -entropy_coeff * mean(H[pi(.|s)])`` and ``loss_critic = critic_coeff * mean(L(V(s),
    value_target))``, ``L`` the ``loss_critic_type`` distance, optionally value-clipped.

    Args:
        actor_network: a TorchRL ``ProbabilisticActor`` (anything with ``get_dist(td)``).
        critic_network: a module writing ``state_value`` (a TorchRL ``ValueOperator``); may be
            ``None`` when ``critic_coeff`` is ``None`` or 0 and the batch carries advantages.
        entropy_bonus: add ``loss_entropy``.
        samples_mc_entropy: samples of the Monte-Carlo entropy estimate, used when the
            distribution has no closed-form entropy (e.g. TanhNormal).
        entropy_coeff: entropy weight (a buffer: ``loss.entropy_coeff = x`` is in place).
        log_explained_variance: report ``explained_variance`` of the critic.
        critic_coeff: critic weight, default 1.0 when a critic is given (a buffer).
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"``.
        normalize_advantage: standardise the advantage over the (valid part of the) batch.
        separate_losses: the critic loss sends no gradient into parameters it shares with the
            actor.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        clip_value: value clipping radius (``None``: off).

    Padded sequence batches: where the batch holds ``tensor_keys.mask`` (TorchRL's
    ``("collector", "mask")``), every loss and diagnostic is reduced over valid steps only.

    Differences from TorchRL: composite (multi-head) action distributions and TorchRL's
    ``delay_actor``, ``max_importance_ratio``, ``advantage_norm`` and
    ``normalize_advantage_exclude_dims`` options are not supported (passing them raises
    ``TypeError``); a batch without ``("next", "terminated")`` is refused instead of treating
    ``done`` as termination.

    Example:
        >>> loss = PPOLoss(actor, critic)
        >>> out = loss(batch)  # batch holds advantage and value_target, or GAE runs first
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by the PPO losses."""

        advantage: NestedKey = "advantage"  # A(s, a), [*B, 1]
        value_target: NestedKey = "value_target"  # critic regression target, [*B, 1]
        value: NestedKey = "state_value"  # V(s) written by the critic; old V(s) for clip_value
        sample_log_prob: NestedKey = "action_log_prob"  # log pi_old(a|s) at collection, [*B]
        action: NestedKey = "action"  # the action taken
        reward: NestedKey = "reward"  # read under "next" by the value estimator
        done: NestedKey = "done"  # read under "next" by the value estimator
        terminated: NestedKey = "terminated"  # read under "next" by the value estimator
        mask: NestedKey = ("collector", "mask")  # optional padding mask of sequence batches

    default_keys = _AcceptedKeys
    default_value_estimator = ValueEstimators.GAE
    _value_network_name = "critic_network"
    _schedulable_buffers = frozenset({"entropy_coeff", "critic_coeff", "clip_value"})

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = 0.01,
        log_explained_variance: bool = True,
        critic_coeff: float | None = None,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        separate_losses: bool = False,
        reduction: str | None = None,
        clip_value: float | None = None,
    ) -> None:
        super().__init__()
        if critic_coeff is None and critic_network is not None:
            critic_coeff = 1.0
        if critic_network is None and critic_coeff not in (None, 0, 0.0):
            raise TypeError(
                f"{type(self).__name__}: critic_coeff={critic_coeff} needs a critic_network."
            )
        check_in_range("entropy_coeff", entropy_coeff, 0.0)
        check_in_range("samples_mc_entropy", samples_mc_entropy, 1)
        check_choice("loss_critic_type", loss_critic_type, DISTANCES)
        if critic_coeff is not None:
            check_in_range("critic_coeff", critic_coeff, 0.0)
        if clip_value is not None:
            check_in_range("clip_value", clip_value, 0.0, low_open=True)
        self.reduction = self._check_reduction(reduction)

        self.actor_network = actor_network
        self.critic_network = critic_network
        self._actor_call = DistributionCall(actor_network)
        self._critic_call = None if critic_network is None else NetworkCall(critic_network)
        self.entropy_bonus = entropy_bonus
        self.samples_mc_entropy = int(samples_mc_entropy)
        self.log_explained_variance = log_explained_variance
        self.loss_critic_type = loss_critic_type
        self.normalize_advantage = normalize_advantage
        self.separate_losses = separate_losses
        self._has_critic = critic_network is not None and bool(critic_coeff)
        device = _device_of(actor_network)
        self.register_buffer("entropy_coeff", torch.tensor(float(entropy_coeff), device=device))
        self._register_optional_buffer("critic_coeff", critic_coeff if self._has_critic else None)
        self._register_optional_buffer("clip_value", clip_value)
        self._critic_params_without_shared = self._critic_params_detached_from_actor()
        log_prob_keys = getattr(actor_network, "log_prob_keys", None)
        if log_prob_keys:
            self.tensor_keys.sample_log_prob = log_prob_keys[0]
        sample_keys = getattr(actor_network, "dist_sample_keys", None)
        if sample_keys:
            self.tensor_keys.action = sample_keys[0]

    def _register_optional_buffer(self, name: str, value: float | None) -> None:
        if value is None:
            setattr(self, name, None)
        else:
            self.register_buffer(name, torch.tensor(float(value), device=self.entropy_coeff.device))

    def _critic_params_detached_from_actor(self) -> TensorDict | None:
        """With ``separate_losses``, the critic's parameters with those it shares with the actor
        replaced by detached views (same storage), or ``None`` when nothing is shared."""
        if not (self.separate_losses and self._has_critic):
            return None
        actor_params = {id(p) for p in self.actor_network.parameters()}
        params = TensorDict.from_module(self.critic_network)
        shared = [k for k, p in params.items(True, True) if id(p) in actor_params]
        if not shared:
            return None
        for key in shared:
            params.set(key, params.get(key).detach())
        return params

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if getattr(self, "_critic_params_without_shared", None) is not None:
            self._critic_params_without_shared = self._critic_params_detached_from_actor()
        return out

    _surrogate_keys: tuple[str, ...] = ()

    @property
    def in_keys(self) -> list[NestedKey]:
        """The entries the loss reads (those of the value estimator excepted)."""
        keys = [*self.actor_network.in_keys, self.tensor_keys.action]
        keys += [self.tensor_keys.sample_log_prob, self.tensor_keys.advantage]
        if self._has_critic:
            keys += [*self.critic_network.in_keys, self.tensor_keys.value_target]
            keys += [self.tensor_keys.value] if self.clip_value is not None else []
        return list(dict.fromkeys(keys))

    @property
    def out_keys(self) -> list[str]:
        """The entries of the output TensorDict."""
        keys = ["loss_objective", "kl_approx", *self._surrogate_keys]
        keys += ["loss_entropy", "entropy"] if self.entropy_bonus else []
        if self._has_critic:
            keys += ["loss_critic"]
            keys += ["value_clip_fraction"] if self.clip_value is not None else []
            keys += ["explained_variance"] if self.log_explained_variance else []
        return keys

    # ----------------------------------------------------------------------------- pieces
    def _advantage(
        self, batch: TensorDictBase, mask: torch.Tensor | None
    ) -> tuple[TensorDictBase, torch.Tensor]:
        """The batch's advantage; when absent, the value estimator writes it (and the value
        target) into a shallow copy of the batch, returned with it."""
        if batch.get(self.tensor_keys.advantage, None) is None:
            if self.critic_network is None:
                self._get(batch, "advantage")  # raises: nothing to estimate it with
            batch = self.value_estimator(batch.copy())
        advantage = self._get(batch, "advantage")
        if self.normalize_advantage and advantage.numel() > 1:
            advantage = F.standardize(advantage, mask)
        return batch, advantage

    def _policy(self, batch: TensorDictBase) -> tuple[D.Distribution, torch.Tensor]:
        """The current policy and the log-ratio ``log pi(a|s) - log pi_old(a|s)``, ``[*B, 1]``."""
        old_log_prob = self._get(batch, "sample_log_prob")
        action = self._get(batch, "action")
        distribution = self._actor_call(batch)
        return distribution, F.log_ratio(distribution.log_prob(action), old_log_prob).unsqueeze(-1)

    def _surrogate(
        self, log_ratio: torch.Tensor, advantage: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-element surrogate objective and its diagnostics."""
        return log_ratio.exp() * advantage, {}

    def loss_entropy(
        self, distribution: D.Distribution, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``-entropy_coeff * H`` reduced, and the mean entropy (detached)."""
        entropy = F.distribution_entropy(distribution, self.samples_mc_entropy).unsqueeze(-1)
        reduced = F.reduce(entropy, self.reduction, mask)
        mean = reduced if self.reduction == "mean" else F.reduce(entropy, "mean", mask)
        return -(self.entropy_coeff * reduced), {"entropy": mean.detach()}

    def _critic_value(self, batch: TensorDictBase) -> torch.Tensor:
        params = self._critic_params_without_shared
        if self.separate_losses:
            batch = batch.detach()
        if params is None:
            return self._critic_call(batch)[self.tensor_keys.value]
        with params.to_module(self.critic_network):
            return self._critic_call(batch)[self.tensor_keys.value]

    def loss_critic(
        self, batch: TensorDictBase, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``critic_coeff * L(V(s), value_target)`` (value-clipped if asked) reduced, with the
        clip fraction and explained variance."""
        target = self._get(batch, "value_target")
        old_value = None if self.clip_value is None else self._get(batch, "value")
        value = self._critic_value(batch)
        info = {}
        if old_value is None:
            loss = F.distance(value, target, self.loss_critic_type)
        else:
            loss, clipped = F.clipped_value_loss(
                value, old_value, target, self.clip_value, self.loss_critic_type
            )
            info["value_clip_fraction"] = F.reduce(clipped, "mean", mask)
        if self.log_explained_variance:
            info["explained_variance"] = F.explained_variance(value, target)
        return F.reduce(self.critic_coeff * loss, self.reduction, mask), info

    # ----------------------------------------------------------------------------- forward
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Compute the losses on a batch (the caller's TensorDict is not modified)."""
        mask = tensordict.get(self.tensor_keys.mask, None)
        batch, advantage = self._advantage(tensordict, mask)
        distribution, log_ratio = self._policy(batch)
        surrogate, out = self._surrogate(log_ratio, advantage, mask)
        out["loss_objective"] = _as_scalar_output(
            F.reduce(-surrogate, self.reduction, mask), self.reduction
        )
        out["kl_approx"] = F.reduce(-log_ratio.detach(), "mean", mask)
        if self.entropy_bonus:
            loss, info = self.loss_entropy(distribution, mask)
            out["loss_entropy"] = _as_scalar_output(loss, self.reduction)
            out.update(info)
        if self._has_critic:
            loss, info = self.loss_critic(batch, mask)
            out["loss_critic"] = _as_scalar_output(loss, self.reduction)
            out.update(info)
        return TensorDict._new_unsafe(out, batch_size=torch.Size([]))


class ClipPPOLoss(PPOLoss):
    """PPO with the clipped surrogate, optionally dual-clipped.

    ``loss_objective = -mean(min(r A, clip(r, 1 - eps_low, 1 + eps_high) A))``, the ratio
    clipped in log space as TorchRL does; with ``dual_clip=c`` the objective of samples with
    ``A < 0`` is bounded by ``c A`` (Ye et al., arXiv:1912.09729). Diagnostics:
    ``clip_fraction``, ``kl_approx`` (``mean(log pi_old - log pi)``, TorchRL's), ``ESS``
    (normalised effective sample size of the ratios), ``max_ratio``, ``mean_ratio``, and
    ``entropy``, ``explained_variance``, ``value_clip_fraction`` as in :class:`PPOLoss`.

    Args:
        clip_epsilon: ``eps`` (symmetric) or ``(eps_low, eps_high)``.
        dual_clip: the dual-clip constant ``c > 1``, or ``None``.
        clip_value: value clipping radius; ``True`` uses ``clip_epsilon`` (symmetric only).
        Other arguments as :class:`PPOLoss`.

    Example:
        >>> loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.0)
        >>> out = loss(batch)
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """

    _schedulable_buffers = frozenset(
        {"clip_epsilon", "clip_epsilon_low", "clip_epsilon_high", "dual_clip"}
    )
    _surrogate_keys = ("clip_fraction", "ESS", "max_ratio", "mean_ratio")

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        clip_epsilon: float | tuple[float, float] = 0.2,
        dual_clip: float | None = None,
        clip_value: bool | float | None = None,
        **kwargs,
    ) -> None:
        asymmetric = isinstance(clip_epsilon, (tuple, list))
        if isinstance(clip_value, bool):
            if clip_value and asymmetric:
                raise ValueError(
                    "clip_value=True cannot take its radius from an asymmetric clip_epsilon "
                    "tuple; pass a float, e.g. clip_value=0.2."
                )
            clip_value = clip_epsilon if clip_value else None
        super().__init__(actor_network, critic_network, clip_value=clip_value, **kwargs)
        device = self.entropy_coeff.device
        if asymmetric:
            if len(clip_epsilon) != 2:
                raise ValueError(
                    f"clip_epsilon must be a float or a (low, high) pair, got {clip_epsilon}."
                )
            check_in_range("clip_epsilon[0]", clip_epsilon[0], 0.0, 1.0, low_open=True,
                           high_open=True)
            check_in_range("clip_epsilon[1]", clip_epsilon[1], 0.0, low_open=True)
            self.register_buffer("clip_epsilon_low", torch.tensor(float(clip_epsilon[0]),
                                                                  device=device))
            self.register_buffer("clip_epsilon_high", torch.tensor(float(clip_epsilon[1]),
                                                                   device=device))
        else:
            check_in_range("clip_epsilon", clip_epsilon, 0.0, 1.0, low_open=True, high_open=True)
            self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon), device=device))
        if dual_clip is not None:
            check_in_range("dual_clip", dual_clip, 1.0, low_open=True)
        self._register_optional_buffer("dual_clip", dual_clip)

    def _log_clip_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        if hasattr(self, "clip_epsilon_low"):
            return F.clip_bounds(self.clip_epsilon_low, self.clip_epsilon_high)
        return F.clip_bounds(self.clip_epsilon, self.clip_epsilon)

    def _surrogate(self, log_ratio, advantage, mask):
        low, high = self._log_clip_bounds()
        surrogate = F.clipped_surrogate(log_ratio, advantage, low, high, self.dual_clip)
        with torch.no_grad():
            ratio = log_ratio.exp()
            info = {
                "clip_fraction": F.reduce(F.clipped(log_ratio, low, high), "mean", mask),
                "ESS": F.normalized_effective_sample_size(log_ratio, mask),
                "max_ratio": F.reduce(ratio, "max", mask),
                "mean_ratio": F.reduce(ratio, "mean", mask),
            }
        return surrogate, info


def _device_of(module: nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    return torch.device("cpu")
