"""Multi-agent PPO: ``MAPPOLoss`` (a centralised critic) and ``IPPOLoss`` (one critic per
agent), :class:`rlloss.ClipPPOLoss` with multi-agent defaults, as TorchRL's classes of the same
names are.

Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games",
arXiv:2103.01955 (MAPPO, with its value normalisation); de Witt et al., "Is Independent Learning
All You Need in the StarCraft Multi-Agent Challenge?", arXiv:2011.09533 (IPPO).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict.utils import NestedKey
from torch import nn
from torchrl.objectives.utils import ValueEstimators

from rlloss._keywords import torchrl_keywords
from rlloss.estimators.value_norm import ValueNormalizer
from rlloss.onpolicy.advantage import check_value_norm, update_value_norm
from rlloss.onpolicy.ppo import ClipPPOLoss

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class MAPPOLoss(ClipPPOLoss):
    """Multi-agent PPO with a centralised critic: :class:`rlloss.ClipPPOLoss` whose defaults
    suit per-agent data.

    - the value estimator is :class:`rlloss.MultiAgentGAE` (team rewards and done flags
      ``[*B, 1]`` broadcast along the agent dim of ``[*B, n_agents, 1]`` values);
    - ``normalize_advantage=True`` over ``normalize_advantage_exclude_dims=(-2,)``: one mean and
      std per agent;
    - ``entropy_coeff=0.01``;
    - ``value_norm``: an optional TorchRL ``ValueNorm`` (``PopArtValueNorm(shape=1)``, the
      paper's, or ``RunningValueNorm``): each critic loss first updates it with the value
      targets of the valid steps (a padded batch's padding does not move its statistics; the
      valid rows are selected by boolean indexing, a host sync, as ``advantage_norm``'s), then
      regresses the normalised prediction onto the normalised target (and clips
      around the normalised old value with ``clip_value``): the critic's loss keeps one scale
      while the returns grow (Yu et al., arXiv:2103.01955, Table 13).

    The critic is any module writing ``[*B, n_agents, 1]`` values, e.g. TorchRL's
    ``MultiAgentMLP(centralized=True)`` for MAPPO, ``centralized=False`` for IPPO.

    Args:
        actor_network: the per-agent policy and the critic (TorchRL's
            ``actor=`` / ``critic=`` aliases work too).
        critic_network: as ``actor_network``.
        value_norm: a TorchRL ``ValueNorm``, or ``None``.
        entropy_coeff: as
            :class:`rlloss.PPOLoss`, with the defaults above.
        clip_epsilon: as :class:`rlloss.ClipPPOLoss`.
        dual_clip: as ``clip_epsilon``.
        clip_value: as ``clip_epsilon``.
        entropy_bonus: as :class:`rlloss.PPOLoss`.
        samples_mc_entropy: as ``entropy_bonus``.
        critic_coeff: as ``entropy_bonus``.
        loss_critic_type: as ``entropy_bonus``.
        advantage_norm: as ``entropy_bonus``.
        separate_losses: as ``entropy_bonus``.
        reduction: as ``entropy_bonus``.
        delay_actor: as ``entropy_bonus``.
        max_importance_ratio: as ``entropy_bonus``.
        device: as ``entropy_bonus``.
        log_explained_variance: as ``entropy_bonus``.
        functional: as ``entropy_bonus``.
        diagnostics: as ``entropy_bonus``.
        vf_clip_param: as ``entropy_bonus``.
        policy_loss_addons: as ``entropy_bonus``.
        value_normalizer: as ``entropy_bonus``.
        normalize_advantage_global: as ``entropy_bonus``.
        process_group: as ``entropy_bonus``.
        gamma: TorchRL's removed keyword, refused with TorchRL's error (it goes to
            ``make_value_estimator``).
        advantage_key: TorchRL's removed keyword, refused as TorchRL does (``set_keys``).
        value_target_key: TorchRL's removed keyword, refused as TorchRL does (``set_keys``).
        value_key: TorchRL's removed keyword, refused as TorchRL does (``set_keys``).
        entropy_coef: TorchRL's removed keyword, refused with TorchRL's error.
        critic_coef: TorchRL's removed keyword, refused with TorchRL's error.
        normalize_advantage: as :class:`rlloss.PPOLoss`.
        normalize_advantage_exclude_dims: as :class:`rlloss.PPOLoss`.

    The other keywords are as :class:`rlloss.ClipPPOLoss`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MultiAgentMLP, ProbabilisticActor
        >>> from torchrl.modules.value_norm import PopArtValueNorm
        >>> from rlloss import MAPPOLoss
        >>> actor = ProbabilisticActor(  # 3 agents, 4 observations, 2 discrete actions each
        ...     TensorDictModule(
        ...         MultiAgentMLP(4, 2, 3, centralized=False, share_params=True),
        ...         [("agents", "observation")],
        ...         [("agents", "logits")],
        ...     ),
        ...     in_keys={"logits": ("agents", "logits")},
        ...     out_keys=[("agents", "action")],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = TensorDictModule(
        ...     MultiAgentMLP(4, 1, 3, centralized=True, share_params=True),
        ...     [("agents", "observation")],
        ...     [("agents", "state_value")],
        ... )
        >>> def agents():
        ...     return TensorDict(observation=torch.randn(8, 3, 4), batch_size=[8, 3])
        >>> batch = TensorDict(
        ...     {
        ...         "agents": agents(),
        ...         "next": {
        ...             "agents": agents(),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> with torch.no_grad():
        ...     actor(batch)  # the collection: ("agents", "action") and its log-probability
        >>> loss = MAPPOLoss(actor, critic, value_norm=PopArtValueNorm(shape=1))
        >>> loss.set_keys(
        ...     value=("agents", "state_value"),
        ...     action=("agents", "action"),
        ...     sample_log_prob=("agents", "action_log_prob"),
        ... )
        >>> out = loss(batch)  # MultiAgentGAE runs first when the batch has no advantage
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """

    default_value_estimator = ValueEstimators.MAGAE

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        value_norm: nn.Module | None = None,
        entropy_coeff: float | dict[NestedKey, float] = 0.01,
        normalize_advantage: bool = True,
        normalize_advantage_exclude_dims: tuple[int, ...] = (-2,),
        clip_epsilon: float | tuple[float, float] = 0.2,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        critic_coeff: float | None = None,
        loss_critic_type: str = "smooth_l1",
        advantage_norm: nn.Module | None = None,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        clip_value: bool | float | None = None,
        delay_actor: bool = False,
        max_importance_ratio: float | None = None,
        device: torch.device | str | None = None,
        log_explained_variance: bool = True,
        advantage_key: str | None = None,
        value_target_key: str | None = None,
        value_key: str | None = None,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        entropy_coef: float | None = None,
        critic_coef: float | None = None,
        dual_clip: float | None = None,
        diagnostics: bool = True,
        vf_clip_param: float | None = None,
        policy_loss_addons: list | None = None,
        value_normalizer: ValueNormalizer | None = None,
        normalize_advantage_global: bool = False,
        process_group: ProcessGroup | None = None,
    ) -> None:
        translated = {
            "actor": actor,
            "critic": critic,
            "gamma": gamma,
            "advantage_key": advantage_key,
            "value_target_key": value_target_key,
            "value_key": value_key,
            "entropy_coef": entropy_coef,
            "critic_coef": critic_coef,
        }
        given = torchrl_keywords(
            self,
            {name: value for name, value in translated.items() if value is not None},
            accepted=(),
            translated=tuple(translated),
        )
        super().__init__(
            given.get("actor_network", actor_network),
            given.get("critic_network", critic_network),
            clip_epsilon=clip_epsilon,
            dual_clip=dual_clip,
            clip_value=clip_value,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            log_explained_variance=log_explained_variance,
            diagnostics=diagnostics,
            critic_coeff=critic_coeff,
            loss_critic_type=loss_critic_type,
            normalize_advantage=normalize_advantage,
            separate_losses=separate_losses,
            reduction=reduction,
            vf_clip_param=vf_clip_param,
            functional=functional,
            device=device,
            policy_loss_addons=policy_loss_addons,
            value_normalizer=value_normalizer,
            normalize_advantage_global=normalize_advantage_global,
            process_group=process_group,
            normalize_advantage_exclude_dims=normalize_advantage_exclude_dims,
            advantage_norm=advantage_norm,
            delay_actor=delay_actor,
            max_importance_ratio=max_importance_ratio,
        )
        check_value_norm(type(self).__name__, "value_norm", value_norm, ("update", "normalize"))
        self.value_norm = value_norm  # a submodule: its statistics are in state_dict

    def _critic_inputs(
        self,
        target: torch.Tensor,
        value: torch.Tensor,
        old_value: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The critic regression in ``value_norm``'s units, its statistics first updated with
        the (real-scale) value targets of the valid steps, as TorchRL's
        ``_critic_loss_inputs`` (which also folds in the padding)."""
        target, value, old_value = super()._critic_inputs(target, value, old_value, mask)
        norm = self.value_norm
        if norm is None:
            return target, value, old_value
        update_value_norm(norm, target, mask)
        old_value = None if old_value is None else norm.normalize(old_value)
        return norm.normalize(target.detach()), norm.normalize(value), old_value


class IPPOLoss(MAPPOLoss):
    """Independent PPO: :class:`MAPPOLoss` given a decentralised critic, one value per agent
    from its own observation (TorchRL's ``MultiAgentMLP(centralized=False)``); the same maths,
    keywords and defaults (de Witt et al., arXiv:2011.09533). ``value_norm`` is rarely used
    here.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MultiAgentMLP, ProbabilisticActor
        >>> from rlloss import IPPOLoss
        >>> actor = ProbabilisticActor(  # 3 agents, 4 observations, 2 discrete actions each
        ...     TensorDictModule(
        ...         MultiAgentMLP(4, 2, 3, centralized=False, share_params=True),
        ...         [("agents", "observation")],
        ...         [("agents", "logits")],
        ...     ),
        ...     in_keys={"logits": ("agents", "logits")},
        ...     out_keys=[("agents", "action")],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = TensorDictModule(
        ...     MultiAgentMLP(4, 1, 3, centralized=False, share_params=True),
        ...     [("agents", "observation")],
        ...     [("agents", "state_value")],
        ... )
        >>> def agents():
        ...     return TensorDict(observation=torch.randn(8, 3, 4), batch_size=[8, 3])
        >>> batch = TensorDict(
        ...     {
        ...         "agents": agents(),
        ...         "next": {
        ...             "agents": agents(),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> with torch.no_grad():
        ...     actor(batch)  # the collection: ("agents", "action") and its log-probability
        >>> loss = IPPOLoss(actor, critic)  # each agent's critic sees its own observation
        >>> loss.set_keys(
        ...     value=("agents", "state_value"),
        ...     action=("agents", "action"),
        ...     sample_log_prob=("agents", "action_log_prob"),
        ... )
        >>> out = loss(batch)  # MultiAgentGAE runs first when the batch has no advantage
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """
