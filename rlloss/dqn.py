"""DQN losses: ``DQNLoss`` (Q-learning, double Q-learning with ``double_dqn=True``) and
``DDQNLoss``.

Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015; van
Hasselt et al., "Deep Reinforcement Learning with Double Q-learning", arXiv:1509.06461.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.objectives.utils import ValueEstimators

from rlloss import functional as F
from rlloss._networks import NetworkCall, entry
from rlloss.common import LossModule, check_choice, check_in_range
from rlloss.functional.critic import DISTANCES

ACTION_SPACES = ("one-hot", "categorical", "one_hot", "mult-one-hot", "binary")
PRIORITY_WEIGHTINGS = ("mean", "normalized")


class DQNLoss(LossModule):
    """Q-learning loss ``L(Q(s, a), r + gamma^n (1 - terminated) V'(s'))``.

    ``V'(s') = max_a Q_target(s', a)``, or with ``double_dqn=True`` the target network's value
    of the online network's greedy action. ``n`` is ``steps_to_next_obs`` when the batch has it
    (TorchRL's ``MultiStep``), else 1. The loss is weighted by ``priority_weight`` when the batch
    has it (prioritized replay) and the squared TD error is written into the input batch under
    ``td_error`` for ``replay_buffer.update_tensordict_priority(batch)``.

    Args:
        value_network: a TorchRL ``QValueActor`` or any module writing ``action_value``
            (``[*B, num_actions]``).
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        delay_value: keep a target copy of the network (update it with TorchRL's ``SoftUpdate``
            or ``HardUpdate``); ``False`` bootstraps from the online network (no gradient).
        double_dqn: double Q-learning (needs ``delay_value``).
        gamma: the discount (default 0.99; ``make_value_estimator(ValueEstimators.TD0,
            gamma=...)`` sets it too, as in TorchRL).
        action_space: ``"one-hot"`` or ``"categorical"``; the action's dtype decides either way
            (floating or bool: one-hot; integer: index).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        use_prioritized_weights: ``"auto"`` (use ``priority_weight`` when present), ``True`` or
            ``False``.
        priority_weighting: ``"mean"``, the mean of ``w l`` (Schaul et al., arXiv:1511.05952), or
            ``"normalized"``, ``sum(w l) / sum(w)`` (TorchRL's).

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean (pass
    ``"normalized"`` for TorchRL's numbers); a batch without ``("next", "terminated")`` is
    refused instead of bootstrapping on ``done``; only one-step (n-step through
    ``steps_to_next_obs``) targets are built, so ``make_value_estimator`` takes ``TD0`` only.

    Example:
        >>> loss = DQNLoss(QValueActor(net, in_keys=["observation"], spec=spec), double_dqn=True)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch); out["loss"].backward(); optimizer.step(); updater.step()
        >>> replay_buffer.update_tensordict_priority(batch)
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read (and ``priority`` written) by DQNLoss."""

        value: NestedKey = "chosen_action_value"  # Q(s, a) (kept for TorchRL's key names)
        action_value: NestedKey = "action_value"  # Q(s, .) written by the value network
        action: NestedKey = "action"  # the action taken: index or one-hot
        priority: NestedKey = "td_error"  # written: squared TD error, [*B, 1]
        reward: NestedKey = "reward"  # read under "next"
        done: NestedKey = "done"  # read under "next" (not used by one-step targets)
        terminated: NestedKey = "terminated"  # read under "next": stops bootstrapping
        priority_weight: NestedKey = "priority_weight"  # optional importance weights
        steps_to_next_obs: NestedKey = "steps_to_next_obs"  # optional: n of n-step returns

    default_keys = _AcceptedKeys
    default_value_estimator = ValueEstimators.TD0
    out_keys = ["loss"]

    def __init__(
        self,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        double_dqn: bool = False,
        gamma: float | None = None,
        action_space: str | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
    ) -> None:
        super().__init__()
        check_choice("loss_function", loss_function, DISTANCES)
        check_choice("use_prioritized_weights", use_prioritized_weights, (True, False, "auto"))
        check_choice("priority_weighting", priority_weighting, PRIORITY_WEIGHTINGS)
        if isinstance(action_space, str):
            check_choice("action_space", action_space, ACTION_SPACES)
        if double_dqn and not delay_value:
            raise ValueError("double_dqn=True needs delay_value=True (a target network).")
        self.gamma = 0.99 if gamma is None else gamma
        check_in_range("gamma", self.gamma, 0.0, 1.0)
        self.reduction = self._check_reduction(reduction)
        self.loss_function = loss_function
        self.double_dqn = double_dqn
        self.delay_value = delay_value
        self.use_prioritized_weights = use_prioritized_weights
        self.priority_weighting = priority_weighting
        self.value_network = value_network
        self._value_call = NetworkCall(value_network, until=self.tensor_keys.action_value)
        if delay_value:
            self._register_target_network("value_network", until=self.tensor_keys.action_value)

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = [*self.value_network.in_keys, self.tensor_keys.action]
        keys += [("next", k) for k in self.value_network.in_keys]
        keys += [("next", self.tensor_keys.reward), ("next", self.tensor_keys.terminated)]
        return list(dict.fromkeys(keys))

    make_value_estimator = LossModule.make_gamma_estimator

    def _action_values(self, batch: TensorDictBase) -> torch.Tensor:
        return self._value_call(batch)[self.tensor_keys.action_value]

    def _next_value(self, next_batch: TensorDictBase) -> torch.Tensor:
        """``V'(s')``: greedy (or double-Q) value of the next state, without gradient."""
        key = self.tensor_keys.action_value
        with torch.no_grad():
            if not self.delay_value:
                return F.greedy_value(self._action_values(next_batch))
            target = self._target_outputs("value_network", next_batch)[key]
            if not self.double_dqn:
                return F.greedy_value(target)
            return F.double_q_value(self._action_values(next_batch), target)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions; writes ``td_error`` into ``tensordict``."""
        value = F.chosen_action_value(
            self._action_values(tensordict), self._get(tensordict, "action")
        )
        reward = self._get(tensordict, "reward", nested=True)
        target = F.td0_return(
            reward,
            self._next_value(entry(tensordict, "next")),
            self._get(tensordict, "terminated", nested=True),
            self._bootstrap_discount(tensordict, reward),
        )
        self._write(tensordict, "priority", (value - target).detach().square())
        loss = self._reduce_replayed(F.distance(value, target, self.loss_function), tensordict)
        return TensorDict._new_unsafe({"loss": loss}, batch_size=torch.Size([]))


class DDQNLoss(DQNLoss):
    """:class:`DQNLoss` with ``double_dqn=True`` (and a target network), as TorchRL's alias."""

    def __init__(self, value_network: nn.Module, **kwargs) -> None:
        super().__init__(value_network, double_dqn=True, delay_value=True, **kwargs)
