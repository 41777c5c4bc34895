"""Discrete SAC: ``DiscreteSACLoss`` (Christodoulou, "Soft Actor-Critic for Discrete Action
Settings", arXiv:1910.07207)."""

from __future__ import annotations

import dataclasses
import math

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import (
    Coefficient,
    check_choice,
    check_in_range,
    check_network,
)
from rlloss._distribution_calls import DistributionCall
from rlloss._ensembles import ensemble_architecture
from rlloss._networks import (
    entry,
    network_inputs,
)
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss
from rlloss.offpolicy.dqn import ACTION_SPACE_SETTINGS, ACTION_SPACES
from rlloss.offpolicy.temperature import (
    OUT_KEYS,
    SCALAR_OUTPUT_MODES,
    log_temperatures,
    projected_alpha,
    soft_outputs,
    zero_where_done,
)


class DiscreteSACLoss(TDTargetLoss):
    r"""Discrete SAC: the losses of :class:`rlloss.SACLoss` with exact expectations over actions.

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_k L\big(Q_k(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated}) \sum_{a'} \pi(a' \mid s')
    \Big(\min_k \bar{Q}_k(s', a') - \alpha \log \pi(a' \mid s')\Big)
    $$

    $$
    \mathcal{L}_{\text{actor}} = \sum_a \pi(a \mid s)
    \Big(\alpha \log \pi(a \mid s) - \min_k Q_k(s, a)\Big), \qquad
    \mathcal{L}_{\text{alpha}} = -\log \alpha \Big(\sum_a \pi(a \mid s) \log \pi(a \mid s)
    + \bar{\mathcal{H}}\Big)
    $$

    (critics detached in the actor's loss, $\bar{\mathcal{H}}$ = ``target_entropy``;
    arXiv:1910.07207, eqs. 9, 10 and 11). ``forward`` writes ``td_error``
    (``max_i |Q_i(s, a) - y|``, ``[*B]``) into the batch.

    Args:
        actor_network: a ``ProbabilisticActor`` over a categorical (``logits``), one-hot or index.
        qvalue_network: a module writing ``action_value`` (``[*B, num_actions]``), or a list of
            ``num_qvalue_nets`` such modules.
        num_actions: the number of actions (for ``target_entropy="auto"``).
        target_entropy: ``"auto"``, ``-log(1 / num_actions) * target_entropy_weight``, or a number.
        action_space: ``"one-hot"`` or ``"categorical"`` (or a spec); the action's dtype decides
            (integer: index, else one-hot).

    The other keywords are as :class:`rlloss.SACLoss`.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean;
    ``alpha`` and ``entropy`` are returned with ``reduction="none"`` too; actions of
    probability 0 contribute exactly 0 to the soft value (TorchRL puts ``log 1e-8`` there).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> from rlloss import DiscreteSACLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ... )
        >>> qvalue = TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["action_value"])
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.randint(4, (8,)),
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = DiscreteSACLoss(
        ...     actor, qvalue, num_actions=4, num_qvalue_nets=2, action_space="categorical"
        ... )
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by DiscreteSACLoss (``priority``: ``max_i |TD error|``, ``[*B]``)."""

        value: NestedKey = "state_value"  # kept for TorchRL's key names (not read)
        action: NestedKey = "action"  # the action taken: index [*B] or one-hot [*B, A]
        action_value: NestedKey = "action_value"  # Q(s, .) written by the Q networks, [*B, A]
        log_prob: NestedKey = "log_prob"  # kept for TorchRL's key names (not read)

    out_keys = OUT_KEYS
    _actor_loss_key = "loss_actor"
    _choices = {
        **TDTargetLoss._choices,
        "scalar_output_mode": SCALAR_OUTPUT_MODES,
        "action_space": ACTION_SPACE_SETTINGS,  # checked on assignment too
    }
    # ``exp(log_alpha)``: a parameter, or a buffer with ``fixed_alpha``; bounds on it, None:
    # unbounded; the temperature loss's target
    log_alpha = Coefficient(buffer=True)
    min_log_alpha = Coefficient(buffer=True)
    max_log_alpha = Coefficient(buffer=True)
    target_entropy = Coefficient(buffer=True)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        action_space: str | TensorSpec | None = None,
        num_actions: int | None = None,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        target_entropy_weight: float = 0.98,
        target_entropy: str | float = "auto",
        delay_qvalue: bool = True,
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        skip_done_states: bool = False,
        deactivate_vmap: bool = False,
        use_prioritized_weights: bool | str = "auto",
        scalar_output_mode: str | None = None,
        gamma: float | None = None,
        delay_actor: bool = False,
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        if isinstance(action_space, str):
            check_choice("action_space", action_space, ACTION_SPACES)
        if target_entropy == "auto":
            if num_actions is None:
                raise ValueError("DiscreteSACLoss: target_entropy='auto' needs num_actions.")
            check_in_range("num_actions", num_actions, 1, integer=True)
            target_entropy = -math.log(1.0 / num_actions) * target_entropy_weight
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
        self.delay_actor = delay_actor
        self._register_temperature(actor_network, alpha_init, min_alpha, max_alpha)
        self._register_networks(actor_network, qvalue_network, num_qvalue_nets)
        self.num_actions = num_actions
        self._register_coefficients(self.log_alpha.device, target_entropy=target_entropy)
        keys = self._actor_call.parameter_keys if self._actor_call.direct else {}
        self._logits_key = keys.get("logits") if set(keys) == {"logits"} else None

    def _register_temperature(self, actor_network, alpha_init, min_alpha, max_alpha) -> None:
        """``log_alpha`` (a parameter, a buffer with ``fixed_alpha``) on the actor's device and
        its bounds ``min_log_alpha`` / ``max_log_alpha`` (``None``: unbounded)."""
        device = next(actor_network.parameters()).device
        log_alpha, min_log_alpha, max_log_alpha = log_temperatures(alpha_init, min_alpha, max_alpha)
        if self.fixed_alpha:
            self._register_coefficients(device, log_alpha=log_alpha)
        else:
            self.log_alpha = nn.Parameter(torch.tensor(log_alpha, device=device))
        self._register_coefficients(
            device, min_log_alpha=min_log_alpha, max_log_alpha=max_log_alpha
        )

    def _register_networks(self, actor_network, qvalue_network, num_qvalue_nets) -> None:
        """The actor and its call (a target copy with ``delay_actor``, as TorchRL keeps), and the
        ``num_qvalue_nets`` Q networks (target copies with ``delay_qvalue``) evaluated up to
        ``action_value``."""
        self.actor_network = actor_network
        self._expose_parameters("actor_network")
        self._actor_call = DistributionCall(actor_network)
        if self.delay_actor:
            self._register_target_network("actor_network")
        self._qvalue = self._register_qvalue_ensemble(
            qvalue_network,
            num_qvalue_nets,
            target=self.delay_qvalue,
            until=self.tensor_keys.action_value,
        )

    qvalue_network = ensemble_architecture("_qvalue", "qvalue_network_params")

    @property
    def in_keys(self) -> list[NestedKey]:
        actor_in_keys = self.actor_network.in_keys
        keys = [*actor_in_keys, *self._qvalue.in_keys, self.tensor_keys.action]
        return self._transition_keys(keys, actor_in_keys)

    def _alpha(self) -> torch.Tensor:
        """``exp(log_alpha)`` (no gradient), ``log_alpha`` projected in place onto its bounds."""
        return projected_alpha(self.log_alpha, self.min_log_alpha, self.max_log_alpha)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """All three losses, ``alpha`` and the policy's ``entropy`` estimate (``-sum_a pi log
        pi``); writes ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        loss_qvalue, info = self.loss_qvalue(batch)
        loss_actor, info_actor = self.loss_actor(batch)
        expected_log_prob = info_actor["log_prob"]
        self._write_priority(tensordict, info["td_error"])
        loss_alpha = rlf.temperature_loss(self.log_alpha, expected_log_prob, self.target_entropy)
        out = {
            "loss_actor": loss_actor,
            "loss_qvalue": loss_qvalue,
            "loss_alpha": self._reduce_replayed(loss_alpha.unsqueeze(-1), batch),
            **self._addon_entries(info_actor),
        }
        return soft_outputs(
            out,
            self.log_alpha,
            expected_log_prob,
            self.reduction,
            self.scalar_output_mode,
            tensordict.batch_size,
        )

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

    # TorchRL's names for the terms stepped one at a time
    def actor_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """TorchRL's name of :meth:`loss_actor`."""
        return self.loss_actor(tensordict)

    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """TorchRL's name of :meth:`loss_qvalue`."""
        return self.loss_qvalue(tensordict)

    def alpha_loss(self, log_prob: torch.Tensor) -> torch.Tensor:
        """``-log_alpha (log_prob + target_entropy)`` elementwise, **not reduced** (as TorchRL's:
        reduce it yourself); ``log_prob`` is :meth:`actor_loss`'s ``"log_prob"``
        (``sum_a pi log pi``), detached here."""
        return rlf.temperature_loss(self.log_alpha, log_prob, self.target_entropy)

    def _policy(self, batch: TensorDictBase, log_probs: torch.Tensor):
        """The current policy's distribution, from its log-probabilities when the actor's head
        reads only logits, else by running the actor."""
        if self._logits_key is not None:
            return self._actor_call.from_parameters({self._logits_key: log_probs})
        return self._actor_call(batch)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced; ``td_error = max_i |Q_i - y|`` ``[*B]``, and the
        targets and values (detached) as ``target_value``, ``pred_value``."""
        alpha = self._alpha()
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            next_values = self._action_values(
                next_batch, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            next_value = rlf.discrete_soft_value(
                rlf.clipped_double_q_value(next_values), self._log_probs(next_batch), alpha
            )
            if self.skip_done_states:  # TorchRL does not run the actor at done next states
                done = self._get(tensordict, "done", nested=True).reshape(tensordict.batch_size)
                next_value = zero_where_done(next_value, done)
            target = self._td_target(tensordict, next_value)
        action = self._get(tensordict, "action")
        values = rlf.chosen_action_value(
            self._action_values(tensordict), action.expand(self.num_qvalue_nets, *action.shape)
        )
        info = {
            "td_error": rlf.ensemble_td_error(values, target, "absolute").squeeze(-1),
            **rlf.regression_diagnostics(values, target),
        }
        return self._ensemble_critic_loss(values, target, tensordict), info
