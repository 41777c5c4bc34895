"""The base of DDPG and TD3: a deterministic actor ``mu(s)`` trained through a critic
``Q(s, a)`` (Silver et al., "Deterministic Policy Gradient Algorithms", ICML 2014; Lillicrap et
al., arXiv:1509.02971; Fujimoto et al., arXiv:1802.09477)."""

from __future__ import annotations

import abc
import dataclasses

from tensordict.utils import NestedKey

from rlloss._networks import NetworkCall
from rlloss.offpolicy.base import TDTargetLoss


class DeterministicActorCritic(TDTargetLoss):
    """What DDPG and TD3 (TD3+BC) share: the keys, the deterministic actor's calls (online, and
    a target copy with ``delay_actor``: :meth:`_register_actor_calls`) and ``in_keys``. A
    subclass sets ``actor_network`` and its critic, then calls :meth:`_register_actor_calls`;
    :meth:`_critic_in_keys` names what its critic reads."""

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """The keys of DDPG and TD3: the action and the critic's output, besides the replay
        keys."""

        action: NestedKey = "action"  # the action taken, and the actor's output, [*B, A]
        state_action_value: NestedKey = "state_action_value"  # the critic's Q(s, a), [*B, 1]

    _estimator_keys = {"value": "state_action_value"}
    _actor_loss_key = "loss_actor"
    _deterministic_actor = True

    def _register_actor_calls(self, delay_actor: bool) -> None:
        """``_actor_call``, ``mu(s)`` up to ``tensor_keys.action``, and ``_target_actor_call``:
        the target copy's with ``delay_actor``, else the online actor's (the next action then
        comes from it, without gradient)."""
        self.delay_actor = delay_actor
        action_key = self.tensor_keys.action
        self._actor_call = NetworkCall(self.actor_network, until=action_key)
        self._target_actor_call = self._actor_call
        if delay_actor:
            self._target_actor_call = self._register_target_network("actor_network", action_key)

    @abc.abstractmethod
    def _critic_in_keys(self) -> list[NestedKey]:
        """The keys the critic reads (the observation's and ``action``)."""

    @property
    def in_keys(self) -> list[NestedKey]:
        actor_in_keys, value_in_keys = self.actor_network.in_keys, self._critic_in_keys()
        next_keys = [*actor_in_keys, *(k for k in value_in_keys if k != self.tensor_keys.action)]
        return self._transition_keys([*actor_in_keys, *value_in_keys], next_keys)
