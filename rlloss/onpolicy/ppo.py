"""PPO losses: ``PPOLoss`` (unclipped surrogate) and ``ClipPPOLoss`` (clipped, dual clip).

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347. The modules read
keys, call :mod:`rlloss.functional` and write ``loss_*`` entries plus detached diagnostics;
summing every ``loss_*`` entry gives the training objective.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.nn import CompositeDistribution
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._keywords import NOT_GIVEN, NotGiven
from rlloss._networks import as_list, stored_log_prob, sum_heads
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.onpolicy.base import OnPolicyLoss, as_scalar_output
from rlloss.onpolicy.constants import KLAdaptationConstants, LogClipBounds
from rlloss.training.distributed import all_mean

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class PPOLoss(OnPolicyLoss):
    """PPO with the plain importance-weighted surrogate ``r A`` (no clipping, no penalty).

    ``loss_objective = -mean(r A)`` with ``r = pi(a|s) / pi_old(a|s)``, ``loss_entropy =
    -entropy_coeff * mean(H[pi(.|s)])`` and ``loss_critic = critic_coeff * mean(L(V(s),
    value_target))``, ``L`` the ``loss_critic_type`` distance, optionally value-clipped.

    Args:
        actor_network: a TorchRL ``ProbabilisticActor`` (anything with ``get_dist(td)``).
        critic_network: a module writing ``state_value`` (a TorchRL ``ValueOperator``); may be
            ``None`` when ``critic_coeff`` is ``None`` or 0 and the batch carries advantages.
        entropy_bonus: add ``loss_entropy``.
        samples_mc_entropy: samples of the Monte-Carlo entropy estimate, used when the
            distribution has no closed-form entropy (e.g. TanhNormal).
        entropy_coeff: entropy weight, 0.01 by default (``None``); a buffer:
            ``loss.entropy_coeff = x`` is in place. A map head -> weight for a composite action.
        log_explained_variance: report ``explained_variance`` of the critic (variances over the
            batch's first dim, as TorchRL's: ``[1]`` for ``[B, 1]`` values, ``[T, 1]`` for ``[B, T,
            1]``, ``[n_agents, 1]`` for per-agent values ``[B, n_agents, 1]``).
        diagnostics: compute and report the detached diagnostics (``kl_approx``, ``kl_k3``,
            ``clip_fraction``, ``ESS``, ``max_ratio``, ``mean_ratio``, ``entropy``,
            ``explained_variance``, ``value_clip_fraction``). ``False`` leaves the losses
            only (plus what the loss itself needs, as KLPEN's ``kl`` and ``beta``): the same
            losses and gradients, less work per update at small batches. Not a TorchRL
            keyword (TorchRL has ``log_explained_variance`` only).
        critic_coeff: critic weight, default 1.0 when a critic is given (a buffer).
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"``.
        normalize_advantage: standardise the advantage over the (valid part of the) batch.
        separate_losses: the critic loss sends no gradient into parameters it shares with the
            actor.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        clip_value: value clipping radius (``None``: off).
        vf_clip_param: rl8's (RLlib's) option, another thing than ``clip_value``: the
            per-element critic loss is clamped to ``[0, vf_clip_param]`` before the reduction
            (``None``: off). Not a TorchRL keyword.
        functional: TorchRL's switch between functional parameters (``True``) and plain
            modules. rlloss always calls the networks directly (the same numbers); with
            ``True`` the loss exposes ``actor_network_params`` / ``critic_network_params`` (views
            of the networks' parameters, e.g. for optimizer groups) as TorchRL does, with
            ``False`` they are ``None``.
        device: where the coefficient buffers live (default: the actor's device).
        policy_loss_addons: extra terms on ``loss_objective`` (:mod:`rlloss.addons`, e.g.
            ``[BehaviorCloning(0.1, action_key=("expert", "action"))]``), each reported as
            ``addon_<name>``; they see the policy as the objective does (RPO's perturbed one).
        value_normalizer: an :class:`rlloss.ValueNormalizer` (skrl's value preprocessor): the
            critic outputs normalised values, the value estimator works on de-normalised ones
            and feeds the moments with the value targets, the critic regresses onto the
            normalised targets. Not a TorchRL keyword.
        normalize_advantage_global: with ``normalize_advantage``, take the mean and std over
            every rank's batch in data-parallel training (two all-reduces of detached moments,
            :func:`rlloss.training.distributed.global_standardize`) instead of this rank's; on
            one process the same numbers. Not a TorchRL keyword.
        process_group: the ``torch.distributed`` group that shares the adaptive state (KLPEN's
            beta, the global advantage normalisation); default: the default group when
            ``torch.distributed`` is initialised, else none. Not a TorchRL keyword.
        normalize_advantage_exclude_dims: dims of the advantage with their own statistics in
            ``normalize_advantage`` (``(-2,)``: one mean and std per agent of a ``[*B,
            n_agents, 1]`` advantage).
        advantage_norm: a TorchRL ``ValueNorm`` (``torchrl.modules.PopArtValueNorm``,
            ``RunningValueNorm``, ``PercentileValueNorm``...): the advantage is divided by its
            ``scale()``, not re-centred; in training mode, when the loss estimates the
            advantage itself, the norm is first updated with the value targets of the valid
            steps (call ``advantage_norm.update(value_target)`` yourself for precomputed
            advantages). Exclusive with ``normalize_advantage``.
        delay_actor: keep a target copy of the actor (``target_actor_network_params``, moved by
            ``SoftUpdate`` after each step: an exponential moving average of the policy) as the
            proximal policy: the ratio that is clipped (ClipPPO), penalised (KLPEN: the KL to
            it) and reported (``kl_approx``) is ``pi / pi_prox``, while the surrogate stays
            weighted by the behaviour ratio ``pi / pi_behav`` (PPO-EWMA, Hilton et al., "Batch
            size-invariance for policy optimization", arXiv:2110.00641). Needs
            ``functional=True``.
        max_importance_ratio: cap of the behaviour ratio ``pi / pi_behav``, applied by lifting
            the behaviour log-prob (:func:`rlloss.functional.capped_log_weight`), so capped
            samples keep a rescaled gradient (``None``: no cap; PPO-EWMA's code uses 100).
        gamma: TorchRL's removed keyword: a ``TypeError`` when given (pass it to
            ``make_value_estimator``).
        advantage_key: TorchRL's removed keyword: a ``RuntimeError`` when given
            (``set_keys(advantage=...)``).
        value_target_key: as ``advantage_key`` (``set_keys(value_target=...)``).
        value_key: as ``advantage_key`` (``set_keys(value=...)``).
        actor: TorchRL's alias of ``actor_network``.
        critic: TorchRL's alias of ``critic_network``.
        entropy_coef: removed by TorchRL v0.11 for ``entropy_coeff``: a ``TypeError`` whenever
            given.
        critic_coef: removed by TorchRL v0.11 for ``critic_coeff``: a ``TypeError`` whenever
            given.

    Padded sequence batches: where the batch holds ``tensor_keys.mask`` (TorchRL's
    ``("collector", "mask")``), every loss and diagnostic is reduced over valid steps only.

    Differences from TorchRL: a batch without ``("next", "terminated")`` is refused instead of
    treating ``done`` as termination. ``advantage_norm`` with a padding mask selects the valid
    value targets by boolean indexing (a host sync, as TorchRL's); without one, no sync.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import PPOLoss
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
        >>> loss = PPOLoss(actor, critic)
        >>> out = loss(batch)  # batch holds advantage and value_target, or GAE runs first
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    """

    _diagnostic_keys: tuple[str, ...] = ("kl_approx", "kl_k3")  # dropped by diagnostics=False
    _surrogate_keys: tuple[str, ...] = ()  # what the surrogate always reports (KLPEN's beta)
    _heads_per_advantage = True  # composite heads summed to the advantage's shape (TorchRL's)

    def _objective_in_keys(self) -> list[NestedKey]:
        return as_list(self.tensor_keys.sample_log_prob)

    def _objective_out_keys(self) -> list[str]:
        diagnostics = self._diagnostic_keys if self.diagnostics else ()
        return ["loss_objective", *diagnostics, *self._surrogate_keys]

    def _policy(
        self, batch: TensorDictBase, shape: torch.Size
    ) -> tuple[D.Distribution, torch.Tensor, torch.Tensor | None]:
        """The current policy, the log-ratio to the proximal policy ``log pi(a|s) -
        log pi_prox(a|s)`` (``[*B, 1]``) and the log-weight ``log(pi_prox / pi_behav)`` that
        makes it the behaviour ratio (``[*B, 1]``, ``None`` when it is 0). The proximal policy
        is the behaviour policy (the stored log-prob), or with ``delay_actor`` the target copy
        of the actor; ``max_importance_ratio`` caps the behaviour ratio through the weight.
        A composite action's log-probs are summed over its heads to ``shape``, the advantage's
        (TorchRL's ``adv_shape``): per agent where the advantage is per agent."""
        behaviour = self._old_log_prob(batch, shape)
        distribution = self._distribution(batch)
        log_prob = self._log_prob(distribution, batch, shape)
        proximal, log_weight = behaviour, None
        if self._proximal is not None:
            proximal = self._log_prob(self._proximal(batch), batch, shape)
            log_weight = rlf.decoupled_log_weight(proximal, behaviour).unsqueeze(-1)
        log_ratio = rlf.log_ratio(log_prob, proximal).unsqueeze(-1)
        if self.max_importance_ratio is not None:
            log_weight = torch.zeros_like(log_ratio) if log_weight is None else log_weight
            log_weight = rlf.capped_log_weight(log_weight, log_ratio, self.max_importance_ratio)
        return distribution, log_ratio, log_weight

    def _old_log_prob(self, batch: TensorDictBase, shape=None) -> torch.Tensor:
        """``log pi_old(a|s)``, ``[*B]``: the stored entry, or the sum over the heads of a
        composite action (a list of keys, or an entry holding one log-prob per head), to
        ``shape`` (default ``[*B]``)."""
        keys = self._tensor_keys.sample_log_prob
        if isinstance(keys, list):
            return stored_log_prob(batch, keys, type(self).__name__, shape)
        log_prob = self._get(batch, "sample_log_prob")
        if type(log_prob) is torch.Tensor or not is_tensor_collection(log_prob):
            return log_prob
        return sum_heads(log_prob, batch.batch_size if shape is None else shape)

    def _surrogate(
        self,
        log_ratio: torch.Tensor,
        log_weight: torch.Tensor | None,
        advantage: torch.Tensor,
        mask: torch.Tensor | None,
        batch: TensorDictBase,
        distribution: D.Distribution,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-element surrogate objective (to maximise) and its diagnostics; the ratio is
        the behaviour ratio, ``log_ratio + log_weight``."""
        behaviour = log_ratio if log_weight is None else log_ratio + log_weight
        return rlf.surrogate(behaviour, advantage), {}

    def _objective(self, batch, advantage, mask):
        distribution, log_ratio, log_weight = self._policy(batch, advantage.shape[:-1])
        surrogate, out = self._surrogate(
            log_ratio, log_weight, advantage, mask, batch, distribution
        )
        out["loss_objective"] = as_scalar_output(
            rlf.reduce(-surrogate, self.reduction, mask), self.reduction
        )
        if self.diagnostics:
            log_ratio = log_ratio.detach()
            out["kl_approx"] = rlf.reduce(-log_ratio, "mean", mask)
            out["kl_k3"] = rlf.reduce(rlf.kl_k3(log_ratio), "mean", mask)
        return distribution, out


class ClipPPOLoss(PPOLoss):
    """PPO with the clipped surrogate, optionally dual-clipped.

    ``loss_objective = -mean(min(r A, clip(r, 1 - eps_low, 1 + eps_high) A))``, the ratio
    clipped in log space as TorchRL does; with ``dual_clip=c`` the objective of samples with
    ``A < 0`` is bounded by ``c A`` (Ye et al., arXiv:1912.09729). Diagnostics:
    ``clip_fraction``, ``kl_approx`` (``mean(log pi_old - log pi)``, TorchRL's), ``ESS``
    (normalised effective sample size of the behaviour ratios over the batch's first dim, as
    TorchRL's: one per time step, agent or action feature of a multi-dim batch, a scalar for a
    ``[B]`` one), ``max_ratio``, ``mean_ratio``, and
    ``entropy``, ``explained_variance``, ``value_clip_fraction`` as in :class:`PPOLoss`.

    Args:
        clip_epsilon: ``eps`` (symmetric) or ``(eps_low, eps_high)``.
        dual_clip: the dual-clip constant ``c > 1``, or ``None``.
        clip_value: value clipping radius; ``True`` uses ``clip_epsilon`` (symmetric only).

    The other keywords are as :class:`PPOLoss`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ClipPPOLoss
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
        >>> loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.0)
        >>> out = loss(batch)
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """

    clip_epsilon = Coefficient(low=0.0, high=1.0, low_open=True, high_open=True, buffer=True)
    clip_epsilon_low = Coefficient(low=0.0, high=1.0, low_open=True, high_open=True, buffer=True)
    clip_epsilon_high = Coefficient(low=0.0, low_open=True, buffer=True)
    dual_clip = Coefficient(low=1.0, low_open=True, buffer=True)  # None: no dual clip
    _diagnostic_keys = (
        *PPOLoss._diagnostic_keys,
        "clip_fraction",
        "ESS",
        "max_ratio",
        "mean_ratio",
    )

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
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
        asymmetric = isinstance(clip_epsilon, (tuple, list))
        if isinstance(clip_value, bool):
            if clip_value and asymmetric:
                raise ValueError(
                    "clip_value=True cannot take its radius from an asymmetric clip_epsilon "
                    "tuple; pass a float, e.g. clip_value=0.2."
                )
            clip_value = clip_epsilon if clip_value else None
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
        device = self.entropy_coeff.device
        self._asymmetric_clip = asymmetric
        if asymmetric:
            if len(clip_epsilon) != 2:
                raise ValueError(
                    "clip_epsilon must be a float or a (low, high) pair of length 2, got "
                    f"{clip_epsilon}."
                )
            ClipPPOLoss.clip_epsilon_low.check(clip_epsilon[0], "clip_epsilon[0]")
            ClipPPOLoss.clip_epsilon_high.check(clip_epsilon[1], "clip_epsilon[1]")
            low, high = clip_epsilon
            self._register_coefficients(device, clip_epsilon_low=low, clip_epsilon_high=high)
        else:
            self._register_coefficients(device, clip_epsilon=clip_epsilon)
        self._register_coefficients(device, dual_clip=dual_clip)
        self._clip_bounds = LogClipBounds()

    def _log_clip_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``log(1 - eps_low), log(1 + eps_high)`` from the clip buffers (kept between forwards
        while the buffers are unchanged, :class:`~rlloss.onpolicy.constants.LogClipBounds`)."""
        if self._asymmetric_clip:
            return self._clip_bounds(self.clip_epsilon_low, self.clip_epsilon_high)
        return self._clip_bounds(self.clip_epsilon, self.clip_epsilon)

    def _surrogate(self, log_ratio, log_weight, advantage, mask, batch, distribution):
        low, high = self._log_clip_bounds()
        surrogate = rlf.clipped_surrogate(
            log_ratio, advantage, low, high, self.dual_clip, log_weight
        )
        if not self.diagnostics:
            return surrogate, {}
        with torch.no_grad():  # the clipped ratio's fraction; the behaviour ratio's statistics
            behaviour = log_ratio if log_weight is None else log_ratio + log_weight
            ratio = behaviour.exp()
            info = {
                "clip_fraction": rlf.reduce(rlf.clipped(log_ratio, low, high), "mean", mask),
                "ESS": rlf.normalized_effective_sample_size(behaviour.squeeze(-1), mask, dim=0),
                "max_ratio": rlf.reduce(ratio, "max", mask),
                "mean_ratio": rlf.reduce(ratio, "mean", mask),
            }
        return surrogate, info


class KLPENPPOLoss(PPOLoss):
    """PPO with an adaptive KL penalty: ``loss_objective = -mean(r A - beta KL(pi_old || pi))``.

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
        if self._actor_call.head is None:
            raise TypeError(
                "KLPENPPOLoss needs an actor ending in a ProbabilisticTensorDictModule (a TorchRL "
                "ProbabilisticActor) to rebuild the collecting policy from stored parameters."
            )
        self.adaptive_beta = adaptive_beta
        self.beta_min, self.beta_max = beta_min, beta_max
        self._beta_init = float(beta)
        self._kl_constants = KLAdaptationConstants()

    def reset(self) -> None:
        """Restore the initial beta (TorchRL's ``reset``), in place."""
        self.beta.fill_(self._beta_init)

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(dict.fromkeys([*super().in_keys, *self._actor_call.parameter_keys.values()]))

    def _surrogate(self, log_ratio, log_weight, advantage, mask, batch, distribution):
        surrogate, info = super()._surrogate(
            log_ratio, log_weight, advantage, mask, batch, distribution
        )
        kl = self._kl_from_collecting_policy(batch, distribution, advantage.shape[:-1])
        kl = kl.unsqueeze(-1)
        beta = self.beta.clone()  # the beta of this loss, whatever the update below does
        mean_kl = rlf.reduce(kl.detach(), "mean", mask)
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
        (``kl`` is detached and beta a buffer: no ``no_grad`` frame on each forward)."""
        if self.beta.requires_grad and torch.is_grad_enabled():  # a parameter: no graph either
            with torch.no_grad():
                return self._adapt_beta(kl)
        kl = all_mean(kl, self.process_group)
        beta, bounds = self.beta, (self.beta_min, self.beta_max)
        up, down, thresholds = self._kl_constants(beta, self.dtarg, self.increment, self.decrement)
        return beta.copy_(rlf.adaptive_kl_beta(beta, kl, self.dtarg, up, down, *bounds, thresholds))


class RPOLoss(ClipPPOLoss):
    """Robust Policy Optimization: ClipPPOLoss whose new-policy location gets fresh uniform
    noise in every forward, ``mu -> mu + z``, ``z ~ U(-rpo_alpha, rpo_alpha)`` per element.

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

        rpo_alpha: NestedKey = "rpo_alpha"  # written for actors that apply the noise themselves

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
