"""PPO with an adaptive KL penalty: ``KLPENPPOLoss``, :class:`rlloss.PPOLoss` whose surrogate
is penalised by ``beta KL(pi_old || pi)``, beta adapted to a target KL.

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347, section 4. A
``PPOLoss`` as TorchRL's ``KLPENPPOLoss`` is, so that ``isinstance`` holds as it does there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase
from tensordict.nn import CompositeDistribution
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._keywords import NOT_GIVEN, NotGiven
from rlloss._networks import sum_heads
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.onpolicy.ppo import PPOLoss, SurrogateInputs
from rlloss.training.distributed import all_mean

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class KLPENPPOLoss(PPOLoss):
    r"""PPO with an adaptive KL penalty.

    $$
    \mathcal{L}_{\text{objective}} = -\frac{1}{N} \sum_i \Big(r_i A_i -
    \beta \, \mathrm{KL}\big(\pi_{\text{old}}(\cdot \mid s_i) \,\|\,
    \pi_\theta(\cdot \mid s_i)\big)\Big)
    $$

    Schulman et al., arXiv:1707.06347, section 4. ``KL(pi_old || pi)`` is analytic when the
    distribution family has a closed form, computed from the distribution parameters the batch
    stores (``loc``/``scale``, ``logits``), else a Monte-Carlo estimate with ``samples_mc_kl``
    draws. After the loss is built, beta adapts (in training mode, with grad enabled, when
    ``adaptive_beta``): ``mean KL > 1.5 dtarg -> beta *= increment``, ``mean KL < dtarg / 1.5 ->
    beta *= decrement``, clamped to ``[beta_min, beta_max]``. Outputs add ``kl`` (mean KL) and
    ``beta`` (the value the loss used).

    Data-parallel training: with a ``process_group``, or the default group when
    ``torch.distributed`` is initialised, the KL that adapts beta (in the forward and in
    :meth:`update_beta`) is the mean of the ranks' mean KLs (an all-reduce on the device, no host
    sync), so beta stays equal on every rank; ``kl`` in the output stays this rank's.

    Args:
        dtarg: target KL. beta: initial beta (a buffer, in ``state_dict``).
        increment: the factor on beta when the KL is high (``>= 1``).
        decrement: the factor on beta when the KL is low (``<= 1``).
        samples_mc_kl: draws of the Monte-Carlo KL.
        adaptive_beta: adapt beta in each forward; with ``False`` call :meth:`update_beta`
            yourself (e.g. once per epoch with the epoch's mean KL).
        beta_min: an optional lower bound on beta.
        beta_max: an optional upper bound on beta.

    The other keywords are as :class:`PPOLoss`.

    Differences from TorchRL: TorchRL multiplies beta in place after building ``beta * KL``, so
    the backward pass sees the updated beta while the reported loss used the old one; here the
    gradient is that of the reported loss. TorchRL also adapts beta under ``torch.no_grad()`` and
    in eval mode, and with a host sync (``if kl.mean() > ...``); rlloss's update is a
    ``torch.where`` on the buffer. TorchRL's ``kl`` output is per sample; rlloss's is the mean.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import KLPENPPOLoss
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
        ...     logits=torch.zeros(8, 2),
        ...     advantage=torch.randn(8, 1),
        ...     value_target=torch.randn(8, 1),
        ...     batch_size=[8],
        ... )
        >>> loss = KLPENPPOLoss(actor, critic, dtarg=0.01, beta=1.0)
        >>> out = loss(batch)  # batch holds the logits (or loc/scale) of the collecting policy
        >>> out["loss_objective"].backward()
        >>> print(out["beta"], out["kl"])
    """

    beta = Coefficient(low=0.0, buffer=True)
    dtarg = Coefficient(low=0.0, low_open=True)
    increment = Coefficient(low=1.0)
    decrement = Coefficient(low=0.0, high=1.0, low_open=True)
    samples_mc_kl = Coefficient(low=1, integer=True)
    beta_min = Coefficient(low=0.0, at_most="beta_max")  # None: unbounded; checked on assignment
    beta_max = Coefficient(low=0.0, at_least="beta_min")  # too, beta_min <= beta_max included
    _surrogate_keys = ("kl", "beta")

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        dtarg: float = 0.01,
        beta: float = 1.0,
        increment: float = 2.0,
        decrement: float = 0.5,
        samples_mc_kl: int = 1,
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
        clip_value: float | None = None,
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
        adaptive_beta: bool = True,
        beta_min: float | None = None,
        beta_max: float | None = None,
    ) -> None:
        super().__init__(
            actor_network,
            critic_network,
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
        )
        self._register_coefficients(
            self.entropy_coeff.device,
            dtarg=dtarg,
            beta=beta,
            increment=increment,
            decrement=decrement,
            samples_mc_kl=samples_mc_kl,
        )
        if beta_min is not None and beta_max is not None and beta_min > beta_max:
            raise ValueError(f"beta_min ({beta_min}) must be <= beta_max ({beta_max}).")
        self._check_collecting_policy()
        self.adaptive_beta = adaptive_beta
        self.beta_min, self.beta_max = beta_min, beta_max
        self._beta_init = float(beta)

    def _check_collecting_policy(self) -> None:
        """KLPEN rebuilds the collecting policy from the parameters the batch stores: the actor
        must build its distribution from named parameters."""
        if self._actor_call.head is None:
            raise TypeError(
                "KLPENPPOLoss needs an actor ending in a ProbabilisticTensorDictModule (a TorchRL "
                "ProbabilisticActor) to rebuild the collecting policy from stored parameters."
            )

    def reset(self) -> None:
        """Restore the initial beta (TorchRL's ``reset``), in place."""
        self.beta.fill_(self._beta_init)

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(dict.fromkeys([*super().in_keys, *self._actor_call.parameter_keys.values()]))

    def _surrogate(self, inputs: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``r A - beta KL(pi_old || pi)``, ``[*B, 1]``, with the mean KL and the beta used;
        beta then adapts to the mean KL (in training mode, with grad enabled)."""
        surrogate, info = super()._surrogate(inputs)
        shape = inputs.advantage.shape[:-1]
        kl = self._kl_from_collecting_policy(inputs.batch, inputs.distribution, shape)
        kl = kl.unsqueeze(-1)
        beta = self.beta.clone()  # the beta of this loss, whatever the update below does
        mean_kl = rlf.reduce(kl.detach(), "mean", inputs.mask)
        if self.adaptive_beta and self.training and torch.is_grad_enabled():
            self._adapt_beta(mean_kl)  # a 0-d tensor of beta's dtype and device already
        objective = rlf.kl_penalized_surrogate(surrogate, kl, beta)
        return objective, {**info, "kl": mean_kl, "beta": beta}

    def _kl_from_collecting_policy(
        self, batch: TensorDictBase, distribution: D.Distribution, shape=None
    ) -> torch.Tensor:
        """``KL(pi_old || pi)``, ``[*B]``, ``pi_old`` rebuilt from the stored parameters (the
        proximal policy with ``delay_actor``); summed over the heads of a composite
        distribution, to ``shape`` (the advantage's; default ``[*B]``)."""
        previous = (
            self._actor_call.stored(batch) if self._proximal is None else self._proximal(batch)
        )
        if not isinstance(distribution, CompositeDistribution):
            return rlf.kl_divergence(previous, distribution, self.samples_mc_kl)
        return sum(
            sum_heads(
                rlf.kl_divergence(previous.dists[name], head, self.samples_mc_kl),
                batch.batch_size if shape is None else shape,
            )
            for name, head in distribution.dists.items()
        )

    @torch.no_grad()
    def update_beta(self, kl: float | torch.Tensor) -> torch.Tensor:
        """Adapt beta to a mean KL (a float or a one-element tensor), averaged over the ranks of
        the process group if there is one, without a host sync."""
        kl = torch.as_tensor(kl, dtype=self.beta.dtype, device=self.beta.device).reshape(())
        return self._adapt_beta(kl)

    def _adapt_beta(self, kl: torch.Tensor) -> torch.Tensor:
        """:meth:`update_beta` of a 0-d tensor of beta's dtype and device, without gradient
        (``kl`` is detached and beta a buffer: no ``no_grad`` needed)."""
        if self.beta.requires_grad and torch.is_grad_enabled():  # a parameter: no graph either
            with torch.no_grad():
                return self._adapt_beta(kl)
        kl = all_mean(kl, self.process_group)
        beta, bounds = self.beta, (self.beta_min, self.beta_max)
        up, down = self.increment, self.decrement
        return beta.copy_(rlf.adaptive_kl_beta(beta, kl, self.dtarg, up, down, *bounds))
