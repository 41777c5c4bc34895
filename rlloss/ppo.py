"""PPO losses: ``PPOLoss`` (unclipped surrogate) and ``ClipPPOLoss`` (clipped, dual clip).

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347. The modules read
keys, call :mod:`rlloss.functional` and write ``loss_*`` entries plus detached diagnostics;
summing every ``loss_*`` entry gives the training objective.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tensordict.nn import CompositeDistribution, set_composite_lp_aggregate
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn
from torchrl.modules.distributions.utils import composite_entropy
from torchrl.objectives.utils import ValueEstimators

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import (
    MissingKeyError,
    batch_mask,
    check_choice,
    check_in_range,
    check_network,
    next_key,
)
from rlloss._networks import (
    DistributionCall,
    NetworkCall,
    action_log_prob,
    as_list,
    log_prob_of,
    stored_log_prob,
    sum_heads,
)
from rlloss.common import LossModule, fill_padding
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
        functional: TorchRL's switch between functional parameters (``True``) and plain
            modules. rlloss always calls the networks directly (the same numbers); with
            ``True`` the loss exposes ``actor_network_params`` / ``critic_network_params`` (views
            of the networks' parameters, e.g. for optimizer groups) as TorchRL does, with
            ``False`` they are ``None``.
        device: where the coefficient buffers live (default: the actor's device).

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

    default_value_estimator = ValueEstimators.GAE
    _value_network_name = "critic_network"
    _schedulable_buffers = frozenset({"entropy_coeff", "critic_coeff", "clip_value"})
    _coefficient_ranges = {
        "entropy_coeff": {"low": 0.0},
        "critic_coeff": {"low": 0.0},
        "clip_value": {"low": 0.0, "low_open": True},
        "samples_mc_entropy": {"low": 1, "integer": True},
    }

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float | dict[NestedKey, float] = 0.01,
        log_explained_variance: bool = True,
        critic_coeff: float | None = None,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        separate_losses: bool = False,
        reduction: str | None = None,
        clip_value: float | None = None,
        functional: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        check_network(type(self).__name__, "actor_network", actor_network)
        if critic_network is not None:
            check_network(type(self).__name__, "critic_network", critic_network)
        if critic_coeff is None and critic_network is not None:
            critic_coeff = 1.0
        if critic_network is None and critic_coeff not in (None, 0, 0.0):
            raise TypeError(
                f"{type(self).__name__}: critic_coeff={critic_coeff} needs a critic_network."
            )
        self._entropy_coeff_map = None
        if isinstance(entropy_coeff, dict):  # per head of a composite action: TorchRL's map
            for head, coeff in entropy_coeff.items():
                check_in_range(f"entropy_coeff[{head!r}]", coeff, 0.0)
            self._entropy_coeff_map = {
                _compat.unravel_key(k): float(c) for k, c in entropy_coeff.items()
            }
            entropy_coeff = 0.0
        self._check_coefficient("entropy_coeff", entropy_coeff)
        self._check_coefficient("samples_mc_entropy", samples_mc_entropy)
        check_choice("loss_critic_type", loss_critic_type, DISTANCES)
        if critic_coeff is not None:
            self._check_coefficient("critic_coeff", critic_coeff)
        if isinstance(clip_value, bool):  # ClipPPOLoss maps True to clip_epsilon; here, TorchRL's
            raise ValueError(f"clip_value must be a float or a scalar tensor, got {clip_value}.")
        if clip_value is not None:
            self._check_coefficient("clip_value", clip_value)
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
        self._functional = functional
        device = _device_of(actor_network) if device is None else torch.device(device)
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

    @property
    def functional(self) -> bool:
        """TorchRL's ``functional`` flag, as given (see the class docstring)."""
        return self._functional

    @property
    def actor_network_params(self) -> TensorDict | None:
        """The actor's parameters as a TensorDict of views (``None`` with ``functional=False``),
        as TorchRL exposes them: ``optimizer = Adam(loss.actor_network_params.values(True,
        True))``."""
        return TensorDict.from_module(self.actor_network) if self._functional else None

    @property
    def critic_network_params(self) -> TensorDict | None:
        """The critic's parameters as a TensorDict of views (``None`` with ``functional=False``
        or without a critic)."""
        if not self._functional or self.critic_network is None:
            return None
        return TensorDict.from_module(self.critic_network)

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

    def _refresh_views(self) -> None:
        if self._critic_params_without_shared is not None:
            self._critic_params_without_shared = self._critic_params_detached_from_actor()

    _surrogate_keys: tuple[str, ...] = ()

    @property
    def in_keys(self) -> list[NestedKey]:
        """The entries the loss reads, with those its value estimator reads when the batch has
        no advantage (the networks' inputs under ``"next"``, reward, done, terminated)."""
        keys = [*self.actor_network.in_keys, *as_list(self.tensor_keys.action)]
        keys += [*as_list(self.tensor_keys.sample_log_prob), self.tensor_keys.advantage]
        next_inputs = list(self.actor_network.in_keys)
        if self._has_critic:
            keys += [*self.critic_network.in_keys, self.tensor_keys.value_target]
            keys += [self.tensor_keys.value] if self.clip_value is not None else []
            next_inputs += self.critic_network.in_keys
        flags = [self.tensor_keys.reward, self.tensor_keys.done, self.tensor_keys.terminated]
        keys += [next_key(key) for key in [*next_inputs, *flags]]
        return list(dict.fromkeys(keys))

    @property
    def out_keys(self) -> list[str]:
        """The entries of the output TensorDict."""
        keys = ["loss_objective", "kl_approx", "kl_k3", *self._surrogate_keys]
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
            advantage = rlf.standardize(advantage, mask)
        return batch, advantage

    def _policy(self, batch: TensorDictBase) -> tuple[D.Distribution, torch.Tensor]:
        """The current policy and the log-ratio ``log pi(a|s) - log pi_old(a|s)``, ``[*B, 1]``."""
        old_log_prob = self._old_log_prob(batch)
        distribution = self._distribution(batch)
        log_prob = self._log_prob(distribution, batch)
        return distribution, rlf.log_ratio(log_prob, old_log_prob).unsqueeze(-1)

    def _old_log_prob(self, batch: TensorDictBase) -> torch.Tensor:
        """``log pi_old(a|s)``, ``[*B]``: the stored entry, or the sum over the heads of a
        composite action (a list of keys, or an entry holding one log-prob per head)."""
        if isinstance(self.tensor_keys.sample_log_prob, list):
            return stored_log_prob(batch, self.tensor_keys.sample_log_prob, type(self).__name__)
        log_prob = self._get(batch, "sample_log_prob")
        return sum_heads(log_prob, batch.batch_size) if is_tensor_collection(log_prob) else log_prob

    def _log_prob(self, distribution: D.Distribution, batch: TensorDictBase) -> torch.Tensor:
        """``log pi(a|s)``, ``[*B]``; summed over the heads of a composite distribution."""
        if not isinstance(distribution, CompositeDistribution):
            action = self._get(batch, "action")
            return log_prob_of(distribution, action, self.tensor_keys.action, type(self).__name__)
        return action_log_prob(distribution, batch, self.tensor_keys.action, type(self).__name__)

    def _distribution(self, batch: TensorDictBase) -> D.Distribution:
        """The current policy at the batch's observations."""
        return self._actor_call(batch)

    def _surrogate(
        self,
        log_ratio: torch.Tensor,
        advantage: torch.Tensor,
        mask: torch.Tensor | None,
        batch: TensorDictBase,
        distribution: D.Distribution,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-element surrogate objective (to maximise) and its diagnostics."""
        return rlf.surrogate(log_ratio, advantage), {}

    def loss_entropy(
        self, distribution: D.Distribution, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``-entropy_coeff * H`` reduced, and the mean entropy (detached)."""
        if isinstance(distribution, CompositeDistribution):
            return self._composite_loss_entropy(distribution, mask)
        entropy = rlf.distribution_entropy(distribution, self.samples_mc_entropy)  # [*B]
        reduced = rlf.reduce(entropy, self.reduction, mask)
        mean = reduced if self.reduction == "mean" else rlf.reduce(entropy, "mean", mask)
        return -(self.entropy_coeff * reduced), {"entropy": mean.detach()}

    def _composite_loss_entropy(
        self, distribution: CompositeDistribution, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The entropy loss of a multi-head action: ``-sum_h c_h H_h`` reduced, with ``c_h``
        from the ``entropy_coeff`` map (TorchRL's), or ``entropy_coeff`` for every head; the
        per-head entropies are reported as ``composite_entropy``."""
        with set_composite_lp_aggregate(False):
            heads = composite_entropy(distribution, self.samples_mc_entropy)
        shape = distribution.batch_shape if heads.batch_size == () else heads.batch_size
        if self._entropy_coeff_map is None:
            weighted = self.entropy_coeff * sum_heads(heads, shape)
        else:
            weighted = sum(
                self._entropy_coeff_of(key) * sum_heads(value, shape)
                for key, value in heads.items(True, True)
            )
        reduced = rlf.reduce(weighted, self.reduction, mask)
        entropy = rlf.reduce(sum_heads(heads, shape), "mean", mask)
        return -reduced, {"entropy": entropy.detach(), "composite_entropy": heads.detach()}

    def _entropy_coeff_of(self, head: NestedKey) -> float:
        head = _compat.unravel_key(head)
        if head not in self._entropy_coeff_map:
            raise KeyError(
                f"{type(self).__name__}: entropy_coeff has no coefficient for the head {head!r}; "
                f"its keys are {list(self._entropy_coeff_map)}."
            )
        return self._entropy_coeff_map[head]

    def _critic_value(self, batch: TensorDictBase) -> torch.Tensor:
        params = self._critic_params_without_shared
        if self.separate_losses:
            batch = batch.detach()
        batch = self._with_actor_features(batch)
        if params is None:
            return self._critic_call(batch)[self.tensor_keys.value]
        with params.to_module(self.critic_network):
            return self._critic_call(batch)[self.tensor_keys.value]

    def _with_actor_features(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch, with the actor trunk's outputs added when the critic reads some that the
        batch lacks (a critic head on the actor's trunk: TorchRL's actor call leaves them in the
        batch); detached under ``separate_losses``."""
        if all(batch.get(key, None) is not None for key in self.critic_network.in_keys):
            return batch
        batch = batch.copy()
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.separate_losses):
            self.actor_network.get_dist(batch)  # writes the trunk's outputs, samples nothing
        return batch

    def _old_value(self, batch: TensorDictBase) -> torch.Tensor:
        """``V_old(s)`` stored at collection, needed by value clipping (TorchRL's message)."""
        value = self._read(batch, "value")
        if value is None:
            raise MissingKeyError(
                f"{type(self).__name__}: clip_value is set to {self.clip_value}, but the key "
                f"{self.tensor_keys.value} was not found in the input tensordict. Make sure that "
                "the value key passed to PPO exists in the input tensordict (store V(s) at "
                "collection, or rename it with loss.set_keys(value=...))."
            )
        return value

    def loss_critic(
        self, batch: TensorDictBase, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``critic_coeff * L(V(s), value_target)`` (value-clipped if asked) reduced, with the
        clip fraction and explained variance."""
        target = self._get(batch, "value_target")
        old_value = None if self.clip_value is None else self._old_value(batch)
        value = self._critic_value(batch)
        info = {}
        if old_value is None:
            loss = rlf.distance(value, target, self.loss_critic_type)
        else:
            loss, clipped = rlf.clipped_value_loss(
                value, old_value, target, self.clip_value, self.loss_critic_type
            )
            info["value_clip_fraction"] = rlf.reduce(clipped, "mean", mask)
        if self.log_explained_variance:
            info["explained_variance"] = rlf.explained_variance(value, target, mask)
        return rlf.reduce(self.critic_coeff * loss, self.reduction, mask), info

    def _padding_mask(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        mask = tensordict.get(self.tensor_keys.mask, None)
        if mask is None:
            return None
        return batch_mask(type(self).__name__, self.tensor_keys.mask, mask, tensordict.shape)

    # ----------------------------------------------------------------------------- forward
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Compute the losses on a batch (the caller's TensorDict is not modified)."""
        mask = self._padding_mask(tensordict)
        if mask is not None:  # padded sequences: padding enters no arithmetic
            tensordict = fill_padding(tensordict, mask, [self.tensor_keys.mask])
        batch, advantage = self._advantage(tensordict, mask)
        distribution, log_ratio = self._policy(batch)
        surrogate, out = self._surrogate(log_ratio, advantage, mask, batch, distribution)
        out["loss_objective"] = _as_scalar_output(
            rlf.reduce(-surrogate, self.reduction, mask), self.reduction
        )
        log_ratio = log_ratio.detach()
        out["kl_approx"] = rlf.reduce(-log_ratio, "mean", mask)
        out["kl_k3"] = rlf.reduce(rlf.kl_k3(log_ratio), "mean", mask)
        if self.entropy_bonus:
            loss, info = self.loss_entropy(distribution, mask)
            out["loss_entropy"] = loss  # already [*B] with reduction="none"
            out.update(info)
        if self._has_critic:
            loss, info = self.loss_critic(batch, mask)
            out["loss_critic"] = _as_scalar_output(loss, self.reduction)
            out.update(info)
        return _compat.output_tensordict(out)


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
    _coefficient_ranges = {
        "clip_epsilon": {"low": 0.0, "high": 1.0, "low_open": True, "high_open": True},
        "clip_epsilon_low": {"low": 0.0, "high": 1.0, "low_open": True, "high_open": True},
        "clip_epsilon_high": {"low": 0.0, "low_open": True},
        "dual_clip": {"low": 1.0, "low_open": True},
    }

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
        self._asymmetric_clip = asymmetric
        if asymmetric:
            if len(clip_epsilon) != 2:
                raise ValueError(
                    "clip_epsilon must be a float or a (low, high) pair of length 2, got "
                    f"{clip_epsilon}."
                )
            check_in_range(
                "clip_epsilon[0]", clip_epsilon[0], 0.0, 1.0, low_open=True, high_open=True
            )
            check_in_range("clip_epsilon[1]", clip_epsilon[1], 0.0, low_open=True)
            self.register_buffer(
                "clip_epsilon_low", torch.tensor(float(clip_epsilon[0]), device=device)
            )
            self.register_buffer(
                "clip_epsilon_high", torch.tensor(float(clip_epsilon[1]), device=device)
            )
        else:
            self._check_coefficient("clip_epsilon", clip_epsilon)
            self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon), device=device))
        if dual_clip is not None:
            self._check_coefficient("dual_clip", dual_clip)
        self._register_optional_buffer("dual_clip", dual_clip)

    def _log_clip_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``log(1 - eps_low), log(1 + eps_high)`` from the clip buffers (computed on every call:
        caching them saved nothing measurable, ClipPPO at batch 64 ran 0.99-1.01x without)."""
        if self._asymmetric_clip:
            return rlf.clip_bounds(self.clip_epsilon_low, self.clip_epsilon_high)
        return rlf.clip_bounds(self.clip_epsilon, self.clip_epsilon)

    def _surrogate(self, log_ratio, advantage, mask, batch, distribution):
        low, high = self._log_clip_bounds()
        surrogate = rlf.clipped_surrogate(log_ratio, advantage, low, high, self.dual_clip)
        with torch.no_grad():
            ratio = log_ratio.exp()
            info = {
                "clip_fraction": rlf.reduce(rlf.clipped(log_ratio, low, high), "mean", mask),
                "ESS": rlf.normalized_effective_sample_size(log_ratio, mask),
                "max_ratio": rlf.reduce(ratio, "max", mask),
                "mean_ratio": rlf.reduce(ratio, "mean", mask),
            }
        return surrogate, info


def _device_of(module: nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    return torch.device("cpu")


class KLPENPPOLoss(PPOLoss):
    """PPO with an adaptive KL penalty: ``loss_objective = -mean(r A - beta KL(pi_old || pi))``.

    Schulman et al., arXiv:1707.06347, section 4. ``KL(pi_old || pi)`` is analytic when the
    distribution family has a closed form, computed from the distribution parameters the batch
    stores (``loc``/``scale``, ``logits``), else a Monte-Carlo estimate with ``samples_mc_kl``
    draws. After the loss is built, beta adapts (in training mode, with grad enabled, when
    ``adaptive_beta``): ``mean KL > 1.5 dtarg -> beta *= increment``, ``mean KL < dtarg / 1.5 ->
    beta *= decrement``, clamped to ``[beta_min, beta_max]``. Outputs add ``kl`` (mean KL) and
    ``beta`` (the value the loss used).

    Args:
        dtarg: target KL. beta: initial beta (a buffer, in ``state_dict``).
        increment, decrement: beta factors (``>= 1`` and ``<= 1``).
        samples_mc_kl: draws of the Monte-Carlo KL.
        adaptive_beta: adapt beta in each forward; with ``False`` call :meth:`update_beta`
            yourself (e.g. once per epoch with the epoch's mean KL).
        beta_min, beta_max: optional bounds on beta.
        Other arguments as :class:`PPOLoss`.

    Differences from TorchRL: TorchRL multiplies beta in place after building ``beta * KL``, so
    the backward pass sees the updated beta while the reported loss used the old one; here the
    gradient is that of the reported loss. TorchRL also adapts beta under ``torch.no_grad()`` and
    in eval mode, and with a host sync (``if kl.mean() > ...``); rlloss's update is a
    ``torch.where`` on the buffer. TorchRL's ``kl`` output is per sample; rlloss's is the mean.

    Example:
        >>> loss = KLPENPPOLoss(actor, critic, dtarg=0.01, beta=1.0)
        >>> out = loss(batch)  # batch holds loc/scale (or logits) of the collecting policy
        >>> out["beta"], out["kl"]
    """

    _schedulable_buffers = frozenset({"beta"})
    _coefficient_ranges = {
        "dtarg": {"low": 0.0, "low_open": True},
        "beta": {"low": 0.0},
        "increment": {"low": 1.0},
        "decrement": {"low": 0.0, "high": 1.0, "low_open": True},
        "samples_mc_kl": {"low": 1, "integer": True},
    }
    _surrogate_keys = ("kl", "beta")

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        dtarg: float = 0.01,
        beta: float = 1.0,
        increment: float = 2.0,
        decrement: float = 0.5,
        samples_mc_kl: int = 1,
        adaptive_beta: bool = True,
        beta_min: float | None = None,
        beta_max: float | None = None,
        **kwargs,
    ) -> None:
        super().__init__(actor_network, critic_network, **kwargs)
        for name, value in (
            ("dtarg", dtarg),
            ("beta", beta),
            ("increment", increment),
            ("decrement", decrement),
            ("samples_mc_kl", samples_mc_kl),
        ):
            self._check_coefficient(name, value)
        if beta_min is not None and beta_max is not None and beta_min > beta_max:
            raise ValueError(f"beta_min ({beta_min}) must be <= beta_max ({beta_max}).")
        if self._actor_call.head is None:
            raise TypeError(
                "KLPENPPOLoss needs an actor ending in a ProbabilisticTensorDictModule (a TorchRL "
                "ProbabilisticActor) to rebuild the collecting policy from stored parameters."
            )
        self.dtarg, self.increment, self.decrement = (
            float(dtarg),
            float(increment),
            float(decrement),
        )
        self.samples_mc_kl = int(samples_mc_kl)
        self.adaptive_beta = adaptive_beta
        self.beta_min, self.beta_max = beta_min, beta_max
        self.register_buffer("beta", torch.tensor(float(beta), device=self.entropy_coeff.device))
        self._beta_init = float(beta)

    def reset(self) -> None:
        """Restore the initial beta (TorchRL's ``reset``), in place."""
        self.beta.fill_(self._beta_init)

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(dict.fromkeys([*super().in_keys, *self._actor_call.parameter_keys.values()]))

    def _surrogate(self, log_ratio, advantage, mask, batch, distribution):
        surrogate, info = super()._surrogate(log_ratio, advantage, mask, batch, distribution)
        kl = self._kl_from_collecting_policy(batch, distribution).unsqueeze(-1)
        beta = self.beta.clone()  # the beta of this loss, whatever the update below does
        mean_kl = rlf.reduce(kl.detach(), "mean", mask)
        if self.adaptive_beta and self.training and torch.is_grad_enabled():
            self.update_beta(mean_kl)
        objective = rlf.kl_penalized_surrogate(surrogate, kl, beta)
        return objective, {**info, "kl": mean_kl, "beta": beta}

    def _kl_from_collecting_policy(
        self, batch: TensorDictBase, distribution: D.Distribution
    ) -> torch.Tensor:
        """``KL(pi_old || pi)``, ``[*B]``, ``pi_old`` rebuilt from the stored parameters;
        summed over the heads of a composite distribution."""
        previous = self._actor_call.stored(batch)
        if not isinstance(distribution, CompositeDistribution):
            return rlf.kl_divergence(previous, distribution, self.samples_mc_kl)
        return sum(
            sum_heads(
                rlf.kl_divergence(previous.dists[name], head, self.samples_mc_kl), batch.batch_size
            )
            for name, head in distribution.dists.items()
        )

    @torch.no_grad()
    def update_beta(self, kl: float | torch.Tensor) -> torch.Tensor:
        """Adapt beta to a mean KL (a float or a one-element tensor) without a host sync."""
        kl = torch.as_tensor(kl, dtype=self.beta.dtype, device=self.beta.device).reshape(())
        beta = rlf.adaptive_kl_beta(
            self.beta, kl, self.dtarg, self.increment, self.decrement, self.beta_min, self.beta_max
        )
        return self.beta.copy_(beta)


class RPOLoss(ClipPPOLoss):
    """Robust Policy Optimization: ClipPPOLoss whose new-policy location gets fresh uniform
    noise in every forward, ``mu -> mu + z``, ``z ~ U(-rpo_alpha, rpo_alpha)`` per element.

    Rahman & Xue, "Robust Policy Optimization in Deep Reinforcement Learning", arXiv:2212.07536;
    CleanRL's ``rpo_continuous_action.py``. The ratio uses the unperturbed log-prob stored at
    collection; the noise reaches the new log-prob and the entropy only. ``rpo_alpha=0`` is
    ClipPPOLoss exactly.

    Args:
        rpo_alpha: noise half-width (a buffer). CleanRL's default 0.5; 0.01 is advised for some
            MuJoCo tasks.
        noise_in_actor: instead of perturbing the location itself, write ``rpo_alpha`` into the
            batch (``[*B, 1]`` under ``tensor_keys.rpo_alpha``) for an actor that reads it and
            applies the noise (skrl's style).
        Other arguments as :class:`ClipPPOLoss`.

    Example:
        >>> loss = RPOLoss(actor, critic, rpo_alpha=0.5)
    """

    @dataclasses.dataclass
    class _AcceptedKeys(ClipPPOLoss._AcceptedKeys):
        """Keys read by RPOLoss: those of the PPO losses, and ``rpo_alpha``."""

        rpo_alpha: NestedKey = "rpo_alpha"  # written for actors that apply the noise themselves

    _schedulable_buffers = frozenset({"rpo_alpha"})
    _coefficient_ranges = {"rpo_alpha": {"low": 0.0}}

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        rpo_alpha: float = 0.5,
        noise_in_actor: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(actor_network, critic_network, **kwargs)
        self._check_coefficient("rpo_alpha", rpo_alpha)
        self.noise_in_actor = noise_in_actor
        if not noise_in_actor:
            keys = self._actor_call.parameter_keys if self._actor_call.head is not None else {}
            if "loc" not in keys or not self._actor_call.direct:
                raise TypeError(
                    "RPOLoss perturbs the 'loc' parameter of a TorchRL ProbabilisticActor whose "
                    "modules are TensorDictModules (e.g. over IndependentNormal or TanhNormal); "
                    "for another actor pass noise_in_actor=True and apply the noise in the actor."
                )
            self._loc_key = keys["loc"]
        self.register_buffer(
            "rpo_alpha", torch.tensor(float(rpo_alpha), device=self.entropy_coeff.device)
        )

    def _distribution(self, batch: TensorDictBase) -> D.Distribution:
        if self.noise_in_actor:
            batch = batch.copy()
            batch.set(self.tensor_keys.rpo_alpha, self.rpo_alpha.expand(*batch.batch_size, 1))
            return self._actor_call(batch)

        def perturb(params: dict) -> dict:
            return {
                **params,
                self._loc_key: rlf.rpo_perturbation(params[self._loc_key], self.rpo_alpha),
            }

        return self._actor_call(batch, perturb)
