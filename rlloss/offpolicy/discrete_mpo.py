"""MPO for categorical policies: ``DiscreteMPOLoss`` (Abdolmaleki et al., arXiv:1806.06920 and
arXiv:1812.02256), on the MPO base :class:`rlloss.offpolicy.mpo_base.MaximumAPosteriori` that it
shares with :class:`rlloss.MPOLoss`."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_in_range
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import network_inputs
from rlloss.addons import ActorOutput
from rlloss.offpolicy.base import TDTargetLoss
from rlloss.offpolicy.mpo_base import MaximumAPosteriori


class DiscreteMPOLoss(MaximumAPosteriori):
    r"""Categorical MPO: the E-step enumerates the actions instead of sampling them.

    E-step (no gradient) and temperature loss:

    $$
    q(a \mid s) \propto \bar{\pi}(a \mid s) \exp\big(\bar{Q}(s, a) / \eta\big), \qquad
    \mathcal{L}_{\eta} = \eta \Big(\epsilon + \mathbb{E}_s \log \sum_a \bar{\pi}(a \mid s)
    \exp\big(\bar{Q}(s, a) / \eta\big)\Big)
    $$

    M-step ($\mathrm{sg}$: no gradient; Acme's ``CategoricalMPO``):

    $$
    \mathcal{L}_{\text{actor}} = \mathbb{E}_s \Big[-\sum_a q(a \mid s) \log \pi(a \mid s)
    + \mathrm{sg}(\alpha) \mathrm{KL}(\bar{\pi} \,\|\, \pi)\Big], \qquad
    \mathcal{L}_{\alpha} = \alpha \big(\epsilon_\pi - \mathrm{sg}(\mathbb{E}_s \mathrm{KL})\big)
    $$

    Critic (expected SARSA, exact):

    $$
    L\big(Q(s, a), y\big), \qquad y = r + \gamma^n (1 - \text{terminated})
    \sum_{a'} \bar{\pi}(a' \mid s') \bar{Q}(s', a')
    $$

    Reference: Abdolmaleki et al., "Maximum a Posteriori Policy Optimisation", arXiv:1806.06920,
    and "Relative Entropy Regularized Policy Iteration", arXiv:1812.02256.

    Args:
        actor_network: a ``ProbabilisticActor`` over a categorical (``logits``): ``Categorical``
            or ``OneHotCategorical``.
        qvalue_network: a module writing ``action_value`` (``[*B, num_actions]``).
        epsilon: the E-step KL bound (Acme's default).
        epsilon_policy: the M-step KL bound (Acme's default).
        init_log_temperature: the initial temperature, a dual parameter (softplus space).
        init_log_alpha: the initial KL multiplier, a dual parameter (softplus space).
        alpha_max: a cap on the KL multiplier (pytorchrl's ``alpha_max``; default uncapped).
        alpha_scale: a factor on the multiplier's dual loss (pytorchrl's; default 1).

    The other keywords are as :class:`rlloss.MPOLoss`. The taken action is an index or a one-hot
    (its dtype decides, as in :class:`rlloss.DiscreteSACLoss`).

    Outputs: ``loss_actor``, ``loss_qvalue``, ``loss_temperature``, ``loss_alpha``; diagnostics
    ``temperature``, ``alpha``, ``kl`` (``KL(pi_target || pi)``), ``kl_q`` (``KL(q ||
    pi_target)``), ``q_mean`` (``Q_target(s, .)`` over states and actions). ``forward`` writes
    ``td_error`` (``|Q(s, a) - y|``, ``[*B]``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> from rlloss import DiscreteMPOLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ... )
        >>> qvalue = TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["action_value"])
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
        >>> loss = DiscreteMPOLoss(actor, qvalue)
        >>> out = loss(batch)
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by DiscreteMPOLoss (``priority``: ``|TD error|``, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken: index [*B] or one-hot [*B, A]
        action_value: NestedKey = "action_value"  # Q(s, .) written by the Q network, [*B, A]

    out_keys = [
        "loss_actor",
        "loss_qvalue",
        "loss_temperature",
        "loss_alpha",
        "temperature",
        "alpha",
        "kl",
        "kl_q",
        "q_mean",
    ]

    epsilon_policy = Coefficient(low=0.0, low_open=True)  # the M-step's KL bound

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        epsilon: float = 0.1,
        epsilon_policy: float = 2.5e-3,
        init_log_temperature: float = 3.0,
        init_log_alpha: float = 3.0,
        alpha_max: float | None = None,
        alpha_scale: float = 1.0,
        loss_function: str = "l2",
        delay_actor: bool = True,
        delay_qvalue: bool = True,
        gamma: float | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
    ) -> None:
        if alpha_max is not None:
            check_in_range("alpha_max", alpha_max, 0.0, low_open=True)
        check_in_range("alpha_scale", alpha_scale, 0.0, low_open=True)
        super().__init__(
            actor_network,
            qvalue_network,
            value="action_value",
            loss_function=loss_function,
            delay_actor=delay_actor,
            delay_qvalue=delay_qvalue,
            gamma=gamma,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
        )
        self._register_coefficients(epsilon=epsilon, epsilon_policy=epsilon_policy)
        keys = self._actor_call.parameter_keys if self._actor_call.direct else {}
        self._logits_key = keys.get("logits") if set(keys) == {"logits"} else None
        device = next(actor_network.parameters()).device
        self._register_dual("log_temperature", init_log_temperature, (), device)
        self._register_dual("log_alpha", init_log_alpha, (), device, alpha_max, alpha_scale)

    def _logits(self, call: DistributionCall, batch: TensorDictBase) -> torch.Tensor:
        """The policy's logits ``[*B, num_actions]`` on ``batch``."""
        if self._logits_key is not None:
            return call.distribution_parameters(batch)[self._logits_key]
        return call(batch).logits

    def _policy(self, batch: TensorDictBase, logits: torch.Tensor):
        """The current policy's distribution, from its ``logits`` when the actor's head reads
        nothing else, else by running the actor."""
        if self._logits_key is not None:
            return self._actor_call.from_parameters({self._logits_key: logits})
        return self._actor_call(batch)

    def _target_policy_and_values(self, batch: TensorDictBase) -> tuple[torch.Tensor, ...]:
        """Under ``no_grad``: the target policy's logits and ``Q_target(s, .)``, ``[*B, A]``."""
        with torch.no_grad():
            logits = self._logits(self._target_actor_call, batch)
            inputs = network_inputs(batch, self.qvalue_network)
            outputs = self._call(self._target_qvalue_call, inputs, batch.batch_size)
            return logits, outputs[self.tensor_keys.action_value]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The M-step loss reduced, and in the metadata ``loss_temperature``, ``loss_alpha`` and
        the detached diagnostics. Projects the dual parameters onto their floor first."""
        self.clamp_duals()
        temperature, alpha = self._dual("log_temperature"), self._dual("log_alpha")
        target_logits, action_values = self._target_policy_and_values(tensordict)
        logits = self._logits(self._actor_call, tensordict)

        log_weights = rlf.categorical_mpo_log_weights(action_values, target_logits, temperature)
        loss_temperature = rlf.categorical_mpo_temperature_loss(
            action_values, target_logits, temperature, self.epsilon
        )
        kl = rlf.categorical_kl(target_logits, logits).unsqueeze(-1)
        loss = rlf.categorical_cross_entropy(log_weights, logits) + rlf.kl_penalty(kl, alpha)
        loss_alpha = self._dual_loss("log_alpha", alpha, kl, self.epsilon_policy)
        info = {
            "loss_temperature": self._reduce_replayed(loss_temperature.unsqueeze(-1), tensordict),
            "loss_alpha": self._reduce_replayed(loss_alpha.unsqueeze(-1), tensordict),
            "temperature": temperature.detach(),
            "alpha": alpha.detach(),
            "kl": kl.detach().mean(),
            "kl_q": rlf.categorical_kl(log_weights, target_logits).mean(),
            "q_mean": action_values.mean(),
        }
        loss = self._reduce_replayed(loss.unsqueeze(-1), tensordict)
        actor = ActorOutput(distribution=lambda: self._policy(tensordict, logits))
        return self._with_policy_addons(loss, tensordict, actor, info)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``L(Q(s, a), y)`` reduced with ``y = r + gamma^n (1 - terminated) sum_a'
        pi_target(a'|s') Q_target(s', a')``; and ``td_error``, ``target_value``, ``pred_value``."""
        action = self._get(tensordict, "action")
        with torch.no_grad():
            next_logits, next_values = self._target_policy_and_values(tensordict.get("next"))
            # the expected value under pi_target: a soft value with temperature 0
            next_value = rlf.discrete_soft_value(next_values, next_logits.log_softmax(-1), 0.0)
            target = self._td_target(tensordict, next_value)
        inputs = network_inputs(tensordict, self.qvalue_network)
        outputs = self._call(self._qvalue_call, inputs, tensordict.batch_size)
        value = rlf.chosen_action_value(outputs[self.tensor_keys.action_value], action)
        return self._mpo_critic_loss(value, target, tensordict)
