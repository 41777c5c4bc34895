"""Multi-agent PPO: ``MAPPOLoss`` (a centralised critic) and ``IPPOLoss`` (one critic per
agent), :class:`rlloss.ClipPPOLoss` with multi-agent defaults, as TorchRL's classes of the same
names are.

Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games",
arXiv:2103.01955 (MAPPO, with its value normalisation); de Witt et al., "Is Independent Learning
All You Need in the StarCraft Multi-Agent Challenge?", arXiv:2011.09533 (IPPO).
"""

from __future__ import annotations

import torch
from torch import nn
from torchrl.objectives.utils import ValueEstimators

from rlloss.onpolicy.advantage import check_value_norm
from rlloss.onpolicy.ppo import ClipPPOLoss


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
      targets, then regresses the normalised prediction onto the normalised target (and clips
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
        normalize_advantage: as ``entropy_coeff``.
        normalize_advantage_exclude_dims: as ``entropy_coeff``.

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
        entropy_coeff: float | dict = 0.01,
        normalize_advantage: bool = True,
        normalize_advantage_exclude_dims: tuple[int, ...] = (-2,),
        **kwargs,
    ) -> None:
        super().__init__(
            actor_network,
            critic_network,
            entropy_coeff=entropy_coeff,
            normalize_advantage=normalize_advantage,
            normalize_advantage_exclude_dims=normalize_advantage_exclude_dims,
            **kwargs,
        )
        check_value_norm(type(self).__name__, "value_norm", value_norm, ("update", "normalize"))
        self.value_norm = value_norm  # a submodule: its statistics are in state_dict

    def _critic_inputs(
        self, target: torch.Tensor, value: torch.Tensor, old_value: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The critic regression in ``value_norm``'s units, its statistics first updated with
        the (real-scale) value targets, as TorchRL's ``_critic_loss_inputs``."""
        target, value, old_value = super()._critic_inputs(target, value, old_value)
        norm = self.value_norm
        if norm is None:
            return target, value, old_value
        norm.update(target)
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
