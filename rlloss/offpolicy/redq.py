"""Randomized ensembled double Q-learning: ``REDQLoss`` (Chen et al., "Randomized Ensembled Double
Q-Learning: Learning Fast Without a Model", arXiv:2101.05982)."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    composite_lp_aggregate,
)
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._networks import (
    entry,
    stacked_inputs,
)
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.soft_actor_critic import ContinuousSoftActorCritic

_EPS_GSDE = "_eps_gSDE"  # the gSDE noise entry TorchRL's REDQ sets to zeros for the actor


class REDQLoss(ContinuousSoftActorCritic):
    r"""REDQ's actor, critic and temperature losses.

    With ``a~ ~ pi(.|s)`` (reparameterised) and ``a' ~ pi(.|s')`` drawn together, and a subset
    ``J`` of ``M = sub_sample_len`` of the ``N = num_qvalue_nets`` target critics drawn uniformly
    without replacement at each call:

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_{i=1}^{N} L\big(Q_i(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated})
    \Big(\min_{j \in J} \bar{Q}_j(s', a') - \alpha \log \pi(a' \mid s')\Big)
    $$

    $$
    \mathcal{L}_{\text{actor}} = \frac{1}{N} \sum_{i=1}^{N}
    \Big(\alpha \log \pi(\tilde{a} \mid s) - Q_i(s, \tilde{a})\Big), \qquad
    \mathcal{L}_{\text{alpha}} = -\alpha \big(\log \pi + \bar{\mathcal{H}}\big)
    $$

    - critic: $y$ without gradient (arXiv:2101.05982, Algorithm 1);
    - actor: the mean over the ensemble (line 13; the critics get no gradient from it);
    - temperature: over the log-probs of ``a~`` and ``a'``,
      ``alpha = exp(clamp(log_alpha, log min_alpha, log max_alpha))`` with the clamp's gradient
      taken as the identity (:func:`rlloss.functional.alpha_temperature_loss`,
      :func:`rlloss.functional.straight_through_clamp`): TorchRL's rule.

    The per-critic losses are ``[N, *B]`` (``[2, *B]`` for the temperature: ``s`` and ``s'``),
    reduced over every dim. ``forward`` also returns ``state_action_value_actor`` (``[N, *B]``),
    ``action_log_prob_actor``, ``next.state_value`` and ``target_value`` (``[*B]``), detached,
    and writes ``td_error`` (``max_i (Q_i - y)^2``, ``[*B]``) into the batch. The subset is drawn
    with ``torch.randperm`` on the critics' device (no host sync); on the CPU it is TorchRL's
    draw, followed by the actions' draw, as in TorchRL.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module writing ``state_action_value`` (``[*B, 1]``), or a list of
            ``num_qvalue_nets`` such modules.
        num_qvalue_nets: ``N`` (default 10).
        sub_sample_len: ``M`` (default 2), an integer >= 1; as in TorchRL, at most ``N - 1``
            (and 1 when ``N = 1``).
        min_alpha: bounds on alpha (default 0.1 and 10, TorchRL's); ``log_alpha``
            itself is not projected (TorchRL's REDQ; SACLoss projects it).
        max_alpha: as ``min_alpha``.
        gSDE: give the actor zeros as ``_eps_gSDE`` (TorchRL's keyword).

    The other keywords are as :class:`rlloss.SACLoss` (TorchRL's REDQ keywords; ``gamma`` and
    ``make_value_estimator`` with TD0, TD1 or TDLambda, n-step through ``steps_to_next_obs``).

    Differences from TorchRL: prioritized-replay weights (``priority_weight``) weight the
    losses, as in every rlloss off-policy loss (TorchRL's REDQ ignores them); ``alpha`` and
    ``entropy`` are returned with ``reduction="none"`` too; the tanh is not clamped away from
    ±1 (see :class:`rlloss.SACLoss`); ``target_entropy="auto"`` without a spec reads the action
    dim from the first batch (TorchRL raises).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import REDQLoss, SoftUpdate
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
        >>> loss = REDQLoss(actor, qvalue, num_qvalue_nets=10, sub_sample_len=2)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
        >>> updater.step()  # after the optimizer's step
    """

    @dataclasses.dataclass
    class _AcceptedKeys(ContinuousSoftActorCritic._AcceptedKeys):
        """Keys read by REDQLoss (SACLoss's; ``priority``: ``max_i (Q_i - y)^2``, ``[*B]``)."""

        sample_log_prob: NestedKey | None = None  # TorchRL's REDQ key name (not read)

        def __post_init__(self):
            if self.sample_log_prob is None:  # TorchRL's default
                aggregate = composite_lp_aggregate(nowarn=True)
                self.sample_log_prob = "sample_log_prob" if aggregate else "action_log_prob"

    sub_sample_len = Coefficient(low=1, integer=True)  # checked on assignment too
    out_keys = [
        "loss_actor",
        "loss_qvalue",
        "loss_alpha",
        "alpha",
        "entropy",
        "state_action_value_actor",
        "action_log_prob_actor",
        "next.state_value",
        "target_value",
    ]

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        num_qvalue_nets: int = 10,
        sub_sample_len: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float = 0.1,
        max_alpha: float = 10.0,
        action_spec: TensorSpec | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_qvalue: bool = True,
        gSDE: bool = False,
        gamma: float | None = None,
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        scalar_output_mode: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        REDQLoss.sub_sample_len.check(sub_sample_len)
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
            delay_qvalue=delay_qvalue,
            gamma=gamma,
            priority_key=priority_key,
            separate_losses=separate_losses,
            reduction=reduction,
            deactivate_vmap=deactivate_vmap,
            scalar_output_mode=scalar_output_mode,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        sub_sample_len = max(1, min(int(sub_sample_len), self.num_qvalue_nets - 1))
        self._register_coefficients(sub_sample_len=sub_sample_len)
        self.gSDE = gSDE

    @property
    def alpha(self) -> torch.Tensor:
        """``exp(clamp(log_alpha, log min_alpha, log max_alpha))``, no gradient."""
        return self._alpha()

    def _alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().clamp(self.min_log_alpha, self.max_log_alpha).exp()

    def _target_subset(self) -> torch.Tensor:
        """The indices ``J`` of ``sub_sample_len`` distinct target critics drawn uniformly,
        ``[M]`` on the critics' device."""
        device = self.log_alpha.device
        return torch.randperm(self.num_qvalue_nets, device=device)[: self.sub_sample_len]

    def _current_and_next_sample(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``a~ ~ pi(.|s)`` and ``a' ~ pi(.|s')`` and their log-probs, stacked along a leading
        ``[2]`` dim, drawn in one call as TorchRL draws them, without the actor's backward over
        the ``s'`` half where it can be avoided (no loss term differentiates ``a'``: it enters
        the target and the detached temperature loss only); with ``gSDE``, one call on the
        stacked inputs with zero noise."""
        if self.gSDE:
            return self._policy_sample(self._current_and_next_inputs(batch))
        return self._actor_call.paired_sample_with_log_prob(
            batch, entry(batch, "next"), self.action_low, self.action_high
        )

    def _current_and_next_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        """The actor's inputs at ``s`` and ``s'`` stacked along a leading ``[2]`` dim (with
        ``gSDE``, zeros as its noise)."""
        exclude = _EPS_GSDE if self.gSDE else None
        inputs = stacked_inputs([batch, entry(batch, "next")], self.actor_network, exclude)
        if self.gSDE:
            inputs.set(_EPS_GSDE, torch.zeros(inputs.batch_size, device=self.log_alpha.device))
        return inputs

    def _reduce_members(self, loss: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        """Reduce a per-member loss ``[E, *B]`` over the members and the batch, each transition
        weighted and masked as :meth:`_reduce_replayed` does; ``"none"`` keeps ``[E, *B]``."""
        reduced = self._reduce_replayed(loss.movedim(0, -1), tensordict)
        if self.reduction != "none":
            return reduced
        return reduced.reshape(*loss.shape[1:], loss.shape[0]).movedim(-1, 0)

    def _actor_objective(
        self, tensordict: TensorDictBase, action: torch.Tensor, log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """``alpha log pi(a~|s) - Q_i(s, a~)`` for each critic, reduced, and the values and
        log-probs (detached)."""
        values = self._q_values(tensordict, action, detach=True)  # [N, *B, 1]
        log_prob = log_prob.unsqueeze(-1).expand_as(values)
        loss = -rlf.soft_value(values, log_prob, self._alpha()).squeeze(-1)
        info = {
            "state_action_value_actor": values.detach().squeeze(-1),
            "action_log_prob_actor": log_prob[0].detach().squeeze(-1),
        }
        loss = self._reduce_members(loss, tensordict)
        actor = ActorOutput(action=action, distribution=lambda: self._actor_call(tensordict))
        return self._with_policy_addons(loss, tensordict, actor, info)

    def _subset_target(
        self,
        tensordict: TensorDictBase,
        next_action: torch.Tensor,
        next_log_prob: torch.Tensor,
        subset: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``y`` and ``V(s') = min_{j in J} Q_j,target(s', a') - alpha log pi(a'|s')``, both
        ``[*B, 1]``, without gradient (``J``: ``subset``)."""
        with torch.no_grad():
            next_values = self._q_values(
                entry(tensordict, "next"),
                next_action,
                target=self.delay_qvalue,
                detach=not self.delay_qvalue,
                members=subset,
            )
            next_value = rlf.soft_value(
                rlf.clipped_double_q_value(next_values), next_log_prob, self._alpha()
            )
            return self._td_target(tensordict, next_value), next_value

    def _critic_objective(
        self, tensordict: TensorDictBase, target: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """``L(Q_i(s, a), y)`` for each critic, reduced, and ``td_error`` ``[*B]``."""
        values = self._q_values(tensordict, self._get(tensordict, "action"))  # [N, *B, 1]
        loss = rlf.distance(values, target.expand_as(values), self.loss_function)
        td_error = rlf.ensemble_td_error(values, target, "squared").squeeze(-1)
        return self._reduce_members(loss.squeeze(-1), tensordict), {"td_error": td_error}

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The actor loss alone, with its own draw of ``a~``: the mean over the critics of
        ``alpha log pi(a~|s) - Q_i(s, a~)`` (per critic with ``reduction="none"``)."""
        action, log_prob = self._policy_sample(tensordict)
        self._fill_target_entropy(tensordict, action)
        return self._actor_objective(tensordict, action, log_prob)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The critic loss alone, with its own draws of ``J`` and ``a'``, and ``td_error``."""
        subset = self._target_subset()  # TorchRL's draw order: J, then a'
        with torch.no_grad():
            next_action, next_log_prob = self._policy_sample(entry(tensordict, "next"))
        target, _ = self._subset_target(tensordict, next_action, next_log_prob, subset)
        return self._critic_objective(tensordict, target)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The three losses and the diagnostics (see the class docstring); writes ``td_error``
        into ``tensordict``."""
        batch = self._valid_batch(tensordict)
        subset = self._target_subset()  # drawn before the actions, as TorchRL does
        action, log_prob = self._current_and_next_sample(batch)
        self._fill_target_entropy(batch, action[0])
        loss_actor, info = self._actor_objective(batch, action[0], log_prob[0])
        target, next_value = self._subset_target(batch, action[1], log_prob[1], subset)
        loss_qvalue, critic_info = self._critic_objective(batch, target)
        self._write_priority(tensordict, critic_info["td_error"])
        log_alpha = rlf.straight_through_clamp(
            self.log_alpha, self.min_log_alpha, self.max_log_alpha
        )
        loss_alpha = rlf.alpha_temperature_loss(log_alpha.exp(), log_prob, self.target_entropy)
        out = {
            "loss_actor": loss_actor,
            "loss_qvalue": loss_qvalue,
            "loss_alpha": self._reduce_members(loss_alpha, batch),
            "alpha": self._alpha(),
            "entropy": -log_prob.detach().mean(),
            **info,
            "next.state_value": next_value.squeeze(-1),
            "target_value": target.squeeze(-1),
        }
        if self.reduction == "none" and self.scalar_output_mode == "non_tensor":
            scalars = {name: out.pop(name) for name in ("alpha", "entropy")}
            result = TensorDict(out, batch_size=[])
            for name, value in scalars.items():
                result.set_non_tensor(name, value)
            return result
        return TensorDict(out, batch_size=[])
