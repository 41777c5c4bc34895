"""Soft actor-critic: ``SACLoss`` (continuous actions, SAC v2 without a value network) and
``DiscreteSACLoss``.

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905;
Christodoulou, "Soft Actor-Critic for Discrete Action Settings", arXiv:1910.07207.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import CompositeDistribution, set_composite_lp_aggregate
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Composite
from torchrl.modules import TanhNormal

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import check_choice, check_in_range, check_network
from rlloss._networks import DistributionCall, NetworkCall, entry, network_inputs, sum_heads
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
        }
        scalars = {"alpha": self.log_alpha.detach().exp(), "entropy": -log_prob.mean()}
        if self.reduction != "none":
            return _compat.output_tensordict({**out, **scalars})
        out = TensorDict(out, batch_size=tensordict.batch_size)  # per-sample losses
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
        gamma, reduction, use_prioritized_weights, priority_weighting: see
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
            params = call.distribution_parameters(batch)
            keys = call.parameter_keys
            return rlf.tanh_normal_sample_and_log_prob(
                params[keys["loc"]], params[keys["scale"]], self.action_low, self.action_high
            )
        distribution = call(batch)
        if isinstance(distribution, CompositeDistribution):  # a TensorDict of actions
            with set_composite_lp_aggregate(False):
                action = distribution.rsample()
                return action, sum_heads(distribution.log_prob(action), batch.batch_size)
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
        value = rlf.clipped_double_q_value(self._q_values(tensordict, action, detach=True))
        loss = -rlf.soft_value(value, log_prob, alpha)
        self._fill_target_entropy(tensordict, action)
        return self._reduce_replayed(loss, tensordict), {"log_prob": log_prob.detach()}

    def _fill_target_entropy(self, tensordict: TensorDictBase, action: torch.Tensor) -> None:
        """``target_entropy="auto"`` without a spec: ``-dim(A)`` from the batch's action shape,
        written while the buffer is still unset (NaN); in place, no Python state changes, so a
        compiled loss does not recompile."""
        if self._target_entropy_from_batch:
            dim = float(action.shape[tensordict.ndim :].numel())
            unset = self.target_entropy.isnan()
            self.target_entropy.copy_(torch.where(unset, -dim, self.target_entropy))

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, and ``td_error``, ``target_value``, ``pred_value``
        (see :meth:`_soft_critic_loss`)."""
        if self._version == 1:
            return self._qvalue_v1_loss(tensordict)
        alpha = self._alpha()
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            next_action, next_log_prob = self._policy_sample(next_batch)
            next_action = self._skip_done(tensordict, next_action)
            next_log_prob = self._skip_done(tensordict, next_log_prob)
            next_values = self._q_values(
                next_batch, next_action, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            next_value = rlf.soft_value(
                rlf.clipped_double_q_value(next_values), next_log_prob, alpha
            )
            target = self._td_target(tensordict, next_value)
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
        return self._reduce_replayed(loss, tensordict), {"log_prob": expected_log_prob}

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
