"""Learning from demonstrations and exploration bonuses: behaviour cloning's action error, GAIL's
discriminator cross-entropy, gradient penalty and reward, the DDPM noise schedule and its
noise-prediction objective, ACT's chunk reconstruction and CVAE KL, and Random Network
Distillation's prediction error. Elementwise or per-sample; reductions are the losses'."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlloss._checks import check_same_shape
from rlloss.functional.critic import distance

Scalar = float | torch.Tensor

ACTION_ERRORS = ("l1", "l2", "mse", "smooth_l1", "cross_entropy")
GAIL_REWARDS = ("positive", "negative", "logit")


def action_error(
    prediction: torch.Tensor, target: torch.Tensor, kind: str, reduction: str = "none"
) -> torch.Tensor:
    """Behaviour cloning's error of a predicted action against a demonstrated one, elementwise
    (Pomerleau, "ALVINN", 1989; Bain & Sammut, 1995); with ``reduction`` ``"mean"`` or
    ``"sum"``, reduced over every element in the same operation (one autograd node).

    ``kind``: ``"l2"`` / ``"mse"`` (``(a - a*)^2``), ``"l1"`` (``|a - a*|``), ``"smooth_l1"``
    (Huber, delta 1), each ``[*B, D]`` against ``[*B, D]``; ``"cross_entropy"``: ``-log
    softmax(logits)[a*]`` of logits ``[*B, n]`` against class indices ``[*B]`` or ``[*B, 1]``,
    giving ``[*B]``. The gradient reaches ``prediction`` only.
    """
    if kind == "cross_entropy":
        index = target.squeeze(-1) if target.ndim == prediction.ndim else target
        if index.shape != prediction.shape[:-1]:
            raise ValueError(
                f"cross_entropy: logits of shape {tuple(prediction.shape)} need class indices "
                f"of shape {tuple(prediction.shape[:-1])} (or with a trailing 1), got "
                f"{tuple(target.shape)}."
            )
        return F.cross_entropy(
            prediction.movedim(-1, 1) if prediction.ndim > 2 else prediction,
            index.long(),
            reduction=reduction,
        )
    if kind not in ACTION_ERRORS:
        raise ValueError(f"unknown action error {kind!r}; expected one of {ACTION_ERRORS}")
    return distance(prediction, target.detach(), "l2" if kind == "mse" else kind, reduction)


def discriminator_cross_entropy(
    expert_probability: torch.Tensor, policy_probability: torch.Tensor, reduction: str = "none"
) -> torch.Tensor:
    r"""GAIL's discriminator loss, elementwise: ``-log D(s_E, a_E) - log(1 - D(s, a))`` with ``D``
    the probability that a pair is the expert's (Ho & Ermon, arXiv:1606.03476, eq. 17, the
    discriminator's side; each log clamped at -100 as ``torch.nn.BCELoss``); with
    ``reduction`` ``"mean"`` or ``"sum"``, each term reduced in its own operation, then added
    (the two have the same shape, so the same value as reducing their sum).

    $$
    \mathcal{L} = -\log D(s_E, a_E) - \log\big(1 - D(s, a)\big)
    $$
    """
    check_same_shape(expert_probability=expert_probability, policy_probability=policy_probability)
    expert = F.binary_cross_entropy(
        expert_probability, torch.ones_like(expert_probability), reduction=reduction
    )
    policy = F.binary_cross_entropy(
        policy_probability, torch.zeros_like(policy_probability), reduction=reduction
    )
    return expert + policy


def interpolate(first: torch.Tensor, second: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight * first + (1 - weight) * second``: the random points between two batches at which
    WGAN-GP's penalty is taken (Gulrajani et al., arXiv:1704.00028, Algorithm 1)."""
    return weight * first + (1 - weight) * second


def gradient_penalty(gradient: torch.Tensor, coefficient: Scalar = 1.0) -> torch.Tensor:
    r"""``coefficient * (||g||_2 - 1)^2`` per sample, the norm over the last dim of ``gradient``
    (the discriminator's input gradient, ``[*B, F]``) (Gulrajani et al., arXiv:1704.00028,
    eq. 3): ``[*B]``.

    $$
    \lambda \big(\lVert g \rVert_2 - 1\big)^2
    $$
    """
    return coefficient * (torch.linalg.vector_norm(gradient, dim=-1) - 1).square()


def gail_reward(
    expert_probability: torch.Tensor, form: str = "positive", eps: float = 1e-8
) -> torch.Tensor:
    """The reward a GAIL discriminator gives a policy's pair, from ``D(s, a)`` (the probability
    that the pair is the expert's), elementwise, without gradient:

    - ``"positive"``: ``-log(1 - D)`` (>= 0, Ho & Ermon's cost ``log(1 - D)`` with its sign
      flipped: a survival bonus, for tasks that end on failure);
    - ``"negative"``: ``log D`` (<= 0, for tasks that end on success);
    - ``"logit"``: ``log D - log(1 - D)`` (AIRL's, Fu et al., arXiv:1710.11248, eq. 5).

    ``D`` is clamped to ``[eps, 1 - eps]`` (``eps`` at least the dtype's machine epsilon). Feed it
    to any loss as the batch's reward.
    """
    eps = max(eps, torch.finfo(expert_probability.dtype).eps)  # 1 - eps below 1 in its dtype
    probability = expert_probability.detach().clamp(eps, 1 - eps)
    if form == "positive":
        return -torch.log1p(-probability)
    if form == "negative":
        return probability.log()
    if form == "logit":
        return probability.log() - torch.log1p(-probability)
    raise ValueError(f"unknown GAIL reward form {form!r}; expected one of {GAIL_REWARDS}")


def linear_beta_schedule(steps: int, beta_start: float = 1e-4, beta_end: float = 0.02):
    """DDPM's linear noise schedule: ``beta_t`` evenly spaced from ``beta_start`` to ``beta_end``
    and ``alpha_bar_t = prod_{s <= t} (1 - beta_s)`` (Ho et al., arXiv:2006.11239, sec. 4):
    ``(betas, alphas_cumprod)``, each ``[steps]``."""
    betas = torch.linspace(beta_start, beta_end, steps)
    return betas, torch.cumprod(1.0 - betas, dim=0)


def diffuse(action: torch.Tensor, alpha_bar: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    r"""DDPM's forward process in closed form, ``sqrt(alpha_bar_t) a_0 + sqrt(1 - alpha_bar_t)
    eps`` (Ho et al., arXiv:2006.11239, eq. 4); ``alpha_bar``: ``[*B]`` (one step per sample),
    ``action`` and ``noise``: ``[*B, D]``.

    $$
    a_t = \sqrt{\bar{\alpha}_t}\, a_0 + \sqrt{1 - \bar{\alpha}_t}\, \epsilon
    $$
    """
    check_same_shape(action=action, noise=noise)
    alpha_bar = alpha_bar.reshape(*alpha_bar.shape, *(1,) * (action.ndim - alpha_bar.ndim))
    return alpha_bar.sqrt() * action + (1.0 - alpha_bar).sqrt() * noise


def noise_prediction_error(
    predicted: torch.Tensor, noise: torch.Tensor, reduction: str = "none"
) -> torch.Tensor:
    r"""The simplified DDPM objective ``||eps - eps_theta(x_t, t)||^2``, elementwise (Ho et al.,
    arXiv:2006.11239, eq. 14; Diffusion Policy's, Chi et al., arXiv:2303.04137); with
    ``reduction`` ``"mean"`` or ``"sum"``, reduced over every element in the same operation.

    $$
    \big\lVert \epsilon - \epsilon_\theta(x_t, t) \big\rVert^2
    $$
    """
    check_same_shape(predicted=predicted, noise=noise)
    return F.mse_loss(predicted, noise.detach(), reduction=reduction)


def chunk_l1(
    prediction: torch.Tensor, chunk: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """ACT's reconstruction loss of an action chunk, per sample: ``mean_{t, d} |a_t,d - a*_t,d|``
    over the chunk's steps ``t`` and action dims ``d`` (Zhao et al., arXiv:2304.13705, sec. IV);
    with ``valid`` (``[*B, T]``, ``False`` marks padding), the mean over the valid steps only.
    ``prediction``, ``chunk``: ``[*B, T, D]``; returns ``[*B]``."""
    check_same_shape(prediction=prediction, chunk=chunk)
    error = (prediction - chunk.detach()).abs()
    if valid is None:
        return error.mean(dim=(-2, -1))
    if valid.shape != chunk.shape[:-1]:
        raise ValueError(
            f"the chunk's padding mask has shape {tuple(valid.shape)}, the chunk "
            f"{tuple(chunk.shape)}: give one flag per chunk step, shape {tuple(chunk.shape[:-1])}."
        )
    error = torch.where(valid.unsqueeze(-1), error, 0.0).sum(dim=(-2, -1))
    return error / (valid.sum(-1) * chunk.shape[-1]).clamp_min(1)


def standard_normal_kl(mu: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    r"""``KL(N(mu, diag(exp(log_var))) || N(0, I)) = 1/2 sum_j (mu_j^2 + exp(log_var_j) - 1 -
    log_var_j)``, the CVAE's latent regulariser (Kingma & Welling, arXiv:1312.6114, appendix B):
    ``[*B]`` from ``[*B, Z]``.

    $$
    \mathrm{KL}\big(N(\mu, \mathrm{diag}(\sigma^2)) \,\|\, N(0, I)\big)
    = \frac{1}{2} \sum_j \big(\mu_j^2 + \sigma_j^2 - 1 - \log \sigma_j^2\big)
    $$
    """
    check_same_shape(mu=mu, log_var=log_var)
    return 0.5 * (mu.square() + log_var.exp() - 1.0 - log_var).sum(-1)


def distillation_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    r"""Random Network Distillation's error, per sample: ``1/K ||f_hat(s) - f(s)||^2`` between the
    predictor's features and the frozen random target's (Burda et al., arXiv:1810.12894,
    sec. 2.2): the predictor's loss and, detached, the intrinsic reward. ``[*B, K]`` -> ``[*B]``;
    no gradient reaches ``target``.

    $$
    \frac{1}{K} \big\lVert \hat{f}(s) - f(s) \big\rVert^2
    $$
    """
    check_same_shape(prediction=prediction, target=target)
    return (prediction - target.detach()).square().mean(-1)


def bc_negative_log_likelihood(log_prob: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning of a stochastic policy, ``-log pi(a*|s)`` per sample (the maximum
    likelihood objective of Ross et al., arXiv:1011.0686, sec. 2)."""
    return -log_prob
