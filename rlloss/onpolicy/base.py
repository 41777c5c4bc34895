"""The on-policy base of the PPO family and A2C: :class:`OnPolicyLoss`.

It holds what every on-policy loss shares (the actor and critic calls, advantages read or
estimated, the entropy bonus, the critic regression, padding masks); subclasses write the policy
objective.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import CompositeDistribution
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn
from torchrl.objectives.utils import ValueEstimators

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._call_errors import missing_output_error
from rlloss._checks import Coefficient, batch_mask, check_choice
from rlloss._distribution_calls import DistributionCall
from rlloss._keywords import NOT_GIVEN, NotGiven, given_networks
from rlloss._networks import (
    NetworkCall,
    action_log_prob,
    as_list,
    log_prob_of,
    parameter_device,
)
from rlloss.addons import ActorOutput
from rlloss.common import LossModule, accepts_tensor_arguments, fill_padding
from rlloss.estimators.value_norm import (
    ValueNormalizer,
    check_value_normalizer,
    share_value_normalizer,
)
from rlloss.functional.critic import DISTANCES
from rlloss.onpolicy.advantage import (
    check_advantage_options,
    norm_scaled_advantage,
    standardized_advantage,
)
from rlloss.onpolicy.critic import critic_regression
from rlloss.onpolicy.entropy import entropy_bonus, entropy_coefficients, policy_entropy
from rlloss.onpolicy.networks import (
    critic_coefficient,
    critic_params_detached_from_actor,
    declared_actor_keys,
    lacks_any,
    missing_old_value_error,
    proximal_policy,
    with_actor_features,
)
from rlloss.training.distributed import check_process_group

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def as_scalar_output(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """A ``[*B, 1]`` loss as ``[*B]`` with ``reduction="none"`` (TorchRL's output shape)."""
    return loss.squeeze(-1) if reduction == "none" else loss


class OnPolicyLoss(LossModule):
    """The on-policy base: an actor with ``get_dist``, an optional critic, advantages read from
    the batch or estimated (GAE by default), an entropy bonus and the critic's regression (value
    clipping, separate losses), padding masks, TorchRL's keywords. Subclasses give the policy
    objective, ``_objective(batch, advantage, mask) -> (distribution, outputs)`` (the policy on
    the batch and ``loss_objective`` with its diagnostics): the PPO family a ratio surrogate,
    ``A2CLoss`` the plain log-likelihood one. Arguments as :class:`rlloss.PPOLoss`.
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by the on-policy losses."""

        advantage: NestedKey = "advantage"  # A(s, a), [*B, 1]
        value_target: NestedKey = "value_target"  # critic regression target, [*B, 1]
        value: NestedKey = "state_value"  # the critic's V(s), [*B, 1]; old V(s) for clip_value
        sample_log_prob: NestedKey = "action_log_prob"  # log pi_old(a|s) at collection, [*B]
        action: NestedKey = "action"  # the action taken, [*B, *A] (the action spec's shape)
        reward: NestedKey = "reward"  # read under "next" by the value estimator, [*B, 1]
        done: NestedKey = "done"  # read under "next" by the value estimator, [*B, 1]
        terminated: NestedKey = "terminated"  # under "next", read by the value estimator, [*B, 1]
        mask: NestedKey = ("collector", "mask")  # optional padding mask of sequence batches, [*B]

    default_value_estimator = ValueEstimators.GAE
    _value_key_hint = "the value key passed to PPO"  # TorchRL's words, per family
    _critic_loss_key = "loss_critic"  # TorchRL's name of the critic's loss, per family
    _actor_loss_key = "loss_objective"  # TorchRL's name of the policy's loss, per family
    _value_network_name = "critic_network"
    _heads_per_advantage = False  # PPO: a composite action's entropy per advantage element
    _choices = {**LossModule._choices, "loss_critic_type": DISTANCES}
    entropy_coeff = Coefficient(low=0.0, buffer=True)  # 0.0 with a per-head map
    critic_coeff = Coefficient(low=0.0, buffer=True)  # None without a critic loss
    clip_value = Coefficient(low=0.0, low_open=True, buffer=True)  # None: no value clipping
    samples_mc_entropy = Coefficient(low=1, integer=True)
    vf_clip_param = Coefficient(low=0.0, low_open=True)  # None: no clamp of the critic loss
    max_importance_ratio = Coefficient(low=0.0, low_open=True, buffer=True)  # None: no cap

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float | dict[NestedKey, float] | None = None,
        log_explained_variance: bool = True,
        critic_coeff: float | None = None,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        advantage_norm: nn.Module | None = None,
        gamma: float | None = None,
        separate_losses: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        reduction: str | None = None,
        clip_value: float | None = None,
        delay_actor: bool = False,
        max_importance_ratio: float | None = None,
        device: torch.device | str | None = None,
        entropy_coef: NotGiven = NOT_GIVEN,
        critic_coef: NotGiven = NOT_GIVEN,
        diagnostics: bool = True,
        vf_clip_param: float | None = None,
        policy_loss_addons: list | None = None,
        value_normalizer: ValueNormalizer | None = None,
        normalize_advantage_global: bool = False,
        process_group: ProcessGroup | None = None,
    ) -> None:
        torchrl = {
            "gamma": gamma,
            "advantage_key": advantage_key,
            "value_target_key": value_target_key,
            "value_key": value_key,
            "critic_coef": critic_coef,
            "entropy_coef": entropy_coef,
        }
        actor_network, critic_network = given_networks(
            self, actor_network, critic_network, actor, critic, torchrl
        )
        entropy_coeff = 0.01 if entropy_coeff is None else entropy_coeff  # TorchRL's default
        super().__init__()
        self._check_objective()
        owner = type(self).__name__
        critic_coeff = critic_coefficient(owner, actor_network, critic_network, critic_coeff)
        entropy_coeff, self._entropy_coeff_map = entropy_coefficients(entropy_coeff)
        check_choice("loss_critic_type", loss_critic_type, DISTANCES)
        if isinstance(clip_value, bool):  # ClipPPOLoss maps True to clip_epsilon; here, TorchRL's
            raise ValueError(f"clip_value must be a float or a scalar tensor, got {clip_value}.")
        self.reduction = self._check_reduction(reduction)
        self._register_policy_addons(policy_loss_addons)
        self._register_networks(actor_network, critic_network, value_normalizer)
        self._set_advantage_normalization(
            normalize_advantage,
            normalize_advantage_global,
            process_group,
            normalize_advantage_exclude_dims,
            advantage_norm,
        )
        self.entropy_bonus = entropy_bonus
        self.log_explained_variance = log_explained_variance
        self.diagnostics = diagnostics
        self.loss_critic_type = loss_critic_type
        self.separate_losses = separate_losses
        self._has_critic = critic_network is not None and bool(critic_coeff)
        self._functional = functional
        self._register_coefficients(
            parameter_device(actor_network) if device is None else torch.device(device),
            entropy_coeff=entropy_coeff,
            samples_mc_entropy=samples_mc_entropy,
            critic_coeff=critic_coeff if self._has_critic else None,
            clip_value=clip_value,
            vf_clip_param=vf_clip_param,
            max_importance_ratio=max_importance_ratio,
        )
        self._critic_params_without_shared = self._critic_params_cut_from_actor()
        self._register_proximal_policy(delay_actor)
        if value_normalizer is not None:  # built now: it holds the normaliser (state, compile)
            self.make_value_estimator()

    @classmethod
    def _check_objective(cls) -> None:
        """Refuse a base without a policy objective (``_objective``)."""
        if not callable(getattr(cls, "_objective", None)):
            raise TypeError(
                f"{cls.__name__} is an on-policy base without a policy objective: "
                "subclasses define _objective(batch, advantage, mask) -> (distribution, "
                "outputs); use PPOLoss, ClipPPOLoss, A2CLoss... "
            )

    def _register_networks(self, actor_network, critic_network, value_normalizer) -> None:
        """Hold the actor, the critic, their calls and the critic's value normaliser; read the
        action and log-prob keys the actor declares, over the defaults."""
        check_value_normalizer(type(self).__name__, value_normalizer)
        if value_normalizer is not None and critic_network is None:
            raise ValueError(
                f"{type(self).__name__}: value_normalizer standardises the critic's targets; "
                "it needs a critic_network."
            )
        self.value_normalizer = value_normalizer
        self.actor_network = actor_network
        self.critic_network = critic_network
        self._actor_call = DistributionCall(actor_network)
        self._critic_call = None if critic_network is None else NetworkCall(critic_network)
        for name, keys in declared_actor_keys(actor_network).items():
            setattr(self.tensor_keys, name, keys)

    def _set_advantage_normalization(
        self, local: bool, global_: bool, process_group, exclude_dims, advantage_norm
    ) -> None:
        owner = type(self).__name__
        self.normalize_advantage_exclude_dims = check_advantage_options(
            owner, local, global_, exclude_dims, advantage_norm
        )
        self.normalize_advantage = local
        self.normalize_advantage_global = global_
        self.advantage_norm = advantage_norm  # a submodule: its statistics are in state_dict
        check_process_group(owner, process_group)
        self.process_group = process_group

    def _register_proximal_policy(self, delay_actor: bool) -> None:
        """With ``delay_actor``, a target copy of the actor (``target_actor_network_params``,
        moved by TorchRL's ``SoftUpdate`` / ``HardUpdate``): the proximal policy of the PPO
        losses (PPO-EWMA, Hilton et al., arXiv:2110.00641)."""
        self.delay_actor = delay_actor
        self._proximal = None
        if not delay_actor:
            return
        proximal, params = proximal_policy(self.actor_network, self._functional)
        _compat.expect_updater(self, "actor_network")
        self._proximal, self.target_actor_network_params = proximal, params
        self._refresh_views()
        self._warn_until_every_target_has_an_updater()

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

    def _critic_params_cut_from_actor(self) -> TensorDict | None:
        """With ``separate_losses``, the critic's parameters with those it shares with the actor
        detached (:func:`~rlloss.onpolicy.networks.critic_params_detached_from_actor`);
        ``None`` without, or when nothing is shared."""
        if not (self.separate_losses and self._has_critic):
            return None
        return critic_params_detached_from_actor(self.actor_network, self.critic_network)

    def _refresh_views(self) -> None:
        if self._critic_params_without_shared is not None:
            self._critic_params_without_shared = self._critic_params_cut_from_actor()
        if getattr(self, "_proximal", None) is not None:  # read from the tree: see TDTargetLoss
            target = dict(self.named_children())["target_actor_network_params"]
            self._proximal.use(target.flatten_keys("."))

    @property
    def in_keys(self) -> list[NestedKey]:
        """The entries the loss reads, with those its value estimator reads when the batch has
        no advantage (the networks' inputs under ``"next"``, reward, done, terminated)."""
        keys = [*self.actor_network.in_keys, *as_list(self.tensor_keys.action)]
        keys += [*self._objective_in_keys(), self.tensor_keys.advantage]
        next_inputs = list(self.actor_network.in_keys)
        if self._has_critic:
            keys += [*self.critic_network.in_keys, self.tensor_keys.value_target]
            keys += [self.tensor_keys.value] if self.clip_value is not None else []
            next_inputs += self.critic_network.in_keys
        return self._transition_keys(keys, next_inputs)

    @property
    def out_keys(self) -> list[str]:
        """The entries of the output TensorDict."""
        keys = list(self._objective_out_keys())
        keys += ["loss_entropy"] if self.entropy_bonus else []
        keys += ["entropy"] if self.entropy_bonus and self.diagnostics else []
        if self._has_critic:
            keys += [self._critic_loss_key]
            if self.diagnostics:
                keys += ["value_clip_fraction"] if self.clip_value is not None else []
                keys += ["explained_variance"] if self.log_explained_variance else []
        return keys

    def _objective_in_keys(self) -> list[NestedKey]:
        """The entries the policy objective reads besides the action and the advantage."""
        return []

    def _objective_out_keys(self) -> list[str]:
        """The entries the policy objective writes."""
        return ["loss_objective"]

    # ----------------------------------------------------------------------------- pieces
    def _advantage(
        self, batch: TensorDictBase, mask: torch.Tensor | None
    ) -> tuple[TensorDictBase, torch.Tensor]:
        """The batch's advantage, normalised as asked; when absent, the value estimator writes
        it (and the value target) into a shallow copy of the batch, returned with it. An
        ``advantage_norm`` learns from the value targets of the advantages the loss estimated
        itself, in training mode (TorchRL's rule)."""
        advantage = self._read(batch, "advantage")
        estimated = advantage is None
        if estimated:
            if self.critic_network is None:
                self._get(batch, "advantage")  # raises: nothing to estimate it with
            batch = self.value_estimator(batch.copy(), **self._estimator_weights())
            advantage = self._get(batch, "advantage")
        if self.advantage_norm is not None:
            target = self._get(batch, "value_target") if estimated and self.training else None
            return batch, norm_scaled_advantage(advantage, self.advantage_norm, target, mask)
        if self.normalize_advantage:
            advantage = standardized_advantage(
                type(self).__name__,
                advantage,
                mask,
                batch.numel(),
                self.normalize_advantage_exclude_dims,
                self.normalize_advantage_global,
                self.process_group,
            )
        return batch, advantage

    def make_value_estimator(self, value_type=None, **hyperparams):
        """:meth:`rlloss.LossModule.make_value_estimator`; with a ``value_normalizer``, the
        estimator shares it (it de-normalises the critic's outputs and updates the moments with
        the value targets it computes)."""
        super().make_value_estimator(value_type, **hyperparams)
        if self.value_normalizer is not None:
            share_value_normalizer(
                type(self).__name__, _compat.stored_value_estimator(self), self.value_normalizer
            )
        return self

    def _estimator_weights(self) -> dict:
        """Keywords of the value estimator's call (``target_params`` for a target critic)."""
        return {}

    def _log_prob(self, distribution: D.Distribution, batch: TensorDictBase, shape=None):
        """``log pi(a|s)``, ``[*B]``; summed over the heads of a composite distribution (to
        ``shape``: PPO's advantage shape, per agent where the advantage is)."""
        owner, key = type(self).__name__, self._tensor_keys.action
        if not isinstance(distribution, CompositeDistribution):
            return log_prob_of(distribution, self._get(batch, "action"), key, owner)
        return action_log_prob(distribution, batch, key, owner, shape)

    def _distribution(self, batch: TensorDictBase) -> D.Distribution:
        """The current policy at the batch's observations."""
        return self._actor_call(batch)

    def get_entropy_bonus(self, dist: D.Distribution) -> torch.Tensor:
        """TorchRL's (``A2CLoss``'s) method: the entropy of ``dist`` ``[*B, 1]`` (its closed
        form where it has one, else the Monte-Carlo estimate over ``samples_mc_entropy``
        draws; summed over the heads of a composite one), neither scaled nor reduced."""
        return policy_entropy(dist, self.samples_mc_entropy).unsqueeze(-1)

    def loss_entropy(
        self, distribution: D.Distribution, mask: torch.Tensor | None, shape=None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``-entropy_coeff * H[pi(.|s)]`` reduced (analytic where the distribution has a
        closed form, else ``samples_mc_entropy`` draws), and the mean entropy (detached); per
        head for a composite distribution, summed to ``shape``
        (:func:`~rlloss.onpolicy.entropy.entropy_bonus`)."""
        return entropy_bonus(
            distribution,
            mask,
            shape,
            coeff=self.entropy_coeff,
            coeff_map=self._entropy_coeff_map,
            samples=self.samples_mc_entropy,
            reduction=self.reduction,
            diagnostics=self.diagnostics,
        )

    def _critic_value(self, batch: TensorDictBase) -> torch.Tensor:
        params = self._critic_params_without_shared
        if self.separate_losses:
            batch = batch.detach()
        if lacks_any(batch, self._critic_call.in_keys):  # a critic head on the actor's trunk
            batch = with_actor_features(batch, self.actor_network, self.separate_losses)
        if params is None:
            outputs = self._critic_call(batch)
        else:
            with params.to_module(self.critic_network):
                outputs = self._critic_call(batch)
        value = outputs.get(self._tensor_keys.value, None)
        if value is None:  # a critic writing another key: named, with the set_keys call
            key, written = self.tensor_keys.value, self.critic_network.out_keys
            owner, network = type(self).__name__, self._value_network_name
            raise missing_output_error(owner, network, "value", key, written)
        return value

    def _old_value(self, batch: TensorDictBase) -> torch.Tensor:
        """``V_old(s)`` stored at collection, needed by value clipping (TorchRL's message)."""
        value = self._read(batch, "value")
        if value is None:
            key, hint = self.tensor_keys.value, self._value_key_hint
            raise missing_old_value_error(type(self).__name__, self.clip_value, key, hint)
        return value

    def loss_critic(
        self, batch: TensorDictBase, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``critic_coeff * L(V(s), value_target)`` (value-clipped if asked, clamped to
        ``[0, vf_clip_param]`` if asked) reduced, with the clip fraction and explained
        variance; with a ``value_normalizer``, ``value_target`` and the old value are
        normalised first (the critic's output is in normalised units). The arithmetic:
        :func:`~rlloss.onpolicy.critic.critic_regression`."""
        target = self._get(batch, "value_target")
        clip_value = self.clip_value
        old_value = None if clip_value is None else self._old_value(batch)
        value = self._critic_value(batch)
        target, value, old_value = self._critic_inputs(target, value, old_value, mask)
        return critic_regression(
            value,
            target,
            old_value,
            mask,
            coeff=self.critic_coeff,
            distance=self.loss_critic_type,
            reduction=self.reduction,
            clip_value=clip_value,
            vf_clip_param=self.vf_clip_param,
            explained_variance=self.log_explained_variance and self.diagnostics,
            clip_fraction=self.diagnostics,
        )

    def _critic_inputs(
        self,
        target: torch.Tensor,
        value: torch.Tensor,
        old_value: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The critic regression's target, prediction and old value, in the units it learns
        in: with a ``value_normalizer`` the critic outputs normalised values, so the target and
        the old value are normalised (TorchRL's ``_critic_loss_inputs`` hook; MAPPO's
        ``value_norm`` overrides it and learns from the valid steps of ``mask``)."""
        if self.value_normalizer is not None:
            target = self.value_normalizer.normalize(target)
            old_value = None if old_value is None else self.value_normalizer.normalize(old_value)
        return target, value, old_value

    def _reduce_policy_term(self, term: torch.Tensor, batch: TensorDictBase) -> torch.Tensor:
        """``term`` (``[*B]``) reduced over the valid steps, as ``loss_objective``."""
        reduced = rlf.reduce(term.unsqueeze(-1), self.reduction, self._padding_mask(batch))
        return as_scalar_output(reduced, self.reduction)

    def _padding_mask(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        mask = self._read(tensordict, "mask")
        if mask is None:
            return None
        return batch_mask(type(self).__name__, self.tensor_keys.mask, mask, tensordict.shape)

    # ----------------------------------------------------------------------------- forward
    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Compute the losses on a batch (the caller's TensorDict is not modified)."""
        mask = self._padding_mask(tensordict)
        if mask is not None:  # padded sequences: padding enters no arithmetic
            tensordict = fill_padding(tensordict, mask, [self.tensor_keys.mask])
        batch, advantage = self._advantage(tensordict, mask)
        distribution, out = self._objective(batch, advantage, mask)
        if self._addon_keys:
            key, actor = self._actor_loss_key, ActorOutput(distribution=distribution)
            out[key], _ = self._with_policy_addons(out[key], batch, actor, out)
        if self.entropy_bonus:
            shape = advantage.shape[:-1] if self._heads_per_advantage else None
            loss, info = self.loss_entropy(distribution, mask, shape)
            out["loss_entropy"] = loss  # already [*B] with reduction="none"
            out.update(info)
        if self._has_critic:
            loss, info = self.loss_critic(batch, mask)
            out[self._critic_loss_key] = as_scalar_output(loss, self.reduction)
            out.update(info)
        return TensorDict(out, batch_size=[])
