"""Action-value targets: Q-learning, double Q-learning, clipped double-Q with target policy
smoothing (TD3), soft values and the categorical entropy (SAC, discrete SAC), expected SARSA.

Values are ``[*B, 1]`` (TorchRL's convention) and action values ``[*B, A]``; ensembles of Q
networks stack along a leading dim ``[E, *B, 1]``. Targets are built from target networks'
outputs: callers compute them under ``torch.no_grad()`` (the functions do not detach).
"""

from __future__ import annotations

import torch

from rlloss._checks import check_same_shape
from rlloss.functional.distributions import standard_normal_like

Scalar = float | torch.Tensor


def chosen_action_value(action_value: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``Q(s, a)`` of the taken action, ``[*B, 1]``.

    Args:
        action_value: ``[*B, A]`` Q-values of every action.
        action: one-hot (``[*B, A]``, any dtype) or an integer index (``[*B]`` or ``[*B, 1]``).
    """
    if action.shape == action_value.shape:
        # an integer or boolean one-hot multiplies as it is: type promotion keeps Q's dtype
        weight = action.to(action_value.dtype) if action.dtype.is_floating_point else action
        return (action_value * weight).sum(-1, keepdim=True)
    if action.shape == action_value.shape[:-1]:
        action = action.unsqueeze(-1)
    if action.shape != (*action_value.shape[:-1], 1) or action.dtype.is_floating_point:
        raise ValueError(
            f"action of shape {tuple(action.shape)} and dtype {action.dtype} matches neither a "
            f"one-hot action {tuple(action_value.shape)} nor an integer index "
            f"{tuple(action_value.shape[:-1])} for action values of shape "
            f"{tuple(action_value.shape)}."
        )
    try:
        return action_value.gather(-1, action)
    except (RuntimeError, IndexError) as error:  # CPU checks the range (CUDA asserts instead)
        raise ValueError(
            f"action index out of range: the action values have {action_value.shape[-1]} actions, "
            f"so indices must lie in [0, {action_value.shape[-1]}) (gather raised: {error}). "
            "Store the index of the action taken, or a one-hot action."
        ) from error


def greedy_value(action_value: torch.Tensor) -> torch.Tensor:
    r"""``max_a Q(s, a)``, ``[*B, 1]`` (the Q-learning bootstrap; Watkins, 1989). ``amax``: the
    value without the argmax (a tie shares the gradient, where ``max`` gives it to one action).

    $$
    y = \max_a Q(s, a)
    $$
    """
    return action_value.amax(-1, keepdim=True)


def double_q_value(
    online_action_value: torch.Tensor, target_action_value: torch.Tensor
) -> torch.Tensor:
    r"""``Q_target(s', argmax_a Q_online(s', a))``, ``[*B, 1]``: the online network picks the
    action, the target network evaluates it (van Hasselt et al., "Deep Reinforcement Learning with
    Double Q-learning", arXiv:1509.06461).

    $$
    y = \bar{Q}\big(s', \arg\max_{a} Q(s', a)\big)
    $$
    """
    check_same_shape(
        online_action_value=online_action_value, target_action_value=target_action_value
    )
    return target_action_value.gather(-1, online_action_value.argmax(-1, keepdim=True))


def clipped_double_q_value(ensemble_value: torch.Tensor) -> torch.Tensor:
    r"""``min_i Q_i(s', a')`` over the leading ensemble dim of ``[E, *B, 1]`` (Fujimoto et al.,
    "Addressing Function Approximation Error in Actor-Critic Methods", arXiv:1802.09477).

    $$
    y = \min_i Q_i(s', a')
    $$
    """
    return ensemble_value.min(0).values


def smoothed_target_action(
    action: torch.Tensor, noise_scale: Scalar, noise_clip: Scalar, low: Scalar, high: Scalar
) -> torch.Tensor:
    r"""TD3's target policy smoothing: ``clip(a + clip(eps, -c, c), low, high)``, ``eps ~ N(0,
    noise_scale^2)`` drawn per element (Fujimoto et al., arXiv:1802.09477, eq. 14).

    $$
    a' = \operatorname{clip}\big(a + \operatorname{clip}(\epsilon, -c, c),
    a_{\text{low}}, a_{\text{high}}\big),
    \qquad \epsilon \sim N(0, \sigma^2)
    $$
    """
    noise = (standard_normal_like(action) * noise_scale).clamp(-noise_clip, noise_clip)
    return torch.clamp(action + noise, low, high)


def soft_value(value: torch.Tensor, log_prob: torch.Tensor, alpha: Scalar) -> torch.Tensor:
    r"""SAC's soft state value ``V(s') = Q(s', a') - alpha log pi(a'|s')`` with ``a' ~ pi``
    (Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905, eq. 3).

    $$
    V(s') = Q(s', a') - \alpha \log \pi(a' \mid s'), \qquad a' \sim \pi(\cdot \mid s')
    $$

    Args:
        value: ``[*B, 1]`` Q-values of the sampled actions (already min over the ensemble).
        log_prob: ``[*B]`` or ``[*B, 1]`` log-probabilities of those actions.
    """
    if log_prob.shape == value.shape[:-1]:
        log_prob = log_prob.unsqueeze(-1)
    check_same_shape(value=value, log_prob=log_prob)
    return value - alpha * log_prob


def discrete_soft_value(
    action_value: torch.Tensor, log_probs: torch.Tensor, alpha: Scalar
) -> torch.Tensor:
    r"""Discrete SAC's exact soft value ``V(s') = sum_a pi(a|s') (Q(s', a) - alpha log pi(a|s'))``,
    ``[*B, 1]`` (Christodoulou, "Soft Actor-Critic for Discrete Action Settings",
    arXiv:1910.07207, eq. 9). Actions of probability 0 contribute 0.

    $$
    V(s') = \sum_a \pi(a \mid s') \big(Q(s', a) - \alpha \log \pi(a \mid s')\big)
    $$
    """
    check_same_shape(action_value=action_value, log_probs=log_probs)
    possible = log_probs > -torch.inf
    log_probs = torch.where(possible, log_probs, 0.0)
    terms = torch.where(possible, log_probs.exp() * (action_value - alpha * log_probs), 0.0)
    return terms.sum(-1, keepdim=True)


def categorical_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    r"""Entropy of a categorical policy, ``H(pi) = -sum_a pi(a) log pi(a)`` over the last dim
    (Shannon, 1948; the entropy term of discrete SAC, arXiv:1910.07207, eq. 9).

    $$
    H(\pi) = -\sum_a \pi(a) \log \pi(a)
    $$

    Actions of probability 0 (``log pi(a) = -inf``, as action masking produces) contribute 0 to
    the value and the gradient: the log-probs are masked before the arithmetic.

    Args:
        log_probs: ``[*B, A]`` normalised log-probabilities (e.g. ``logits.log_softmax(-1)``).

    Returns:
        ``[*B]`` the entropies.
    """
    possible = log_probs > -torch.inf
    log_probs = torch.where(possible, log_probs, 0.0)
    return -torch.where(possible, log_probs.exp() * log_probs, 0.0).sum(-1)


def temperature_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: Scalar
) -> torch.Tensor:
    r"""SAC's temperature loss ``-log(alpha) (log pi(a|s) + H_target)``, elementwise; only
    ``log_alpha`` gets gradient (arXiv:1812.05905, eq. 18, written in log alpha).

    $$
    \mathcal{L}_{\alpha} = -\log \alpha \,\big(\log \pi(a \mid s) + \bar{\mathcal{H}}\big)
    $$
    """
    return -log_alpha * (log_prob + target_entropy).detach()


def alpha_temperature_loss(
    alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: Scalar
) -> torch.Tensor:
    r"""SAC's temperature loss as the paper writes it, ``-alpha (log pi(a|s) + H_target)``,
    elementwise; only ``alpha`` gets gradient (arXiv:1812.05905, eq. 18; REDQ's, Chen et al.,
    arXiv:2101.05982, Algorithm 1). Its gradient in ``log alpha`` is ``alpha`` times that of
    :func:`temperature_loss`.

    $$
    \mathcal{L}_{\alpha} = -\alpha \big(\log \pi(a \mid s) + \bar{\mathcal{H}}\big)
    $$
    """
    return -alpha * (log_prob + target_entropy).detach()


def straight_through_clamp(x: torch.Tensor, low: Scalar | None, high: Scalar | None):
    """``clamp(x, low, high)`` in value with the identity's gradient (``x - x.detach() +
    clamp(x).detach()``, exactly the clamped value): a bounded temperature that still learns
    where the bound is active (TorchRL's REDQ ``log_alpha``)."""
    return x - x.detach() + x.detach().clamp(low, high)


def td3_bc_actor_loss(
    value: torch.Tensor, action: torch.Tensor, data_action: torch.Tensor, alpha: Scalar
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""TD3+BC's actor loss, elementwise: ``-lambda Q(s, pi(s)) + mean((pi(s) - a)^2)`` with
    ``lambda = alpha / mean|Q(s, pi(s))|`` (no gradient through ``lambda``): Fujimoto & Gu, "A
    Minimalist Approach to Offline Reinforcement Learning", arXiv:2106.06860, eq. 3. The
    behaviour-cloning term is the mean squared error over the batch and the action dims (a
    scalar added to every element), as in the paper's code and TorchRL.

    $$
    \mathcal{L} = -\lambda Q(s, \pi(s)) + \frac{1}{D} \sum_d \big(\pi(s)_d - a_d\big)^2, \qquad
    \lambda = \frac{\alpha}{\frac{1}{N} \sum |Q(s, \pi(s))|}
    $$

    Guard (not in the paper's code or TorchRL): ``mean|Q|`` is floored at the machine epsilon of
    ``value``'s dtype, so a critic whose outputs are all 0 (e.g. a zero-initialised last layer)
    gives a finite ``lambda`` and the behaviour-cloning loss, not ``inf * 0 = NaN``.

    Args:
        value: ``[*B, 1]`` ``Q(s, pi(s))``.
        action: ``[*B, A]`` the policy's action ``pi(s)``.
        data_action: ``[*B, A]`` the dataset's action ``a``.
        alpha: the weight of the RL term, > 0 (2.5 in the paper).

    Returns:
        ``(loss [*B, 1], bc_loss [], lambda [])``.
    """
    check_same_shape(action=action, data_action=data_action)
    bc_loss = (action - data_action).square().mean()
    scale = value.abs().mean().detach().clamp_min(torch.finfo(value.dtype).eps)
    lmbd = alpha / scale
    return -lmbd * value + bc_loss, bc_loss, lmbd


def cql_penalty(
    action_value: torch.Tensor,
    chosen_value: torch.Tensor,
    log_proposal: torch.Tensor | None = None,
    temperature: Scalar = 1.0,
) -> torch.Tensor:
    r"""CQL(H)'s conservative penalty ``T log sum_a exp(Q(s, a) / T) - Q(s, a_data)``, ``[*B, 1]``
    (Kumar et al., "Conservative Q-Learning for Offline Reinforcement Learning",
    arXiv:2006.04779, eq. 4 with the entropy regulariser: CQL(H)): it pushes down a soft maximum
    of the values and pushes up the dataset action's value.

    $$
    T \log \sum_a \exp\big(Q(s, a) / T\big) - Q(s, a_{\text{data}})
    $$

    Discrete actions (``log_proposal=None``): the sum runs over every action. Continuous actions:
    it is estimated by importance sampling from ``K`` actions ``a_k`` drawn from proposals of
    log-density ``log q(a_k)`` (uniform and policy actions, appendix F):
    ``T logsumexp_k((Q(s, a_k) - log q(a_k)) / T)``; the constant ``-log K`` of the average is
    left out, as in the authors' code.

    Args:
        action_value: ``[*B, A]`` Q-values of every action, or ``[*B, K]`` of ``K`` sampled ones.
        chosen_value: ``[*B, 1]`` the dataset action's value (:func:`chosen_action_value`).
        log_proposal: ``[*B, K]`` (broadcastable) log-densities of the sampled actions under the
            distributions they were drawn from; ``None`` for the exact sum.
        temperature: ``T`` > 0 (1 in the paper; the authors' ``temp``).
    """
    if log_proposal is not None:
        action_value = action_value - log_proposal
    if type(temperature) in (int, float) and temperature == 1:  # the paper's T: no scaling ops
        return torch.logsumexp(action_value, -1, keepdim=True) - chosen_value
    soft_maximum = temperature * torch.logsumexp(action_value / temperature, -1, keepdim=True)
    return soft_maximum - chosen_value


def expected_action_value(log_probs: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    r"""``Q(s, a) = sum_j z_j p_j(s, a)`` of a categorical return distribution, ``[*B, A]``.

    $$
    Q(s, a) = \sum_j z_j p_j(s, a)
    $$

    Args:
        log_probs: ``[*B, K, A]`` log-probabilities of the ``K`` atoms for every action.
        support: ``[K]`` the atoms ``z_j``.
    """
    return (log_probs.exp() * support.unsqueeze(-1)).sum(-2)


def categorical_projection(
    atoms: torch.Tensor, probs: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """Project the distribution putting ``probs`` on ``atoms`` onto a fixed, evenly spaced
    ``support``, ``[*B, K]`` (Bellemare et al., "A Distributional Perspective on Reinforcement
    Learning", arXiv:1707.06887, Algorithm 1).

    Each atom is clamped to ``[z_0, z_{K-1}]``, placed at ``b = (a - z_0) / dz`` and its mass
    split between the neighbours ``l = floor(b)`` and ``l + 1`` in proportions ``l + 1 - b`` and
    ``b - l`` (all of it on ``z_l`` when ``a`` is an atom of the support). Two ``scatter_add``
    over the last dimension: no loop over atoms, no host sync.

    Args:
        atoms: ``[*B, N]`` where the mass sits (for C51, ``r + gamma (1 - terminated) z``).
        probs: ``[*B, N]`` the mass of each atom.
        support: ``[K]`` evenly spaced, increasing, ``K >= 2``.
    """
    num_atoms = support.shape[-1]
    low, high = support[0], support[-1]
    position = (atoms.clamp(low, high) - low) / ((high - low) / (num_atoms - 1))
    lower = position.floor()
    upper_share = position - lower
    lower_index = lower.long()  # at most K - 1: the position is clamped to [0, K - 1]
    upper_index = (lower_index + 1).clamp(max=num_atoms - 1)
    projected = probs.new_zeros(*probs.shape[:-1], num_atoms)
    lower_share = torch.rsub(upper_share, 1)  # 1 - share
    projected = projected.scatter_add(-1, lower_index, probs * lower_share)
    return projected.scatter_add(-1, upper_index, probs * upper_share)


def max_backup_value(ensemble_value: torch.Tensor) -> torch.Tensor:
    r"""CQL's max-backup target value ``min_i max_k Q_i(s', a'_k)`` over ``K`` actions sampled from
    the policy at ``s'`` (the authors' ``max_q_backup`` option, Kumar et al., arXiv:2006.04779),
    ``[*B, 1]``: the maximum over the samples per network, then the minimum over the networks.

    $$
    y = \min_i \max_k Q_i(s', a'_k)
    $$

    Args:
        ensemble_value: ``[E, *B, K, 1]`` values of the sampled actions for each of ``E``
            networks.
    """
    return ensemble_value.max(-2).values.min(0).values


def soft_behavior_cloning_loss(
    log_prob: torch.Tensor, data_log_prob: torch.Tensor, alpha: Scalar
) -> torch.Tensor:
    """Behaviour cloning with SAC's entropy term, ``alpha log pi(a~|s) - log pi(a_data|s)``,
    elementwise (``a~ ~ pi(.|s)``): CQL's actor warm-up (the authors' ``policy_eval_start``
    phase, Kumar et al., arXiv:2006.04779), TorchRL's ``loss_actor_bc``.

    Args:
        log_prob: ``[*B]`` log-probabilities of the policy's own (reparameterised) samples.
        data_log_prob: ``[*B]`` log-probabilities of the dataset's actions.
        alpha: the entropy temperature.
    """
    check_same_shape(log_prob=log_prob, data_log_prob=data_log_prob)
    return alpha * log_prob - data_log_prob
