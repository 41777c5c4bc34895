"""DDPG: deep deterministic policy gradient (Lillicrap et al., "Continuous control with deep
reinforcement learning", arXiv:1509.02971)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import check_network
from rlloss._networks import NetworkCall, entry
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss


class DDPGLoss(TDTargetLoss):
    r"""DDPG's actor and critic losses.

    $$
    \mathcal{L}_{\text{value}} = L\big(Q(s, a),\,
    r + \gamma^n (1 - \text{terminated}) \bar{Q}(s', \bar{\mu}(s'))\big), \qquad
    \mathcal{L}_{\text{actor}} = -Q(s, \mu(s))
    $$

    with $\bar{Q}$, $\bar{\mu}$ the target copies and the critic's parameters detached in the
    actor's loss. :meth:`loss_actor` and
    :meth:`loss_value` can be called separately; ``forward`` returns both and writes the squared
    TD error ``td_error`` (``[*B]``) into the batch for prioritized replay.

    Reference: Lillicrap et al., "Continuous control with deep reinforcement learning",
    arXiv:1509.02971.

    Args:
        actor_network: a deterministic actor writing ``action`` (a TorchRL ``Actor``).
        value_network: a module reading the observation and ``action`` and writing
            ``state_action_value`` (a TorchRL ``ValueOperator``).
        delay_actor: a target copy of the actor (TorchRL's default: no).
        delay_value: a target copy of the critic (default: yes).
        loss_function: see :class:`rlloss.offpolicy.TDTargetLoss` (``loss_function``
            defaults to ``"l2"``).
        gamma: as ``loss_function``.
        reduction: as ``loss_function``.
        use_prioritized_weights: as ``loss_function``.
        priority_weighting: as ``loss_function``.
        policy_loss_addons: as ``loss_function``.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean;
    ``separate_losses`` is not supported.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MLP, ValueOperator
        >>> from rlloss import DDPGLoss, SoftUpdate
        >>> actor = TensorDictModule(
        ...     torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh()),
        ...     ["observation"],
        ...     ["action"],
        ... )
        >>> qvalue = ValueOperator(
        ...     MLP(in_features=4, out_features=1, num_cells=[8]), in_keys=["observation", "action"]
        ... )
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.rand(8, 1) * 2 - 1,
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = DDPGLoss(actor, qvalue)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_value"]).backward()
        >>> updater.step()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by DDPGLoss (``priority``: the squared TD error, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken, and the actor's output, [*B, A]
        state_action_value: NestedKey = "state_action_value"  # the critic's Q(s, a), [*B, 1]

    _estimator_keys = {"value": "state_action_value"}
    _actor_loss_key = "loss_actor"
    _deterministic_actor = True

    out_keys = [
        "loss_actor",
        "loss_value",
        "td_error",
        "pred_value",
        "target_value",
        "pred_value_max",
        "target_value_max",
    ]

    def __init__(
        self,
        actor_network: nn.Module,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_actor: bool = False,
        delay_value: bool = True,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        check_network(type(self).__name__, "actor_network", actor_network)
        check_network(type(self).__name__, "value_network", value_network)
        super().__init__(
            loss_function=loss_function,
            gamma=gamma,
            separate_losses=separate_losses,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        self.delay_actor = delay_actor
        self.delay_value = delay_value
        self.actor_network = actor_network
        self.value_network = value_network
        self._expose_parameters("actor_network", "value_network")
        self._read_action_key(actor_network, value_network)
        action_key, value_key = self.tensor_keys.action, self.tensor_keys.state_action_value
        self._actor_call = NetworkCall(actor_network, until=action_key)
        # without target copies, the next action and value come from the online networks
        # (no gradient)
        self._target_actor_call = self._actor_call
        if delay_actor:
            self._target_actor_call = self._register_target_network("actor_network", action_key)
        self._value_call = NetworkCall(value_network, until=value_key)
        self._detached_value_call = self._register_detached_view("value_network", value_key)
        self._target_value_call = self._detached_value_call
        if delay_value:
            self._target_value_call = self._register_target_network("value_network", value_key)

    def _read_action_key(self, actor_network: nn.Module, value_network: nn.Module) -> None:
        """The action key is the actor's output that the critic reads, when there is exactly
        one (TorchRL's DDPGLoss has no action key: the critic reads whatever the actor writes,
        e.g. a multi-agent ``("agents", "action")``); else the default ``"action"``."""
        written = [k for k in getattr(actor_network, "out_keys", []) if k in value_network.in_keys]
        if len(written) == 1:
            self.tensor_keys.action = written[0]

    @property
    def in_keys(self) -> list[NestedKey]:
        actor_keys, critic_keys = self.actor_network.in_keys, self.value_network.in_keys
        next_keys = [*actor_keys, *(k for k in critic_keys if k != self.tensor_keys.action)]
        return self._transition_keys([*actor_keys, *critic_keys], next_keys)

    def _value(self, call: Callable, batch: TensorDictBase, action: torch.Tensor):
        """``Q(s, action)``, ``[*B, 1]``, from ``call``: the online critic, its target copy or
        its detached view."""
        outputs = call.at_action(batch, self.tensor_keys.action, action)
        return outputs[self.tensor_keys.state_action_value]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``-Q(s, mu(s))`` reduced (the critic gets no gradient)."""
        action = self._actor_call(tensordict)[self.tensor_keys.action]
        value = self._value(self._detached_value_call, tensordict, action)
        loss = self._reduce_replayed(-value, tensordict)
        return self._with_policy_addons(loss, tensordict, ActorOutput(action=action), {})

    def loss_value(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``L(Q(s, a), y)`` reduced, with the TD errors and values (detached)."""
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            next_action = self._target_actor_call(next_batch)[self.tensor_keys.action]
            next_value = self._value(self._target_value_call, next_batch, next_action)
            target = self._td_target(tensordict, next_value)
        value = self._value(self._value_call, tensordict, self._get(tensordict, "action"))
        loss = self._critic_loss(value, target, tensordict)
        info = {
            "td_error": rlf.td_error(value, target, "squared").squeeze(-1),
            **rlf.regression_diagnostics(value, target),
        }
        info["pred_value_max"] = info["pred_value"].max()
        info["target_value_max"] = info["target_value"].max()
        return loss, info

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Both losses; writes ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        loss_value, info = self.loss_value(batch)
        loss_actor, info_actor = self.loss_actor(batch)
        self._write_priority(tensordict, info["td_error"])
        return TensorDict(
            {"loss_actor": loss_actor, "loss_value": loss_value, **info, **info_actor},
            batch_size=[],
        )
