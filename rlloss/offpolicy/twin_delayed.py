"""The TD3 base: twin delayed deep deterministic policy gradient (Fujimoto et al., "Addressing
Function Approximation Error in Actor-Critic Methods", arXiv:1802.09477)."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Bounded, Composite, TensorSpec

from rlloss import _fast
from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_network
from rlloss._ensembles import ensemble_architecture
from rlloss._networks import entry
from rlloss.addons import ActorOutput
from rlloss.common import accepts_tensor_arguments
from rlloss.offpolicy.deterministic import DeterministicActorCritic


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


class TwinDelayedLoss(DeterministicActorCritic):
    """TD3's steps, the base of ``TD3Loss`` and ``TD3BCLoss``: the deterministic actor, the Q
    ensemble at substituted actions, target policy smoothing and the clipped double-Q target.
    The keywords are documented in :class:`rlloss.TD3Loss`.
    """

    @dataclasses.dataclass
    class _AcceptedKeys(DeterministicActorCritic._AcceptedKeys):
        """Keys read by TD3Loss (``priority``: ``max_i`` squared TD error, ``[*B]``)."""

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
        self._expose_parameters("actor_network")
        self._register_actor_calls(delay_actor)
        self._qvalue = self._register_qvalue_ensemble(
            qvalue_network,
            num_qvalue_nets,
            target=delay_qvalue,
            until=self.tensor_keys.state_action_value,
        )

    qvalue_network = ensemble_architecture("_qvalue", "qvalue_network_params")

    def _critic_in_keys(self) -> list[NestedKey]:
        return self._qvalue.in_keys

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
            **self._regression_diagnostics(values, target),
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
        return _fast.output_tensordict(out)
