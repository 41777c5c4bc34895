"""DDPG: deep deterministic policy gradient (Lillicrap et al., "Continuous control with deep
reinforcement learning", arXiv:1509.02971)."""

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
from rlloss.dqn import PRIORITY_WEIGHTINGS
from rlloss.functional.critic import DISTANCES


class DDPGLoss(LossModule):
    """DDPG's actor and critic losses.

    Critic: ``L(Q(s, a), r + gamma^n (1 - terminated) Q_target(s', mu_target(s')))``. Actor:
    ``-Q(s, mu(s))`` with the critic's parameters detached. :meth:`loss_actor` and
    :meth:`loss_value` can be called separately; ``forward`` returns both and writes the squared
    TD error ``td_error`` (``[*B]``) into the batch for prioritized replay.

    Args:
        actor_network: a deterministic actor writing ``action`` (a TorchRL ``Actor``).
        value_network: a module reading the observation and ``action`` and writing
            ``state_action_value`` (a TorchRL ``ValueOperator``).
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        delay_actor: a target copy of the actor (TorchRL's default: no).
        delay_value: a target copy of the critic (default: yes).
        gamma, reduction, use_prioritized_weights, priority_weighting: as in
            :class:`rlloss.DQNLoss`.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean;
    ``separate_losses`` is not supported.

    Example:
        >>> loss = DDPGLoss(actor, critic)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch); (out["loss_actor"] + out["loss_value"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read (and ``priority`` written) by DDPGLoss."""

        action: NestedKey = "action"  # the action taken, and the actor's output
        state_action_value: NestedKey = "state_action_value"  # written by the critic
        priority: NestedKey = "td_error"  # written: squared TD error, [*B]
        reward: NestedKey = "reward"  # read under "next"
        done: NestedKey = "done"  # read under "next" (not used by one-step targets)
        terminated: NestedKey = "terminated"  # read under "next": stops bootstrapping
        priority_weight: NestedKey = "priority_weight"  # optional importance weights
        steps_to_next_obs: NestedKey = "steps_to_next_obs"  # optional: n of n-step returns

    default_keys = _AcceptedKeys
    default_value_estimator = ValueEstimators.TD0
    out_keys = [
        "loss_actor",
        "loss_value",
        "td_error",
        "pred_value",
        "target_value",
        "pred_value_max",
        "target_value_max",
    ]
    make_value_estimator = LossModule.make_gamma_estimator

    def __init__(
        self,
        actor_network: nn.Module,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_actor: bool = False,
        delay_value: bool = True,
        gamma: float | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
    ) -> None:
        super().__init__()
        check_choice("loss_function", loss_function, DISTANCES)
        check_choice("use_prioritized_weights", use_prioritized_weights, (True, False, "auto"))
        check_choice("priority_weighting", priority_weighting, PRIORITY_WEIGHTINGS)
        self.gamma = 0.99 if gamma is None else gamma
        check_in_range("gamma", self.gamma, 0.0, 1.0)
        self.reduction = self._check_reduction(reduction)
        self.loss_function = loss_function
        self.use_prioritized_weights = use_prioritized_weights
        self.priority_weighting = priority_weighting
        self.delay_actor, self.delay_value = delay_actor, delay_value
        self.actor_network = actor_network
        self.value_network = value_network
        self._actor_call = NetworkCall(actor_network, until=self.tensor_keys.action)
        self._value_call = NetworkCall(value_network, until=self.tensor_keys.state_action_value)
        if delay_actor:
            self._register_target_network("actor_network", until=self.tensor_keys.action)
        if delay_value:
            self._register_target_network(
                "value_network", until=self.tensor_keys.state_action_value
            )
        self._register_detached_view("value_network", until=self.tensor_keys.state_action_value)

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = [*self.actor_network.in_keys, *self.value_network.in_keys]
        keys += [("next", k) for k in self.actor_network.in_keys]
        keys += [("next", self.tensor_keys.reward), ("next", self.tensor_keys.terminated)]
        return list(dict.fromkeys(keys))

    def _value(self, batch: TensorDictBase, action: torch.Tensor, *, target=False, detach=False):
        """``Q(s, action)``, ``[*B, 1]``: online, target (no gradient) or online detached."""
        key = self.tensor_keys.state_action_value
        inputs = {k: entry(batch, k) for k in self.value_network.in_keys}
        inputs[self.tensor_keys.action] = action
        if target:
            return self._target_outputs("value_network", inputs)[key]
        if detach:
            return self._detached_outputs("value_network", inputs)[key]
        return self._value_call(inputs)[key]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``-Q(s, mu(s))`` reduced (the critic gets no gradient)."""
        action = self._actor_call(tensordict)[self.tensor_keys.action]
        value = self._value(tensordict, action, detach=True)
        return self._reduce_replayed(-value, tensordict), {}

    def loss_value(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``L(Q(s, a), y)`` reduced, with the TD errors and values (detached)."""
        reward = self._get(tensordict, "reward", nested=True)
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            if self.delay_actor:
                next_action = self._target_outputs("actor_network", next_batch)
            else:
                next_action = self._actor_call(next_batch)
            next_action = next_action[self.tensor_keys.action]
            next_value = self._value(
                next_batch, next_action, target=self.delay_value, detach=not self.delay_value
            )
            target = F.td0_return(
                reward,
                next_value,
                self._get(tensordict, "terminated", nested=True),
                self._bootstrap_discount(tensordict, reward),
            )
        value = self._value(tensordict, self._get(tensordict, "action"))
        loss = self._reduce_replayed(F.distance(value, target, self.loss_function), tensordict)
        value, target = value.detach().squeeze(-1), target.squeeze(-1)
        info = {
            "td_error": (value - target).square(),
            "pred_value": value,
            "target_value": target,
            "pred_value_max": value.max(),
            "target_value_max": target.max(),
        }
        return loss, info

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Both losses; writes ``td_error`` into ``tensordict``."""
        loss_value, info = self.loss_value(tensordict)
        loss_actor, _ = self.loss_actor(tensordict)
        self._write(tensordict, "priority", info["td_error"])
        out = {"loss_actor": loss_actor, "loss_value": loss_value, **info}
        return TensorDict._new_unsafe(out, batch_size=torch.Size([]))
