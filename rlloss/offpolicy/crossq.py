"""CrossQ: ``CrossQLoss`` (Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement
Learning for Greater Sample Efficiency and Simplicity", ICLR 2024): SAC without target networks,
batch-normalised critics on the current and next transitions in one pass."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss._checks import (
    check_concatenable,
    next_key,
)
from rlloss._networks import (
    entry,
    inputs_at_action,
)
from rlloss.offpolicy.soft_actor_critic import ContinuousSoftActorCritic


class CrossQLoss(ContinuousSoftActorCritic):
    r"""CrossQ's actor, critic and temperature losses: SAC without target networks, whose
    critics (with BatchNorm / BatchRenorm layers) see the current and the next transitions in
    one batch.

    $$
    \begin{bmatrix} Q_i(s, a) \\ Q_i(s', a') \end{bmatrix}
    = Q_i\Big(\begin{bmatrix} s \\ s' \end{bmatrix},
    \begin{bmatrix} a \\ a' \end{bmatrix}\Big)
    $$

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_i L\big(Q_i(s, a), y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated}) \Big(\min_i \mathrm{sg}\big(Q_i(s', a')\big)
    - \alpha \log \pi(a' \mid s')\Big)
    $$

    Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample
    Efficiency and Simplicity", ICLR 2024 (https://openreview.net/pdf?id=PczQtTsTIX), Algorithm 1:

    - joint forward pass: ``[Q_i(s, a); Q_i(s', a')] = Q_i([s; s'], [a; a'])`` for each of the
      ``num_qvalue_nets`` critics, in one call on the batch joined along its first dim, with
      ``a' ~ pi(.|s')`` (no gradient): the normalisation layers' batch statistics are those of
      the joint batch, so they cover both action distributions (the paper's Section 3); the
      critics run in train mode (running statistics updated), or in eval mode after
      ``loss.eval()``;
    - critic: $\sum_i L(Q_i(s, a), y)$ with $y = r + \gamma^n (1 - \text{terminated})
      \big(\min_i Q_i(s', a') - \alpha \log \pi(a' \mid s')\big)$ from the ``s'`` half of the
      same pass, detached (no target network: the paper's "removing target networks");
    - actor: $\alpha \log \pi(\tilde{a} \mid s) - \min_i Q_i(s, \tilde{a})$ with the critics in
      eval mode (running statistics, not updated) and no gradient to them, as the authors' code
      and TorchRL do;
    - temperature: SAC's ``-log alpha (log pi(a~|s) + target_entropy)``.

    ``forward`` returns ``out_keys`` (``loss_actor``, ``loss_qvalue``, ``loss_alpha``,
    ``alpha``, ``entropy``) and writes ``td_error`` (``max_i |Q_i(s, a) - y|``, ``[*B]``) into
    the batch. ``qvalue_loss``, ``actor_loss`` and ``alpha_loss`` are TorchRL's methods, called in
    that order (the actor's pass reads the running statistics the joint pass updated).

    Reference: Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement Learning for
    Greater Sample Efficiency and Simplicity" (ICLR 2024), arXiv:1902.05605.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module writing ``state_action_value`` (``[*B, 1]``), typically with
            ``nn.BatchNorm1d`` or ``torchrl.modules.BatchRenorm1d`` layers, or a list of
            ``num_qvalue_nets`` such modules. Its inputs at ``s`` and ``s'`` must have the same
            shapes and dtypes (checked). The normalisation statistics are stacked buffers of
            ``qvalue_network_params``; the given modules, and their modes, are left as they are.
        num_qvalue_nets: the number of critics (default 2).
        loss_function: ``"smooth_l1"`` (default), ``"l2"`` or ``"l1"``.
        separate_losses: with a single ``qvalue_network`` that shares layers with the actor,
            those layers stay the actor's parameters in ``qvalue_network_params`` (detached
            views) and only the actor loss trains them (TorchRL's behaviour); without it (the
            default), the critics hold their own copies of them.
        alpha_init: as :class:`rlloss.SACLoss` (TorchRL's CrossQ
            keywords). Targets: TD0 (default, n-step through ``steps_to_next_obs``), TD1 or
            TDLambda with ``make_value_estimator``.
        min_alpha: as ``alpha_init``.
        max_alpha: as ``alpha_init``.
        fixed_alpha: as ``alpha_init``.
        action_spec: as ``alpha_init``.
        target_entropy: as ``alpha_init``.
        reduction: as ``alpha_init``.
        scalar_output_mode: as ``alpha_init``.
        deactivate_vmap: as ``alpha_init``.
        use_prioritized_weights: see
            :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_weighting: as ``use_prioritized_weights``.

    Differences from TorchRL: prioritized-replay weights (``priority_weight``) weight the
    losses (TorchRL's CrossQ ignores them); the critics' modes are set for each pass without
    touching the user's modules (TorchRL's ``actor_loss`` switches the user's critic to eval and
    back to train, and its joint pass runs in whatever mode the critic is in); ``forward``
    returns ``out_keys`` only (TorchRL's also holds ``log_prob`` and ``td_error``); the tanh is
    not clamped away from ±1 (see :class:`rlloss.SACLoss`); ``target_entropy="auto"`` without a
    spec reads the action size from the first batch (TorchRL raises).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import BatchRenorm1d, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import CrossQLoss
        >>> class Critic(torch.nn.Module):  # BatchRenorm on the input and after the hidden layer
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.net = torch.nn.Sequential(
        ...             BatchRenorm1d(n),
        ...             torch.nn.Linear(n, 16),
        ...             torch.nn.ReLU(),
        ...             BatchRenorm1d(16),
        ...             torch.nn.Linear(16, 1),
        ...         )
        ...     def forward(self, observation, action):
        ...         return self.net(torch.cat([observation, action], -1))
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(
        ...         torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
        ...         ["observation"],
        ...         ["loc", "scale"],
        ...     ),
        ...     ["loc", "scale"],
        ...     distribution_class=TanhNormal,
        ... )
        >>> qvalue = ValueOperator(Critic(3 + 1), in_keys=["observation", "action"])
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
        >>> loss = CrossQLoss(actor, qvalue, action_spec=Bounded(-1, 1, (1,)))
        >>> out = loss(batch)  # no updater: CrossQ has no target network
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(ContinuousSoftActorCritic._AcceptedKeys):
        """Keys read by CrossQLoss (SACLoss's; ``priority``: ``max_i |Q_i - y|``, ``[*B]``)."""

        log_prob: NestedKey = "_log_prob"  # TorchRL's CrossQ key name (not read)

    _ties_shared_layers = True

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: TensorSpec | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        scalar_output_mode: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
    ) -> None:
        super().__init__(
            actor_network,
            qvalue_network,
            delay_qvalue=False,
            num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function,
            alpha_init=alpha_init,
            min_alpha=min_alpha,
            max_alpha=max_alpha,
            action_spec=action_spec,
            fixed_alpha=fixed_alpha,
            target_entropy=target_entropy,
            priority_key=priority_key,
            separate_losses=separate_losses,
            reduction=reduction,
            deactivate_vmap=deactivate_vmap,
            scalar_output_mode=scalar_output_mode,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
        )

    @property
    def in_keys(self) -> list[NestedKey]:
        """SACLoss's, and the critics' inputs under ``"next"`` (the joint pass reads them)."""
        critic_keys = [k for k in self._qvalue.in_keys if k != self._qvalue_action_key]
        return list(dict.fromkeys([*super().in_keys, *(next_key(k) for k in critic_keys)]))

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of ``action`` at the batch's observations, the
        critics in eval mode (the actor's objective)."""
        return super()._q_values(batch, action, training=False, **kwargs)

    def _joint_q_values(
        self, tensordict: TensorDictBase, next_action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``Q_i(s, a)`` and ``Q_i(s', a')``, each ``[num_qvalue_nets, *B, 1]``, from one
        ensemble call on the batch joined along its first dim (train mode unless
        ``loss.eval()``)."""
        key, action = self._qvalue_action_key, self._get(tensordict, "action")
        current = inputs_at_action(tensordict, self._qvalue, key, action)
        following = inputs_at_action(entry(tensordict, "next"), self._qvalue, key, next_action)
        check_concatenable("CrossQLoss", current, following)
        joint = {name: torch.cat([current[name], following[name]]) for name in current}
        values = self._qvalue(joint, training=self.training)[self.tensor_keys.state_action_value]
        size = tensordict.batch_size[0]
        return values[:, :size], values[:, size:]

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, and ``td_error``, ``target_value``, ``pred_value``
        (see the class docstring)."""
        alpha = self._alpha()
        with torch.no_grad():
            next_action, next_log_prob = self._policy_sample(entry(tensordict, "next"))
        values, next_values = self._joint_q_values(tensordict, next_action)
        with torch.no_grad():
            next_value = self._next_soft_value(next_values.detach(), next_log_prob, alpha)
            target = self._td_target(tensordict, next_value)
        return self._soft_critic_loss(values, target, tensordict)

    # TorchRL's method names
    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The critic loss and ``{"td_error": ...}`` (``[*B]``, detached)."""
        loss, info = self.loss_qvalue(tensordict)
        return loss, {"td_error": info["td_error"]}

    def alpha_loss(
        self, log_prob: torch.Tensor, tensordict: TensorDictBase | None = None
    ) -> torch.Tensor:
        """The temperature loss of ``log_prob`` (``actor_loss``'s metadata), reduced; the
        padding mask and replay weights are read from ``tensordict`` when given."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=log_prob.shape)
        return self._temperature_loss(log_prob, tensordict)
