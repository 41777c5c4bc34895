"""SAC: ``SACLoss``, the soft actor-critic's actor, critic and temperature losses (SAC v2), with
SAC v1's state-value network as a composed alternative backup.

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905; Haarnoja et
al., "Soft Actor-Critic: Off-Policy Maximum Entropy Deep Reinforcement Learning with a Stochastic
Actor", arXiv:1801.01290 (v1)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._networks import NetworkCall, entry
from rlloss.offpolicy.soft_actor_critic import ContinuousSoftActorCritic
from rlloss.offpolicy.temperature import OUT_KEYS


class SACLoss(ContinuousSoftActorCritic):
    r"""SAC's actor, critic and temperature losses (SAC v2; SAC v1 with a ``value_network``).

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_{k} L\big(Q_k(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated})
    \Big(\min_{k} \bar{Q}_k(s', a') - \alpha \log \pi(a' \mid s')\Big)
    $$

    $$
    \mathcal{L}_{\text{actor}} = \alpha \log \pi(\tilde{a} \mid s) - \min_{k} Q_k(s, \tilde{a}),
    \qquad
    \mathcal{L}_{\text{alpha}} = -\log \alpha \,\big(\log \pi(\tilde{a} \mid s)
    + \bar{\mathcal{H}}\big)
    $$

    The critic (``loss_qvalue``) regresses on $y$, with $a' \sim \pi(\cdot \mid s')$ from the
    current policy and no gradient, $\bar{Q}_k$ the target copies. The actor (``loss_actor``)
    uses $\tilde{a}$ reparameterised (the critics get no gradient from it); the temperature
    (``loss_alpha``) drives the entropy towards $\bar{\mathcal{H}}$ (``target_entropy``)
    (arXiv:1812.05905, eqs. 5, 7 and 18). The Q networks are an ensemble of ``num_qvalue_nets``
    evaluated in one ``vmap`` call. ``forward`` writes ``td_error`` (``max_i |Q_i - y|``,
    ``[*B]``) into the batch.

    For a TorchRL ``ProbabilisticActor`` over ``TanhNormal`` the action and its log-probability
    come from :func:`rlloss.functional.tanh_normal_sample_and_log_prob` on the actor's
    ``loc``/``scale`` (no ``torch.distributions`` transform path, no host sync); any other
    actor is sampled with its distribution's ``rsample`` and ``log_prob``.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module reading the observation and ``action`` and writing
            ``state_action_value``, or a list of ``num_qvalue_nets`` such modules (weights kept;
            copies of a single module are re-initialised).
        num_qvalue_nets: as in TorchRL.
        loss_function: as in TorchRL.
        alpha_init: initial temperature; ``fixed_alpha``: keep it (``log_alpha`` is a buffer).
        min_alpha: bounds on alpha (``log_alpha`` is projected before each use).
        max_alpha: bounds on alpha (``log_alpha`` is projected before each use).
        action_spec: the action spec, for ``target_entropy="auto"`` (``-dim(A)``); without it
            the actor's ``spec``, else the batch's action shape at the first call.
        target_entropy: ``"auto"`` or a number.
        value_network: SAC v1's state-value network ``V(s)`` (arXiv:1801.01290), writing
            ``state_value``: the critics regress on ``r + gamma^n (1 - terminated) V_target(s')``
            (each Q network on its own share of the batch, as TorchRL) and ``loss_value``
            trains ``V``; ``None`` (default): SAC v2.
        delay_actor: a target copy of the actor, from which SAC v1's value target samples (SAC
            v2 samples its target actions from the current policy).
        delay_value: a target copy of ``value_network`` (SAC v1); ignored without one, as
            TorchRL does.
        delay_qvalue: keep target Q copies (update them with ``SoftUpdate``).
        gamma: see
            :class:`rlloss.offpolicy.TDTargetLoss`.
        reduction: as ``gamma``.
        use_prioritized_weights: as ``gamma``.
        priority_weighting: as ``gamma``.
        policy_loss_addons: as ``gamma``.

    Differences from TorchRL: ``priority_weighting`` defaults to the PER paper's mean (pass
    ``"normalized"`` for TorchRL's numbers); ``alpha`` and ``entropy`` are returned with
    ``reduction="none"`` too; the tanh is not clamped away from ±1 (TorchRL's ``safe_tanh``): the
    log-probability is computed from the pre-tanh value, finite at the bounds.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import SACLoss, SoftUpdate
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
        >>> loss = SACLoss(actor, qvalue, num_qvalue_nets=2, action_spec=Bounded(-1, 1, (1,)))
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
        >>> updater.step()  # after the optimizer's step
    """

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        value_network: nn.Module | None = None,
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: TensorSpec | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_actor: bool = False,
        delay_qvalue: bool = True,
        delay_value: bool = True,
        gamma: float | None = None,
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        skip_done_states: bool = False,
        deactivate_vmap: bool = False,
        use_prioritized_weights: bool | str = "auto",
        scalar_output_mode: str | None = None,
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
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
        self.value_network = value_network
        self.delay_value = delay_value
        if value_network is not None:  # SAC v1 (arXiv:1801.01290): V(s) and its target
            self._expose_parameters("value_network")
            self._value_call = NetworkCall(value_network, self.tensor_keys.value)
            self._target_value = (
                self._register_target_network("value_network", self.tensor_keys.value)
                if delay_value
                else self._register_detached_view("value_network", self.tensor_keys.value)
            )

    @property
    def _version(self) -> int:
        """TorchRL's attribute: 1 with a state-value network (SAC v1), else 2."""
        return 2 if self.value_network is None else 1

    @property
    def out_keys(self) -> list[str]:
        value_keys = [] if self.value_network is None else ["loss_value"]
        return [*OUT_KEYS, *value_keys]

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = super().in_keys
        if self.value_network is None:
            return keys
        return list(dict.fromkeys([*keys, *self.value_network.in_keys]))

    def _value_losses(self, tensordict: TensorDictBase) -> dict:
        """SAC v1's ``loss_value`` (none for SAC v2)."""
        if self.value_network is None:
            return {}
        return {"loss_value": self.loss_value(tensordict)}

    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``sum_i L(Q_i(s, a), y)`` reduced, and ``td_error``, ``target_value``, ``pred_value``:
        SAC v2's soft Q target (:meth:`_soft_target`), or SAC v1's state value
        (:meth:`_qvalue_v1_loss`)."""
        if self.value_network is None:
            return super().loss_qvalue(tensordict)
        return self._qvalue_v1_loss(tensordict)

    def loss_value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """SAC v1's state-value loss ``L(V(s), min_i Q_i,target(s, a~) - alpha log pi(a~|s))``
        reduced, ``a~`` from the target policy (the current one without ``delay_actor``), no
        gradient through the target (arXiv:1801.01290, eq. 5)."""
        self._require_value_network("loss_value")
        alpha = self._alpha()
        with torch.no_grad():
            action, log_prob = self._policy_sample(tensordict, self._target_actor_call)
            values = self._q_values(
                tensordict, action, target=self.delay_qvalue, detach=not self.delay_qvalue
            )
            target = rlf.soft_value(rlf.clipped_double_q_value(values), log_prob, alpha)
        value = self._value_call(tensordict)[self.tensor_keys.value]
        loss = rlf.distance(value, target, self.loss_function)
        return self._reduce_replayed(loss, tensordict)

    # TorchRL's names for the critic and state-value losses, whichever version forward runs
    def qvalue_v2_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """SAC v2's critic loss (the soft Q target of :meth:`_soft_target`) and ``td_error``
        ``[*B]``, with or without a state-value network, as TorchRL's."""
        return ContinuousSoftActorCritic.loss_qvalue(self, tensordict)

    def qvalue_v1_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """SAC v1's critic loss (:meth:`_qvalue_v1_loss`); needs ``value_network``."""
        self._require_value_network("qvalue_v1_loss")
        return self._qvalue_v1_loss(tensordict)

    def value_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """:meth:`loss_value` and empty metadata (TorchRL's pair); needs ``value_network``."""
        self._require_value_network("value_loss")
        return self.loss_value(tensordict), {}

    def _require_value_network(self, method: str) -> None:
        if self.value_network is None:
            raise RuntimeError(
                f"SACLoss.{method} is SAC v1's loss of a state-value network, and this loss has "
                f"none: pass value_network=... to SACLoss, or use qvalue_v2_loss (SAC v2)."
            )

    def _qvalue_v1_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """SAC v1's critic loss, as TorchRL computes it: ``y = r + gamma^n (1 - terminated)
        V_target(s')`` and each Q network regressed on its own ``1 / num_qvalue_nets`` of the
        batch (the batch size must be a multiple of it); ``td_error = (Q_i - y)^2``."""
        with torch.no_grad():
            next_value = self._target_value(entry(tensordict, "next"))[self.tensor_keys.value]
            target = self._td_target(tensordict, next_value)
        n, size = self.num_qvalue_nets, tensordict.batch_size
        if size[0] % n:
            raise RuntimeError(
                f"SACLoss (SAC v1): the batch's first dimension ({size[0]}) must be a multiple "
                f"of num_qvalue_nets={n}: each Q network is trained on its own share of it."
            )
        values = self._q_values(tensordict, self._get(tensordict, "action"))  # [n, *B, 1]
        own = values.reshape(n, n, -1, *values.shape[2:]).diagonal(dim1=0, dim2=1)
        own = own.movedim(-1, 0).reshape(values.shape[1:])
        loss = rlf.distance(own, target, self.loss_function)
        info = {
            "td_error": (own - target).pow(2).reshape(size),
            **rlf.regression_diagnostics(own, target),
        }
        return self._reduce_replayed(loss, tensordict), info
