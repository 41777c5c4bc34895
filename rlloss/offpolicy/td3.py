"""TD3: twin delayed deep deterministic policy gradient (Fujimoto et al., "Addressing Function
Approximation Error in Actor-Critic Methods", arXiv:1802.09477)."""

from __future__ import annotations

from rlloss.offpolicy.twin_delayed import TwinDelayedLoss


class TD3Loss(TwinDelayedLoss):
    r"""TD3's actor and critic losses.

    $$
    \mathcal{L}_{\text{qvalue}} = \sum_k L\big(Q_k(s, a),\, y\big), \qquad
    y = r + \gamma^n (1 - \text{terminated}) \min_k \bar{Q}_k(s', a'), \qquad
    \mathcal{L}_{\text{actor}} = -Q_1(s, \mu(s))
    $$

    $$
    a' = \operatorname{clip}\big(\bar{\mu}(s') + \operatorname{clip}(\epsilon, -c, c),\,
    a_{\text{low}}, a_{\text{high}}\big), \qquad \epsilon \sim N(0, \sigma^2)
    $$

    (target policy smoothing with $\sigma$ = ``policy_noise`` and $c$ = ``noise_clip``,
    clipped double Q; the critics get no gradient from the actor's loss). The Q networks are an
    ensemble of
    ``num_qvalue_nets`` evaluated in one ``vmap`` call. :meth:`loss_actor` and
    :meth:`loss_qvalue` can be called separately (delayed actor updates); ``forward`` returns
    both and writes ``td_error`` (max over the Q networks of the squared TD error, ``[*B]``)
    into the batch for prioritized replay.

    Reference: Fujimoto, van Hoof and Meger, "Addressing Function Approximation Error in
    Actor-Critic Methods", arXiv:1802.09477.

    Args:
        actor_network: a deterministic actor writing ``action`` (a TorchRL ``Actor``).
        qvalue_network: a module reading the observation and ``action`` and writing
            ``state_action_value``, or a list of ``num_qvalue_nets`` such modules (their weights
            kept; copies of a single module are re-initialised).
        action_spec: a TorchRL ``Bounded`` spec: the bounds of the smoothed target action
            (give it or ``bounds``, not both).
        bounds: ``(low, high)``, the same bounds given directly.
        num_qvalue_nets: as in TorchRL.
        policy_noise: as in TorchRL.
        noise_clip: as in TorchRL.
        loss_function: as in TorchRL.
        delay_actor: keep target copies (update them with ``SoftUpdate``).
        delay_qvalue: keep target copies (update them with ``SoftUpdate``).
        gamma: see :class:`rlloss.offpolicy.TDTargetLoss`.
        reduction: see :class:`rlloss.offpolicy.TDTargetLoss`.
        use_prioritized_weights: see :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_weighting: see :class:`rlloss.offpolicy.TDTargetLoss`.
        policy_loss_addons: see :class:`rlloss.offpolicy.TDTargetLoss`.
        separate_losses: see :class:`rlloss.offpolicy.TDTargetLoss`.
        priority_key: see :class:`rlloss.offpolicy.TDTargetLoss`.
        deactivate_vmap: see :class:`rlloss.offpolicy.TDTargetLoss`.

    Differences from TorchRL: the actor loss evaluates ``Q_1`` alone (TorchRL evaluates every Q
    network on ``mu(s)`` and keeps the first: the same loss and gradients for ``num_qvalue_nets``
    times the work), so ``state_action_value_actor`` is ``[1, *B]`` (TorchRL's
    ``[num_qvalue_nets, *B]``; index 0 is the same in both); copies of a single Q module are
    re-initialised with each layer's ``reset_parameters`` (TorchRL draws them uniformly between
    the original weights' min and max); ``priority_weighting`` defaults to the PER paper's mean;
    ``separate_losses`` is not supported.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ValueOperator
        >>> from rlloss import TD3Loss
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
        >>> loss = TD3Loss(actor, qvalue, action_spec=Bounded(-1, 1, (1,)), num_qvalue_nets=2)
        >>> for step in range(2):
        ...     critic_loss, _ = loss.loss_qvalue(batch)
        ...     if step % 2 == 0:  # the delayed policy update
        ...         actor_loss, _ = loss.loss_actor(batch)
    """
