"""TD3+BC: ``TD3BCLoss`` (Fujimoto & Gu, "A Minimalist Approach to Offline Reinforcement
Learning", arXiv:2106.06860), on TD3's steps (``TwinDelayedLoss``, ``offpolicy/td3.py``): TD3's
critic, and its own actor loss."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import TensorSpec

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss.addons import ActorOutput
from rlloss.offpolicy.td3 import TwinDelayedLoss


class TD3BCLoss(TwinDelayedLoss):
    r"""TD3+BC (Fujimoto & Gu, "A Minimalist Approach to Offline Reinforcement Learning",
    arXiv:2106.06860): TD3's critic, and an actor that also imitates the dataset
    (:func:`rlloss.functional.td3_bc_actor_loss`):

    $$
    \mathcal{L}_{\text{actor}} = -\lambda \frac{1}{N} \sum Q_1(s, \mu(s))
    + \frac{1}{N} \sum \big(\mu(s) - a\big)^2, \qquad
    \lambda = \frac{\alpha}{\frac{1}{N} \sum |Q_1(s, \mu(s))|}
    $$

    TorchRL's ``TD3BCLoss`` with the same keywords and outputs: :class:`rlloss.TD3Loss`'s, plus
    ``bc_loss`` and ``lmbd``; ``state_action_value_actor`` is ``Q_1(s, mu(s))``, ``[*B]``, as
    TorchRL's (only ``Q_1`` is evaluated for the actor, as in :class:`rlloss.TD3Loss`).

    Args:
        alpha: the weight of the RL term, > 0 (default 2.5, the paper's).

    The other keywords are as :class:`rlloss.TD3Loss`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ValueOperator
        >>> from rlloss import TD3BCLoss
        >>> actor = TensorDictModule(
        ...     torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh()),
        ...     ["observation"],
        ...     ["action"],
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
        >>> loss = TD3BCLoss(actor, qvalue, action_spec=Bounded(-1, 1, (1,)), alpha=2.5)
        >>> out = loss(batch)  # an offline batch: the dataset's actions
        >>> (out["loss_actor"] + out["loss_qvalue"]).backward()
    """

    alpha = Coefficient(low=0.0, low_open=True)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module | list[nn.Module],
        *,
        action_spec: TensorSpec | None = None,
        bounds: tuple[float, float] | None = None,
        num_qvalue_nets: int = 2,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        alpha: float = 2.5,
        loss_function: str = "smooth_l1",
        delay_actor: bool = True,
        delay_qvalue: bool = True,
        priority_key: NestedKey | None = None,
        separate_losses: bool = False,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        use_prioritized_weights: bool | str = "auto",
        gamma: float | None = None,
        priority_weighting: str = "mean",
        policy_loss_addons: list | None = None,
    ) -> None:
        super().__init__(
            actor_network,
            qvalue_network,
            action_spec=action_spec,
            bounds=bounds,
            num_qvalue_nets=num_qvalue_nets,
            policy_noise=policy_noise,
            noise_clip=noise_clip,
            loss_function=loss_function,
            delay_actor=delay_actor,
            delay_qvalue=delay_qvalue,
            gamma=gamma,
            priority_key=priority_key,
            separate_losses=separate_losses,
            reduction=reduction,
            deactivate_vmap=deactivate_vmap,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            policy_loss_addons=policy_loss_addons,
        )
        self._register_coefficients(alpha=alpha)

    @property
    def out_keys(self) -> list[str]:
        return [*super().out_keys, "bc_loss", "lmbd"]

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``-lambda Q_1(s, mu(s)) + BC`` reduced, and ``Q_1(s, mu(s))`` (``[*B]``), the BC
        term and ``lambda`` (detached)."""
        action = self._actor_call(tensordict)[self.tensor_keys.action]
        value = self._q_values(tensordict, action, detach=True, members=1)
        loss, bc_loss, lmbd = rlf.td3_bc_actor_loss(
            value[0], action, self._get(tensordict, "action"), self.alpha
        )
        info = {
            "state_action_value_actor": value[0].squeeze(-1).detach(),  # [*B], as TorchRL's
            "bc_loss": bc_loss.detach(),
            "lmbd": lmbd,
        }
        loss = self._reduce_replayed(loss, tensordict)
        return self._with_policy_addons(loss, tensordict, ActorOutput(action=action), info)

    actor_loss = loss_actor
    qvalue_loss = TwinDelayedLoss.loss_qvalue  # TorchRL's TD3BCLoss calls its critic loss this
