"""Discrete conservative Q-learning: ``DiscreteCQLLoss`` (Kumar et al., "Conservative Q-Learning
for Offline Reinforcement Learning", arXiv:2006.04779), on the Q-learning base."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._networks import entry
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.dqn import QLearningLoss


class DiscreteCQLLoss(QLearningLoss):
    r"""Discrete conservative Q-learning (Kumar et al., arXiv:2006.04779, CQL(H)) for offline RL:
    DQN's regression, halved as TorchRL does ($y$ the target network's greedy value), and the
    conservative penalty (:func:`rlloss.functional.cql_penalty`); weight the two in the sum as
    the paper's $\alpha$ asks.

    $$
    \mathcal{L}_{\text{qvalue}} = \frac{1}{2N} \sum L\big(Q(s, a),\, y\big), \qquad
    \mathcal{L}_{\text{cql}} = \frac{1}{N} \sum \Big(\log \sum_{a'} e^{Q(s, a')}
    - Q(s, a)\Big)
    $$

    TorchRL's ``DiscreteCQLLoss`` with the same keywords and outputs (``loss_qvalue``,
    ``loss_cql``, and the batch means ``td_error`` (``[1]``), ``pred_value`` (over every action)
    and ``target_value``); ``forward`` writes the per-sample squared TD error (``[*B, 1]``) into
    the batch for prioritized replay.

    Args:
        value_network: as :class:`rlloss.DQNLoss` (TorchRL's ``DiscreteCQLLoss`` names it and
            the next five).
        loss_function: as ``value_network``.
        delay_value: as ``value_network``.
        gamma: as ``value_network``.
        action_space: as ``value_network``.
        reduction: as ``value_network``.
        double_dqn: as ``value_network``.
        priority_key: as ``value_network``.
        use_prioritized_weights: as ``value_network``.
        priority_weighting: as ``value_network``.
        separate_losses: as ``value_network``.
        policy_loss_addons: as ``value_network``.

    Differences from TorchRL: the predicted action values are not written back into the
    caller's batch (TorchRL writes them under ``pred_val`` for its ``cql_loss`` method, which
    here computes them itself).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Categorical
        >>> from torchrl.modules import QValueActor
        >>> from rlloss import DiscreteCQLLoss
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
        >>> loss = DiscreteCQLLoss(qnet)
        >>> out = loss(batch)  # an offline batch
        >>> (out["loss_qvalue"] + out["loss_cql"]).backward()
    """

    out_keys = ["loss_qvalue", "loss_cql", "td_error", "pred_value", "target_value"]

    def __init__(
        self,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        gamma: float | None = None,
        action_space: str | TensorSpec | None = None,
        reduction: str | None = None,
        double_dqn: bool = False,
        priority_key: NestedKey | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
    ) -> None:
        super().__init__(
            value_network,
            loss_function=loss_function,
            delay_value=delay_value,
            gamma=gamma,
            action_space=action_space,
            reduction=reduction,
            double_dqn=double_dqn,
            priority_key=priority_key,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
        )

    def cql_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``mean(logsumexp_a Q(s, a) - Q(s, a_data))`` reduced (TorchRL's method name)."""
        action_values, value = self._chosen_values(tensordict)
        return self._reduce_replayed(rlf.cql_penalty(action_values, value), tensordict), {}

    def value_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """TorchRL's method: ``loss_qvalue`` alone and the diagnostics ``td_error``,
        ``pred_value``, ``target_value``; writes ``td_error`` into ``tensordict``."""
        return self._value_loss(tensordict)[:2]

    def _value_loss(self, tensordict: TensorDictBase):
        """:meth:`value_loss`, and the valid batch with its action values ``[*B, A]`` and the
        data actions' values ``[*B]`` (for the CQL penalty)."""
        batch = self._valid_batch(tensordict)
        action_values, value = self._chosen_values(batch)
        target = self._td_target(batch, self._next_value(entry(batch, "next")))
        td_error = rlf.td_error(value, target, "squared")
        self._write_priority(tensordict, td_error)
        info = {
            "td_error": self._valid_mean(td_error, tensordict, dim=0),
            "pred_value": self._valid_mean(action_values.detach(), tensordict),
            "target_value": self._valid_mean(target, tensordict),
        }
        loss = 0.5 * self._critic_loss(value, target, batch)
        return loss, info, batch, action_values, value

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Both losses and the diagnostics; writes ``td_error`` into ``tensordict``."""
        loss_qvalue, info, batch, action_values, value = self._value_loss(tensordict)
        loss_cql = self._reduce_replayed(rlf.cql_penalty(action_values, value), batch)
        out = {"loss_qvalue": loss_qvalue, "loss_cql": loss_cql, **info}
        return TensorDict(out, batch_size=[])
