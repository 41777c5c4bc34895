"""Returns and advantages: GAE, TD(0), TD(lambda), n-step discounting.

Conventions (DESIGN.md): sequence tensors are ``[*B, T, 1]`` with time at ``time_dim`` (``-2`` by
default); ``terminated`` stops bootstrapping, ``done`` (terminated or truncated) cuts traces. The
functions are differentiable; the estimator modules call them under ``torch.no_grad()`` unless
asked for differentiable targets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlloss._checks import check_same_shape

Scalar = float | torch.Tensor


def _unless(flag: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``(1 - flag) * value``; a boolean flag zeroes ``value`` where it is set (one operation
    instead of a negation, a cast and a product, and no ``0 * inf`` NaN)."""
    if flag.dtype == torch.bool:
        return value.masked_fill(flag, 0.0)
    return _not(flag, value.dtype) * value


def _not(flag: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``1 - flag`` in ``dtype``; a boolean flag is negated before the cast (the same numbers,
    with a cheaper operation than the subtraction)."""
    if flag.dtype == torch.bool:
        return (~flag).to(dtype)
    return 1.0 - flag.to(dtype)


def reverse_discounted_sum(
    x: torch.Tensor, discount: Scalar | torch.Tensor, time_dim: int = -2
) -> torch.Tensor:
    """``y_t = x_t + discount_t * y_{t+1}`` along ``time_dim``, with ``y_T = 0``.

    Solved as a parallel (Hillis-Steele) scan over affine maps in ``ceil(log2 T)`` vectorised
    steps: no Python loop over time, static shapes, compiles with ``fullgraph=True``. After the
    step with offset ``s``, ``y_t`` holds ``sum_{k=t}^{t+2s-1} (prod_{j=t}^{k-1} discount_j) x_k``.

    Args:
        x: ``[*B, T, *F]`` terms to accumulate.
        discount: per-step discount, a scalar or a tensor broadcastable to ``x``.
        time_dim: the time dimension of ``x``.

    Returns:
        ``y`` with the shape of ``x``.
    """
    discount = torch.as_tensor(discount, dtype=x.dtype, device=x.device)
    y = x.transpose(time_dim, -1)
    a = torch.broadcast_to(discount, x.shape).transpose(time_dim, -1)
    steps = y.shape[-1]
    shift = 1
    while shift < steps:
        y = y + a * F.pad(y[..., shift:], (0, shift))
        if 2 * shift < steps:
            a = a * F.pad(a[..., shift:], (0, shift), value=1.0)
        shift *= 2
    return y.transpose(time_dim, -1)


def td0_return(
    reward: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor, gamma: Scalar
) -> torch.Tensor:
    r"""One-step TD target ``r_t + gamma * (1 - terminated_t) * V(s_{t+1})``.

    $$
    \hat{V}_t = r_t + \gamma (1 - \text{terminated}_t) V(s_{t+1})
    $$

    Args:
        reward: ``[*B, 1]`` tensors of one shape.
        next_value: ``[*B, 1]`` tensors of one shape.
        terminated: ``[*B, 1]`` tensors of one shape.
        gamma: discount, a scalar or a tensor broadcastable to ``reward`` (``gamma ** n`` for
            n-step transitions, see :func:`bootstrap_discount`).
    """
    check_same_shape(reward=reward, next_value=next_value, terminated=terminated)
    bootstrap = _unless(terminated, next_value)
    if type(gamma) is float:  # ``r + gamma * v`` in one operation: no scalar tensor for gamma
        return torch.add(reward, bootstrap, alpha=gamma)
    return reward + gamma * bootstrap


def td0_error(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    gamma: Scalar,
) -> torch.Tensor:
    r"""TD error ``delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)``.

    $$
    \delta_t = r_t + \gamma (1 - \text{terminated}_t) V(s_{t+1}) - V(s_t)
    $$
    """
    check_same_shape(reward=reward, value=value)
    return td0_return(reward, next_value, terminated, gamma) - value


def gae_advantage(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: Scalar,
    lmbda: Scalar,
    time_dim: int = -2,
) -> torch.Tensor:
    r"""Generalized advantage estimate ``A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}``.

    $$
    A_t = \delta_t + \gamma \lambda (1 - \text{done}_t) A_{t+1}, \qquad A_T = 0
    $$

    Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438. ``delta_t`` is :func:`td0_error`: ``terminated`` removes the
    bootstrap value, ``done`` (terminated or truncated) stops the trace; ``A_T = 0`` after the
    last step. The value target is ``A_t + V(s_t)``.

    Args:
        reward: ``[*B, T, 1]`` tensors of one shape, time
            at ``time_dim``.
        value: as ``reward``.
        next_value: as ``reward``.
        done: as ``reward``.
        terminated: as ``reward``.
        gamma: scalars or tensors broadcastable to ``reward``.
        lmbda: scalars or tensors broadcastable to ``reward``.

    Returns:
        The advantage, ``[*B, T, 1]``.
    """
    check_same_shape(reward=reward, done=done)
    delta = td0_error(reward, value, next_value, terminated, gamma)
    return reverse_discounted_sum(delta, gamma * lmbda * _not(done, value.dtype), time_dim)


def td_lambda_return(
    reward: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: Scalar,
    lmbda: Scalar,
    time_dim: int = -2,
) -> torch.Tensor:
    r"""TD(lambda) return ``G_t = r_t + gamma (1 - term_t) [(1 - lmbda) V_{t+1} + lmbda G_{t+1}]``.

    $$
    G_t = r_t + \gamma (1 - \text{terminated}_t)
    \big((1 - \lambda) V(s_{t+1}) + \lambda G_{t+1}\big)
    $$

    Sutton & Barto, "Reinforcement Learning: An Introduction", section 12.1. Where the trace is
    cut (``done_t``, and always at the last step) ``G_{t+1}`` is replaced by the bootstrap value
    ``V_{t+1}``, so the recursion is linear: ``G_t = b_t + c_t G_{t+1}`` with
    ``b_t = r_t + gamma (1 - term_t) V_{t+1} ((1 - lmbda) + lmbda cut_t)`` and
    ``c_t = gamma lmbda (1 - term_t) (1 - cut_t)``. ``lmbda = 1`` gives the Monte-Carlo (TD(1))
    return bootstrapped at cuts, ``lmbda = 0`` the TD(0) target.

    Args:
        reward: ``[*B, T, 1]`` tensors of one shape.
        next_value: ``[*B, T, 1]`` tensors of one shape.
        done: ``[*B, T, 1]`` tensors of one shape.
        terminated: ``[*B, T, 1]`` tensors of one shape.
        gamma: scalars or tensors broadcastable to ``reward``.
        lmbda: scalars or tensors broadcastable to ``reward``.

    Returns:
        The return ``G``, ``[*B, T, 1]``.
    """
    check_same_shape(reward=reward, next_value=next_value, done=done, terminated=terminated)
    dtype = next_value.dtype
    cut = done.to(dtype).clone()
    cut.narrow(time_dim, cut.shape[time_dim] - 1, 1).fill_(1.0)
    bootstrap = gamma * _unless(terminated, next_value)
    base = reward + bootstrap * ((1.0 - lmbda) + lmbda * cut)
    decay = gamma * lmbda * _not(terminated, dtype) * (1.0 - cut)
    return reverse_discounted_sum(base, decay, time_dim)


def vtrace(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    log_rho: torch.Tensor,
    gamma: Scalar,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""V-trace targets and advantages (Espeholt et al., "IMPALA", arXiv:1802.01561, eq. 1).

    $$
    v_t = V_t + \delta_t + \gamma (1 - \text{done}_t) c_t (v_{t+1} - V_{t+1}), \qquad
    A_t = \rho_t \big(r_t + \gamma (1 - \text{terminated}_t) v'_{t+1} - V_t\big)
    $$

    $$
    \delta_t = \rho_t \big(r_t + \gamma (1 - \text{terminated}_t) V_{t+1} - V_t\big), \qquad
    \rho_t = \min\Big(\bar{\rho}, \frac{\pi}{\mu}\Big), \qquad
    c_t = \min\Big(\bar{c}, \frac{\pi}{\mu}\Big)
    $$

    (``log_rho`` $= \log \pi - \log \mu$), where $v'_{t+1}$ is $v_{t+1}$ inside a trajectory and
    $V_{t+1}$ where it is cut (``done_t``, and at the last step).

    Args:
        reward: ``[*B, T, 1]``.
        value: ``[*B, T, 1]``.
        next_value: ``[*B, T, 1]``.
        done: ``[*B, T, 1]``.
        terminated: ``[*B, T, 1]``.
        log_rho: ``[*B, T, 1]``.
        gamma: scalar or tensor broadcastable to ``reward``; ``rho_bar``, ``c_bar``: clipping.

    Returns:
        ``(advantage, v)``, both ``[*B, T, 1]``.
    """
    check_same_shape(reward=reward, value=value, next_value=next_value, done=done, log_rho=log_rho)
    dtype = value.dtype
    rho = log_rho.exp()
    clipped_rho, clipped_c = rho.clamp_max(rho_bar), rho.clamp_max(c_bar)
    delta = clipped_rho * td0_error(reward, value, next_value, terminated, gamma)
    vs = value + reverse_discounted_sum(delta, gamma * clipped_c * _not(done, dtype), time_dim)
    steps = vs.shape[time_dim]
    vs_next = torch.cat(
        [vs.narrow(time_dim, 1, steps - 1), next_value.narrow(time_dim, steps - 1, 1)], time_dim
    )
    vs_next = torch.where(done.bool(), next_value, vs_next)
    advantage = clipped_rho * (td0_return(reward, vs_next, terminated, gamma) - value)
    return advantage, vs


def discounted_returns(
    reward: torch.Tensor, done: torch.Tensor, initial: torch.Tensor, gamma: float
) -> torch.Tensor:
    r"""Forward discounted returns along time, restarted after each episode end:

    $$
    R_t = r_t + \gamma (1 - \text{done}_{t-1}) R_{t-1}, \qquad R_{-1} = \text{initial}
    $$

    Vectorised over time: the forward recursion is :func:`rlloss.functional.reverse_discounted_sum`
    on the time-reversed sequence, with the carried return entering through ``r_0``.

    Args:
        reward: ``[*B, T, 1]`` rewards.
        done: ``[*B, T, 1]`` episode-end flags, ``done_t`` set when the episode ended at step ``t``.
        initial: ``[*B, 1, 1]`` return carried from before the first step (0 after an episode end).
        gamma: discount factor.

    Returns:
        ``[*B, T, 1]`` returns ``R_t``, in ``initial``'s dtype.
    """
    dtype = initial.dtype
    steps = reward.shape[-2]
    carried = F.pad(gamma * initial, (0, 0, 0, steps - 1))  # gamma * R_{-1} at t = 0, 0 after
    discount = gamma * F.pad(1.0 - done[..., :-1, :].to(dtype), (0, 0, 1, 0))  # of R_{t-1} in R_t
    terms = reward.to(dtype) + carried
    return reverse_discounted_sum(terms.flip(-2), discount.flip(-2)).flip(-2)


def bootstrap_discount(
    gamma: Scalar, steps_to_next_obs: torch.Tensor | None, dtype: torch.dtype | None = None
) -> Scalar:
    """Discount of the bootstrap value: ``gamma ** n`` for n-step transitions, else ``gamma``.

    ``steps_to_next_obs`` is what TorchRL's ``MultiStep`` writes (an integer count; rewards
    already summed); the discount is computed in ``dtype`` (that of the rewards; default:
    torch's default dtype).
    """
    if steps_to_next_obs is None:
        return gamma
    return gamma ** steps_to_next_obs.to(dtype or torch.get_default_dtype())


def last_kept(valid: torch.Tensor, time_dim: int) -> torch.Tensor:
    """The last kept step of each row of ``valid`` (``[*B, T]``) that drops steps: kept, and
    followed by a dropped one (none in a row that keeps every step)."""
    steps = valid.shape[time_dim]
    following = torch.cat(
        [valid.narrow(time_dim, 1, steps - 1), torch.ones_like(valid.narrow(time_dim, 0, 1))],
        time_dim,
    )
    return valid & ~following


def shifted_layout(
    done: torch.Tensor, terminated: torch.Tensor, budget: int, time_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each step's inputs sit in the single value-network sequence of a shifted estimator
    (TorchRL's ``shifted=True``): ``[s_0 .. s_{T-1}]`` with the next input ``s'_t`` inserted
    after each truncation ``t`` (``done`` and not ``terminated``: ``s'_t`` is not the next root
    input), in a sequence of ``T + budget`` slots.

    Each truncation before the last step takes one slot, so the roots after it move one slot
    right; the steps whose next input no longer fits are dropped (from the tail). The next
    input of the last kept step is inserted after it too (it is then bootstrapped from there
    and its trace cut, see :func:`shifted_flags`); any other step reads its successor's root
    slot as its next input.

    Args:
        done: ``[*B, T]`` booleans (one flag per step).
        terminated: ``[*B, T]`` booleans.
        budget: extra slots (``>= 1``); ``budget = 1 + number of truncations`` keeps every step.
        time_dim: the time dimension of ``done``.

    Returns:
        ``(root_slot, valid, insert)``, each ``[*B, T]``: the slot of ``s_t`` (``s'_t`` is read
        at ``root_slot + 1``), whether step ``t`` is kept, and whether ``s'_t`` is written at
        ``root_slot + 1`` (a kept truncation, the last kept step, or the last step).
    """
    steps = done.shape[time_dim]
    shape = [1] * done.ndim
    shape[time_dim] = steps
    t = torch.arange(steps, device=done.device).view(shape)
    reset = done & ~terminated & (t < steps - 1)  # a truncation at the last step takes no slot
    count = reset.long()
    root_slot = t + count.cumsum(time_dim) - count  # + the truncations before t
    valid = root_slot < steps + budget - 1  # s'_t at root_slot + 1 fits in T + budget slots
    insert = valid & (reset | last_kept(valid, time_dim) | (t == steps - 1))
    return root_slot, valid, insert


def shifted_flags(
    done: torch.Tensor, terminated: torch.Tensor, valid: torch.Tensor, time_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``done`` and ``terminated`` of a shifted estimator: the last kept step of a row that
    drops steps (:func:`last_kept` of ``valid``, ``[*B, T]``, broadcast over the flags' trailing
    dims) becomes a truncation (its trace cut there, bootstrapped from its own next input)."""
    last = last_kept(valid, time_dim)
    while last.ndim < done.ndim:
        last = last.unsqueeze(-1)
    last = last.expand(done.shape)
    return done.masked_fill(last, True), terminated.masked_fill(last, False)


def masked_standardize(
    x: torch.Tensor, valid: torch.Tensor, eps: float = 1e-4, keep_dims: tuple[int, ...] = ()
) -> torch.Tensor:
    """``(x - mean) / max(std, eps)`` with the moments over the elements where ``valid`` (``x``'s
    leading dims, broadcast over the rest) is set, the std without Bessel's correction (TorchRL's
    normalisation of a shifted estimator's advantages); ``keep_dims``: dims with their own
    moments (the agent dim of a multi-agent advantage)."""
    while valid.ndim < x.ndim:
        valid = valid.unsqueeze(-1)
    weight = valid.expand(x.shape).to(x.dtype)
    dims = [d for d in range(x.ndim) if d not in {k % x.ndim for k in keep_dims}]
    count = weight.sum(dims, keepdim=True).clamp_min(1)
    mean = (x * weight).sum(dims, keepdim=True) / count
    variance = ((x - mean).square() * weight).sum(dims, keepdim=True) / count
    return (x - mean) / variance.sqrt().clamp_min(eps)
