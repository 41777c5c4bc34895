"""Soft actor-critic: ``SACLoss`` (continuous actions, SAC v2 without a value network) and
``DiscreteSACLoss``, and the losses built on ``SACLoss``: ``CQLLoss`` (conservative Q-learning,
for offline RL), ``TQCLoss`` (truncated quantile critics), ``REDQLoss`` (a large ensemble with
a random subset in the target) and ``CrossQLoss`` (no target networks, batch-normalised critics
on the current and next transitions in one pass).

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905;
Christodoulou, "Soft Actor-Critic for Discrete Action Settings", arXiv:1910.07207; Kumar et al.,
"Conservative Q-Learning for Offline Reinforcement Learning", arXiv:2006.04779; Kuznetsov et al.,
"Controlling Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile
Critics", arXiv:2005.04269; Chen et al., "Randomized Ensembled Double Q-Learning: Learning Fast
Without a Model", arXiv:2101.05982; Bhatt et al., "CrossQ: Batch Normalization in Deep
Reinforcement Learning for Greater Sample Efficiency and Simplicity", ICLR 2024."""

from __future__ import annotations

import dataclasses
import math

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    CompositeDistribution,
    composite_lp_aggregate,
    set_composite_lp_aggregate,
)
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Composite
from torchrl.modules import TanhNormal

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import (
    check_choice,
    check_concatenable,
    check_in_range,
    check_network,
    next_key,
    refuse_unknown_keywords,
)
from rlloss._networks import (
    DistributionCall,
    NetworkCall,
    entry,
    log_prob_of,
    network_inputs,
    sum_heads,
)
from rlloss.addons import ActorOutput
from rlloss.offpolicy import ACTION_SPACES, TDTargetLoss, ensemble_architecture

_OUT_KEYS = ["loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"]


class _SoftActorCritic(TDTargetLoss):
    """What both SAC losses share: the Q ensemble, the temperature ``alpha = exp(log_alpha)``
    (a parameter, or a buffer with ``fixed_alpha``; projected onto ``[min_alpha, max_alpha]``
    before each use, as TorchRL does), its loss and the outputs.

    ``value``: the name of the key the Q networks write (``tensor_keys.<value>``); the other
    keywords are documented in :class:`SACLoss`, ``replay`` in
    :class:`rlloss.offpolicy.TDTargetLoss`.
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """The keys both SAC losses have (besides the replay keys)."""

        value: NestedKey = "state_value"  # kept for TorchRL's key names (not read)

    out_keys = _OUT_KEYS
    # with separate_losses, critic layers shared with the actor stay the actor's parameters
    # (detached in the critic loss, as TorchRL's); else every critic layer is the loss's own copy
    _ties_shared_layers = False
    _actor_loss_key = "loss_actor"
    # scalar assignment (``loss.target_entropy = -3.0``) updates these buffers in place
    _schedulable_buffers = frozenset(
        {"log_alpha", "min_log_alpha", "max_log_alpha", "target_entropy"}
    )

    def __init__(
        self,
        actor_network,
        qvalue_network,
        *,
        value: str,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        delay_qvalue: bool = True,
        delay_actor: bool = False,
        skip_done_states: bool = False,
        deactivate_vmap: bool = False,
        scalar_output_mode: str | None = None,
        priority_key: NestedKey | None = None,
        **replay,
    ) -> None:
        check_network(type(self).__name__, "actor_network", actor_network)
        check_network(type(self).__name__, "qvalue_network", qvalue_network, ensemble=True)
        super().__init__(loss_function=loss_function, **replay)
        if scalar_output_mode is not None:
            check_choice("scalar_output_mode", scalar_output_mode, ("exclude", "non_tensor"))
        self.scalar_output_mode = scalar_output_mode or "exclude"
        self.skip_done_states = skip_done_states
        self.deactivate_vmap = deactivate_vmap  # same numbers: the ensemble path is rlloss's own
        if priority_key is not None:  # removed from TorchRL's constructors: the same error
            raise RuntimeError(
                f"{type(self).__name__}: setting priority_key via the constructor is deprecated "
                f"(as in TorchRL); use loss.set_keys(priority={priority_key!r}) instead."
            )
        check_in_range("num_qvalue_nets", num_qvalue_nets, 1, integer=True)
        check_in_range("alpha_init", alpha_init, 0.0, low_open=True)
        for name, bound in (("min_alpha", min_alpha), ("max_alpha", max_alpha)):
            if bound is not None:
                check_in_range(name, bound, 0.0, low_open=True)
        if min_alpha is not None and max_alpha is not None:
            check_in_range("max_alpha", max_alpha, min_alpha)
        self.num_qvalue_nets = int(num_qvalue_nets)
        self.delay_qvalue = delay_qvalue
        self.fixed_alpha = fixed_alpha
        device = next(actor_network.parameters()).device

        def log_of(bound):
            return None if bound is None else torch.tensor(math.log(bound), device=device)

        log_alpha = log_of(alpha_init)
        if fixed_alpha:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)
        self.register_buffer("min_log_alpha", log_of(min_alpha))
        self.register_buffer("max_log_alpha", log_of(max_alpha))

        self.actor_network = actor_network
        self._expose_parameters("actor_network")
        self.delay_actor = delay_actor
        self._actor_call = DistributionCall(actor_network)
        self._target_actor_call = None  # SAC v1's value target samples from it (v2: unused)
        if delay_actor:
            target_actor = self._register_target_network("actor_network")
            self._target_actor_call = DistributionCall(target_actor.module)
        self._qvalue = self._register_ensemble(
            "qvalue_network",
            qvalue_network,
            self.num_qvalue_nets,
            target=delay_qvalue,
            until=getattr(self.tensor_keys, value),
            tied_to="actor_network" if self.separate_losses and self._ties_shared_layers else None,
        )

    qvalue_network = ensemble_architecture("_qvalue", "qvalue_network_params")

    @property
    def in_keys(self) -> list[NestedKey]:
        actor_in_keys = self.actor_network.in_keys
        keys = [*actor_in_keys, *self._qvalue.in_keys, self.tensor_keys.action]
        return self._transition_keys(keys, actor_in_keys)

    def _alpha(self) -> torch.Tensor:
        """``exp(log_alpha)`` (no gradient), after projecting ``log_alpha`` in place onto
        ``[log min_alpha, log max_alpha]`` (TorchRL's behaviour; no host sync)."""
        if self.min_log_alpha is not None or self.max_log_alpha is not None:
            with torch.no_grad():
                self.log_alpha.clamp_(self.min_log_alpha, self.max_log_alpha)
        return self.log_alpha.detach().exp()

    def _soft_critic_loss(
        self, values: torch.Tensor, target: torch.Tensor, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i, y)`` reduced; ``td_error = max_i |Q_i - y|`` ``[*B]``, the targets
        ``[*B]`` and the values ``[num_qvalue_nets, *B]`` (detached)."""
        info = {
            "td_error": rlf.ensemble_td_error(values, target, "absolute").squeeze(-1),
            **self._regression_diagnostics(values, target),
        }
        return self._ensemble_critic_loss(values, target, tensordict), info

    def _temperature_loss(self, log_prob: torch.Tensor, tensordict: TensorDictBase):
        """``-log_alpha (log pi + target_entropy)`` reduced (only ``log_alpha`` gets gradient)."""
        loss = rlf.temperature_loss(self.log_alpha, log_prob, self.target_entropy)
        return self._reduce_replayed(loss.unsqueeze(-1), tensordict)

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
        """The losses with ``alpha`` and ``entropy`` (``-mean(log pi)``): one TensorDict of
        scalars, or with ``reduction="none"`` of per-sample losses (the two scalars as non-tensor
        entries with ``scalar_output_mode="non_tensor"``, else left out, as TorchRL)."""
        scalars = {"alpha": self.log_alpha.detach().exp(), "entropy": -log_prob.mean()}
        if self.reduction != "none":
            return _compat.output_tensordict({**losses, **scalars})
        out = TensorDict(losses, batch_size=tensordict.batch_size)  # per-sample losses
        if self.scalar_output_mode == "non_tensor":
            for name, value in scalars.items():
                out.set_non_tensor(name, value)
        return out

    def _value_losses(self, tensordict: TensorDictBase) -> dict:
        """Losses of networks besides the actor, critics and temperature (SAC v1's V)."""
        return {}

    def _skip_done(self, tensordict: TensorDictBase, value: torch.Tensor) -> torch.Tensor:
        """With ``skip_done_states``, ``value`` (``[*B, ...]``) is 0 at transitions whose next
        state is done, as TorchRL's (which does not run the actor there)."""
        if not self.skip_done_states:
            return value
        done = self._get(tensordict, "done", nested=True).reshape(tensordict.batch_size)
        done = done.reshape(*done.shape, *(1,) * (value.ndim - done.ndim))
        return torch.where(done, torch.zeros((), dtype=value.dtype, device=value.device), value)


class SACLoss(_SoftActorCritic):
    """SAC's actor, critic and temperature losses (SAC v2: no state-value network).

    Critic: ``sum_i L(Q_i(s, a), y)``, ``y = r + gamma^n (1 - terminated) (min_i Q_i,target(s',
    a') - alpha log pi(a'|s'))`` with ``a' ~ pi(.|s')`` from the current policy, no gradient.
    Actor: ``alpha log pi(a~|s) - min_i Q_i(s, a~)`` with ``a~`` reparameterised (the critics
    get no gradient from it). Temperature: ``-log alpha (log pi(a~|s) + target_entropy)``
    (arXiv:1812.05905, eqs. 5, 7 and 18). The Q networks are an ensemble of ``num_qvalue_nets``
    evaluated in one ``vmap`` call. ``forward`` writes ``td_error`` (``max_i |Q_i - y|``,
    ``[*B]``) into the batch.

    For a TorchRL ``ProbabilisticActor`` over ``TanhNormal`` the action and its log-probability
    come from :func:`rlloss.functional.tanh_normal_sample_and_log_prob` on the actor's
    ``loc``/``scale`` (no ``torch.distributions`` transform path, no host sync); any other
    actor is sampled with its distribution's ``rsample`` and ``log_prob``.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module reading the observation and ``action`` and writing
            ``state_action_value``, or a list of ``num_qvalue_nets`` such modules (weights kept;
            copies of a single module are re-initialised).
        num_qvalue_nets, loss_function: as in TorchRL.
        alpha_init: initial temperature; ``fixed_alpha``: keep it (``log_alpha`` is a buffer).
        min_alpha, max_alpha: bounds on alpha (``log_alpha`` is projected before each use).
        action_spec: the action spec, for ``target_entropy="auto"`` (``-dim(A)``); without it
            the actor's ``spec``, else the batch's action shape at the first call.
        target_entropy: ``"auto"`` or a number.
        delay_actor: not supported (SAC v2 samples target actions from the current policy).
        delay_value: accepted and ignored, as TorchRL does for SAC v2 (it concerns the state-value
            network of SAC v1, which SAC v2 does not have).
        delay_qvalue: keep target Q copies (update them with ``SoftUpdate``).
        gamma, reduction, use_prioritized_weights, priority_weighting,
            policy_loss_addons: see
            :class:`rlloss.offpolicy.TDTargetLoss`.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean (pass
    ``"normalized"`` for TorchRL's numbers); ``alpha`` and ``entropy`` are returned with
    ``reduction="none"`` too; ``value_network`` (SAC v1), ``delay_actor=True``,
    ``skip_done_states=True`` and ``separate_losses=True`` are not supported; the tanh is not
    clamped away from ±1 (TorchRL's ``safe_tanh``): the log-probability is computed from the
    pre-tanh value, finite at the bounds.

    Example:
        >>> loss = SACLoss(actor, [qvalue_1, qvalue_2], action_spec=env.action_spec)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(_SoftActorCritic._AcceptedKeys):
        """Keys read by SACLoss (``priority``: ``max_i |TD error|``, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken, and the actor's sample key
        state_action_value: NestedKey = "state_action_value"  # written by the Q networks
        log_prob: NestedKey = "action_log_prob"  # kept for TorchRL's key names (not read)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        value_network: nn.Module | None = None,
        *,
        action_spec=None,
        target_entropy: str | float = "auto",
        delay_value: bool = True,
        **options,
    ) -> None:
        super().__init__(actor_network, qvalue_network, value="state_action_value", **options)
        self._version = 1 if value_network is not None else 2
        self.value_network = value_network
        self.delay_value = delay_value
        if value_network is not None:  # SAC v1 (arXiv:1801.01290): V(s) and its target
            self._expose_parameters("value_network")
            self._value_call = NetworkCall(value_network, self.tensor_keys.value)
            self._target_value = (
                self._register_target_network("value_network", self.tensor_keys.value)
                if delay_value
                else self._register_detached_view("value_network", self.tensor_keys.value)
            )
        sample_keys = getattr(actor_network, "dist_sample_keys", None) or []
        if len(sample_keys) == 1:
            self.set_keys(action=sample_keys[0])
        self._qvalue_action_key = self.tensor_keys.action
        self._tanh_normal = self._tanh_normal_bounds(actor_network)
        if target_entropy == "auto":
            action_spec = (
                action_spec if action_spec is not None else getattr(actor_network, "spec", None)
            )
            target_entropy = self._action_entropy_target(action_spec)
        self._target_entropy_from_batch = target_entropy is None
        self.register_buffer(
            "target_entropy",
            torch.tensor(
                math.nan if target_entropy is None else float(target_entropy),
                device=self.log_alpha.device,
            ),
        )

    def _tanh_normal_bounds(self, actor_network) -> bool:
        """Register ``action_low``/``action_high`` and return ``True`` when the actor is a
        TanhNormal ``ProbabilisticActor`` that rlloss can sample directly from its parameters."""
        head = self._actor_call.head
        if not self._actor_call.direct or head.distribution_class is not TanhNormal:
            return False
        kwargs = dict(head.distribution_kwargs)
        if kwargs.get("tanh_loc", False) or kwargs.get("event_dims", 1) != 1:
            return False
        if set(self._actor_call.parameter_keys) != {"loc", "scale"}:
            return False
        device = self.log_alpha.device
        dtype = torch.get_default_dtype()
        for name, bound in (("low", -1.0), ("high", 1.0)):
            value = torch.as_tensor(kwargs.get(name, bound), dtype=dtype, device=device)
            self.register_buffer(f"action_{name}", value.clone())
        return True

    def _action_entropy_target(self, action_spec) -> float | None:
        """``-dim(A)`` from a spec (TorchRL's rule), or ``None`` to read it from the batch."""
        if action_spec is None:
            return None
        container_shape = torch.Size([])
        if isinstance(action_spec, Composite):
            container_shape = action_spec.shape
            action_spec = action_spec.get(self.tensor_keys.action, None)
        if action_spec is None:  # e.g. a ProbabilisticActor built without a spec
            return None
        return -float(action_spec.shape[len(container_shape) :].numel())

    def _policy_sample(
        self, batch: TensorDictBase, call: DistributionCall | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action ``[*B, D]`` from the current policy (or the one ``call``
        builds) and its log-prob ``[*B]``."""
        call = self._actor_call if call is None else call
        if self._tanh_normal:
            return self._squashed_sample(call.distribution_parameters(batch), call)
        return self._sample(call(batch), batch.batch_size)

    def _squashed_sample(
        self, params: dict, call: DistributionCall, repeats: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A tanh-Normal action and its log-prob from the actor's parameters (``params``, as
        ``call.distribution_parameters`` returns them); with ``repeats``, ``repeats`` actions
        per state, in a row along the last batch dim (``[*B[:-1], B[-1] * repeats, D]``)."""
        keys = call.parameter_keys
        loc, scale = params[keys["loc"]], params[keys["scale"]]
        if repeats > 1:
            loc, scale = (x.repeat_interleave(repeats, dim=loc.ndim - 2) for x in (loc, scale))
        return rlf.tanh_normal_sample_and_log_prob(loc, scale, self.action_low, self.action_high)

    @staticmethod
    def _sample(distribution, batch_size: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action of ``distribution`` and its log-prob ``[*B]``."""
        if isinstance(distribution, CompositeDistribution):  # a TensorDict of actions
            with set_composite_lp_aggregate(False):
                action = distribution.rsample()
                return action, sum_heads(distribution.log_prob(action), batch_size)
        action = distribution.rsample()
        return action, distribution.log_prob(action)

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of ``action`` at the batch's observations."""
        key = self._qvalue_action_key  # the Q networks' own input key (fixed at construction)
        inputs = network_inputs(batch, self._qvalue, exclude=key)
        inputs[key] = action
        return self._qvalue(inputs, **kwargs)[self.tensor_keys.state_action_value]

    @property
    def out_keys(self) -> list[str]:
        return [*_OUT_KEYS, *(["loss_value"] if self._version == 1 else [])]

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = super().in_keys
        return (
            keys
            if self._version == 2
            else list(dict.fromkeys([*keys, *self.value_network.in_keys]))
        )

    def _value_losses(self, tensordict: TensorDictBase) -> dict:
        return {} if self._version == 2 else {"loss_value": self.loss_value(tensordict)}

    def loss_value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """SAC v1's state-value loss ``L(V(s), min_i Q_i,target(s, a~) - alpha log pi(a~|s))``
        reduced, ``a~`` from the target policy (the current one without ``delay_actor``), no
        gradient through the target (arXiv:1801.01290, eq. 5)."""
        alpha = self._alpha()
        with torch.no_grad():
            action, log_prob = self._policy_sample(tensordict, self._target_actor_call)
            values = self._q_values(
                tensordict, action, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            target = rlf.soft_value(rlf.clipped_double_q_value(values), log_prob, alpha)
        value = self._value_call(tensordict)[self.tensor_keys.value]
        loss = rlf.distance(value, target, self.loss_function)
        return self._reduce_replayed(loss, tensordict)

    def _qvalue_v1_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """SAC v1's critic loss, as TorchRL computes it: ``y = r + gamma^n (1 - terminated)
        V_target(s')`` and each Q network regressed on its own ``1 / num_qvalue_nets`` of the
        batch (the batch size must be a multiple of it); ``td_error = (Q_i - y)^2``."""
        with torch.no_grad():
            next_value = self._target_value(entry(tensordict, "next"))[self.tensor_keys.value]
            target = self._td_target(tensordict, next_value)
        n, size = self.num_qvalue_nets, tensordict.batch_size
        if size[0] % n:
            raise RuntimeError(
                f"SACLoss (SAC v1): the batch's first dimension ({size[0]}) must be a multiple "
                f"of num_qvalue_nets={n}: each Q network is trained on its own share of it."
            )
        values = self._q_values(tensordict, self._get(tensordict, "action"))  # [n, *B, 1]
        own = values.reshape(n, n, -1, *values.shape[2:]).diagonal(dim1=0, dim2=1)
        own = own.movedim(-1, 0).reshape(values.shape[1:])
        loss = rlf.distance(own, target, self.loss_function)
        info = {
            "td_error": (own - target).pow(2).reshape(size),
            **self._regression_diagnostics(own, target),
        }
        return self._reduce_replayed(loss, tensordict), info

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

    def _fill_target_entropy(self, tensordict: TensorDictBase, action: torch.Tensor) -> None:
        """``target_entropy="auto"`` without a spec: ``-dim(A)`` from the batch's action shape,
        written while the buffer is still unset (NaN); in place, no Python state changes, so a
        compiled loss does not recompile."""
        if self._target_entropy_from_batch:
            dim = float(action.shape[tensordict.ndim :].numel())
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
        if self._version == 1:
            return self._qvalue_v1_loss(tensordict)
        target = self._soft_target(tensordict)
        values = self._q_values(tensordict, self._get(tensordict, "action"))
        return self._soft_critic_loss(values, target, tensordict)


class DiscreteSACLoss(_SoftActorCritic):
    """Discrete SAC: the losses of :class:`SACLoss` with exact expectations over the actions.

    Critic: ``sum_i L(Q_i(s, a), y)``, ``y = r + gamma^n (1 - terminated) sum_a' pi(a'|s')
    (min_i Q_i,target(s', a') - alpha log pi(a'|s'))``. Actor: ``sum_a pi(a|s) (alpha log
    pi(a|s) - min_i Q_i(s, a))`` (critics detached). Temperature: ``-log alpha (sum_a pi log pi
    + target_entropy)`` (arXiv:1910.07207, eqs. 9, 10 and 11). ``forward`` writes ``td_error``
    (``max_i |Q_i(s, a) - y|``, ``[*B]``) into the batch.

    Args:
        actor_network: a ``ProbabilisticActor`` over a categorical (``logits``), one-hot or index.
        qvalue_network: a module writing ``action_value`` (``[*B, num_actions]``), or a list of
            ``num_qvalue_nets`` such modules.
        num_actions: the number of actions (for ``target_entropy="auto"``).
        target_entropy: ``"auto"``, ``-log(1 / num_actions) * target_entropy_weight``, or a number.
        action_space: ``"one-hot"`` or ``"categorical"`` (or a spec); the action's dtype decides
            (integer: index, else one-hot).
        Other arguments: as :class:`SACLoss`.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean;
    ``alpha`` and ``entropy`` are returned with ``reduction="none"`` too; actions of
    probability 0 contribute exactly 0 to the soft value (TorchRL puts ``log 1e-8`` there).

    Example:
        >>> loss = DiscreteSACLoss(actor, [q1, q2], num_actions=4, action_space="categorical")
        >>> out = loss(batch)
    """

    @dataclasses.dataclass
    class _AcceptedKeys(_SoftActorCritic._AcceptedKeys):
        """Keys read by DiscreteSACLoss (``priority``: ``max_i |TD error|``, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken: index or one-hot
        action_value: NestedKey = "action_value"  # Q(s, .) written by the Q networks
        log_prob: NestedKey = "log_prob"  # kept for TorchRL's key names (not read)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        action_space=None,
        num_actions: int | None = None,
        target_entropy_weight: float = 0.98,
        target_entropy: str | float = "auto",
        **options,
    ) -> None:
        if isinstance(action_space, str):
            check_choice("action_space", action_space, ACTION_SPACES)
        if target_entropy == "auto":
            if num_actions is None:
                raise ValueError("DiscreteSACLoss: target_entropy='auto' needs num_actions.")
            check_in_range("num_actions", num_actions, 1, integer=True)
            target_entropy = -math.log(1.0 / num_actions) * target_entropy_weight
        super().__init__(actor_network, qvalue_network, value="action_value", **options)
        self.num_actions = num_actions
        self.register_buffer(
            "target_entropy", torch.tensor(float(target_entropy), device=self.log_alpha.device)
        )
        keys = self._actor_call.parameter_keys if self._actor_call.direct else {}
        self._logits_key = keys.get("logits") if set(keys) == {"logits"} else None

    def _log_probs(self, batch: TensorDictBase) -> torch.Tensor:
        """``log pi(.|s)``, ``[*B, num_actions]``."""
        if self._logits_key is not None:
            params = self._actor_call.distribution_parameters(batch)
            return params[self._logits_key].log_softmax(-1)
        return self._actor_call(batch).logits

    def _action_values(self, batch: TensorDictBase, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, num_actions]`` action values at the batch's observations."""
        inputs = network_inputs(batch, self._qvalue)
        return self._qvalue(inputs, **kwargs)[self.tensor_keys.action_value]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_a pi (alpha log pi - min_i Q_i)`` reduced, and ``sum_a pi log pi`` (detached)."""
        alpha = self._alpha()
        log_probs = self._log_probs(tensordict)
        value = rlf.clipped_double_q_value(self._action_values(tensordict, detach=True))
        loss = -rlf.discrete_soft_value(value, log_probs, alpha)
        expected_log_prob = -rlf.categorical_entropy(log_probs.detach())
        loss = self._reduce_replayed(loss, tensordict)
        actor = ActorOutput(distribution=lambda: self._policy(tensordict, log_probs))
        return self._with_policy_addons(loss, tensordict, actor, {"log_prob": expected_log_prob})

    def _policy(self, batch: TensorDictBase, log_probs: torch.Tensor):
        """The current policy's distribution, from its log-probabilities when the actor's head
        reads only logits, else by running the actor."""
        if self._logits_key is not None:
            return self._actor_call.from_parameters({self._logits_key: log_probs})
        return self._actor_call(batch)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, and ``td_error``, ``target_value``, ``pred_value``
        (see :meth:`_soft_critic_loss`)."""
        alpha = self._alpha()
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            next_values = self._action_values(
                next_batch, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            next_value = rlf.discrete_soft_value(
                rlf.clipped_double_q_value(next_values), self._log_probs(next_batch), alpha
            )
            next_value = self._skip_done(tensordict, next_value)
            target = self._td_target(tensordict, next_value)
        action = self._get(tensordict, "action")
        values = rlf.chosen_action_value(
            self._action_values(tensordict), action.expand(self.num_qvalue_nets, *action.shape)
        )
        return self._soft_critic_loss(values, target, tensordict)


_CQL_OUT_KEYS = [
    "loss_actor",
    "loss_actor_bc",
    "loss_qvalue",
    "loss_cql",
    "loss_alpha",
    "alpha",
    "entropy",
]


# TorchRL's TQCLoss keywords besides the networks, passed on to SACLoss (with rlloss's
class CQLLoss(SACLoss):
    """Conservative Q-learning (CQL(H)) for offline RL with continuous actions, on SAC.

    - ``loss_qvalue = sum_i L(Q_i(s, a), y)``, ``y = r + gamma^n (1 - terminated) V'(s')``, no
      gradient: ``V'(s') = min_i Q_i,target(s', a')`` with ``a' ~ pi(.|s')``
      (``deterministic_backup``, the default), minus ``alpha log pi(a'|s')`` otherwise; with
      ``max_q_backup``, ``min_i max_k Q_i,target(s', a'_k)`` over ``num_random`` samples
      (:func:`rlloss.functional.max_backup_value`).
    - ``loss_cql = min_q_weight sum_i [T logsumexp_k((Q_i(s, a_k) - log q(a_k)) / T) - Q_i(s,
      a)]`` (:func:`rlloss.functional.cql_penalty`, eq. 4 and appendix F): the ``a_k`` are
      ``num_random`` uniform actions, ``num_random`` actions from ``pi(.|s)`` and ``num_random``
      from ``pi(.|s')``, all evaluated at ``s``, ``q`` the density each was drawn from (policy
      samples and log-densities without gradient); ``T = temperature``.
    - ``with_lagrange``: ``loss_cql`` is weighted by ``alpha' = min(exp(log_alpha_prime), 1e6)``
      (no gradient) and ``loss_alpha_prime = alpha' (tau - mean_i penalty_i)`` (penalties without
      gradient, ``tau = lagrange_thresh``) adapts ``alpha'`` to keep the penalty near ``tau``.
    - ``loss_actor``, ``loss_alpha``, ``alpha``, ``entropy``: :class:`SACLoss`'s;
      ``loss_actor_bc = alpha log pi(a~|s) - log pi(a|s)`` (the authors' behaviour-cloning warm-up,
      :func:`rlloss.functional.soft_behavior_cloning_loss`).

    The ``td_error`` written into the batch is ``max_i (Q_i - y)^2`` (``[*B]``). TorchRL's
    ``CQLLoss`` with the same keywords, keys, outputs and methods (``q_loss``, ``cql_loss``,
    ``alpha_prime_loss``, ``actor_loss``, ``actor_bc_loss``, ``alpha_loss``), each callable alone.

    Args:
        actor_network, qvalue_network, loss_function, alpha_init, min_alpha, max_alpha,
            fixed_alpha, action_spec, target_entropy, delay_actor, delay_qvalue: as
            :class:`SACLoss`.
        num_qvalue_nets: Q networks, >= 1 (default 2; TorchRL's is fixed at 2).
        temperature: ``T`` of the log-sum-exp, > 0 (default 1.0).
        min_q_weight: the penalty's weight, >= 0 (default 1.0; the paper's ``alpha``).
        max_q_backup, deterministic_backup: the target value (see above).
        num_random: actions sampled per state and proposal (default 10).
        with_lagrange, lagrange_thresh: the Lagrangian form (default off, threshold 0).
        reduction, use_prioritized_weights, priority_weighting: see
            :class:`rlloss.offpolicy.TDTargetLoss`.

    The uniform actions cover the tanh-Normal actor's ``[low, high]`` (TorchRL's ``[-1, 1]``
    whatever the bounds), ``[-1, 1]`` for other actors.

    Differences from TorchRL: the log-sum-exp runs over the ``3 num_random`` actions of each
    state and the actions sampled at ``s'`` are evaluated at ``s``, as in the paper and the
    authors' code (TorchRL takes it over the three proposals of each sample separately and
    evaluates the ``s'`` samples at ``s'``); with ``with_lagrange`` the penalty in ``loss_cql`` is
    weighted by ``alpha'`` and ``loss_alpha_prime`` sends no gradient to the Q networks (TorchRL
    leaves ``loss_cql`` unweighted, and its ``loss_alpha_prime`` pushes the Q networks to raise
    the penalty); ``max_q_backup`` draws no unused ``pi(.|s')`` sample; nothing (``pred_q1``,
    ``cql_q1_loss``...) is written into the caller's batch, so ``cql_loss`` and
    ``alpha_prime_loss`` need no earlier call; prioritized-replay weights apply to every loss;
    ``loss_alpha_prime`` follows ``reduction`` (TorchRL's is always a mean).

    Example:
        >>> loss = CQLLoss(actor, qvalue, action_spec=env.action_spec, with_lagrange=True,
        ...                lagrange_thresh=5.0)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(offline_batch)
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(SACLoss._AcceptedKeys):
        """Keys read by CQLLoss (``priority``: ``max_i`` squared TD error, ``[*B]``)."""

        log_prob: NestedKey = "_log_prob"  # the key of log pi in ``actor_loss``'s metadata
        pred_q1: NestedKey = "pred_q1"  # kept for TorchRL's key names (not written)
        pred_q2: NestedKey = "pred_q2"  # kept for TorchRL's key names (not written)
        cql_q1_loss: NestedKey = "cql_q1_loss"  # kept for TorchRL's key names (not written)
        cql_q2_loss: NestedKey = "cql_q2_loss"  # kept for TorchRL's key names (not written)

    _coefficient_ranges = {
        "temperature": {"low": 0.0, "low_open": True},
        "min_q_weight": {"low": 0.0},
    }

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        temperature: float = 1.0,
        min_q_weight: float = 1.0,
        max_q_backup: bool = False,
        deterministic_backup: bool = True,
        num_random: int = 10,
        with_lagrange: bool = False,
        lagrange_thresh: float = 0.0,
        **options,
    ) -> None:
        self._check_coefficient("temperature", temperature)
        self._check_coefficient("min_q_weight", min_q_weight)
        check_in_range("num_random", num_random, 1, integer=True)
        super().__init__(actor_network, qvalue_network, **options)
        self.temperature, self.min_q_weight = float(temperature), float(min_q_weight)
        self.max_q_backup = max_q_backup
        self.deterministic_backup = deterministic_backup
        self.num_random = int(num_random)
        self.with_lagrange = with_lagrange
        self.target_action_gap = float(lagrange_thresh)
        if with_lagrange:
            self.log_alpha_prime = nn.Parameter(torch.zeros((), device=self.log_alpha.device))

    @property
    def out_keys(self) -> list[str]:
        return [*_CQL_OUT_KEYS, *(["loss_alpha_prime"] if self.with_lagrange else [])]

    # ----------------------------------------------------------------------------- sampling
    def _policy_samples(self, batch: TensorDictBase, num: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``num`` actions per state from the current policy, ``[*B, num, D]``, and their
        log-probs ``[*B, num]`` (drawn as TorchRL does: each state repeated ``num`` times in a
        row along the last batch dim)."""
        dim, size = batch.ndim - 1, batch.batch_size
        if self._tanh_normal:  # the actor runs once per state, its parameters are repeated
            params = self._actor_call.distribution_parameters(batch)
            action, log_prob = self._squashed_sample(params, self._actor_call, num)
        else:
            inputs = network_inputs(batch, self.actor_network)
            repeated = TensorDict(
                {key: value.repeat_interleave(num, dim=dim) for key, value in inputs.items()},
                batch_size=(*size[:-1], size[-1] * num),
            )
            action, log_prob = self._policy_sample(repeated)
        return action.reshape(*size, num, *action.shape[batch.ndim :]), log_prob.reshape(*size, num)

    def _sampled_q_values(
        self, batch: TensorDictBase, action: torch.Tensor, **kwargs
    ) -> torch.Tensor:
        """``[num_qvalue_nets, *B, K, 1]`` values of ``K`` actions per state (``[*B, K, D]``) at
        the batch's observations, in one ensemble call."""
        key, dim = self._qvalue_action_key, batch.ndim
        inputs = {
            name: value.unsqueeze(dim).expand(*value.shape[:dim], action.shape[dim], -1)
            for name, value in network_inputs(batch, self._qvalue, exclude=key).items()
        }
        inputs[key] = action
        return self._qvalue(inputs, **kwargs)[self.tensor_keys.state_action_value]

    def _proposal_actions(self, batch: TensorDictBase, data_action: torch.Tensor):
        """The penalty's ``3 num_random`` actions per state ``[*B, 3 num_random, D]`` (uniform,
        from ``pi(.|s')``, from ``pi(.|s)``) and their log-densities ``[*B, 3 num_random]``, no
        gradient; drawn in TorchRL's order (uniform, ``s``, ``s'``)."""
        num, dim = self.num_random, batch.ndim
        low, high = (self.action_low, self.action_high) if self._tanh_normal else (-1.0, 1.0)
        shape = (*batch.batch_size, num, data_action.shape[-1])
        uniform, uniform_log_prob = rlf.uniform_sample_and_log_prob(
            low, high, shape, data_action.dtype, data_action.device
        )  # [*B, num, D], [*B, num]
        with torch.no_grad():
            current, current_log_prob = self._policy_samples(batch, num)
            following, following_log_prob = self._policy_samples(entry(batch, "next"), num)
        actions = torch.cat([uniform, following, current], dim=dim)
        log_prob = torch.cat([uniform_log_prob, following_log_prob, current_log_prob], -1)
        return actions, log_prob

    # ----------------------------------------------------------------------------- pieces
    def _next_value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``V'(s')`` of the target, ``[*B, 1]``, without gradient (see the class docstring)."""
        next_batch = entry(tensordict, "next")
        with torch.no_grad():
            kwargs = {"target": self.delay_qvalue, "detach": not self.delay_qvalue}
            if self.max_q_backup:
                actions, _ = self._policy_samples(next_batch, self.num_random)
                return rlf.max_backup_value(self._sampled_q_values(next_batch, actions, **kwargs))
            action, log_prob = self._policy_sample(next_batch)
            action = self._skip_done(tensordict, action)
            log_prob = self._skip_done(tensordict, log_prob)
            value = rlf.clipped_double_q_value(self._q_values(next_batch, action, **kwargs))
            if self.deterministic_backup:
                return value
            return rlf.soft_value(value, log_prob, self._alpha())

    def _q_regression(self, tensordict: TensorDictBase, values: torch.Tensor):
        """``sum_i L(Q_i(s, a), y)`` reduced, and the squared TD errors ``[E, *B]``."""
        with torch.no_grad():
            target = self._td_target(tensordict, self._next_value(tensordict))
        td_error = rlf.td_error(values, target.expand_as(values), "squared").squeeze(-1)
        return self._ensemble_critic_loss(values, target, tensordict), {"td_error": td_error}

    def _penalties(self, tensordict: TensorDictBase, values: torch.Tensor) -> torch.Tensor:
        """``min_q_weight`` times each network's CQL penalty, ``[E, *B, 1]`` (``values``: the
        networks' ``Q_i(s, a)`` of the dataset's actions, ``[E, *B, 1]``)."""
        actions, log_proposal = self._proposal_actions(tensordict, self._get(tensordict, "action"))
        sampled = self._sampled_q_values(tensordict, actions).squeeze(-1)  # [E, *B, 3 num]
        penalty = rlf.cql_penalty(sampled, values, log_proposal, self.temperature)
        return self.min_q_weight * penalty

    def _alpha_prime(self) -> torch.Tensor:
        """``alpha' = min(exp(log_alpha_prime), 1e6)``."""
        return self.log_alpha_prime.exp().clamp_max(1e6)

    def _cql_loss(self, tensordict: TensorDictBase, penalties: torch.Tensor) -> torch.Tensor:
        """``sum_i penalty_i`` reduced, weighted by ``alpha'`` (no gradient) with the Lagrangian
        form."""
        penalty = penalties.sum(0)
        if self.with_lagrange:
            penalty = self._alpha_prime().detach() * penalty
        return self._reduce_replayed(penalty, tensordict)

    def _alpha_prime_loss(self, tensordict: TensorDictBase, penalties: torch.Tensor):
        """``alpha' (tau - mean_i penalty_i)`` reduced; only ``log_alpha_prime`` gets gradient."""
        dual = rlf.lagrange_dual_loss(
            penalties.mean(0), self._alpha_prime(), self.target_action_gap
        )
        return self._reduce_replayed(dual.unsqueeze(-1), tensordict)

    def _q_values_of_data(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``[E, *B, 1]`` values of the dataset's actions (with gradient)."""
        return self._q_values(tensordict, self._get(tensordict, "action"))

    # ----------------------------------------------------------------------------- losses
    def q_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``loss_qvalue`` and ``td_error`` (``[E, *B]``, squared) (TorchRL's method name)."""
        return self._q_regression(tensordict, self._q_values_of_data(tensordict))

    loss_qvalue = q_loss

    def cql_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``loss_cql`` (TorchRL's method name)."""
        penalties = self._penalties(tensordict, self._q_values_of_data(tensordict))
        return self._cql_loss(tensordict, penalties), {}

    def alpha_prime_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``loss_alpha_prime`` (``with_lagrange`` only; TorchRL's method name)."""
        with torch.no_grad():
            penalties = self._penalties(tensordict, self._q_values_of_data(tensordict))
        return self._alpha_prime_loss(tensordict, penalties), {}

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """:meth:`SACLoss.loss_actor`, its log-probs under ``tensor_keys.log_prob``."""
        loss, info = self.loss_actor(tensordict)
        return loss, {self.tensor_keys.log_prob: info["log_prob"]}

    def actor_bc_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``alpha log pi(a~|s) - log pi(a|s)`` reduced, and ``bc_log_prob`` (the mean of
        ``log pi(a|s)``, detached)."""
        alpha = self._alpha()
        action = self._get(tensordict, "action")
        if self._tanh_normal:  # the distribution's parameters, computed once
            params = self._actor_call.distribution_parameters(tensordict)
            _, log_prob = self._squashed_sample(params, self._actor_call)
            distribution = self._actor_call.from_parameters(params)
        else:
            distribution = self._actor_call(tensordict)
            _, log_prob = self._sample(distribution, tensordict.batch_size)
        key, owner = self.tensor_keys.action, type(self).__name__
        data_log_prob = log_prob_of(distribution, action, key, owner)
        loss = rlf.soft_behavior_cloning_loss(log_prob, data_log_prob, alpha)
        loss = self._reduce_replayed(loss.unsqueeze(-1), tensordict)
        return loss, {"bc_log_prob": data_log_prob.mean().detach()}

    def alpha_loss(self, tensordict, mask_tensordict: TensorDictBase | None = None):
        """``loss_alpha`` from ``actor_loss``'s metadata (``tensor_keys.log_prob``); the batch for
        the padding mask and replay weights is ``mask_tensordict`` (TorchRL's signature)."""
        log_prob = tensordict.get(self.tensor_keys.log_prob)
        if mask_tensordict is None:
            mask_tensordict = (
                tensordict
                if isinstance(tensordict, TensorDictBase)
                else TensorDict({}, batch_size=log_prob.shape)
            )
        return self._temperature_loss(log_prob, mask_tensordict), {}

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Every loss, ``alpha`` and ``entropy``; writes ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        values = self._q_values_of_data(batch)
        loss_qvalue, info = self._q_regression(batch, values)
        penalties = self._penalties(batch, values)
        loss_actor_bc, _ = self.actor_bc_loss(batch)
        loss_actor, info_actor = self.loss_actor(batch)
        log_prob = info_actor["log_prob"]
        self._write_priority(tensordict, info["td_error"].amax(0))
        out = {
            "loss_actor": loss_actor,
            "loss_actor_bc": loss_actor_bc,
            "loss_qvalue": loss_qvalue,
            "loss_cql": self._cql_loss(batch, penalties),
            "loss_alpha": self._temperature_loss(log_prob, batch),
            **self._addon_entries(info_actor),
        }
        if self.with_lagrange:
            out["loss_alpha_prime"] = self._alpha_prime_loss(batch, penalties)
        return self._outputs(out, log_prob, tensordict)


# ``priority_weighting``); SACLoss's others (``loss_function``, ``value_network``, ``gamma``...)
# have no meaning here and are refused.
_TQC_OPTIONS = frozenset(
    {
        "alpha_init",
        "min_alpha",
        "max_alpha",
        "action_spec",
        "fixed_alpha",
        "target_entropy",
        "delay_qvalue",
        "separate_losses",
        "reduction",
        "deactivate_vmap",
        "skip_done_states",
        "use_prioritized_weights",
        "scalar_output_mode",
        "priority_weighting",
        "policy_loss_addons",
    }
)


class TQCLoss(SACLoss):
    """TQC's actor, critic and temperature losses: SAC with quantile critics.

    Each of the ``num_qvalue_nets`` critics outputs ``M`` atoms ``theta_n^m(s, a)`` (the last
    dim of ``state_action_value``, ``[*B, M]``). Critic: the target critics' ``N M`` atoms at
    ``(s', a')``, ``a' ~ pi(.|s')``, are pooled and sorted and the ``d N`` largest dropped
    (``d = top_quantiles_to_drop_per_net``, :func:`rlloss.functional.truncated_mixture_atoms`);
    the kept atoms give ``y_k = r + gamma^n (1 - terminated) (z_(k) - alpha log pi(a'|s'))``
    and each critic is trained by the quantile Huber loss against all of them, summed over the
    critics (:func:`rlloss.functional.quantile_huber_loss`; arXiv:2005.04269).
    Actor: ``alpha log pi(a~|s) - 1/(N M) sum_n sum_m theta_n^m(s, a~)`` (the critics
    get no gradient from it). Temperature: SAC's. ``forward`` writes ``td_error`` (``max_n``
    of the mean ``|y_k - theta_n^m|`` over the atom pairs, ``[*B]``) into the batch.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module writing ``state_action_value`` of shape ``[*B, M]``, or a list
            of ``num_qvalue_nets`` such modules.
        num_qvalue_nets: the number of critics ``N`` (default 5).
        top_quantiles_to_drop_per_net: ``d``, the pooled atoms dropped per critic (default 2;
            ``d N`` in all, fewer than ``N M``).
        Other arguments: as :class:`rlloss.SACLoss` (only TorchRL's TQC keywords); targets are
        one-step (n-step through ``steps_to_next_obs``): ``ValueEstimators.TD0`` only.

    Differences from TorchRL: those of :class:`rlloss.SACLoss` (``priority_weighting``
    defaults to the PER paper's mean, ``alpha`` and ``entropy`` come with ``reduction="none"``
    too, no ``safe_tanh`` clamp); ``skip_done_states`` changes no number: the actor runs at
    terminal next states too and their next value is discarded by ``terminated``, NaN-safe
    (TorchRL does not run it there, so its random stream differs).

    Example:
        >>> loss = TQCLoss(actor, quantile_critic, num_qvalue_nets=5, action_spec=spec)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    _one_step_targets_only = True  # the targets are per atom

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        num_qvalue_nets: int = 5,
        top_quantiles_to_drop_per_net: int = 2,
        **options,
    ) -> None:
        refuse_unknown_keywords("TQCLoss", options, _TQC_OPTIONS)
        drop = top_quantiles_to_drop_per_net
        if isinstance(drop, (int, float)) and drop < 0:  # TorchRL's words
            raise ValueError(
                f"TQCLoss: top_quantiles_to_drop_per_net must be greater than or equal to zero, "
                f"got {drop}."
            )
        check_in_range("top_quantiles_to_drop_per_net", drop, 0, integer=True)
        super().__init__(actor_network, qvalue_network, num_qvalue_nets=num_qvalue_nets, **options)
        self.top_quantiles_to_drop_per_net = int(drop)

    # TorchRL's names for the two losses and the target
    actor_loss = SACLoss.loss_actor

    def qvalue_v2_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """TorchRL's name of :meth:`loss_qvalue`."""
        return self.loss_qvalue(tensordict)

    def compute_target(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The kept target atoms ``y_k`` (no gradient), ``[*B, N M - d N]``."""
        return self._soft_target(tensordict)

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, M]`` atoms of ``action`` at the batch's observations."""
        quantiles = super()._q_values(batch, action, **kwargs)
        if quantiles.ndim != batch.ndim + 2:
            raise RuntimeError(
                "TQCLoss: the critic must write one quantile dim after the batch dims "
                f"({tuple(batch.batch_size)}), got {self.tensor_keys.state_action_value!r} "
                f"of shape {tuple(quantiles.shape[1:])}."
            )
        return quantiles

    def _policy_value(self, values: torch.Tensor) -> torch.Tensor:
        """The mixture's mean ``1/(N M) sum_n sum_m theta_n^m``, ``[*B, 1]``: the actor sees
        every atom (only the critic's target is truncated)."""
        return values.mean((0, -1)).unsqueeze(-1)

    def _next_soft_value(
        self, next_values: torch.Tensor, next_log_prob: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        """The kept atoms of the pooled target mixture minus ``alpha log pi(a'|s')``,
        ``[*B, N M - d N]``."""
        num_quantiles = next_values.shape[-1]
        if self.top_quantiles_to_drop_per_net >= num_quantiles:
            raise ValueError(
                f"TQCLoss: top_quantiles_to_drop_per_net={self.top_quantiles_to_drop_per_net} "
                f"must be smaller than the critic's number of quantiles ({num_quantiles})."
            )
        dropped = self.top_quantiles_to_drop_per_net * self.num_qvalue_nets
        atoms = rlf.truncated_mixture_atoms(next_values, dropped)
        return rlf.soft_value(atoms, next_log_prob.unsqueeze(-1).expand_as(atoms), alpha)

    def _skip_done(self, tensordict: TensorDictBase, value: torch.Tensor) -> torch.Tensor:
        """Nothing to skip: a terminal next state's value is discarded by ``terminated``
        (NaN-safe) and a truncated one bootstraps."""
        return value

    def _soft_critic_loss(
        self, values: torch.Tensor, target: torch.Tensor, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, dict]:
        """``sum_n`` of each critic's quantile Huber loss against the target atoms, reduced,
        and ``td_error`` ``[*B]``."""
        target = target.expand(values.shape[0], *target.shape)
        loss = rlf.quantile_huber_loss(values, target).sum(0).unsqueeze(-1)
        td_error = rlf.quantile_td_error(values, target).max(0).values
        return self._reduce_replayed(loss, tensordict), {"td_error": td_error}


# TorchRL's REDQLoss keywords besides the networks and those REDQLoss names, passed on to
# SACLoss, with rlloss's replay options
_REDQ_OPTIONS = frozenset(
    {
        "action_spec",
        "fixed_alpha",
        "target_entropy",
        "delay_qvalue",
        "gamma",
        "priority_key",
        "separate_losses",
        "reduction",
        "deactivate_vmap",
        "scalar_output_mode",
        "use_prioritized_weights",
        "priority_weighting",
        "policy_loss_addons",
    }
)
_EPS_GSDE = "_eps_gSDE"  # the gSDE noise entry TorchRL's REDQ sets to zeros for the actor


class REDQLoss(SACLoss):
    """REDQ's actor, critic and temperature losses.

    With ``a~ ~ pi(.|s)`` (reparameterised) and ``a' ~ pi(.|s')`` drawn together, and a subset
    ``J`` of ``M = sub_sample_len`` of the ``N = num_qvalue_nets`` target critics drawn uniformly
    without replacement at each call:

    - critic: ``L(Q_i(s, a), y)`` for every ``i``, ``y = r + gamma^n (1 - terminated) (min_{j in
      J} Q_j,target(s', a') - alpha log pi(a'|s'))`` (no gradient) (arXiv:2101.05982,
      Algorithm 1);
    - actor: ``alpha log pi(a~|s) - Q_i(s, a~)`` for every ``i`` (the mean over the ensemble,
      line 13; the critics get no gradient from it);
    - temperature: ``-alpha (log pi + target_entropy)`` over the log-probs of ``a~`` and ``a'``,
      ``alpha = exp(clamp(log_alpha, log min_alpha, log max_alpha))`` with the clamp's gradient
      taken as the identity (:func:`rlloss.functional.alpha_temperature_loss`,
      :func:`rlloss.functional.straight_through_clamp`): TorchRL's rule.

    The per-critic losses are ``[N, *B]`` (``[2, *B]`` for the temperature: ``s`` and ``s'``),
    reduced over every dim. ``forward`` also returns ``state_action_value_actor`` (``[N, *B]``),
    ``action_log_prob_actor``, ``next.state_value`` and ``target_value`` (``[*B]``), detached,
    and writes ``td_error`` (``max_i (Q_i - y)^2``, ``[*B]``) into the batch. The subset is drawn
    with ``torch.randperm`` on the critics' device (no host sync); on the CPU it is TorchRL's
    draw, followed by the actions' draw, as in TorchRL.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module writing ``state_action_value`` (``[*B, 1]``), or a list of
            ``num_qvalue_nets`` such modules.
        num_qvalue_nets: ``N`` (default 10).
        sub_sample_len: ``M`` (default 2), an integer >= 1; as in TorchRL, at most ``N - 1``
            (and 1 when ``N = 1``).
        min_alpha, max_alpha: bounds on alpha (default 0.1 and 10, TorchRL's); ``log_alpha``
            itself is not projected (TorchRL's REDQ; SACLoss projects it).
        gSDE: give the actor zeros as ``_eps_gSDE`` (TorchRL's keyword).
        Other arguments: as :class:`rlloss.SACLoss` (TorchRL's REDQ keywords; ``gamma`` and
            ``make_value_estimator`` with TD0, TD1 or TDLambda, n-step through
            ``steps_to_next_obs``).

    Differences from TorchRL: prioritized-replay weights (``priority_weight``) weight the
    losses, as in every rlloss off-policy loss (TorchRL's REDQ ignores them); ``alpha`` and
    ``entropy`` are returned with ``reduction="none"`` too; the tanh is not clamped away from
    ±1 (see :class:`rlloss.SACLoss`); ``target_entropy="auto"`` without a spec reads the action
    dim from the first batch (TorchRL raises).

    Example:
        >>> loss = REDQLoss(actor, qvalue, num_qvalue_nets=10, sub_sample_len=2)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(SACLoss._AcceptedKeys):
        """Keys read by REDQLoss (SACLoss's; ``priority``: ``max_i (Q_i - y)^2``, ``[*B]``)."""

        sample_log_prob: NestedKey | None = None  # TorchRL's REDQ key name (not read)

        def __post_init__(self):
            if self.sample_log_prob is None:  # TorchRL's default
                aggregate = composite_lp_aggregate(nowarn=True)
                self.sample_log_prob = "sample_log_prob" if aggregate else "action_log_prob"

    out_keys = [
        "loss_actor",
        "loss_qvalue",
        "loss_alpha",
        "alpha",
        "entropy",
        "state_action_value_actor",
        "action_log_prob_actor",
        "next.state_value",
        "target_value",
    ]

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        num_qvalue_nets: int = 10,
        sub_sample_len: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float = 0.1,
        max_alpha: float = 10.0,
        gSDE: bool = False,
        **options,
    ) -> None:
        refuse_unknown_keywords("REDQLoss", options, _REDQ_OPTIONS)
        check_in_range("sub_sample_len", sub_sample_len, 1, integer=True)
        super().__init__(
            actor_network,
            qvalue_network,
            num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function,
            alpha_init=alpha_init,
            min_alpha=min_alpha,
            max_alpha=max_alpha,
            **options,
        )
        self.sub_sample_len = max(1, min(int(sub_sample_len), self.num_qvalue_nets - 1))
        self.gSDE = gSDE

    @property
    def alpha(self) -> torch.Tensor:
        """``exp(clamp(log_alpha, log min_alpha, log max_alpha))``, no gradient."""
        return self._alpha()

    def _alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().clamp(self.min_log_alpha, self.max_log_alpha).exp()

    def _target_subset(self) -> torch.Tensor:
        """The indices ``J`` of ``sub_sample_len`` distinct target critics drawn uniformly,
        ``[M]`` on the critics' device."""
        device = self.log_alpha.device
        return torch.randperm(self.num_qvalue_nets, device=device)[: self.sub_sample_len]

    def _current_and_next_sample(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``a~ ~ pi(.|s)`` and ``a' ~ pi(.|s')`` and their log-probs, stacked along a leading
        ``[2]`` dim, drawn in one call as TorchRL draws them. A tanh-Normal actor runs on ``s``
        with gradient and on ``s'`` without, its parameters stacked before the one draw: the
        same numbers as one call on the stacked inputs, without the actor's backward over the
        ``s'`` half, which no loss term differentiates (``a'`` and its log-prob enter the target
        and the detached temperature loss only)."""
        if not self._tanh_normal or self.gSDE:
            return self._policy_sample(self._current_and_next_inputs(batch))
        call = self._actor_call
        now = call.distribution_parameters(batch)
        with torch.no_grad():
            following = call.distribution_parameters(entry(batch, "next"))
        params = {key: torch.stack([now[key], following[key]]) for key in now}
        return self._squashed_sample(params, call)

    def _current_and_next_inputs(self, batch: TensorDictBase):
        """The actor's inputs at ``s`` and ``s'`` stacked along a leading ``[2]`` dim."""
        exclude = _EPS_GSDE if self.gSDE else None
        now = network_inputs(batch, self.actor_network, exclude=exclude)
        following = network_inputs(entry(batch, "next"), self.actor_network, exclude=exclude)
        stacked = {key: torch.stack([now[key], following[key]]) for key in now}
        batch_size = (2, *batch.batch_size)
        if self.gSDE:
            stacked[_EPS_GSDE] = torch.zeros(batch_size, device=self.log_alpha.device)
        if self._actor_call.direct:
            return stacked
        inputs = TensorDict({}, batch_size=batch_size)
        for key, value in stacked.items():
            inputs.set(key, value)
        return inputs

    def _reduce_members(self, loss: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        """Reduce a per-member loss ``[E, *B]`` over the members and the batch, each transition
        weighted and masked as :meth:`_reduce_replayed` does; ``"none"`` keeps ``[E, *B]``."""
        reduced = self._reduce_replayed(loss.movedim(0, -1), tensordict)
        if self.reduction != "none":
            return reduced
        return reduced.reshape(*loss.shape[1:], loss.shape[0]).movedim(-1, 0)

    def _actor_objective(
        self, tensordict: TensorDictBase, action: torch.Tensor, log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """``alpha log pi(a~|s) - Q_i(s, a~)`` for each critic, reduced, and the values and
        log-probs (detached)."""
        values = self._q_values(tensordict, action, detach=True)  # [N, *B, 1]
        log_prob = log_prob.unsqueeze(-1).expand_as(values)
        loss = -rlf.soft_value(values, log_prob, self._alpha()).squeeze(-1)
        info = {
            "state_action_value_actor": values.detach().squeeze(-1),
            "action_log_prob_actor": log_prob[0].detach().squeeze(-1),
        }
        loss = self._reduce_members(loss, tensordict)
        actor = ActorOutput(action=action, distribution=lambda: self._actor_call(tensordict))
        return self._with_policy_addons(loss, tensordict, actor, info)

    def _subset_target(
        self,
        tensordict: TensorDictBase,
        next_action: torch.Tensor,
        next_log_prob: torch.Tensor,
        subset: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``y`` and ``V(s') = min_{j in J} Q_j,target(s', a') - alpha log pi(a'|s')``, both
        ``[*B, 1]``, without gradient (``J``: ``subset``)."""
        with torch.no_grad():
            next_values = self._q_values(
                entry(tensordict, "next"),
                next_action,
                target=self.delay_qvalue,
                detach=not self.delay_qvalue,
                members=subset,
            )
            next_value = rlf.soft_value(
                rlf.clipped_double_q_value(next_values), next_log_prob, self._alpha()
            )
            return self._td_target(tensordict, next_value), next_value

    def _critic_objective(
        self, tensordict: TensorDictBase, target: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """``L(Q_i(s, a), y)`` for each critic, reduced, and ``td_error`` ``[*B]``."""
        values = self._q_values(tensordict, self._get(tensordict, "action"))  # [N, *B, 1]
        loss = rlf.distance(values, target.expand_as(values), self.loss_function)
        td_error = rlf.ensemble_td_error(values, target, "squared").squeeze(-1)
        return self._reduce_members(loss.squeeze(-1), tensordict), {"td_error": td_error}

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The actor loss alone, with its own draw of ``a~``: the mean over the critics of
        ``alpha log pi(a~|s) - Q_i(s, a~)`` (per critic with ``reduction="none"``)."""
        action, log_prob = self._policy_sample(tensordict)
        self._fill_target_entropy(tensordict, action)
        return self._actor_objective(tensordict, action, log_prob)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The critic loss alone, with its own draws of ``J`` and ``a'``, and ``td_error``."""
        subset = self._target_subset()  # TorchRL's draw order: J, then a'
        with torch.no_grad():
            next_action, next_log_prob = self._policy_sample(entry(tensordict, "next"))
        target, _ = self._subset_target(tensordict, next_action, next_log_prob, subset)
        return self._critic_objective(tensordict, target)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The three losses and the diagnostics (see the class docstring); writes ``td_error``
        into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        subset = self._target_subset()  # drawn before the actions, as TorchRL does
        action, log_prob = self._current_and_next_sample(batch)
        self._fill_target_entropy(batch, action[0])
        loss_actor, info = self._actor_objective(batch, action[0], log_prob[0])
        target, next_value = self._subset_target(batch, action[1], log_prob[1], subset)
        loss_qvalue, critic_info = self._critic_objective(batch, target)
        self._write_priority(tensordict, critic_info["td_error"])
        log_alpha = rlf.straight_through_clamp(
            self.log_alpha, self.min_log_alpha, self.max_log_alpha
        )
        loss_alpha = rlf.alpha_temperature_loss(log_alpha.exp(), log_prob, self.target_entropy)
        out = {
            "loss_actor": loss_actor,
            "loss_qvalue": loss_qvalue,
            "loss_alpha": self._reduce_members(loss_alpha, batch),
            "alpha": self._alpha(),
            "entropy": -log_prob.detach().mean(),
            **info,
            "next.state_value": next_value.squeeze(-1),
            "target_value": target.squeeze(-1),
        }
        if self.reduction == "none" and self.scalar_output_mode == "non_tensor":
            scalars = {name: out.pop(name) for name in ("alpha", "entropy")}
            result = _compat.output_tensordict(out)
            for name, value in scalars.items():
                result.set_non_tensor(name, value)
            return result
        return _compat.output_tensordict(out)


# TorchRL's CrossQLoss keywords besides the networks and those CrossQLoss names, passed on to
# SACLoss, with rlloss's replay options (no target networks: no delay_* keywords, no gamma)
_CROSSQ_OPTIONS = frozenset(
    {
        "alpha_init",
        "min_alpha",
        "max_alpha",
        "action_spec",
        "fixed_alpha",
        "target_entropy",
        "priority_key",
        "separate_losses",
        "reduction",
        "deactivate_vmap",
        "scalar_output_mode",
        "use_prioritized_weights",
        "priority_weighting",
    }
)


class CrossQLoss(SACLoss):
    """CrossQ's actor, critic and temperature losses: SAC without target networks, whose
    critics (with BatchNorm / BatchRenorm layers) see the current and the next transitions in
    one batch.

    Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample
    Efficiency and Simplicity", ICLR 2024 (https://openreview.net/pdf?id=PczQtTsTIX), Algorithm 1:

    - joint forward pass: ``[Q_i(s, a); Q_i(s', a')] = Q_i([s; s'], [a; a'])`` for each of the
      ``num_qvalue_nets`` critics, in one call on the batch joined along its first dim, with
      ``a' ~ pi(.|s')`` (no gradient): the normalisation layers' batch statistics are those of
      the joint batch, so they cover both action distributions (the paper's Section 3); the
      critics run in train mode (running statistics updated), or in eval mode after
      ``loss.eval()``;
    - critic: ``sum_i L(Q_i(s, a), y)``, ``y = r + gamma^n (1 - terminated) (min_i Q_i(s', a') -
      alpha log pi(a'|s'))`` from the ``s'`` half of the same pass, detached (no target
      network: the paper's "removing target networks");
    - actor: ``alpha log pi(a~|s) - min_i Q_i(s, a~)`` with the critics in eval mode (running
      statistics, not updated) and no gradient to them, as the authors' code and TorchRL do;
    - temperature: SAC's ``-log alpha (log pi(a~|s) + target_entropy)``.

    ``forward`` returns ``out_keys`` (``loss_actor``, ``loss_qvalue``, ``loss_alpha``,
    ``alpha``, ``entropy``) and writes ``td_error`` (``max_i |Q_i(s, a) - y|``, ``[*B]``) into
    the batch. ``qvalue_loss``, ``actor_loss`` and ``alpha_loss`` are TorchRL's methods, called in
    that order (the actor's pass reads the running statistics the joint pass updated).

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module writing ``state_action_value`` (``[*B, 1]``), typically with
            ``nn.BatchNorm1d`` or ``torchrl.modules.BatchRenorm1d`` layers, or a list of
            ``num_qvalue_nets`` such modules. Its inputs at ``s`` and ``s'`` must have the same
            shapes and dtypes (checked). The normalisation statistics are stacked buffers of
            ``qvalue_network_params``; the given modules, and their modes, are left as they are.
        num_qvalue_nets: the number of critics (default 2).
        loss_function: ``"smooth_l1"`` (default), ``"l2"`` or ``"l1"``.
        separate_losses: with a single ``qvalue_network`` that shares layers with the actor,
            those layers stay the actor's parameters in ``qvalue_network_params`` (detached
            views) and only the actor loss trains them (TorchRL's behaviour); without it (the
            default), the critics hold their own copies of them.
        alpha_init, min_alpha, max_alpha, fixed_alpha, action_spec, target_entropy, reduction,
            scalar_output_mode, deactivate_vmap: as :class:`rlloss.SACLoss` (TorchRL's CrossQ
            keywords). Targets: TD0 (default, n-step through ``steps_to_next_obs``), TD1 or
            TDLambda with ``make_value_estimator``.
        use_prioritized_weights, priority_weighting: see
            :class:`rlloss.offpolicy.TDTargetLoss`.

    Differences from TorchRL: prioritized-replay weights (``priority_weight``) weight the
    losses (TorchRL's CrossQ ignores them); the critics' modes are set for each pass without
    touching the user's modules (TorchRL's ``actor_loss`` switches the user's critic to eval and
    back to train, and its joint pass runs in whatever mode the critic is in); ``forward``
    returns ``out_keys`` only (TorchRL's also holds ``log_prob`` and ``td_error``); the tanh is
    not clamped away from ±1 (see :class:`rlloss.SACLoss`); ``target_entropy="auto"`` without a
    spec reads the action size from the first batch (TorchRL raises).

    Example:
        >>> class Critic(nn.Module):  # BatchRenorm on the input and after the hidden layer
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.net = nn.Sequential(BatchRenorm1d(n), nn.Linear(n, 256), nn.ReLU(),
        ...                                  BatchRenorm1d(256), nn.Linear(256, 1))
        ...     def forward(self, observation, action):
        ...         return self.net(torch.cat([observation, action], -1))
        >>> qvalue = ValueOperator(Critic(obs + act), in_keys=["observation", "action"])
        >>> loss = CrossQLoss(actor, qvalue, action_spec=env.action_spec)
        >>> out = loss(batch)  # no updater: CrossQ has no target network
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(SACLoss._AcceptedKeys):
        """Keys read by CrossQLoss (SACLoss's; ``priority``: ``max_i |Q_i - y|``, ``[*B]``)."""

        log_prob: NestedKey = "_log_prob"  # TorchRL's CrossQ key name (not read)

    _ties_shared_layers = True

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        **options,
    ) -> None:
        refuse_unknown_keywords("CrossQLoss", options, _CROSSQ_OPTIONS)
        super().__init__(
            actor_network,
            qvalue_network,
            num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function,
            delay_qvalue=False,
            **options,
        )

    @property
    def in_keys(self) -> list[NestedKey]:
        """SACLoss's, and the critics' inputs under ``"next"`` (the joint pass reads them)."""
        critic_keys = [k for k in self._qvalue.in_keys if k != self._qvalue_action_key]
        return list(dict.fromkeys([*super().in_keys, *(next_key(k) for k in critic_keys)]))

    @property
    def target_entropy_buffer(self) -> torch.Tensor:
        """TorchRL's name of ``target_entropy``."""
        return self.target_entropy

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of ``action`` at the batch's observations, the
        critics in eval mode (the actor's objective)."""
        return super()._q_values(batch, action, training=False, **kwargs)

    def _joint_q_values(
        self, tensordict: TensorDictBase, next_action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``Q_i(s, a)`` and ``Q_i(s', a')``, each ``[num_qvalue_nets, *B, 1]``, from one
        ensemble call on the batch joined along its first dim (train mode unless ``loss.eval()``)."""
        key = self._qvalue_action_key
        current = network_inputs(tensordict, self._qvalue, exclude=key)
        current[key] = self._get(tensordict, "action")
        following = network_inputs(entry(tensordict, "next"), self._qvalue, exclude=key)
        following[key] = next_action
        check_concatenable("CrossQLoss", current, following)
        joint = {name: torch.cat([current[name], following[name]]) for name in current}
        values = self._qvalue(joint, training=self.training)[self.tensor_keys.state_action_value]
        size = tensordict.batch_size[0]
        return values[:, :size], values[:, size:]

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, and ``td_error``, ``target_value``, ``pred_value``
        (see the class docstring)."""
        alpha = self._alpha()
        with torch.no_grad():
            next_action, next_log_prob = self._policy_sample(entry(tensordict, "next"))
        values, next_values = self._joint_q_values(tensordict, next_action)
        with torch.no_grad():
            next_value = self._next_soft_value(next_values.detach(), next_log_prob, alpha)
            target = self._td_target(tensordict, next_value)
        return self._soft_critic_loss(values, target, tensordict)

    # TorchRL's method names
    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The critic loss and ``{"td_error": ...}`` (``[*B]``, detached)."""
        loss, info = self.loss_qvalue(tensordict)
        return loss, {"td_error": info["td_error"]}

    actor_loss = SACLoss.loss_actor

    def alpha_loss(
        self, log_prob: torch.Tensor, tensordict: TensorDictBase | None = None
    ) -> torch.Tensor:
        """The temperature loss of ``log_prob`` (``actor_loss``'s metadata), reduced; the
        padding mask and replay weights are read from ``tensordict`` when given."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=log_prob.shape)
        return self._temperature_loss(log_prob, tensordict)
