"""The Q-learning base of the value-based losses (DQN, double DQN, C51, discrete CQL).

Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015; van
Hasselt et al., "Deep Reinforcement Learning with Double Q-learning", arXiv:1509.06461.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec
from torchrl.modules import QValueActor

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import check_choice, check_network
from rlloss._networks import NetworkCall, entry
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import ACTION_SPACE_SETTINGS, ACTION_SPACES, TDTargetLoss


class QLearningLoss(TDTargetLoss):
    """Q-learning with a target network, the base of ``DQNLoss``, ``DDQNLoss``,
    ``DistributionalDQNLoss`` and ``DiscreteCQLLoss``: the chosen action's value
    (:meth:`_chosen_values`), the bootstrapped value of the next state (:meth:`_next_value`,
    greedy or double-Q) and the regression on ``r + gamma^n (1 - terminated) V'(s')``. The
    keywords are documented in :class:`rlloss.DQNLoss`.
    """

    _choices = {**TDTargetLoss._choices, "action_space": ACTION_SPACE_SETTINGS}  # on assignment

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by DQNLoss (``priority``: the squared TD error, ``[*B, 1]``)."""

        value: NestedKey = "chosen_action_value"  # Q(s, a) (kept for TorchRL's key names)
        advantage: NestedKey = "advantage"  # kept for TorchRL's key names (not read)
        value_target: NestedKey = "value_target"  # kept for TorchRL's key names (not read)
        action_value: NestedKey = "action_value"  # Q(s, .) written by the value network
        action: NestedKey = "action"  # the action taken: index or one-hot

    out_keys = ["loss"]

    def __init__(
        self,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        double_dqn: bool = False,
        gamma: float | None = None,
        action_space: str | TensorSpec | None = None,
        priority_key: NestedKey | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
    ) -> None:
        if isinstance(value_network, nn.Module) and not hasattr(value_network, "in_keys"):
            # TorchRL's convenience: a plain network of the observation becomes a QValueActor
            space = action_space if isinstance(action_space, str) else "one-hot"
            value_network = QValueActor(value_network, in_keys=["observation"], action_space=space)
        check_network(type(self).__name__, "value_network", value_network)
        super().__init__(
            loss_function=loss_function,
            gamma=gamma,
            priority_key=priority_key,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
        )
        if isinstance(action_space, str):
            check_choice("action_space", action_space, ACTION_SPACES)
        if double_dqn and not delay_value:
            raise ValueError("double_dqn=True needs delay_value=True (a target network).")
        self.double_dqn = double_dqn
        self.delay_value = delay_value
        self.value_network = value_network
        self._expose_parameters("value_network")
        self._value_call = NetworkCall(value_network, until=self.tensor_keys.action_value)
        self._target_value_call = None
        if delay_value:
            self._target_value_call = self._register_target_network(
                "value_network", until=self.tensor_keys.action_value
            )

    @property
    def in_keys(self) -> list[NestedKey]:
        in_keys = self.value_network.in_keys
        return self._transition_keys([*in_keys, self.tensor_keys.action], in_keys)

    def _action_values(self, batch: TensorDictBase) -> torch.Tensor:
        return self._value_call(batch)[self._tensor_keys.action_value]

    def _chosen_values(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``Q(s, .)`` (``[*B, A]``) and ``Q(s, a)`` of the batch's action (``[*B, 1]``)."""
        action_values = self._value_call(batch)[self._tensor_keys.action_value]
        return action_values, rlf.chosen_action_value(action_values, self._get(batch, "action"))

    def _next_value(self, next_batch: TensorDictBase) -> torch.Tensor:
        """``V'(s')``: greedy (or double-Q) value of the next state, without gradient.

        Gradient recording is switched off and back by hand (``_compat.set_grad_mode``), the
        same as ``with torch.no_grad():`` without its context manager's Python frames: DQN's
        whole forward is small enough at small batches for them to count (issue 49's
        hand-written comparison)."""
        enabled = torch.is_grad_enabled()
        _compat.set_grad_mode(False)
        try:
            key = self._tensor_keys.action_value
            if not self.delay_value:
                return rlf.greedy_value(self._value_call(next_batch)[key])
            target = self._target_value_call(next_batch)[key]
            if not self.double_dqn:
                return rlf.greedy_value(target)
            return rlf.double_q_value(self._value_call(next_batch)[key], target)
        finally:
            _compat.set_grad_mode(enabled)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions; writes ``td_error`` into ``tensordict``."""
        batch, mask = self._valid_batch_and_mask(tensordict)  # the mask, read once
        _, value = self._chosen_values(batch)
        target = self._td_target(batch, self._next_value(entry(batch, "next")))
        self._write_priority(tensordict, rlf.td_error(value, target, "squared"))
        loss = self._critic_loss(value, target, batch, mask)
        return _compat.output_tensordict({"loss": loss})
