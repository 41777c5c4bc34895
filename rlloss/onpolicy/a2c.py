"""Policy-gradient losses: ``A2CLoss`` (advantage actor-critic) and ``ReinforceLoss``.

Both maximise ``E[log pi(a|s) A(s, a)]``, whose gradient is the policy gradient: Williams,
"Simple statistical gradient-following algorithms for connectionist reinforcement learning"
(1992, REINFORCE, with a learned baseline in ``A``), and Mnih et al., "Asynchronous Methods for
Deep Reinforcement Learning", arXiv:1602.01783 (A2C, the synchronous variant: an entropy bonus
and the critic's regression beside it).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._keywords import NOT_GIVEN, NotGiven
from rlloss._networks import as_list
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.onpolicy.base import OnPolicyLoss, as_scalar_output


class _PolicyGradientLoss(OnPolicyLoss):
    """The shared objective: ``-mean(log pi(a|s) A)`` under ``_actor_loss_key``."""

    _actor_loss_key = "loss_objective"

    def _objective_out_keys(self) -> list[str]:
        return [self._actor_loss_key]

    def _log_probs(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, D.Distribution]:
        """``(log pi(a|s) [*B, 1], pi)`` on ``tensordict``: TorchRL's helper of the same name,
        kept for code (and TorchRL's tests) that call it; a stored action that requires grad
        raises TorchRL's ``RuntimeError`` (the loss would differentiate through the data)."""
        actions = [tensordict.get(key) for key in as_list(self.tensor_keys.action)]
        if any(_requires_grad(action) for action in actions):
            raise RuntimeError(f"tensordict stored {self.tensor_keys.action} requires grad.")
        distribution = self._distribution(tensordict)
        return self._log_prob(distribution, tensordict).unsqueeze(-1), distribution

    def _objective(
        self, batch: TensorDictBase, advantage: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[D.Distribution, dict[str, torch.Tensor]]:
        distribution = self._distribution(batch)
        log_prob = self._log_prob(distribution, batch).unsqueeze(-1)
        objective = rlf.policy_gradient_objective(log_prob, advantage)
        loss = as_scalar_output(rlf.reduce(-objective, self.reduction, mask), self.reduction)
        return distribution, {self._actor_loss_key: loss}


class A2CLoss(_PolicyGradientLoss):
    r"""A2C: the policy gradient with an advantage, an entropy bonus and a critic.

    $$
    \mathcal{L}_{\text{objective}} = -\frac{1}{N} \sum_i \log \pi_\theta(a_i \mid s_i) A_i,
    \qquad
    \mathcal{L}_{\text{entropy}} = -c_H \frac{1}{N} \sum_i H[\pi_\theta(\cdot \mid s_i)],
    \qquad
    \mathcal{L}_{\text{critic}} = c_V \frac{1}{N} \sum_i L\big(V(s_i), \hat{V}_i\big)
    $$

    with $c_H$ = ``entropy_coeff``, $c_V$ = ``critic_coeff`` and $\hat{V}$ the
    ``value_target``.

    TorchRL's ``A2CLoss`` with the same keywords, keys and outputs (``loss_objective``,
    ``loss_critic``, ``entropy``, ``loss_entropy``; ``value_clip_fraction`` with
    ``clip_value``). The advantage is read from the batch, or estimated (GAE by default, any of
    TD(0), TD(1), TD(lambda), VTrace, MAGAE through ``make_value_estimator``) on a copy of it.
    Padded sequence batches, composite action distributions and keyword-tensor calls work as in
    :class:`rlloss.PPOLoss`.

    Reference: Mnih et al., "Asynchronous Methods for Deep Reinforcement Learning", arXiv:1602.01783
    (A3C; A2C is its synchronous variant).

    Args:
        actor_network: a TorchRL ``ProbabilisticActor`` (anything with ``get_dist(td)``).
        critic_network: a module writing ``state_value`` (a TorchRL ``ValueOperator``).
        entropy_bonus: add ``loss_entropy`` (off when ``entropy_coeff`` is 0).
        samples_mc_entropy: samples of the Monte-Carlo entropy estimate (no closed form).
        entropy_coeff: entropy weight, default 0.01 (a buffer).
        critic_coeff: critic weight, default 1.0 (a buffer).
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"``.
        separate_losses: the critic loss sends no gradient into parameters it shares with the
            actor.
        functional: TorchRL's flag (see :class:`rlloss.PPOLoss`).
        actor: TorchRL's aliases of ``actor_network`` and ``critic_network``.
        critic: TorchRL's aliases of ``actor_network`` and ``critic_network``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        clip_value: value clipping radius around the stored ``state_value`` (``None``: off).
        policy_loss_addons: extra terms on ``loss_objective`` (:mod:`rlloss.addons`).
        value_normalizer: an :class:`rlloss.ValueNormalizer` (see :class:`rlloss.PPOLoss`).
        diagnostics: ``False`` skips the detached diagnostics (see :class:`rlloss.PPOLoss`).
        advantage_norm: a TorchRL ``ValueNorm`` dividing the advantage by its scale (see
            :class:`rlloss.PPOLoss`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import A2CLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     observation=torch.randn(8, 3),
        ...     action=torch.randint(2, (8,)),
        ...     action_log_prob=torch.full((8,), -0.69),
        ...     advantage=torch.randn(8, 1),
        ...     value_target=torch.randn(8, 1),
        ...     batch_size=[8],
        ... )
        >>> loss = A2CLoss(actor, critic, entropy_coeff=0.01)
        >>> out = loss(batch)  # batch holds advantage and value_target, or GAE runs first
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """

    _value_key_hint = "the value_key passed to A2C"

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float | None = None,
        critic_coeff: float | None = 1.0,
        loss_critic_type: str = "smooth_l1",
        advantage_norm: nn.Module | None = None,
        gamma: float | None = None,
        separate_losses: bool = False,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        reduction: str | None = None,
        clip_value: float | None = None,
        entropy_coef: NotGiven = NOT_GIVEN,
        critic_coef: NotGiven = NOT_GIVEN,
        policy_loss_addons: list | None = None,
        value_normalizer: ValueNormalizer | None = None,
        diagnostics: bool = True,
    ) -> None:
        both_networks(type(self).__name__, actor_network, critic_network, actor, critic)
        entropy_coeff = 0.01 if entropy_coeff is None else entropy_coeff
        super().__init__(
            actor_network,
            critic_network,
            entropy_bonus=bool(entropy_bonus and entropy_coeff),
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            log_explained_variance=False,  # TorchRL's A2CLoss logs none
            critic_coeff=critic_coeff,
            loss_critic_type=loss_critic_type,
            advantage_norm=advantage_norm,
            gamma=gamma,
            separate_losses=separate_losses,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            functional=functional,
            actor=actor,
            critic=critic,
            reduction=reduction,
            clip_value=clip_value,
            entropy_coef=entropy_coef,
            critic_coef=critic_coef,
            diagnostics=diagnostics,
            policy_loss_addons=policy_loss_addons,
            value_normalizer=value_normalizer,
        )

    @property
    def out_keys(self) -> list[str]:
        """TorchRL's entries, in TorchRL's order (a keyword-tensor call returns them so), and
        ``value_clip_fraction`` with ``clip_value`` (TorchRL writes it without declaring it)."""
        clip_fraction = self._has_critic and self.clip_value is not None and self.diagnostics
        keys = ["loss_objective"]
        keys += ["loss_critic"] if self._has_critic else []
        keys += ["value_clip_fraction"] if clip_fraction else []
        keys += ["entropy"] if self.entropy_bonus and self.diagnostics else []
        keys += ["loss_entropy"] if self.entropy_bonus else []
        return keys


class ReinforceLoss(_PolicyGradientLoss):
    r"""REINFORCE with a learned baseline (no coefficient, no entropy bonus).

    $$
    \mathcal{L}_{\text{actor}} = -\frac{1}{N} \sum_i \log \pi_\theta(a_i \mid s_i) A_i,
    \qquad
    \mathcal{L}_{\text{value}} = \frac{1}{N} \sum_i L\big(V(s_i), \hat{V}_i\big)
    $$

    with $\hat{V}$ the ``value_target``.

    TorchRL's ``ReinforceLoss`` with the same keywords, keys and outputs (``loss_actor``,
    ``loss_value``; ``value_clip_fraction`` with ``clip_value``). The advantage is read from the
    batch or estimated on a copy of it (GAE by default; TD(0), TD(1), TD(lambda), VTrace
    through ``make_value_estimator``): Williams's Monte-Carlo return is the TD(1) estimator.

    Reference: Williams, "Simple statistical gradient-following algorithms for connectionist
    reinforcement learning", Machine Learning 8 (1992).

    Args:
        actor_network: a TorchRL ``ProbabilisticActor`` (anything with ``get_dist(td)``).
        critic_network: a module writing ``state_value`` (a TorchRL ``ValueOperator``).
        delay_value: keep a target copy of the critic (``target_critic_network_params``, for
            TorchRL's ``SoftUpdate`` / ``HardUpdate``) and let the value estimator read ``V(s')``
            from it, as TorchRL does.
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"``.
        separate_losses: as
            :class:`A2CLoss`.
        functional: as ``separate_losses``.
        actor: as ``separate_losses``.
        critic: as ``separate_losses``.
        reduction: as ``separate_losses``.
        clip_value: as ``separate_losses``.
        policy_loss_addons: extra terms on ``loss_actor`` (:mod:`rlloss.addons`).
        value_normalizer: an :class:`rlloss.ValueNormalizer` (see :class:`rlloss.PPOLoss`).
        diagnostics: ``False`` skips the detached diagnostics (see :class:`rlloss.PPOLoss`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ReinforceLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     observation=torch.randn(8, 3),
        ...     action=torch.randint(2, (8,)),
        ...     action_log_prob=torch.full((8,), -0.69),
        ...     advantage=torch.randn(8, 1),
        ...     value_target=torch.randn(8, 1),
        ...     batch_size=[8],
        ... )
        >>> loss = ReinforceLoss(actor, critic)
        >>> out = loss(batch)  # batch holds advantage and value_target, or GAE runs first
        >>> (out["loss_actor"] + out["loss_value"]).backward()
    """

    _actor_loss_key = "loss_actor"
    _critic_loss_key = "loss_value"
    _value_key_hint = "the value_key passed to Reinforce"

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        delay_value: bool = False,
        loss_critic_type: str = "smooth_l1",
        gamma: float | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        separate_losses: bool = False,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        reduction: str | None = None,
        clip_value: float | None = None,
        policy_loss_addons: list | None = None,
        value_normalizer: ValueNormalizer | None = None,
        diagnostics: bool = True,
    ) -> None:
        both_networks(type(self).__name__, actor_network, critic_network, actor, critic)
        super().__init__(
            actor_network,
            critic_network,
            entropy_bonus=False,
            log_explained_variance=False,  # TorchRL's ReinforceLoss logs none
            critic_coeff=1.0,
            loss_critic_type=loss_critic_type,
            gamma=gamma,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            separate_losses=separate_losses,
            functional=functional,
            actor=actor,
            critic=critic,
            reduction=reduction,
            clip_value=clip_value,
            diagnostics=diagnostics,
            policy_loss_addons=policy_loss_addons,
            value_normalizer=value_normalizer,
        )
        if delay_value and not self.functional:  # TorchRL's refusal
            raise RuntimeError(
                "delay_value and ~functional are incompatible, as delayed value currently relies "
                "on functional calls."
            )
        self.delay_value = delay_value
        if delay_value:
            _compat.expect_updater(self, "critic_network")
            target = TensorDict.from_module(self.critic_network).detach().clone()
            self.target_critic_network_params = TensorDictParams(target, no_convert=True)

    def _estimator_weights(self) -> dict:
        if not self.delay_value:
            return {}
        # read through TorchRL's attribute hook: it warns while no updater is associated
        return {"target_params": self.target_critic_network_params}

    @property
    def out_keys(self) -> list[str]:
        """``loss_actor``, ``loss_value`` (TorchRL's), and ``value_clip_fraction`` with
        ``clip_value``."""
        clip_fraction = self.clip_value is not None and self.diagnostics
        return ["loss_actor", "loss_value"] + (["value_clip_fraction"] if clip_fraction else [])


def _requires_grad(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    return any(leaf.requires_grad for leaf in value.values(True, True))  # a composite action


def both_networks(owner: str, actor_network, critic_network, actor, critic) -> None:
    """TorchRL's check of ``A2CLoss`` / ``ReinforceLoss``: both networks are required, given
    as such or under the ``actor=`` / ``critic=`` aliases."""
    if (actor_network is None and actor is None) or (critic_network is None and critic is None):
        raise TypeError(f"{owner}: Missing positional arguments actor_network or critic_network.")
