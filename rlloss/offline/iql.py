"""``IQLLoss``: implicit Q-learning for offline RL.

Kostrikov, Nair and Levine, "Offline Reinforcement Learning with Implicit Q-Learning",
arXiv:2110.06169. ``V(s)`` is fitted by expectile regression to ``min_i Q_target,i(s, a)`` on the
dataset's actions (eq. 5), the Q networks to ``r + gamma V(s')`` (eq. 6), and the policy by
advantage-weighted regression with weights ``exp(beta (Q - V))`` (eq. 7): no action outside the
dataset is ever evaluated.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice, check_network
from rlloss._distribution_calls import DistributionCall
from rlloss._ensembles import ensemble_architecture
from rlloss._networks import NetworkCall, entry, log_prob_of, network_inputs
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss
from rlloss.offpolicy.dqn import ACTION_SPACE_SETTINGS, ACTION_SPACES


class IQLLoss(TDTargetLoss):
    r"""IQL's actor, Q and value losses.

    $$
    \mathcal{L}_{\text{value}} = \frac{1}{N} \sum \big|\tau - \mathbb{1}(u < 0)\big| u^2,
    \qquad u = \min_k \bar{Q}_k(s, a) - V(s)
    $$

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_k \frac{1}{N} \sum
    L\big(Q_k(s, a),\, r + \gamma^n (1 - \text{terminated}) V(s')\big), \qquad
    \mathcal{L}_{\text{actor}} = -\frac{1}{N} \sum w \log \pi(a \mid s)
    $$

    with $w = \min\big(e^{\beta u}, 100\big)$, $\beta$ = ``temperature``:

    - ``loss_value``: :func:`rlloss.functional.expectile_loss`, $\tau$ = ``expectile``;
    - ``loss_qvalue``: $V(s')$ without gradient; n-step, PER weights and TD(lambda) targets as
      every off-policy loss;
    - ``loss_actor``: $w$ without gradient (:func:`rlloss.functional.advantage_weights`);
    - ``entropy``: ``-mean(log pi(a|s))`` of the dataset's actions (a diagnostic).

    ``forward`` writes ``td_error`` (``max_i (Q_i - y)^2``, ``[*B]``) into the batch for
    prioritized replay. TorchRL's ``IQLLoss`` with the same keywords, keys and outputs; the Q
    networks are a stacked ensemble with target copies (update them with ``SoftUpdate``), the
    value network has none (TorchRL's neither).

    Reference: Kostrikov, Nair and Levine, "Offline Reinforcement Learning with Implicit
    Q-Learning", arXiv:2110.06169.

    Args:
        actor_network: a TorchRL ``ProbabilisticActor``.
        qvalue_network: a module reading the observation and ``action`` and writing
            ``state_action_value``, or a list of ``num_qvalue_nets`` such modules.
        value_network: a module writing ``state_value`` (a ``ValueOperator``).
        num_qvalue_nets: Q networks, >= 1 (default 2).
        loss_function: the Q regression distance (default ``"smooth_l1"``, TorchRL's).
        temperature: ``beta`` of the weights, >= 0 (default 1.0).
        expectile: ``tau`` in [0, 1] (default 0.5; the paper uses 0.7 to 0.9).
        scalar_output_mode: as :class:`rlloss.SACLoss`.
        deactivate_vmap: as :class:`rlloss.SACLoss`.
        separate_losses: as :class:`rlloss.SACLoss`.
        gamma: see :class:`rlloss.offpolicy.TDTargetLoss`.
        reduction: see :class:`rlloss.offpolicy.TDTargetLoss`.
        use_prioritized_weights: see :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_weighting: see :class:`rlloss.offpolicy.TDTargetLoss`.
        policy_loss_addons: see :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_key: see :class:`rlloss.offpolicy.TDTargetLoss`.

    Differences from TorchRL: the dataset action's log-probability is not written back into
    the caller's batch (under ``tensor_keys.log_prob``); ``entropy`` reports the same number.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import IQLLoss, SoftUpdate
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
        >>> value = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
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
        >>> loss = IQLLoss(actor, qvalue, value, expectile=0.7, temperature=3.0)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)  # an offline batch: the dataset's actions
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_value"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by IQLLoss (``priority``: ``max_i`` squared TD error, ``[*B]``)."""

        value: NestedKey = "state_value"  # written by the value network, [*B, 1]
        action: NestedKey = "action"  # the dataset's action, [*B, A]
        log_prob: NestedKey = "_log_prob"  # kept for TorchRL's key names (not written)
        state_action_value: NestedKey = "state_action_value"  # written by the Q networks, [*B, 1]

    _actor_loss_key = "loss_actor"
    _choices = {**TDTargetLoss._choices, "scalar_output_mode": ("exclude", "non_tensor")}
    temperature = Coefficient(low=0.0)
    expectile = Coefficient(low=0.0, high=1.0)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        value_network: nn.Module,
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        temperature: float = 1.0,
        expectile: float = 0.5,
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
        owner = type(self).__name__
        check_network(owner, "actor_network", actor_network)
        check_network(owner, "qvalue_network", qvalue_network, ensemble=True)
        check_network(owner, "value_network", value_network)
        if scalar_output_mode is not None:
            check_choice("scalar_output_mode", scalar_output_mode, ("exclude", "non_tensor"))
        super().__init__(
            loss_function=loss_function,
            gamma=gamma,
            priority_key=priority_key,
            separate_losses=separate_losses,
            reduction=reduction,
            deactivate_vmap=deactivate_vmap,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        self._register_coefficients(temperature=temperature, expectile=expectile)
        self.scalar_output_mode = scalar_output_mode or "exclude"
        self.delay_qvalue = True  # TorchRL's attribute: the Q networks always have targets
        self.actor_network = actor_network
        self.value_network = value_network
        self._expose_parameters("actor_network", "value_network")
        self._actor_call = DistributionCall(actor_network)
        self._value_call = NetworkCall(value_network, until=self.tensor_keys.value)
        self._qvalue_action_key = self.tensor_keys.action  # the Q networks' own input key
        self._qvalue = self._register_qvalue_ensemble(
            qvalue_network, num_qvalue_nets, target=True, until=self.tensor_keys.state_action_value
        )

    qvalue_network = ensemble_architecture("_qvalue", "qvalue_network_params")
    out_keys = ["loss_actor", "loss_qvalue", "loss_value", "entropy"]

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = [*self.actor_network.in_keys, *self._qvalue.in_keys, self.tensor_keys.action]
        keys += self.value_network.in_keys
        return self._transition_keys(keys, self.value_network.in_keys)

    # ----------------------------------------------------------------------------- pieces
    def _q_values(self, batch: TensorDictBase, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of the dataset's actions (``tensor_keys.action``,
        given to the Q networks under their own action key)."""
        action = self._get(batch, "action")
        outputs = self._qvalue.at_action(batch, self._qvalue_action_key, action, **kwargs)
        return outputs[self.tensor_keys.state_action_value]

    def _state_value(self, batch: TensorDictBase) -> torch.Tensor:
        """``V(s)``, ``[*B, 1]``."""
        return self._value_call(batch)[self.tensor_keys.value]

    def _advantage(self, batch: TensorDictBase, value: torch.Tensor) -> torch.Tensor:
        """``min_i Q_target,i(s, a) - V(s)``, ``[*B, 1]`` (gradient through ``value`` only)."""
        return rlf.clipped_double_q_value(self._q_values(batch, target=True)) - value

    # ----------------------------------------------------------------------------- losses
    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``-mean(w log pi(a|s))`` reduced, and ``log pi(a|s)`` (``[*B]``, detached)."""
        distribution = self._actor_call(tensordict)
        action = self._get(tensordict, "action")
        log_prob = log_prob_of(distribution, action, self.tensor_keys.action, type(self).__name__)
        with torch.no_grad():
            weights = rlf.advantage_weights(
                self._advantage(tensordict, self._state_value(tensordict)), self.temperature
            )
        objective = rlf.policy_gradient_objective(log_prob.unsqueeze(-1), weights)
        loss = self._reduce_replayed(-objective, tensordict)
        actor = ActorOutput(distribution=distribution)
        return self._with_policy_addons(loss, tensordict, actor, {"log_prob": log_prob.detach()})

    def loss_value(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The expectile regression of ``V(s)`` on ``min_i Q_target,i(s, a)``, reduced."""
        difference = self._advantage(tensordict, self._state_value(tensordict))
        return self._reduce_replayed(rlf.expectile_loss(difference, self.expectile), tensordict), {}

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced with ``y = r + gamma^n (1 - terminated) V(s')``,
        and the per-network squared TD errors ``[num_qvalue_nets, *B]``."""
        with torch.no_grad():
            next_value = self._state_value(entry(tensordict, "next"))
            target = self._td_target(tensordict, next_value)
        values = self._q_values(tensordict)
        td_error = rlf.td_error(values, target.expand_as(values), "squared").squeeze(-1)
        return self._ensemble_critic_loss(values, target, tensordict), {"td_error": td_error}

    # TorchRL's names of the three losses
    actor_loss = loss_actor
    value_loss = loss_value
    qvalue_loss = loss_qvalue

    @staticmethod
    def loss_value_diff(diff: torch.Tensor, expectile: float = 0.8) -> torch.Tensor:
        """TorchRL's name of :func:`rlloss.functional.expectile_loss` (``diff``: target minus
        prediction), with TorchRL's default ``expectile``; elementwise."""
        return rlf.expectile_loss(diff, expectile)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The three losses and ``entropy``; writes ``td_error`` into ``tensordict``."""
        batch, (loss_actor, info), (loss_qvalue, _) = self._actor_then_ensemble_losses(tensordict)
        loss_value, _ = self.loss_value(batch)
        out = {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_value": loss_value}
        out.update(self._addon_entries(info))
        entropy = -self._valid_mean(info["log_prob"], tensordict)
        if self.reduction != "none":
            return TensorDict({**out, "entropy": entropy}, batch_size=[])
        out = TensorDict(out, batch_size=tensordict.batch_size)  # per-sample losses
        if self.scalar_output_mode == "non_tensor":
            out.set_non_tensor("entropy", entropy)
        return out


class DiscreteIQLLoss(IQLLoss):
    """IQL for discrete actions: the Q networks write ``state_action_value`` for every action
    (``[*B, num_actions]``, TorchRL's key) and are read at the dataset's action, an index or a
    one-hot (:func:`rlloss.functional.chosen_action_value`); the rest is :class:`IQLLoss`.

    Reference: Kostrikov, Nair and Levine, "Offline Reinforcement Learning with Implicit
    Q-Learning", arXiv:2110.06169.

    Args:
        action_space: ``"one-hot"`` or ``"categorical"`` (TorchRL's keyword; the action's shape
            decides either way), or a TorchRL spec.

    The other keywords are as :class:`IQLLoss`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import DiscreteIQLLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ... )
        >>> qvalue = TensorDictModule(
        ...     torch.nn.Linear(3, 4), ["observation"], ["state_action_value"]
        ... )
        >>> value = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.randint(4, (8,)),
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> loss = DiscreteIQLLoss(actor, qvalue, value, action_space="categorical")
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_value"]).backward()
    """

    _choices = {**IQLLoss._choices, "action_space": ACTION_SPACE_SETTINGS}  # on assignment

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        value_network: nn.Module,
        *,
        action_space: str | TensorSpec | None = None,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        temperature: float = 1.0,
        expectile: float = 0.5,
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
        if isinstance(action_space, str):
            check_choice("action_space", action_space, ACTION_SPACES)
        super().__init__(
            actor_network,
            qvalue_network,
            value_network,
            num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function,
            temperature=temperature,
            expectile=expectile,
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
        self.action_space = action_space if action_space is not None else "one-hot"

    def _q_values(self, batch: TensorDictBase, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of the dataset's actions."""
        values = self._qvalue(network_inputs(batch, self._qvalue), **kwargs)
        values = values[self.tensor_keys.state_action_value]  # [E, *B, num_actions]
        action = self._get(batch, "action")
        return rlf.chosen_action_value(values, action.expand(values.shape[0], *action.shape))
