"""Discrete SAC: ``DiscreteSACLoss`` (Christodoulou, "Soft Actor-Critic for Discrete Action
Settings", arXiv:1910.07207)."""

from __future__ import annotations

import dataclasses
import math

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import (
    check_choice,
    check_in_range,
)
from rlloss._networks import (
    entry,
    network_inputs,
)
from rlloss.addons import ActorOutput
from rlloss.offpolicy.base import ACTION_SPACE_SETTINGS, ACTION_SPACES
from rlloss.offpolicy.soft_actor_critic import _SoftActorCritic


class DiscreteSACLoss(_SoftActorCritic):
    """Discrete SAC: the losses of :class:`rlloss.SACLoss` with exact expectations over the actions.

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
    class _AcceptedKeys(_SoftActorCritic._AcceptedKeys):
        """Keys read by DiscreteSACLoss (``priority``: ``max_i |TD error|``, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken: index or one-hot
        action_value: NestedKey = "action_value"  # Q(s, .) written by the Q networks
        log_prob: NestedKey = "log_prob"  # kept for TorchRL's key names (not read)

    _choices = {**_SoftActorCritic._choices, "action_space": ACTION_SPACE_SETTINGS}  # assignment

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
        super().__init__(
            actor_network,
            qvalue_network,
            value="action_value",
            num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function,
            alpha_init=alpha_init,
            min_alpha=min_alpha,
            max_alpha=max_alpha,
            fixed_alpha=fixed_alpha,
            delay_qvalue=delay_qvalue,
            priority_key=priority_key,
            separate_losses=separate_losses,
            reduction=reduction,
            skip_done_states=skip_done_states,
            deactivate_vmap=deactivate_vmap,
            use_prioritized_weights=use_prioritized_weights,
            scalar_output_mode=scalar_output_mode,
            gamma=gamma,
            delay_actor=delay_actor,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        self.num_actions = num_actions
        self._register_coefficients(self.log_alpha.device, target_entropy=target_entropy)
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
