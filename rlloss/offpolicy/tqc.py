"""Truncated quantile critics: ``TQCLoss`` (Kuznetsov et al., "Controlling Overestimation Bias
with Truncated Mixture of Continuous Distributional Quantile Critics", arXiv:2005.04269)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss.offpolicy.soft_actor_critic import ContinuousSoftActorCritic


class TQCLoss(ContinuousSoftActorCritic):
    r"""TQC's actor, critic and temperature losses: SAC with quantile critics.

    Each of the ``num_qvalue_nets`` critics outputs ``M`` atoms ``theta_n^m(s, a)`` (the last
    dim of ``state_action_value``, ``[*B, M]``). Critic: the target critics' ``N M`` atoms at
    ``(s', a')``, ``a' ~ pi(.|s')``, are pooled and sorted and the ``d N`` largest dropped
    (``d = top_quantiles_to_drop_per_net``, :func:`rlloss.functional.truncated_mixture_atoms`);
    the kept atoms give the targets $y_k$ and each critic is trained by the quantile Huber loss
    against all of them, summed over the critics (:func:`rlloss.functional.quantile_huber_loss`;
    arXiv:2005.04269):

    $$
    y_k = r + \gamma^n (1 - \text{terminated}) \big(z_{(k)} - \alpha \log \pi(a' \mid s')\big),
    \qquad
    \mathcal{L}_{\text{actor}} = \alpha \log \pi(\tilde{a} \mid s) -
    \frac{1}{N M} \sum_{n=1}^{N} \sum_{m=1}^{M} \theta_n^m(s, \tilde{a})
    $$

    (the critics get no gradient from the actor's loss). Temperature: SAC's. ``forward`` writes
    ``td_error`` (``max_n``
    of the mean ``|y_k - theta_n^m|`` over the atom pairs, ``[*B]``) into the batch.

    Args:
        actor_network: a ``ProbabilisticActor`` with a reparameterisable distribution.
        qvalue_network: a module writing ``state_action_value`` of shape ``[*B, M]``, or a list
            of ``num_qvalue_nets`` such modules.
        num_qvalue_nets: the number of critics ``N`` (default 5).
        top_quantiles_to_drop_per_net: ``d``, the pooled atoms dropped per critic (default 2;
            ``d N`` in all, fewer than ``N M``).

    The other keywords are as :class:`rlloss.SACLoss` (only TorchRL's TQC keywords); targets are
    one-step (n-step through ``steps_to_next_obs``): ``ValueEstimators.TD0`` only.

    Differences from TorchRL: those of :class:`rlloss.SACLoss` (``priority_weighting``
    defaults to the PER paper's mean, ``alpha`` and ``entropy`` come with ``reduction="none"``
    too, no ``safe_tanh`` clamp); ``skip_done_states`` changes no number: the actor runs at
    terminal next states too and their next value is discarded by ``terminated``, NaN-safe
    (TorchRL does not run it there, so its random stream differs).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import SoftUpdate, TQCLoss
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
        >>> quantile_critic = ValueOperator(
        ...     MLP(in_features=4, out_features=25, num_cells=[8]),
        ...     in_keys=["observation", "action"],
        ... )  # M = 25 atoms
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
        >>> loss = TQCLoss(
        ...     actor, quantile_critic, num_qvalue_nets=5, action_spec=Bounded(-1, 1, (1,))
        ... )
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> out = loss(batch)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    _one_step_targets_only = True  # the targets are per atom

    top_quantiles_to_drop_per_net = Coefficient(low=0, integer=True)  # on assignment too

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        num_qvalue_nets: int = 5,
        top_quantiles_to_drop_per_net: int = 2,
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: TensorSpec | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_qvalue: bool = True,
        separate_losses: bool = False,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        skip_done_states: bool = False,
        use_prioritized_weights: bool | str = "auto",
        scalar_output_mode: str | None = None,
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        drop = top_quantiles_to_drop_per_net
        if isinstance(drop, (int, float)) and drop < 0:  # TorchRL's words
            raise ValueError(
                f"TQCLoss: top_quantiles_to_drop_per_net must be greater than or equal to zero, "
                f"got {drop}."
            )
        TQCLoss.top_quantiles_to_drop_per_net.check(drop)
        super().__init__(
            actor_network,
            qvalue_network,
            num_qvalue_nets=num_qvalue_nets,
            alpha_init=alpha_init,
            min_alpha=min_alpha,
            max_alpha=max_alpha,
            action_spec=action_spec,
            fixed_alpha=fixed_alpha,
            target_entropy=target_entropy,
            delay_qvalue=delay_qvalue,
            separate_losses=separate_losses,
            reduction=reduction,
            deactivate_vmap=deactivate_vmap,
            skip_done_states=skip_done_states,
            use_prioritized_weights=use_prioritized_weights,
            scalar_output_mode=scalar_output_mode,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        self._register_coefficients(top_quantiles_to_drop_per_net=drop)

    # TorchRL's names for the critic loss and the target (actor_loss, alpha_loss: the base's)
    def qvalue_v2_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """TorchRL's name of :meth:`loss_qvalue`."""
        return self.loss_qvalue(tensordict)

    def compute_target(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The kept target atoms ``y_k`` (no gradient), ``[*B, N M - d N]``."""
        return self._soft_target(tensordict)

    def _q_values(self, batch: TensorDictBase, action: torch.Tensor, **kwargs) -> torch.Tensor:
        """``[num_qvalue_nets, *B, M]`` atoms of ``action`` at the batch's observations."""
        quantiles = super()._q_values(batch, action, **kwargs)
        if quantiles.ndim != batch.ndim + 2:
            raise RuntimeError(
                "TQCLoss: the critic must write one quantile dim after the batch dims "
                f"({tuple(batch.batch_size)}), got {self.tensor_keys.state_action_value!r} "
                f"of shape {tuple(quantiles.shape[1:])}."
            )
        return quantiles

    def _policy_value(self, values: torch.Tensor) -> torch.Tensor:
        """The mixture's mean ``1/(N M) sum_n sum_m theta_n^m``, ``[*B, 1]``: the actor sees
        every atom (only the critic's target is truncated)."""
        return values.mean((0, -1)).unsqueeze(-1)

    def _next_soft_value(
        self, next_values: torch.Tensor, next_log_prob: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        """The kept atoms of the pooled target mixture minus ``alpha log pi(a'|s')``,
        ``[*B, N M - d N]``."""
        num_quantiles = next_values.shape[-1]
        if self.top_quantiles_to_drop_per_net >= num_quantiles:
            raise ValueError(
                f"TQCLoss: top_quantiles_to_drop_per_net={self.top_quantiles_to_drop_per_net} "
                f"must be smaller than the critic's number of quantiles ({num_quantiles})."
            )
        dropped = self.top_quantiles_to_drop_per_net * self.num_qvalue_nets
        atoms = rlf.truncated_mixture_atoms(next_values, dropped)
        return rlf.soft_value(atoms, next_log_prob.unsqueeze(-1).expand_as(atoms), alpha)

    def _skip_done(self, tensordict: TensorDictBase, value: torch.Tensor) -> torch.Tensor:
        """Nothing to skip: a terminal next state's value is discarded by ``terminated``
        (NaN-safe) and a truncated one bootstraps."""
        return value

    def _soft_critic_loss(
        self, values: torch.Tensor, target: torch.Tensor, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, dict]:
        """``sum_n`` of each critic's quantile Huber loss against the target atoms, reduced,
        and ``td_error`` ``[*B]``."""
        target = target.expand(values.shape[0], *target.shape)
        loss = rlf.quantile_huber_loss(values, target).sum(0).unsqueeze(-1)
        td_error = rlf.quantile_td_error(values, target).max(0).values
        return self._reduce_replayed(loss, tensordict), {"td_error": td_error}
