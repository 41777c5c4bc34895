"""Conservative Q-learning for continuous actions: ``CQLLoss`` (Kumar et al., "Conservative
Q-Learning for Offline Reinforcement Learning", arXiv:2006.04779), on the soft actor-critic base."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._networks import (
    entry,
    log_prob_of,
)
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.soft_actor_critic import ContinuousSoftActorCritic

_CQL_OUT_KEYS = [
    "loss_actor",
    "loss_actor_bc",
    "loss_qvalue",
    "loss_cql",
    "loss_alpha",
    "alpha",
    "entropy",
]


class CQLLoss(ContinuousSoftActorCritic):
    r"""Conservative Q-learning (CQL(H)) for offline RL with continuous actions, on SAC.

    $$
    \mathcal{L}_{\text{cql}} = w_{\min} \sum_i \Big[T \log \sum_k
    \exp\Big(\frac{Q_i(s, a_k) - \log q(a_k)}{T}\Big) - Q_i(s, a)\Big], \qquad
    \mathcal{L}_{\text{qvalue}} = \sum_i L\big(Q_i(s, a),\, r + \gamma^n
    (1 - \text{terminated}) V'(s')\big)
    $$

    ($w_{\min}$ = ``min_q_weight``, $T$ = ``temperature``), in detail:

    - ``loss_qvalue = sum_i L(Q_i(s, a), y)``, ``y = r + gamma^n (1 - terminated) V'(s')``, no
      gradient: ``V'(s') = min_i Q_i,target(s', a')`` with ``a' ~ pi(.|s')``
      (``deterministic_backup``, the default), minus ``alpha log pi(a'|s')`` otherwise; with
      ``max_q_backup``, ``min_i max_k Q_i,target(s', a'_k)`` over ``num_random`` samples
      (:func:`rlloss.functional.max_backup_value`).
    - ``loss_cql = min_q_weight sum_i [T logsumexp_k((Q_i(s, a_k) - log q(a_k)) / T) - Q_i(s,
      a)]`` (:func:`rlloss.functional.cql_penalty`, eq. 4 and appendix F): the ``a_k`` are
      ``num_random`` uniform actions, ``num_random`` actions from ``pi(.|s)`` and ``num_random``
      from ``pi(.|s')``, all evaluated at ``s``, ``q`` the density each was drawn from (policy
      samples and log-densities without gradient); ``T = temperature``.
    - ``with_lagrange``: ``loss_cql`` is weighted by ``alpha' = min(exp(log_alpha_prime), 1e6)``
      (no gradient) and ``loss_alpha_prime = alpha' (tau - mean_i penalty_i)`` (penalties without
      gradient, ``tau = lagrange_thresh``) adapts ``alpha'`` to keep the penalty near ``tau``.
    - ``loss_actor``, ``loss_alpha``, ``alpha``, ``entropy``: :class:`rlloss.SACLoss`'s;
      ``loss_actor_bc = alpha log pi(a~|s) - log pi(a|s)`` (the authors' behaviour-cloning warm-up,
      :func:`rlloss.functional.soft_behavior_cloning_loss`).

    The ``td_error`` written into the batch is ``max_i (Q_i - y)^2`` (``[*B]``). TorchRL's
    ``CQLLoss`` with the same keywords, keys, outputs and methods (``q_loss``, ``cql_loss``,
    ``alpha_prime_loss``, ``actor_loss``, ``actor_bc_loss``, ``alpha_loss``), each callable alone.

    Reference: Kumar et al., "Conservative Q-Learning for Offline Reinforcement Learning",
    arXiv:2006.04779.

    Args:
        actor_network: as
            :class:`rlloss.SACLoss`.
        qvalue_network: as ``actor_network``.
        loss_function: as ``actor_network``.
        alpha_init: as ``actor_network``.
        min_alpha: as ``actor_network``.
        max_alpha: as ``actor_network``.
        fixed_alpha: as ``actor_network``.
        action_spec: as ``actor_network``.
        target_entropy: as ``actor_network``.
        delay_actor: as ``actor_network``.
        delay_qvalue: as ``actor_network``.
        num_qvalue_nets: Q networks, >= 1 (default 2; TorchRL's is fixed at 2).
        temperature: ``T`` of the log-sum-exp, > 0 (default 1.0).
        min_q_weight: the penalty's weight, >= 0 (default 1.0; the paper's ``alpha``).
        max_q_backup: the target value (see above).
        deterministic_backup: the target value (see above).
        num_random: actions sampled per state and proposal (default 10).
        with_lagrange: the Lagrangian form (default off, threshold 0).
        lagrange_thresh: the Lagrangian form (default off, threshold 0).
        reduction: see
            :class:`rlloss.offpolicy.TDTargetLoss`.
        use_prioritized_weights: as ``reduction``.
        priority_weighting: as ``reduction``.

    The uniform actions cover the ``[low, high]`` of the actor's distribution when it has
    bounds (a TanhNormal's, however it is sampled; TorchRL's ``[-1, 1]`` whatever the bounds),
    ``[-1, 1]`` for other actors.

    Differences from TorchRL: the log-sum-exp runs over the ``3 num_random`` actions of each
    state and the actions sampled at ``s'`` are evaluated at ``s``, as in the paper and the
    authors' code (TorchRL takes it over the three proposals of each sample separately and
    evaluates the ``s'`` samples at ``s'``); with ``with_lagrange`` the penalty in ``loss_cql`` is
    weighted by ``alpha'`` and ``loss_alpha_prime`` sends no gradient to the Q networks (TorchRL
    leaves ``loss_cql`` unweighted, and its ``loss_alpha_prime`` pushes the Q networks to raise
    the penalty); ``max_q_backup`` draws no unused ``pi(.|s')`` sample; nothing (``pred_q1``,
    ``cql_q1_loss``...) is written into the caller's batch, so ``cql_loss`` and
    ``alpha_prime_loss`` need no earlier call; prioritized-replay weights apply to every loss;
    ``loss_alpha_prime`` follows ``reduction`` (TorchRL's is always a mean).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import CQLLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(
        ...         torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
        ...         ["observation"],
        ...         ["loc", "scale"],
        ...     ),
        ...     ["loc", "scale"],
        ...     distribution_class=TanhNormal,
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
        >>> loss = CQLLoss(actor, qvalue, action_spec=Bounded(-1, 1, (1,)), with_lagrange=False)
        >>> out = loss(batch)
        >>> (
        ...     out["loss_actor"] + out["loss_qvalue"] + out["loss_cql"] + out["loss_alpha"]
        ... ).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(ContinuousSoftActorCritic._AcceptedKeys):
        """Keys read by CQLLoss (``priority``: ``max_i`` squared TD error, ``[*B]``)."""

        log_prob: NestedKey = "_log_prob"  # the key of log pi in ``actor_loss``'s metadata, [*B]
        pred_q1: NestedKey = "pred_q1"  # kept for TorchRL's key names (not written)
        pred_q2: NestedKey = "pred_q2"  # kept for TorchRL's key names (not written)
        cql_q1_loss: NestedKey = "cql_q1_loss"  # kept for TorchRL's key names (not written)
        cql_q2_loss: NestedKey = "cql_q2_loss"  # kept for TorchRL's key names (not written)

    temperature = Coefficient(low=0.0, low_open=True)
    min_q_weight = Coefficient(low=0.0)
    num_random = Coefficient(low=1, integer=True)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: TensorSpec | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_actor: bool = False,
        delay_qvalue: bool = True,
        gamma: float | None = None,
        temperature: float = 1.0,
        min_q_weight: float = 1.0,
        max_q_backup: bool = False,
        deterministic_backup: bool = True,
        num_random: int = 10,
        with_lagrange: bool = False,
        lagrange_thresh: float = 0.0,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        scalar_output_mode: str | None = None,
        num_qvalue_nets: int = 2,
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        skip_done_states: bool = False,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        CQLLoss.num_random.check(num_random)
        super().__init__(
            actor_network,
            qvalue_network,
            num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function,
            alpha_init=alpha_init,
            min_alpha=min_alpha,
            max_alpha=max_alpha,
            action_spec=action_spec,
            fixed_alpha=fixed_alpha,
            target_entropy=target_entropy,
            delay_actor=delay_actor,
            delay_qvalue=delay_qvalue,
            gamma=gamma,
            priority_key=priority_key,
            separate_losses=separate_losses,
            reduction=reduction,
            skip_done_states=skip_done_states,
            deactivate_vmap=deactivate_vmap,
            use_prioritized_weights=use_prioritized_weights,
            scalar_output_mode=scalar_output_mode,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        self._register_coefficients(
            temperature=temperature, min_q_weight=min_q_weight, num_random=num_random
        )
        self.max_q_backup = max_q_backup
        self.deterministic_backup = deterministic_backup
        self.with_lagrange = with_lagrange
        self.target_action_gap = float(lagrange_thresh)
        if with_lagrange:
            self.log_alpha_prime = nn.Parameter(torch.zeros((), device=self.log_alpha.device))

    @property
    def out_keys(self) -> list[str]:
        return [*_CQL_OUT_KEYS, *(["loss_alpha_prime"] if self.with_lagrange else [])]

    # ----------------------------------------------------------------------------- sampling
    def _policy_samples(self, batch: TensorDictBase, num: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``num`` actions per state from the current policy, ``[*B, num, D]``, and their
        log-probs ``[*B, num]`` (drawn as TorchRL does: each state repeated ``num`` times in a
        row along the last batch dim)."""
        size = batch.batch_size
        action, log_prob = self._policy_sample(batch, repeats=num)
        return action.reshape(*size, num, *action.shape[batch.ndim :]), log_prob.reshape(*size, num)

    def _sampled_q_values(
        self, batch: TensorDictBase, action: torch.Tensor, **kwargs
    ) -> torch.Tensor:
        """``[num_qvalue_nets, *B, K, 1]`` values of ``K`` actions per state (``[*B, K, D]``) at
        the batch's observations, in one ensemble call."""
        return self._q_values(batch, action, samples_dim=batch.ndim, **kwargs)

    def _proposal_actions(self, batch: TensorDictBase, data_action: torch.Tensor):
        """The penalty's ``3 num_random`` actions per state ``[*B, 3 num_random, D]`` (uniform,
        from ``pi(.|s')``, from ``pi(.|s)``) and their log-densities ``[*B, 3 num_random]``, no
        gradient; drawn in TorchRL's order (uniform, ``s``, ``s'``)."""
        num, dim = self.num_random, batch.ndim
        low, high = self._uniform_bounds()
        shape = (*batch.batch_size, num, data_action.shape[-1])
        uniform, uniform_log_prob = rlf.uniform_sample_and_log_prob(
            low, high, shape, data_action.dtype, data_action.device
        )  # [*B, num, D], [*B, num]
        with torch.no_grad():
            current, current_log_prob = self._policy_samples(batch, num)
            following, following_log_prob = self._policy_samples(entry(batch, "next"), num)
        actions = torch.cat([uniform, following, current], dim=dim)
        log_prob = torch.cat([uniform_log_prob, following_log_prob, current_log_prob], -1)
        return actions, log_prob

    def _uniform_bounds(self) -> tuple:
        """The box of the uniform proposals: the actor's distribution's ``[low, high]`` when it
        has bounds (whichever way it is sampled), else ``[-1, 1]``."""
        if self.action_low is None:
            return -1.0, 1.0
        return self.action_low, self.action_high

    # ----------------------------------------------------------------------------- pieces
    def _next_value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``V'(s')`` of the target, ``[*B, 1]``, without gradient (see the class docstring)."""
        next_batch = entry(tensordict, "next")
        with torch.no_grad():
            kwargs = {"target": self.delay_qvalue, "detach": not self.delay_qvalue}
            if self.max_q_backup:
                actions, _ = self._policy_samples(next_batch, self.num_random)
                return rlf.max_backup_value(self._sampled_q_values(next_batch, actions, **kwargs))
            action, log_prob = self._policy_sample(next_batch)
            action = self._skip_done(tensordict, action)
            log_prob = self._skip_done(tensordict, log_prob)
            value = rlf.clipped_double_q_value(self._q_values(next_batch, action, **kwargs))
            if self.deterministic_backup:
                return value
            return rlf.soft_value(value, log_prob, self._alpha())

    def _q_regression(self, tensordict: TensorDictBase, values: torch.Tensor):
        """``sum_i L(Q_i(s, a), y)`` reduced, and the squared TD errors ``[E, *B]``."""
        with torch.no_grad():
            target = self._td_target(tensordict, self._next_value(tensordict))
        td_error = rlf.td_error(values, target.expand_as(values), "squared").squeeze(-1)
        return self._ensemble_critic_loss(values, target, tensordict), {"td_error": td_error}

    def _penalties(self, tensordict: TensorDictBase, values: torch.Tensor) -> torch.Tensor:
        """``min_q_weight`` times each network's CQL penalty, ``[E, *B, 1]`` (``values``: the
        networks' ``Q_i(s, a)`` of the dataset's actions, ``[E, *B, 1]``)."""
        actions, log_proposal = self._proposal_actions(tensordict, self._get(tensordict, "action"))
        sampled = self._sampled_q_values(tensordict, actions).squeeze(-1)  # [E, *B, 3 num]
        penalty = rlf.cql_penalty(sampled, values, log_proposal, self.temperature)
        return self.min_q_weight * penalty

    def _alpha_prime(self) -> torch.Tensor:
        """``alpha' = min(exp(log_alpha_prime), 1e6)``."""
        return self.log_alpha_prime.exp().clamp_max(1e6)

    def _cql_loss(self, tensordict: TensorDictBase, penalties: torch.Tensor) -> torch.Tensor:
        """``sum_i penalty_i`` reduced, weighted by ``alpha'`` (no gradient) with the Lagrangian
        form."""
        penalty = penalties.sum(0)
        if self.with_lagrange:
            penalty = self._alpha_prime().detach() * penalty
        return self._reduce_replayed(penalty, tensordict)

    def _alpha_prime_loss(self, tensordict: TensorDictBase, penalties: torch.Tensor):
        """``alpha' (tau - mean_i penalty_i)`` reduced; only ``log_alpha_prime`` gets gradient."""
        dual = rlf.lagrange_dual_loss(
            penalties.mean(0), self._alpha_prime(), self.target_action_gap
        )
        return self._reduce_replayed(dual.unsqueeze(-1), tensordict)

    def _q_values_of_data(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``[E, *B, 1]`` values of the dataset's actions (with gradient)."""
        return self._q_values(tensordict, self._get(tensordict, "action"))

    # ----------------------------------------------------------------------------- losses
    def q_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``loss_qvalue`` and ``td_error`` (``[E, *B]``, squared) (TorchRL's method name)."""
        return self._q_regression(tensordict, self._q_values_of_data(tensordict))

    loss_qvalue = q_loss

    def cql_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``loss_cql`` (TorchRL's method name)."""
        penalties = self._penalties(tensordict, self._q_values_of_data(tensordict))
        return self._cql_loss(tensordict, penalties), {}

    def alpha_prime_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``loss_alpha_prime`` (``with_lagrange`` only; TorchRL's method name)."""
        with torch.no_grad():
            penalties = self._penalties(tensordict, self._q_values_of_data(tensordict))
        return self._alpha_prime_loss(tensordict, penalties), {}

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """:meth:`rlloss.SACLoss.loss_actor`, its log-probs under ``tensor_keys.log_prob``."""
        loss, info = self.loss_actor(tensordict)
        return loss, {self.tensor_keys.log_prob: info["log_prob"]}

    def actor_bc_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``alpha log pi(a~|s) - log pi(a|s)`` reduced, and ``bc_log_prob`` (the mean of
        ``log pi(a|s)``, detached)."""
        alpha = self._alpha()
        action = self._get(tensordict, "action")
        _, log_prob, distribution = self._actor_call.sample_with_distribution(
            tensordict, self.action_low, self.action_high
        )
        key, owner = self.tensor_keys.action, type(self).__name__
        data_log_prob = log_prob_of(distribution, action, key, owner)
        loss = rlf.soft_behavior_cloning_loss(log_prob, data_log_prob, alpha)
        loss = self._reduce_replayed(loss.unsqueeze(-1), tensordict)
        return loss, {"bc_log_prob": data_log_prob.mean().detach()}

    def alpha_loss(self, tensordict, mask_tensordict: TensorDictBase | None = None):
        """``loss_alpha`` from ``actor_loss``'s metadata (``tensor_keys.log_prob``); the batch for
        the padding mask and replay weights is ``mask_tensordict`` (TorchRL's signature)."""
        log_prob = tensordict.get(self.tensor_keys.log_prob)
        if mask_tensordict is None:
            mask_tensordict = (
                tensordict
                if isinstance(tensordict, TensorDictBase)
                else TensorDict({}, batch_size=log_prob.shape)
            )
        return self._temperature_loss(log_prob, mask_tensordict), {}

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Every loss, ``alpha`` and ``entropy``; writes ``td_error`` into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        values = self._q_values_of_data(batch)
        loss_qvalue, info = self._q_regression(batch, values)
        penalties = self._penalties(batch, values)
        loss_actor_bc, _ = self.actor_bc_loss(batch)
        loss_actor, info_actor = self.loss_actor(batch)
        log_prob = info_actor["log_prob"]
        self._write_priority(tensordict, info["td_error"].amax(0))
        out = {
            "loss_actor": loss_actor,
            "loss_actor_bc": loss_actor_bc,
            "loss_qvalue": loss_qvalue,
            "loss_cql": self._cql_loss(batch, penalties),
            "loss_alpha": self._temperature_loss(log_prob, batch),
            **self._addon_entries(info_actor),
        }
        if self.with_lagrange:
            out["loss_alpha_prime"] = self._alpha_prime_loss(batch, penalties)
        return self._outputs(out, log_prob, tensordict)
