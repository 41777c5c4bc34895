"""TD3: twin delayed deep deterministic policy gradient (Fujimoto et al., "Addressing Function
Approximation Error in Actor-Critic Methods", arXiv:1802.09477).

``TwinDelayedLoss`` holds TD3's steps; two public losses share it: :class:`TD3Loss` (below) and
:class:`rlloss.TD3BCLoss` (``offline/td3_bc.py``, TD3's critic with a behaviour-cloning actor).
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Bounded, Composite, TensorSpec

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_network
from rlloss._ensembles import ensemble_architecture
from rlloss._networks import NetworkCall, entry
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.base import TDTargetLoss


def action_bounds(action_spec, bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)`` from a TorchRL ``Bounded`` spec (or a ``Composite`` holding one under
    ``"action"``) or from ``bounds=(low, high)``; exactly one of the two must be given."""
    if (action_spec is None) == (bounds is None):
        raise ValueError(
            "pass action_spec (a TorchRL Bounded spec) or bounds=(low, high), but not both "
            "(one is needed); "
            f"got action_spec={action_spec!r}, bounds={bounds!r}."
        )
    if action_spec is not None:
        if isinstance(action_spec, Composite):
            action_spec = action_spec["action"]
        if not isinstance(action_spec, Bounded):
            raise ValueError(
                f"action_spec must be a Bounded spec, got {type(action_spec).__name__}."
            )
        low, high = action_spec.space.low, action_spec.space.high
    else:
        low, high = (torch.as_tensor(b, dtype=torch.get_default_dtype()) for b in bounds)
    if (low > high).any():
        raise ValueError(f"action bounds have low > high: low={low}, high={high}.")
    return low, high


class TwinDelayedLoss(TDTargetLoss):
    """TD3's steps, the base of ``TD3Loss`` and ``TD3BCLoss``: the deterministic actor ``mu(s)``
    (and its target copy with ``delay_actor``), the Q ensemble at substituted actions, target
    policy smoothing and the clipped double-Q target. The keywords are documented in
    :class:`rlloss.TD3Loss`.
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by TD3Loss (``priority``: ``max_i`` squared TD error, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken, and the actor's output, [*B, A]
        state_action_value: NestedKey = "state_action_value"  # the critics' Q(s, a), [*B, 1]

    _estimator_keys = {"value": "state_action_value"}
    _actor_loss_key = "loss_actor"
    _deterministic_actor = True

    policy_noise = Coefficient(low=0.0, buffer=True)
    noise_clip = Coefficient(low=0.0, buffer=True)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        action_spec: TensorSpec | None = None,
        bounds: tuple[float, float] | None = None,
        num_qvalue_nets: int = 2,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        loss_function: str = "smooth_l1",
        delay_actor: bool = True,
        delay_qvalue: bool = True,
        gamma: float | None = None,
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        check_network(type(self).__name__, "actor_network", actor_network)
        check_network(type(self).__name__, "qvalue_network", qvalue_network, ensemble=True)
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
        self.delay_qvalue = delay_qvalue
        low, high = action_bounds(action_spec, bounds)
        device = next(actor_network.parameters()).device
        self.register_buffer("min_action", low.to(device).clone())
        self.register_buffer("max_action", high.to(device).clone())
        self._register_coefficients(device, policy_noise=policy_noise, noise_clip=noise_clip)

        self.actor_network = actor_network
        self.delay_actor = delay_actor
        self._expose_parameters("actor_network")
        action_key = self.tensor_keys.action
        self._actor_call = NetworkCall(actor_network, until=action_key)
        # without a target copy, the next action comes from the online actor (no gradient)
        self._target_actor_call = self._actor_call
        if delay_actor:
            self._target_actor_call = self._register_target_network("actor_network", action_key)
        self._qvalue = self._register_qvalue_ensemble(
            qvalue_network,
            num_qvalue_nets,
            target=delay_qvalue,
            until=self.tensor_keys.state_action_value,
        )

    qvalue_network = ensemble_architecture("_qvalue", "qvalue_network_params")

    @property
    def in_keys(self) -> list[NestedKey]:
        actor_keys, critic_keys = self.actor_network.in_keys, self._qvalue.in_keys
        next_keys = [*actor_keys, *(k for k in critic_keys if k != self.tensor_keys.action)]
        return self._transition_keys([*actor_keys, *critic_keys], next_keys)

    @property
    def out_keys(self) -> list[str]:
        return [
            "loss_actor",
            "loss_qvalue",
            "state_action_value_actor",
            "next_state_value",
            "pred_value",
            "target_value",
        ]

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, 1]`` values of ``action`` at the batch's observations."""
        outputs = self._qvalue.at_action(batch, self.tensor_keys.action, action, **kwargs)
        return outputs[self.tensor_keys.state_action_value]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``-Q_1(s, mu(s))`` reduced, and ``Q_1(s, mu(s))`` (detached, ``[1, *B]``): only the
        first Q network is evaluated."""
        action = self._actor_call(tensordict)[self.tensor_keys.action]
        value = self._q_values(tensordict, action, detach=True, members=1)
        loss = self._reduce_replayed(-value[0], tensordict)
        info = {"state_action_value_actor": value.squeeze(-1).detach()}
        return self._with_policy_addons(loss, tensordict, ActorOutput(action=action), info)

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, the TD errors and the values (detached)."""
        with torch.no_grad():
            next_batch = entry(tensordict, "next")
            next_action = rlf.smoothed_target_action(
                self._target_actor_call(next_batch)[self.tensor_keys.action],
                self.policy_noise,
                self.noise_clip,
                self.min_action,
                self.max_action,
            )
            next_values = self._q_values(
                next_batch, next_action, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            next_value = rlf.clipped_double_q_value(next_values)
            target = self._td_target(tensordict, next_value)
        values = self._q_values(tensordict, self._get(tensordict, "action"))
        info = {
            "td_error": rlf.td_error(values, target.expand_as(values), "squared").squeeze(-1),
            "next_state_value": next_value.squeeze(-1),
            **rlf.regression_diagnostics(values, target),
        }
        return self._ensemble_critic_loss(values, target, tensordict), info

    # TorchRL's TD3Loss names these two ``actor_loss`` and ``value_loss``; a training loop written
    # against either library calls them under those names.
    actor_loss = loss_actor
    value_loss = loss_qvalue

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Both losses; writes ``td_error`` into ``tensordict``."""
        _, (loss_actor, info_actor), (loss_qvalue, info) = self._actor_then_ensemble_losses(
            tensordict
        )
        del info["td_error"]  # written as the priority, not an output
        out = {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, **info_actor, **info}
        return TensorDict(out, batch_size=[])


class TD3Loss(TwinDelayedLoss):
    r"""TD3's actor and critic losses.

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_k L\big(Q_k(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated}) \min_k \bar{Q}_k(s', a'), \qquad
    \mathcal{L}_{\text{actor}} = -Q_1(s, \mu(s))
    $$

    $$
    a' = \operatorname{clip}\big(\bar{\mu}(s') + \operatorname{clip}(\epsilon, -c, c),\,
    a_{\text{low}}, a_{\text{high}}\big), \qquad \epsilon \sim N(0, \sigma^2)
    $$

    (target policy smoothing with $\sigma$ = ``policy_noise`` and $c$ = ``noise_clip``,
    clipped double Q; the critics get no gradient from the actor's loss). The Q networks are an
    ensemble of
    ``num_qvalue_nets`` evaluated in one ``vmap`` call. :meth:`loss_actor` and
    :meth:`loss_qvalue` can be called separately (delayed actor updates); ``forward`` returns
    both and writes ``td_error`` (max over the Q networks of the squared TD error, ``[*B]``)
    into the batch for prioritized replay.

    Reference: Fujimoto, van Hoof and Meger, "Addressing Function Approximation Error in
    Actor-Critic Methods", arXiv:1802.09477.

    Args:
        actor_network: a deterministic actor writing ``action`` (a TorchRL ``Actor``).
        qvalue_network: a module reading the observation and ``action`` and writing
            ``state_action_value``, or a list of ``num_qvalue_nets`` such modules (their weights
            kept; copies of a single module are re-initialised).
        action_spec: a TorchRL ``Bounded`` spec: the bounds of the smoothed target action
            (give it or ``bounds``, not both).
        bounds: ``(low, high)``, the same bounds given directly.
        num_qvalue_nets: as in TorchRL.
        policy_noise: as in TorchRL.
        noise_clip: as in TorchRL.
        loss_function: as in TorchRL.
        delay_actor: keep target copies (update them with ``SoftUpdate``).
        delay_qvalue: keep target copies (update them with ``SoftUpdate``).
        gamma: see :class:`rlloss.offpolicy.TDTargetLoss`.
        reduction: see :class:`rlloss.offpolicy.TDTargetLoss`.
        use_prioritized_weights: see :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_weighting: see :class:`rlloss.offpolicy.TDTargetLoss`.
        policy_loss_addons: see :class:`rlloss.offpolicy.TDTargetLoss`.
        separate_losses: see :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_key: see :class:`rlloss.offpolicy.TDTargetLoss`.
        deactivate_vmap: see :class:`rlloss.offpolicy.TDTargetLoss`.

    Differences from TorchRL: the actor loss evaluates ``Q_1`` alone (TorchRL evaluates every Q
    network on ``mu(s)`` and keeps the first: the same loss and gradients for ``num_qvalue_nets``
    times the work), so ``state_action_value_actor`` is ``[1, *B]`` (TorchRL's
    ``[num_qvalue_nets, *B]``; index 0 is the same in both); copies of a single Q module are
    re-initialised with each layer's ``reset_parameters`` (TorchRL draws them uniformly between
    the original weights' min and max); ``priority_weighting`` defaults to the PER paper's mean;
    ``separate_losses`` is not supported.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ValueOperator
        >>> from rlloss import TD3Loss
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
        >>> loss = TD3Loss(actor, qvalue, action_spec=Bounded(-1, 1, (1,)), num_qvalue_nets=2)
        >>> for step in range(2):
        ...     critic_loss, _ = loss.loss_qvalue(batch)
        ...     if step % 2 == 0:  # the delayed policy update
        ...         actor_loss, _ = loss.loss_actor(batch)
    """
