"""PPO losses: ``PPOLoss`` (unclipped surrogate) and ``ClipPPOLoss`` (clipped, dual clip).

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347. The modules read
keys, call :mod:`rlloss.functional` and write ``loss_*`` entries plus detached diagnostics;
summing every ``loss_*`` entry gives the training objective.

This module holds what the PPO family shares: the policy's log-ratio to the proximal policy
(:meth:`PPOLoss._policy`) and the surrogate hook, which takes a :class:`SurrogateInputs` record.
:class:`rlloss.KLPENPPOLoss` (``onpolicy/klpen.py``) and :class:`rlloss.RPOLoss`
(``onpolicy/rpo.py``) build on these two classes, as MAPPO and IPPO do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._keywords import NOT_GIVEN, NotGiven
from rlloss._networks import as_list, stored_log_prob, sum_heads
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.onpolicy.base import OnPolicyLoss, as_scalar_output

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class SurrogateInputs(NamedTuple):
    """What a PPO surrogate reads (:meth:`PPOLoss._surrogate`), shapes ``[*B, 1]`` unless said.

    The clipped surrogate reads the ratios, the advantage and the mask; KLPEN's penalty also
    the batch (the collecting policy's stored parameters) and the current policy.
    """

    log_ratio: torch.Tensor  # log pi(a|s) - log pi_prox(a|s), the ratio that is clipped
    log_weight: torch.Tensor | None  # log(pi_prox / pi_behav); None where it is 0
    advantage: torch.Tensor  # A(s, a), normalised as asked
    mask: torch.Tensor | None  # the valid steps of a padded batch, [*B]; None: all
    batch: TensorDictBase  # the batch the loss reads
    distribution: D.Distribution  # the current policy pi(.|s)

    @property
    def behaviour_log_ratio(self) -> torch.Tensor:
        """``log pi(a|s) - log pi_behav(a|s)``: ``log_ratio + log_weight``."""
        return self.log_ratio if self.log_weight is None else self.log_ratio + self.log_weight


class PPOLoss(OnPolicyLoss):
    r"""PPO with the plain importance-weighted surrogate ``r A`` (no clipping, no penalty).

    $$
    \mathcal{L}_{\text{objective}} = -\frac{1}{N} \sum_i r_i A_i, \qquad
    r_i = \frac{\pi_\theta(a_i \mid s_i)}{\pi_{\text{old}}(a_i \mid s_i)}
    $$

    $$
    \mathcal{L}_{\text{entropy}} = -c_H \frac{1}{N} \sum_i H[\pi_\theta(\cdot \mid s_i)],
    \qquad
    \mathcal{L}_{\text{critic}} = c_V \frac{1}{N} \sum_i L\big(V(s_i), \hat{V}_i\big)
    $$

    with $c_H$ = ``entropy_coeff``, $c_V$ = ``critic_coeff``, $\hat{V}$ the ``value_target``
    and $L$ the ``loss_critic_type`` distance, optionally value-clipped.

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

    def _surrogate(self, inputs: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-element surrogate objective (to maximise, ``[*B, 1]``) and its diagnostics:
        ``r A`` with the behaviour ratio ``r = pi / pi_behav``."""
        return rlf.surrogate(inputs.behaviour_log_ratio, inputs.advantage), {}

    def _objective(self, batch, advantage, mask):
        distribution, log_ratio, log_weight = self._policy(batch, advantage.shape[:-1])
        inputs = SurrogateInputs(log_ratio, log_weight, advantage, mask, batch, distribution)
        surrogate, out = self._surrogate(inputs)
        out["loss_objective"] = as_scalar_output(
            rlf.reduce(-surrogate, self.reduction, mask), self.reduction
        )
        if self.diagnostics:
            log_ratio = log_ratio.detach()
            out["kl_approx"] = rlf.reduce(-log_ratio, "mean", mask)
            out["kl_k3"] = rlf.reduce(rlf.kl_k3(log_ratio), "mean", mask)
        return distribution, out


class ClipPPOLoss(PPOLoss):
    r"""PPO with the clipped surrogate, optionally dual-clipped.

    $$
    \mathcal{L}_{\text{objective}} = -\frac{1}{N} \sum_{i} \min\left(r_i A_i,\;
    \operatorname{clip}(r_i, 1 - \epsilon_{\text{low}}, 1 + \epsilon_{\text{high}}) A_i\right),
    \qquad r_i = \frac{\pi_\theta(a_i \mid s_i)}{\pi_{\text{old}}(a_i \mid s_i)}
    $$

    (``loss_objective``), the ratio clipped in log space as TorchRL does; with
    ``dual_clip=c`` the objective of samples with $A_i < 0$ is bounded by $c A_i$
    (Ye et al., arXiv:1912.09729). Diagnostics:
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
        self._register_clip_epsilon(clip_epsilon, asymmetric)
        self._register_coefficients(self.entropy_coeff.device, dual_clip=dual_clip)

    def _register_clip_epsilon(self, clip_epsilon, asymmetric: bool) -> None:
        """The clip buffers: ``clip_epsilon``, or ``clip_epsilon_low`` and ``clip_epsilon_high``
        for a ``(low, high)`` pair."""
        device = self.entropy_coeff.device
        self._asymmetric_clip = asymmetric
        if not asymmetric:
            self._register_coefficients(device, clip_epsilon=clip_epsilon)
            return
        if len(clip_epsilon) != 2:
            raise ValueError(
                "clip_epsilon must be a float or a (low, high) pair of length 2, got "
                f"{clip_epsilon}."
            )
        ClipPPOLoss.clip_epsilon_low.check(clip_epsilon[0], "clip_epsilon[0]")
        ClipPPOLoss.clip_epsilon_high.check(clip_epsilon[1], "clip_epsilon[1]")
        low, high = clip_epsilon
        self._register_coefficients(device, clip_epsilon_low=low, clip_epsilon_high=high)

    def _log_clip_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``log(1 - eps_low), log(1 + eps_high)`` from the clip buffers."""
        if self._asymmetric_clip:
            return rlf.clip_bounds(self.clip_epsilon_low, self.clip_epsilon_high)
        return rlf.clip_bounds(self.clip_epsilon, self.clip_epsilon)

    def _surrogate(self, inputs: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped (and dual-clipped) surrogate, ``[*B, 1]``, and its diagnostics."""
        low, high = self._log_clip_bounds()
        log_ratio, mask = inputs.log_ratio, inputs.mask
        surrogate = rlf.clipped_surrogate(
            log_ratio, inputs.advantage, low, high, self.dual_clip, inputs.log_weight
        )
        if not self.diagnostics:
            return surrogate, {}
        with torch.no_grad():  # the clipped ratio's fraction; the behaviour ratio's statistics
            behaviour = inputs.behaviour_log_ratio
            ratio = behaviour.exp()
            info = {
                "clip_fraction": rlf.reduce(rlf.clipped(log_ratio, low, high), "mean", mask),
                "ESS": rlf.normalized_effective_sample_size(behaviour.squeeze(-1), mask, dim=0),
                "max_ratio": rlf.reduce(ratio, "max", mask),
                "mean_ratio": rlf.reduce(ratio, "mean", mask),
            }
        return surrogate, info
