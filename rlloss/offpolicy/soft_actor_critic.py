"""The continuous-action soft actor-critic base (SAC v2's steps), shared by ``SACLoss``,
``REDQLoss``, ``TQCLoss``, ``CrossQLoss`` and ``CQLLoss`` (``rlloss.offline``): the Q ensemble,
the temperature and its loss, a reparameterised policy sample with its log-prob, Q at
substituted actions, the soft target and the actor and critic losses. ``DiscreteSACLoss`` shares
the temperature's functions only (:mod:`rlloss.offpolicy.temperature`).

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905."""

from __future__ import annotations

import dataclasses
import math

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Composite, TensorSpec

from rlloss import functional as rlf
from rlloss._checks import (
    Coefficient,
    check_choice,
    check_network,
)
from rlloss._distribution_calls import DistributionCall
from rlloss._ensembles import ensemble_architecture
from rlloss._networks import entry
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss
from rlloss.offpolicy.temperature import (
    OUT_KEYS,
    SCALAR_OUTPUT_MODES,
    log_temperatures,
    projected_alpha,
    soft_outputs,
    zero_where_done,
)


class ContinuousSoftActorCritic(TDTargetLoss):
    """The continuous-action soft actor-critic (SAC v2, no state-value network): the Q ensemble,
    the temperature ``alpha = exp(log_alpha)`` (a parameter, or a buffer with ``fixed_alpha``;
    projected onto ``[min_alpha, max_alpha]`` before each use, as TorchRL does) and its loss, a
    reparameterised policy sample with its log-prob (:meth:`_policy_sample`), the Q ensemble at
    substituted actions (:meth:`_q_values`), the soft target (:meth:`_soft_target`), the actor
    loss (:meth:`loss_actor`) and the critic loss (:meth:`loss_qvalue`).
    :class:`rlloss.SACLoss`, ``CQLLoss``, ``TQCLoss``, ``REDQLoss`` and ``CrossQLoss`` each add
    their own pieces; the keywords are documented in :class:`rlloss.SACLoss`, the replay ones in
    :class:`rlloss.offpolicy.TDTargetLoss`.
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by the continuous SAC losses (``priority``: ``max_i |TD error|``, ``[*B]``)."""

        value: NestedKey = "state_value"  # V(s), written by SAC v1's value network, [*B, 1]
        action: NestedKey = "action"  # the action taken, and the actor's sample key, [*B, A]
        state_action_value: NestedKey = "state_action_value"  # written by the Q networks, [*B, 1]
        log_prob: NestedKey = "action_log_prob"  # kept for TorchRL's key names (not read)

    out_keys = OUT_KEYS
    # with separate_losses, critic layers shared with the actor stay the actor's parameters
    # (detached in the critic loss, as TorchRL's); else every critic layer is the loss's own copy
    _ties_shared_layers = False
    _actor_loss_key = "loss_actor"
    _choices = {**TDTargetLoss._choices, "scalar_output_mode": SCALAR_OUTPUT_MODES}
    # ``exp(log_alpha)``: a parameter, or a buffer with ``fixed_alpha``; bounds on it, None:
    # unbounded; the temperature loss's target (NaN: read from the first batch)
    log_alpha = Coefficient(buffer=True)
    min_log_alpha = Coefficient(buffer=True)
    max_log_alpha = Coefficient(buffer=True)
    target_entropy = Coefficient(buffer=True)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        action_spec: TensorSpec | None = None,
        target_entropy: str | float = "auto",
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        delay_qvalue: bool = True,
        delay_actor: bool = False,
        skip_done_states: bool = False,
        scalar_output_mode: str | None = None,
        gamma: float | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
        priority_key: NestedKey | None = None,
        deactivate_vmap: bool = False,
    ) -> None:
        check_network(type(self).__name__, "actor_network", actor_network)
        check_network(type(self).__name__, "qvalue_network", qvalue_network, ensemble=True)
        super().__init__(
            loss_function=loss_function,
            gamma=gamma,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
            priority_key=priority_key,
            deactivate_vmap=deactivate_vmap,
        )
        if scalar_output_mode is not None:
            check_choice("scalar_output_mode", scalar_output_mode, SCALAR_OUTPUT_MODES)
        self.scalar_output_mode = scalar_output_mode or "exclude"
        self.skip_done_states = skip_done_states
        self.delay_qvalue = delay_qvalue
        self.fixed_alpha = fixed_alpha
        device = next(actor_network.parameters()).device
        self._register_temperature(device, alpha_init, min_alpha, max_alpha)
        self.delay_actor = delay_actor
        value_key = self.tensor_keys.state_action_value
        self._register_networks(actor_network, qvalue_network, num_qvalue_nets, value_key)
        sample_keys = getattr(actor_network, "dist_sample_keys", None) or []
        if len(sample_keys) == 1:
            self.set_keys(action=sample_keys[0])
        self._qvalue_action_key = self.tensor_keys.action
        self._register_action_bounds()
        if target_entropy == "auto":
            action_spec = (
                action_spec if action_spec is not None else getattr(actor_network, "spec", None)
            )
            target_entropy = self._action_entropy_target(action_spec)
        self._target_entropy_from_batch = target_entropy is None
        target_entropy = math.nan if target_entropy is None else target_entropy
        self._register_coefficients(self.log_alpha.device, target_entropy=target_entropy)

    def _register_temperature(self, device, alpha_init, min_alpha, max_alpha) -> None:
        """``log_alpha`` (a parameter, a buffer with ``fixed_alpha``) and its bounds
        ``min_log_alpha`` / ``max_log_alpha`` (``None``: unbounded), after checking them."""
        log_alpha, min_log_alpha, max_log_alpha = log_temperatures(alpha_init, min_alpha, max_alpha)
        if self.fixed_alpha:
            self._register_coefficients(device, log_alpha=log_alpha)
        else:
            self.log_alpha = nn.Parameter(torch.tensor(log_alpha, device=device))
        self._register_coefficients(
            device, min_log_alpha=min_log_alpha, max_log_alpha=max_log_alpha
        )

    def _register_networks(self, actor_network, qvalue_network, num_qvalue_nets, value_key):
        """The actor and its call (a target copy with ``delay_actor``), and the
        ``num_qvalue_nets`` Q networks (with target copies with ``delay_qvalue``) evaluated up
        to ``value_key``."""
        self.actor_network = actor_network
        self._expose_parameters("actor_network")
        self._actor_call = DistributionCall(actor_network)
        self._target_actor_call = None  # SAC v1's value target samples from it (v2: unused)
        if self.delay_actor:
            target_actor = self._register_target_network("actor_network")
            self._target_actor_call = DistributionCall(target_actor.module)
        self._qvalue = self._register_qvalue_ensemble(
            qvalue_network,
            num_qvalue_nets,
            target=self.delay_qvalue,
            until=value_key,
            tied_to="actor_network" if self.separate_losses and self._ties_shared_layers else None,
        )

    qvalue_network = ensemble_architecture("_qvalue", "qvalue_network_params")

    @property
    def in_keys(self) -> list[NestedKey]:
        actor_in_keys = self.actor_network.in_keys
        keys = [*actor_in_keys, *self._qvalue.in_keys, self.tensor_keys.action]
        return self._transition_keys(keys, actor_in_keys)

    def _register_action_bounds(self) -> None:
        """``action_low``/``action_high``: the bounds of the actor's distribution (a TanhNormal's
        ``low``/``high``), ``None`` (not in ``state_dict``) for a distribution without them."""
        bounds = self._actor_call.bounds or (None, None)
        for name, bound in zip(("low", "high"), bounds, strict=True):
            if bound is not None:
                dtype, device = torch.get_default_dtype(), self.log_alpha.device
                bound = torch.as_tensor(bound, dtype=dtype, device=device).clone()
            self.register_buffer(f"action_{name}", bound)

    def _action_entropy_target(self, action_spec) -> float | None:
        """``-dim(A)`` from a spec (TorchRL's rule), or ``None`` to read it from the batch."""
        if action_spec is None:
            return None
        container_shape = torch.Size([])
        if isinstance(action_spec, Composite):
            # the dims of the composite holding the action (e.g. a group's agent dim) are not
            # action dims (TorchRL's rule): ``("agents", "action")`` [n_agents, D] gives -D
            key = self.tensor_keys.action
            parent = key[:-1] if isinstance(key, tuple) and len(key) > 1 else None
            container = action_spec if parent is None else action_spec.get(parent, None)
            container_shape = action_spec.shape if container is None else container.shape
            action_spec = action_spec.get(key, None)
        if action_spec is None:  # e.g. a ProbabilisticActor built without a spec
            return None
        return -float(action_spec.shape[len(container_shape) :].numel())

    def _alpha(self) -> torch.Tensor:
        """``exp(log_alpha)`` (no gradient), ``log_alpha`` projected in place onto its bounds."""
        return projected_alpha(self.log_alpha, self.min_log_alpha, self.max_log_alpha)

    def _soft_critic_loss(
        self, values: torch.Tensor, target: torch.Tensor, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i, y)`` reduced; ``td_error = max_i |Q_i - y|`` ``[*B]``, the targets
        ``[*B]`` and the values ``[num_qvalue_nets, *B]`` (detached)."""
        info = {
            "td_error": rlf.ensemble_td_error(values, target, "absolute").squeeze(-1),
            **rlf.regression_diagnostics(values, target),
        }
        return self._ensemble_critic_loss(values, target, tensordict), info

    def _temperature_loss(self, log_prob: torch.Tensor, tensordict: TensorDictBase):
        """``-log_alpha (log pi + target_entropy)`` reduced (only ``log_alpha`` gets gradient)."""
        loss = rlf.temperature_loss(self.log_alpha, log_prob, self.target_entropy)
        return self._reduce_replayed(loss.unsqueeze(-1), tensordict)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """All three losses, ``alpha`` and the policy's ``entropy`` estimate; writes
        ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        loss_qvalue, info = self.loss_qvalue(batch)
        value_losses = self._value_losses(batch)
        loss_actor, info_actor = self.loss_actor(batch)
        log_prob = info_actor["log_prob"]
        self._write_priority(tensordict, info["td_error"])
        out = {
            "loss_actor": loss_actor,
            "loss_qvalue": loss_qvalue,
            "loss_alpha": self._temperature_loss(log_prob, batch),
            **value_losses,
            **self._addon_entries(info_actor),
        }
        return self._outputs(out, log_prob, tensordict)

    def _outputs(self, losses: dict, log_prob: torch.Tensor, tensordict: TensorDictBase):
        """The losses with ``alpha`` and ``entropy`` (see
        :func:`rlloss.offpolicy.temperature.soft_outputs`)."""
        return soft_outputs(
            losses,
            self.log_alpha,
            log_prob,
            self.reduction,
            self.scalar_output_mode,
            tensordict.batch_size,
        )

    def _value_losses(self, tensordict: TensorDictBase) -> dict:
        """Losses of networks besides the actor, critics and temperature (SAC v1's V)."""
        return {}

    def _skip_done(self, tensordict: TensorDictBase, value: torch.Tensor) -> torch.Tensor:
        """With ``skip_done_states``, ``value`` (``[*B, ...]``) is 0 at transitions whose next
        state is done, as TorchRL's (which does not run the actor there)."""
        if not self.skip_done_states:
            return value
        done = self._get(tensordict, "done", nested=True).reshape(tensordict.batch_size)
        return zero_where_done(value, done)

    def _policy_sample(
        self, batch: TensorDictBase, call: DistributionCall | None = None, repeats: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action ``[*B, D]`` from the current policy (or the one ``call``
        builds) and its log-prob ``[*B]``; with ``repeats``, ``repeats`` actions per state in a
        row along the last batch dim (see ``DistributionCall.sample_with_log_prob``)."""
        call = self._actor_call if call is None else call
        return call.sample_with_log_prob(batch, self.action_low, self.action_high, repeats)

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of ``action`` at the batch's observations
        (``kwargs``: see :meth:`rlloss._ensembles.Ensemble.at_action`)."""
        key = self._qvalue_action_key  # the Q networks' own input key (fixed at construction)
        outputs = self._qvalue.at_action(batch, key, action, **kwargs)
        return outputs[self.tensor_keys.state_action_value]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``alpha log pi(a~|s) - min_i Q_i(s, a~)`` reduced, and the log-probs (detached)."""
        alpha = self._alpha()
        action, log_prob = self._policy_sample(tensordict)
        value = self._policy_value(self._q_values(tensordict, action, detach=True))
        loss = -rlf.soft_value(value, log_prob, alpha)
        self._fill_target_entropy(tensordict, action)
        loss = self._reduce_replayed(loss, tensordict)
        # for add-ons: the sample, and the distribution (the actor runs again if one asks)
        actor = ActorOutput(action=action, distribution=lambda: self._actor_call(tensordict))
        return self._with_policy_addons(loss, tensordict, actor, {"log_prob": log_prob.detach()})

    @property
    def device(self) -> torch.device:
        """TorchRL's attribute: the device of the loss's parameters (``log_alpha``'s)."""
        return self.log_alpha.device

    @property
    def target_entropy_buffer(self) -> torch.Tensor:
        """TorchRL's name of ``target_entropy``."""
        return self.target_entropy

    # TorchRL's SACLoss names for the terms stepped one at a time (e.g. CleanRL's schedule: the
    # critics first, then the policy and the temperature on the updated critics)
    def actor_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """TorchRL's name of :meth:`loss_actor`."""
        return self.loss_actor(tensordict)

    def alpha_loss(self, log_prob: torch.Tensor) -> torch.Tensor:
        """``-log_alpha (log_prob + target_entropy)`` elementwise, **not reduced** (as TorchRL's
        ``alpha_loss``: reduce it yourself, e.g. ``.mean()``); ``log_prob`` is the ``"log_prob"``
        of :meth:`actor_loss`'s metadata, and is detached here."""
        return rlf.temperature_loss(self.log_alpha, log_prob, self.target_entropy)

    def _fill_target_entropy(self, tensordict: TensorDictBase, action: torch.Tensor) -> None:
        """``target_entropy="auto"`` without a spec: ``-dim(A)`` from the batch's action shape,
        written while the buffer is still unset (NaN); in place, no Python state changes, so a
        compiled loss does not recompile."""
        if self._target_entropy_from_batch:
            key = self.tensor_keys.action  # its container's batch dims (agents) are not action dims
            parent = (
                entry(tensordict, key[:-1]) if isinstance(key, tuple) and len(key) > 1 else None
            )
            ndim = parent.ndim if isinstance(parent, TensorDictBase) else tensordict.ndim
            dim = float(action.shape[ndim:].numel())
            unset = self.target_entropy.isnan()
            self.target_entropy.copy_(torch.where(unset, -dim, self.target_entropy))

    def _policy_value(self, values: torch.Tensor) -> torch.Tensor:
        """The critics' estimate ``[*B, 1]`` of ``Q(s, a~)`` that the actor maximises, from the
        ensemble's outputs ``[num_qvalue_nets, *B, 1]``: ``min_i Q_i``."""
        return rlf.clipped_double_q_value(values)

    def _next_soft_value(
        self, next_values: torch.Tensor, next_log_prob: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        """The soft value of the next state, ``min_i Q_i,target(s', a') - alpha log pi(a'|s')``
        ``[*B, 1]``, from the target critics' outputs ``[num_qvalue_nets, *B, 1]``."""
        return rlf.soft_value(rlf.clipped_double_q_value(next_values), next_log_prob, alpha)

    def _soft_target(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The critics' regression target ``r + gamma^n (1 - terminated) V(s')`` (no gradient),
        ``V(s')`` from :meth:`_next_soft_value` with ``a' ~ pi(.|s')``."""
        alpha = self._alpha()
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            next_action, next_log_prob = self._policy_sample(next_batch)
            next_action = self._skip_done(tensordict, next_action)
            next_log_prob = self._skip_done(tensordict, next_log_prob)
            next_values = self._q_values(
                next_batch, next_action, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            next_value = self._next_soft_value(next_values, next_log_prob, alpha)
            return self._td_target(tensordict, next_value)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, and ``td_error``, ``target_value``, ``pred_value``
        (see :meth:`_soft_critic_loss`)."""
        target = self._soft_target(tensordict)
        values = self._q_values(tensordict, self._get(tensordict, "action"))
        return self._soft_critic_loss(values, target, tensordict)
