"""Robust Policy Optimization: ``RPOLoss``, :class:`rlloss.ClipPPOLoss` whose policy location
is perturbed by uniform noise in every forward.

Rahman & Xue, "Robust Policy Optimization in Deep Reinforcement Learning", arXiv:2212.07536: the
clipped surrogate of PPO plus the perturbation (CleanRL's ``rpo_continuous_action.py`` is a copy
of its PPO file with five new lines; here it is the subclass that adds them).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._keywords import NOT_GIVEN, NotGiven
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.onpolicy.ppo import ClipPPOLoss

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class RPOLoss(ClipPPOLoss):
    r"""Robust Policy Optimization: ClipPPOLoss whose new-policy location gets fresh uniform
    noise in every forward, per element:

    $$
    \mu \rightarrow \mu + z, \qquad z \sim U(-\alpha_{\text{rpo}}, \alpha_{\text{rpo}})
    $$

    Rahman & Xue, "Robust Policy Optimization in Deep Reinforcement Learning", arXiv:2212.07536;
    CleanRL's ``rpo_continuous_action.py``. The ratio uses the unperturbed log-prob stored at
    collection; the noise reaches the new log-prob and the entropy only. ``rpo_alpha=0`` is
    ClipPPOLoss exactly.

    Args:
        rpo_alpha: noise half-width (a buffer). CleanRL's default 0.5; 0.01 is advised for some
            MuJoCo tasks.
        noise_in_actor: instead of perturbing the location itself, write ``rpo_alpha`` into the
            batch (``[*B, 1]`` under ``tensor_keys.rpo_alpha``) for an actor that reads it and
            applies the noise (skrl's style).

    The other keywords are as :class:`ClipPPOLoss`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import RPOLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(
        ...         torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
        ...         ["observation"],
        ...         ["loc", "scale"],
        ...     ),
        ...     ["loc", "scale"],
        ...     distribution_class=TanhNormal,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     observation=torch.randn(8, 3),
        ...     action=torch.rand(8, 1) * 1.8 - 0.9,
        ...     action_log_prob=torch.zeros(8),
        ...     advantage=torch.randn(8, 1),
        ...     value_target=torch.randn(8, 1),
        ...     batch_size=[8],
        ... )
        >>> loss = RPOLoss(actor, critic, rpo_alpha=0.5)
        >>> out = loss(batch)  # the mean perturbed by U(-0.5, 0.5) noise before the log-probability
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(ClipPPOLoss._AcceptedKeys):
        """Keys read by RPOLoss: those of the PPO losses, and ``rpo_alpha``."""

        rpo_alpha: NestedKey = "rpo_alpha"  # written for actors that add the noise, [*B, 1]

    rpo_alpha = Coefficient(low=0.0, buffer=True)

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        rpo_alpha: float = 0.5,
        noise_in_actor: bool = False,
        clip_epsilon: float | tuple[float, float] = 0.2,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float | dict[NestedKey, float] | None = None,
        critic_coeff: float | None = None,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        normalize_advantage_exclude_dims: tuple[int, ...] = (),
        advantage_norm: nn.Module | None = None,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        clip_value: bool | float | None = None,
        delay_actor: bool = False,
        max_importance_ratio: float | None = None,
        device: torch.device | str | None = None,
        log_explained_variance: bool = True,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        entropy_coef: NotGiven = NOT_GIVEN,
        critic_coef: NotGiven = NOT_GIVEN,
        diagnostics: bool = True,
        vf_clip_param: float | None = None,
        policy_loss_addons: list | None = None,
        value_normalizer: ValueNormalizer | None = None,
        normalize_advantage_global: bool = False,
        process_group: ProcessGroup | None = None,
        dual_clip: float | None = None,
    ) -> None:
        super().__init__(
            actor_network,
            critic_network,
            clip_epsilon=clip_epsilon,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            critic_coeff=critic_coeff,
            loss_critic_type=loss_critic_type,
            normalize_advantage=normalize_advantage,
            normalize_advantage_exclude_dims=normalize_advantage_exclude_dims,
            advantage_norm=advantage_norm,
            gamma=gamma,
            separate_losses=separate_losses,
            reduction=reduction,
            clip_value=clip_value,
            delay_actor=delay_actor,
            max_importance_ratio=max_importance_ratio,
            device=device,
            log_explained_variance=log_explained_variance,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            value_key=value_key,
            functional=functional,
            actor=actor,
            critic=critic,
            entropy_coef=entropy_coef,
            critic_coef=critic_coef,
            diagnostics=diagnostics,
            vf_clip_param=vf_clip_param,
            policy_loss_addons=policy_loss_addons,
            value_normalizer=value_normalizer,
            normalize_advantage_global=normalize_advantage_global,
            process_group=process_group,
            dual_clip=dual_clip,
        )
        self._register_coefficients(self.entropy_coeff.device, rpo_alpha=rpo_alpha)
        self.noise_in_actor = noise_in_actor
        if not noise_in_actor:
            keys = self._actor_call.parameter_keys if self._actor_call.head is not None else {}
            if "loc" not in keys or not self._actor_call.splittable:
                raise TypeError(
                    "RPOLoss perturbs the 'loc' parameter of a TorchRL ProbabilisticActor whose "
                    "last module builds a location-scale distribution (e.g. IndependentNormal or "
                    "TanhNormal); this actor's distribution has no 'loc' built that way (a "
                    "categorical policy has logits: RPO's noise is defined for continuous "
                    "actions). For another actor pass "
                    "noise_in_actor=True and apply the noise in the actor."
                )
            self._loc_key = keys["loc"]

    def _distribution(self, batch: TensorDictBase) -> D.Distribution:
        if self.noise_in_actor:
            batch = batch.copy()
            batch.set(self.tensor_keys.rpo_alpha, self.rpo_alpha.expand(*batch.batch_size, 1))
            return self._actor_call(batch)

        def perturb(params: dict) -> dict:
            return {
                **params,
                self._loc_key: rlf.rpo_perturbation(params[self._loc_key], self.rpo_alpha),
            }

        return self._actor_call(batch, perturb)
