"""Value decomposition for cooperative multi-agent Q-learning: ``QMixerLoss`` (QMIX with TorchRL's
``QMixer``, VDN with its ``VDNMixer``, or any mixer network).

Rashid et al., "QMIX: Monotonic Value Function Factorisation for Deep Multi-Agent Reinforcement
Learning", arXiv:1803.11485; Sunehag et al., "Value-Decomposition Networks For Cooperative
Multi-Agent Learning", arXiv:1706.05296.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from tensordict.utils import NestedKey
from torch import nn
from torchrl.modules import QValueActor

from rlloss import functional as rlf
from rlloss._checks import check_choice, check_network
from rlloss._keywords import torchrl_keywords
from rlloss._networks import NetworkCall, entry, network_inputs
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss
from rlloss.offpolicy.dqn import ACTION_SPACES, QLearningLoss


class QMixerLoss(QLearningLoss):
    r"""Q-learning on the mixed value of a team: each agent's network gives ``Q_i(o_i, .)``, the
    mixer $f$ turns the agents' chosen values into the team's, regressed on a target
    (no gradient through $y$):

    $$
    Q_{\text{tot}}(s, a) = f\big(Q_1(o_1, a_1), \ldots, Q_n(o_n, a_n); s\big), \qquad
    y = r + \gamma^n (1 - \text{terminated}) \bar{f}\big(\max_{a} \bar{Q}_1(o'_1, a), \ldots,
    \max_{a} \bar{Q}_n(o'_n, a); s'\big)
    $$

    The reward, done and terminated
    flags are the team's (``[*B, 1]``); the agents' entries carry an agent dim
    (``("agents", "action")``: ``[*B, n_agents]`` indices or ``[*B, n_agents, A]`` one-hot).

    ``loss = mean L(Q_tot, y)``; ``forward`` writes ``td_error = (Q_tot - y)^2`` (``[*B, 1]``)
    into the batch for prioritized replay. TD(1) and TD(lambda) targets
    (``make_value_estimator``) read the batch's last dim as time.

    Reference: Rashid et al., "QMIX: Monotonic Value Function Factorisation for Deep
    Multi-Agent Reinforcement Learning", arXiv:1803.11485; Sunehag et al., "Value-Decomposition
    Networks For Cooperative Multi-Agent Learning", arXiv:1706.05296 (VDN).

    Args:
        local_value_network: the agents' Q network, e.g. a ``QValueActor`` or a ``TensorDictModule``
            writing ``("agents", "action_value")`` followed by TorchRL's ``QValueModule``
            (``[*B, n_agents, A]``); a plain ``nn.Module`` of ``"observation"`` is wrapped in a
            ``QValueActor``, as TorchRL does.
        mixer_network: a ``TensorDictModule`` over TorchRL's ``QMixer`` / ``VDNMixer`` (or any
            module) reading ``("agents", "chosen_action_value")`` (``[*B, n_agents, 1]``, and
            e.g. the global ``"state"``) and writing ``"chosen_action_value"`` (``[*B, 1]``); a
            plain ``nn.Module`` is wrapped with those keys.
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        delay_value: target copies of both networks (default), updated with ``SoftUpdate`` or
            ``HardUpdate``; ``False`` bootstraps from the online ones, without gradient.
        action_space: ``"one-hot"`` or ``"categorical"`` (the action's dtype decides either
            way); default: the local network's.
        gamma: see
            :class:`rlloss.offpolicy.TDTargetLoss`.
        reduction: as ``gamma``.
        use_prioritized_weights: as ``gamma``.
        priority_weighting: as ``gamma``.
        priority_key: TorchRL's removed keyword: a ``RuntimeError`` pointing to
            ``set_keys(priority=...)``, as TorchRL's.

    As TorchRL's, the loss reads no padding mask: ``loss_mask_key`` (``"auto"``) is accepted
    and never read, and a batch's ``("collector", "mask")`` changes nothing.

    Differences from TorchRL: ``gamma`` is accepted (TorchRL's raises, ``make_value_estimator``
    sets it there); ``reduction`` and prioritized-replay weights apply to the loss.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.data import Categorical
        >>> from torchrl.modules import QValueModule, SafeSequential
        >>> from torchrl.modules.models.multiagent import QMixer
        >>> from rlloss import QMixerLoss, SoftUpdate
        >>> qnet = SafeSequential(  # 3 agents, 5 observations, 4 actions each
        ...     TensorDictModule(
        ...         torch.nn.Linear(5, 4), [("agents", "observation")], [("agents", "action_value")]
        ...     ),
        ...     QValueModule(
        ...         action_value_key=("agents", "action_value"),
        ...         spec=Categorical(4),
        ...         out_keys=[
        ...             ("agents", "action"),
        ...             ("agents", "action_value"),
        ...             ("agents", "chosen_action_value"),
        ...         ],
        ...     ),
        ... )
        >>> mixer = TensorDictModule(
        ...     QMixer(state_shape=(6,), mixing_embed_dim=8, n_agents=3, device="cpu"),
        ...     in_keys=[("agents", "chosen_action_value"), "state"],
        ...     out_keys=["chosen_action_value"],
        ... )
        >>> def step():
        ...     return {
        ...         "agents": TensorDict(observation=torch.randn(8, 3, 5), batch_size=[8, 3]),
        ...         "state": torch.randn(8, 6),
        ...     }
        >>> batch = TensorDict(
        ...     {
        ...         **step(),
        ...         "next": {
        ...             **step(),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> batch["agents", "action"] = torch.randint(4, (8, 3))
        >>> loss = QMixerLoss(qnet, mixer, action_space="categorical")
        >>> updater = SoftUpdate(loss, eps=0.995)
        >>> loss(batch)["loss"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by QMixerLoss (``priority``: the squared TD error of ``Q_tot``,
        ``[*B, 1]``)."""

        advantage: NestedKey = "advantage"  # kept for TorchRL's key names (not read)
        value_target: NestedKey = "value_target"  # kept for TorchRL's key names (not read)
        local_value: NestedKey = ("agents", "chosen_action_value")  # mixer input, [*B, N, 1]
        global_value: NestedKey = "chosen_action_value"  # Q_tot, written by the mixer, [*B, 1]
        action_value: NestedKey = ("agents", "action_value")  # Q_i(o_i, .) per agent, [*B, N, A]
        action: NestedKey = ("agents", "action")  # index [*B, N] or one-hot [*B, N, A]

    out_keys = ["loss"]
    _reads_loss_mask = False  # TorchRL's QMixerLoss reads no padding mask
    _estimator_keys = {"value": "global_value"}

    def __init__(
        self,
        local_value_network: nn.Module,
        mixer_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        gamma: float | None = None,
        action_space: str | None = None,
        priority_key: NestedKey | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
    ) -> None:
        torchrl_keywords(self, {"priority_key": priority_key}, (), ("priority_key",))
        TDTargetLoss.__init__(
            self,
            loss_function=loss_function,
            gamma=gamma,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
        )
        self.local_value_network = _as_q_network(local_value_network, action_space)
        self.mixer_network = self._as_mixer(mixer_network)
        self.delay_value, self.double_dqn = delay_value, False
        self.action_space = _action_space(self.local_value_network, action_space)
        self._expose_parameters("local_value_network", "mixer_network")
        action_value, global_value = self.tensor_keys.action_value, self.tensor_keys.global_value
        self._value_call = NetworkCall(self.local_value_network, until=action_value)
        self._mixer_call = NetworkCall(self.mixer_network, until=global_value)
        self._target_value_call = self._target_mixer_call = None
        if delay_value:
            self._target_value_call = self._register_target_network(
                "local_value_network", until=action_value
            )
            self._target_mixer_call = self._register_target_network(
                "mixer_network", until=global_value
            )

    def _as_mixer(self, mixer_network: nn.Module) -> nn.Module:
        """TorchRL's convenience: a plain mixer reads ``local_value`` and writes
        ``global_value``."""
        if not hasattr(mixer_network, "in_keys"):
            keys = self.tensor_keys
            mixer_network = TensorDictModule(
                mixer_network, in_keys=[keys.local_value], out_keys=[keys.global_value]
            )
        check_network(type(self).__name__, "mixer_network", mixer_network)
        return mixer_network

    @property
    def in_keys(self) -> list[NestedKey]:
        mixer_keys = [k for k in self.mixer_network.in_keys if k != self.tensor_keys.local_value]
        network_keys = [*self.local_value_network.in_keys, *mixer_keys]
        return self._transition_keys([*network_keys, self.tensor_keys.action], network_keys)

    def _mixed(self, batch: TensorDictBase, local_values: torch.Tensor, target: bool = False):
        """``Q_tot`` ``[*B, 1]``: the (target) mixer on the agents' values ``[*B, n_agents, 1]``
        and the batch's other mixer inputs (e.g. the state)."""
        key = self.tensor_keys.local_value
        inputs = network_inputs(batch, self.mixer_network, exclude=key)
        inputs[key] = local_values
        call = self._target_mixer_call if target else self._mixer_call
        outputs, key = call(inputs), self.tensor_keys.global_value
        if key not in outputs:  # a shape of the keys, known on the host
            raise KeyError(
                f'key "{key}" not found in TensorDict with keys {list(outputs.keys())}: the mixer '
                f"writes {self.mixer_network.out_keys}; set loss.set_keys(global_value=...) to "
                "the key it writes."
            )
        return outputs[key]

    def _next_team_value(self, next_batch: TensorDictBase) -> torch.Tensor:
        """``f_target(max_a Q_i,target(o'_i, a); s')`` ``[*B, 1]``, without gradient."""
        with torch.no_grad():
            greedy = self._next_value(next_batch)  # [*B, n_agents, 1]
            return self._mixed(next_batch, greedy, target=self.delay_value)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of team transitions; writes ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        _, local_values = self._chosen_values(batch)  # [*B, n_agents, 1]
        value = self._mixed(batch, local_values)
        target = self._td_target(batch, self._next_team_value(entry(batch, "next")))
        self._write_priority(tensordict, rlf.td_error(value, target, "squared"))
        return TensorDict({"loss": self._critic_loss(value, target, batch)}, batch_size=[])


def _as_q_network(network: nn.Module, action_space) -> nn.Module:
    """A plain ``nn.Module`` as TorchRL's ``QValueActor`` of ``"observation"``; checked."""
    if isinstance(network, nn.Module) and not hasattr(network, "in_keys"):
        space = action_space if isinstance(action_space, str) else "one-hot"
        network = QValueActor(network, in_keys=["observation"], action_space=space)
    check_network("QMixerLoss", "local_value_network", network)
    return network


def _action_space(network: nn.Module, action_space) -> str | None:
    """The action space as given (checked), else the local network's, as TorchRL infers it."""
    if isinstance(action_space, str):
        check_choice("action_space", action_space, ACTION_SPACES)
        return action_space
    if action_space is not None:
        return action_space
    return getattr(network, "action_space", None)
