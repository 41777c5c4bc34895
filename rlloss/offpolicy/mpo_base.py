"""The base both MPO losses share: ``MaximumAPosteriori``, under :class:`rlloss.MPOLoss`
(``offpolicy/mpo.py``, Gaussian policies) and :class:`rlloss.DiscreteMPOLoss`
(``offpolicy/discrete_mpo.py``, categorical policies).

It holds the online and target actor and critic, the softplus-parameterised Lagrange multipliers
(dual variables) with their floor and caps, the critic's regression, and ``forward``; each loss
gives the E-step and M-step of its policy class (``loss_actor``) and the critic's target
(``loss_qvalue``). Abdolmaleki et al., "Maximum a Posteriori Policy Optimisation",
arXiv:1806.06920; "Relative Entropy Regularized Policy Iteration", arXiv:1812.02256.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_network
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall
from rlloss.common import accepts_tensor_arguments
from rlloss.functional.mpo import MIN_LOG_DUAL
from rlloss.offpolicy.base import TDTargetLoss


class MaximumAPosteriori(TDTargetLoss):
    """What both MPO losses share (:class:`MPOLoss` and :class:`rlloss.DiscreteMPOLoss`): online
    and target actor and critic, the dual parameters and their floor, and ``forward``.

    ``value``: the name of the key the Q network writes (``tensor_keys.<value>``); the other
    keywords are documented in :class:`rlloss.MPOLoss`, ``replay`` in
    :class:`rlloss.offpolicy.TDTargetLoss`.
    """

    _actor_loss_key = "loss_actor"
    epsilon = Coefficient(low=0.0, low_open=True)  # the E-step's KL bound

    def __init__(
        self,
        actor_network,
        qvalue_network,
        *,
        value: str,
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
        check_network(type(self).__name__, "actor_network", actor_network)
        check_network(type(self).__name__, "qvalue_network", qvalue_network)
        super().__init__(
            loss_function=loss_function,
            gamma=gamma,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
        )
        self.delay_actor, self.delay_qvalue = delay_actor, delay_qvalue
        self._dual_names: list[str] = []
        self._dual_bounds: dict[str, float | None] = {}  # the parameter's cap, from a maximum
        self._dual_scales: dict[str, float] = {}
        value_key = getattr(self.tensor_keys, value)

        self.actor_network = actor_network
        self._actor_call = DistributionCall(actor_network)
        self.qvalue_network = qvalue_network
        self._expose_parameters("actor_network", "qvalue_network")
        self._qvalue_call = NetworkCall(qvalue_network, until=value_key)
        self._qvalue_in_keys = list(qvalue_network.in_keys)
        # without target copies, the online networks' outputs are used (no gradient)
        self._target_actor_call = self._actor_call
        self._target_qvalue_call = self._qvalue_call
        if delay_actor:
            target_actor = self._register_target_network("actor_network")
            self._target_actor_call = DistributionCall(target_actor.module)
        if delay_qvalue:
            self._target_qvalue_call = self._register_target_network(
                "qvalue_network", until=value_key
            )

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = [*self.actor_network.in_keys, *self._qvalue_in_keys, self.tensor_keys.action]
        next_keys = [k for k in self._qvalue_in_keys if k != self.tensor_keys.action]
        return self._transition_keys(keys, [*self.actor_network.in_keys, *next_keys])

    # ----------------------------------------------------------------------------- duals
    def _register_dual(
        self,
        name: str,
        init: float,
        shape: tuple[int, ...],
        device,
        maximum: float | None = None,
        scale: float = 1.0,
    ) -> None:
        """A softplus-parameterised Lagrange multiplier, an ``nn.Parameter`` named ``name``;
        ``maximum`` caps the multiplier (its parameter is clamped by :meth:`clamp_duals`),
        ``scale`` multiplies its dual loss (its step size, pytorchrl's ``alpha_*_scale``)."""
        setattr(self, name, nn.Parameter(torch.full(shape, float(init), device=device)))
        self._dual_names.append(name)
        self._dual_bounds[name] = None if maximum is None else rlf.dual_parameter_bound(maximum)
        self._dual_scales[name] = float(scale)

    def dual_parameters(self) -> Iterator[nn.Parameter]:
        """The dual parameters (for their own optimizer or parameter group, lr 1e-2 in Acme)."""
        return (getattr(self, name) for name in self._dual_names)

    def clamp_duals(self) -> None:
        """Project every dual parameter in place onto ``[-18, cap]`` (Acme's floor, and the cap
        of a multiplier given a maximum); no sync."""
        with torch.no_grad():
            for name in self._dual_names:
                getattr(self, name).clamp_(min=MIN_LOG_DUAL, max=self._dual_bounds[name])

    def _dual_loss(
        self, name: str, alpha: torch.Tensor, kl: torch.Tensor, epsilon: float
    ) -> torch.Tensor:
        """The Lagrange dual loss of the multiplier ``name`` (its value ``alpha``), times its
        scale."""
        loss = rlf.lagrange_dual_loss(kl, alpha, epsilon)
        scale = self._dual_scales[name]
        return loss if scale == 1.0 else scale * loss

    def _dual(self, name: str) -> torch.Tensor:
        return rlf.dual_variable(getattr(self, name))

    # ----------------------------------------------------------------------------- critic
    def _mpo_critic_loss(
        self, value: torch.Tensor, target: torch.Tensor, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, dict]:
        """``L(Q(s, a), y)`` reduced; ``td_error = |Q(s, a) - y|``, ``target_value`` and
        ``pred_value`` (``[*B]``, detached)."""
        info = {
            "td_error": rlf.td_error(value, target, "absolute").squeeze(-1),
            **rlf.regression_diagnostics(value, target),
        }
        return self._critic_loss(value, target, tensordict), info

    def _call(self, call: NetworkCall, inputs: dict, batch_shape) -> Mapping:
        """``call`` on a mapping of input tensors (a TensorDict only for the fallback path)."""
        if call.steps is None:
            return call(TensorDict(inputs, batch_size=batch_shape))
        return call(inputs)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The critic, policy and dual losses with diagnostics; writes ``td_error``."""
        batch = self._valid_batch(tensordict)
        loss_qvalue, info_qvalue = self.loss_qvalue(batch)
        loss_actor, info = self.loss_actor(batch)
        self._write_priority(tensordict, info_qvalue["td_error"])
        return TensorDict(
            {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, **info}, batch_size=[]
        )
