"""DQN losses: ``DQNLoss`` (Q-learning, double Q-learning with ``double_dqn=True``),
``DDQNLoss`` and ``DistributionalDQNLoss`` (C51), on ``QLearningLoss``, the Q-learning steps
that ``DQNLoss``, ``DistributionalDQNLoss``, :class:`rlloss.DiscreteCQLLoss`
(``offline/discrete_cql.py``) and :class:`rlloss.QMixerLoss` (``multiagent/qmixer.py``) share.

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

from rlloss import functional as rlf
from rlloss._checks import ChoicesOr, check_atoms, check_choice, check_network, check_support
from rlloss._networks import NetworkCall, entry
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss

# TorchRL's ``action_space`` keyword of the discrete-action losses (the Q-learning ones here,
# discrete SAC, discrete IQL): the action's dtype decides the encoding either way
ACTION_SPACES = ("one-hot", "categorical", "one_hot", "mult-one-hot", "binary")
# the attribute, checked on assignment as the constructor checks the keyword: one of those, a
# spec, None (read from the network), or TorchRL's own spelling of the multi-one-hot space
ACTION_SPACE_SETTINGS = ChoicesOr(
    (*ACTION_SPACES, "mult_one_hot"),
    lambda value: value is None or isinstance(value, TensorSpec),
    ", a TensorSpec, or None",
)


class QLearningLoss(TDTargetLoss):
    """Q-learning with a target network, the base of ``DQNLoss`` (and ``DDQNLoss``),
    ``DistributionalDQNLoss``, ``DiscreteCQLLoss`` and ``QMixerLoss``: the value network and
    its target copy, the chosen action's value (:meth:`_chosen_values`) and the bootstrapped
    value of the next state (:meth:`_next_value`, greedy or double-Q). The keywords are
    documented in :class:`rlloss.DQNLoss`.
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by DQNLoss."""

        priority: NestedKey = "td_error"  # written: the squared TD error, for PER, [*B, 1]
        value: NestedKey = "chosen_action_value"  # Q(s, a): kept for TorchRL's key names (not read)
        advantage: NestedKey = "advantage"  # kept for TorchRL's key names (not read)
        value_target: NestedKey = "value_target"  # kept for TorchRL's key names (not read)
        action_value: NestedKey = "action_value"  # Q(s, .) written by the value network, [*B, A]
        action: NestedKey = "action"  # the action taken: index [*B] or one-hot [*B, A]

    out_keys = ["loss"]
    _choices = {**TDTargetLoss._choices, "action_space": ACTION_SPACE_SETTINGS}  # on assignment

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
        """``V'(s')``: greedy (or double-Q) value of the next state, without gradient."""
        with torch.no_grad():
            key = self._tensor_keys.action_value
            if not self.delay_value:
                return rlf.greedy_value(self._value_call(next_batch)[key])
            target = self._target_value_call(next_batch)[key]
            if not self.double_dqn:
                return rlf.greedy_value(target)
            return rlf.double_q_value(self._value_call(next_batch)[key], target)


class DQNLoss(QLearningLoss):
    r"""Q-learning loss on a TD target from a target network.

    $$
    \mathcal{L} = L\big(Q(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated}) \max_{a'} \bar{Q}(s', a')
    $$

    with $\bar{Q}$ the target network; with ``double_dqn=True`` the target network's value of
    the online network's greedy action, $\bar{Q}(s', \arg\max_{a'} Q(s', a'))$. $n$ is
    ``steps_to_next_obs`` when the batch has it (TorchRL's ``MultiStep``), else 1. The loss is
    weighted by ``priority_weight`` when the batch has it (prioritized replay) and the squared
    TD error is written into the input batch under ``td_error`` for
    ``replay_buffer.update_tensordict_priority(batch)``.

    Reference: Mnih et al., "Human-level control through deep reinforcement learning", Nature
    (2015); van Hasselt et al., "Deep Reinforcement Learning with Double Q-learning",
    arXiv:1509.06461.

    Args:
        value_network: a TorchRL ``QValueActor`` or any module writing ``action_value``
            (``[*B, num_actions]``).
        loss_function: see
            :class:`rlloss.offpolicy.TDTargetLoss` (``loss_function`` defaults to ``"l2"``).
        gamma: as ``loss_function``.
        reduction: as ``loss_function``.
        use_prioritized_weights: as ``loss_function``.
        priority_weighting: as ``loss_function``.
        delay_value: keep a target copy of the network (update it with TorchRL's ``SoftUpdate``
            or ``HardUpdate``); ``False`` bootstraps from the online network (no gradient).
        double_dqn: double Q-learning (needs ``delay_value``).
        action_space: ``"one-hot"`` or ``"categorical"``; the action's dtype decides either way
            (floating or bool: one-hot; integer: index).

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean (pass
    ``"normalized"`` for TorchRL's numbers); a batch without ``("next", "terminated")`` is
    read with ``done`` in its place (truncated steps then not bootstrapped), as TorchRL does, but
    with a warning; only one-step (n-step through
    ``steps_to_next_obs``) targets are built, so ``make_value_estimator`` takes ``TD0`` only.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Categorical
        >>> from torchrl.modules import QValueActor
        >>> from rlloss import DQNLoss, SoftUpdate
        >>> qnet = QValueActor(torch.nn.Linear(3, 2), in_keys=["observation"], spec=Categorical(2))
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.randint(2, (8,)),
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = DQNLoss(qnet, delay_value=True, double_dqn=True)
        >>> optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> out["loss"].backward()
        >>> optimizer.step()
        >>> updater.step()
        >>> print(
        ...     batch["td_error"].shape
        ... )  # written for prioritized replay: update_tensordict_priority
    """

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions; writes ``td_error`` into ``tensordict``."""
        batch, mask = self._valid_batch_and_mask(tensordict)  # the mask, read once
        _, value = self._chosen_values(batch)
        target = self._td_target(batch, self._next_value(entry(batch, "next")))
        self._write_priority(tensordict, rlf.td_error(value, target, "squared"))
        loss = self._critic_loss(value, target, batch, mask)
        return TensorDict({"loss": loss}, batch_size=[])


class DDQNLoss(DQNLoss):
    r""":class:`DQNLoss` with ``double_dqn=True`` (and a target network), as TorchRL's alias;
    its keywords are :class:`DQNLoss`'s but ``delay_value`` and ``double_dqn`` (both ``True``).

    $$
    \mathcal{L} = L\big(Q(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated})\, \bar{Q}\big(s', \arg\max_{a'} Q(s', a')\big)
    $$

    Reference: van Hasselt, Guez and Silver, "Deep Reinforcement Learning with Double
    Q-learning", arXiv:1509.06461.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Categorical
        >>> from torchrl.modules import QValueActor
        >>> from rlloss import DDQNLoss, SoftUpdate
        >>> qnet = QValueActor(torch.nn.Linear(3, 2), in_keys=["observation"], spec=Categorical(2))
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.randint(2, (8,)),
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = DDQNLoss(qnet)  # DQNLoss(qnet, delay_value=True, double_dqn=True)
        >>> optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> out["loss"].backward()
        >>> optimizer.step()
        >>> updater.step()
        >>> print(
        ...     batch["td_error"].shape
        ... )  # written for prioritized replay: update_tensordict_priority
    """

    def __init__(
        self,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        gamma: float | None = None,
        action_space: str | TensorSpec | None = None,
        priority_key: NestedKey | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
    ) -> None:
        super().__init__(
            value_network,
            loss_function=loss_function,
            delay_value=True,
            double_dqn=True,
            gamma=gamma,
            action_space=action_space,
            priority_key=priority_key,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
        )


class DistributionalDQNLoss(QLearningLoss):
    r"""Categorical distributional Q-learning, C51 (Bellemare et al., "A Distributional
    Perspective on Reinforcement Learning", arXiv:1707.06887), with double-Q bootstrapping.

    The network gives, for every action, log-probabilities over a fixed support of ``K`` returns
    ``z`` (``[*B, K, A]``, TorchRL's ``DistributionalQValueActor``). The target distribution
    puts the target network's probabilities at the greedy next action (online network: double Q,
    as TorchRL) on the shifted atoms, projected back onto ``z``
    (:func:`rlloss.functional.categorical_projection`, Algorithm 1), and the loss is its
    cross-entropy with $p(s, a)$:

    $$
    \mathcal{L} = -\sum_j m_j \log p_j(s, a), \qquad
    m = \Phi_z\Big(r + \gamma^n (1 - \text{terminated}) z,\;
    \bar{p}(s', a^*)\Big), \qquad a^* = \arg\max_{a} \sum_j z_j p_j(s', a)
    $$

    ($\Phi_z$ the projection onto the support), weighted by ``priority_weight`` when the batch
    has it. ``forward`` writes that per-sample
    cross-entropy (``[*B, 1]``, TorchRL's priority) into the batch under ``td_error``.

    Args:
        value_network: a TorchRL ``DistributionalQValueActor``, or any module writing
            ``action_value`` log-probabilities ``[*B, K, A]`` with a ``support`` buffer (``[K]``,
            evenly spaced and increasing, ``K >= 2``).
        gamma: the discount (TorchRL requires it; default 0.99 here).
        delay_value: keep a target copy of the network (update it with ``SoftUpdate`` /
            ``HardUpdate``); ``False`` bootstraps from the online network (no gradient).
        reduction: see
            :class:`rlloss.offpolicy.TDTargetLoss`.
        use_prioritized_weights: as ``reduction``.
        priority_weighting: as ``reduction``.

    Only one-step (n-step through ``steps_to_next_obs``) targets exist for a return
    distribution: ``make_value_estimator`` takes ``TD0`` only, as in TorchRL.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean (pass
    ``"normalized"`` for TorchRL's numbers); batches of any number of dimensions are accepted
    (TorchRL's needs one); the greedy next action is the argmax over every action column, also
    for a multi-one-hot action space (TorchRL takes the argmax of the actor's multi-one-hot
    action); nothing is moved to the CPU and no ``.item()`` is read (no host sync).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import OneHot
        >>> from torchrl.modules import DistributionalQValueActor
        >>> from rlloss import DistributionalDQNLoss
        >>> net = torch.nn.Sequential(
        ...     torch.nn.Linear(3, 2 * 11), torch.nn.Unflatten(-1, (11, 2)), torch.nn.LogSoftmax(-2)
        ... )  # log-probabilities of 11 atoms, 2 actions
        >>> actor = DistributionalQValueActor(
        ...     net, support=torch.linspace(-10, 10, 11), spec=OneHot(2), in_keys=["observation"]
        ... )
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.nn.functional.one_hot(torch.randint(2, (8,)), 2),
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = DistributionalDQNLoss(actor, gamma=0.99)
        >>> out = loss(batch)
        >>> out["loss"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by DistributionalDQNLoss (``priority``: the cross-entropy, ``[*B, 1]``)."""

        action_value: NestedKey = "action_value"  # log-probabilities [*B, K, A]
        action: NestedKey = "action"  # the action taken: index [*B] or one-hot [*B, A]

    _one_step_targets_only = True  # TD(1) / TD(lambda) of a return distribution: not defined

    def __init__(
        self,
        value_network: nn.Module,
        *,
        gamma: float | None = None,
        delay_value: bool = True,
        priority_key: NestedKey | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
    ) -> None:
        check_support(type(self).__name__, getattr(value_network, "support", None))
        super().__init__(
            value_network,
            delay_value=delay_value,
            gamma=gamma,
            priority_key=priority_key,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
        )
        self.action_space = getattr(value_network, "action_space", None)

    def _log_probs_at(self, log_probs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``log p(s, a)`` ``[*B, K]`` of ``action`` (index ``[*B]``/``[*B, 1]`` or one-hot)."""
        if action.shape == log_probs.shape[:-2]:  # an index [*B]
            action = action.unsqueeze(-1)
        # the same action for every atom, as a view: [*B, K, A] one-hot or [*B, K, 1] index
        action = action.unsqueeze(-2).expand(*log_probs.shape[:-1], action.shape[-1])
        return rlf.chosen_action_value(log_probs, action).squeeze(-1)

    def _target_distribution(self, batch: TensorDictBase, support: torch.Tensor) -> torch.Tensor:
        """The projected target ``m`` ``[*B, K]`` (no gradient)."""
        next_batch = entry(batch, "next")
        with torch.no_grad():
            online = self._action_values(next_batch)
            greedy = rlf.expected_action_value(online, support).argmax(-1)  # double Q
            target = online
            if self.delay_value:
                target = self._target_value_call(next_batch)[self._tensor_keys.action_value]
            probs = self._log_probs_at(target, greedy).exp()
            atoms = self._td_target(batch, support.expand_as(probs))  # r + gamma^n (1 - d) z
            return rlf.categorical_projection(atoms, probs, support)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions; writes ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        support = self.value_network.support
        action_values = self._action_values(batch)
        check_atoms(type(self).__name__, action_values, support)
        log_probs = self._log_probs_at(action_values, self._get(batch, "action"))
        target = self._target_distribution(batch, support)
        cross_entropy = -(target * log_probs).sum(-1, keepdim=True)
        self._write_priority(tensordict, cross_entropy.detach())
        return TensorDict({"loss": self._reduce_replayed(cross_entropy, batch)}, batch_size=[])
