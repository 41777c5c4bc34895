"""Language-model post-training quantities: token-level ratios over padded sequences, the
GRPO / DAPO / CISPO / GSPO objectives, group-relative advantages and the token aggregations.

Shao et al., "DeepSeekMath" (GRPO), arXiv:2402.03300; Yu et al., "DAPO", arXiv:2503.14476
(clip-higher, token-level mean); MiniMax, "MiniMax-M1" (CISPO), arXiv:2506.13585; Liu et al.,
"Understanding R1-Zero-Like Training" (Dr. GRPO), arXiv:2503.20783; Zheng et al., "Group
Sequence Policy Optimization" (GSPO), arXiv:2507.18071.

Convention: per-token tensors are ``[*B, T]`` (the token dim last) with a boolean ``mask`` of
the same shape, ``False`` on padding and on the tokens that do not enter the loss (the prompt).
Padded entries are replaced *before* any arithmetic, so a NaN there reaches neither the value
nor the gradient.
"""

from __future__ import annotations

import torch

from rlloss._checks import check_same_shape

Scalar = float | torch.Tensor


def masked_log_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Token-level ``log r_t = log pi(y_t | y_<t) - log pi_old(y_t | y_<t)``, 0 on masked
    tokens; the old log-prob carries no gradient (GRPO, arXiv:2402.03300, eq. 3)."""
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob, mask=mask)
    return torch.where(mask, log_prob, 0.0) - torch.where(mask, old_log_prob.detach(), 0.0)


def cispo_surrogate(
    log_ratio: torch.Tensor, advantage: torch.Tensor, log_low: Scalar, log_high: Scalar
) -> torch.Tensor:
    """CISPO's objective (to maximise), elementwise: ``sg(clip(r, 1 - eps_low, 1 + eps_high)) A
    log pi`` (MiniMax-M1, arXiv:2506.13585, eq. 4). The clipped weight is a constant, so every
    token keeps its gradient ``clip(r) A grad log pi``, a clipped one included (PPO's clip drops
    it); the value is ``clip(r) A``.

    Args:
        log_ratio: ``log r``, any shape.
        advantage: same shape as ``log_ratio``, no gradient.
        log_low: log-space clip bounds (:func:`rlloss.functional.clip_bounds`).
        log_high: log-space clip bounds (:func:`rlloss.functional.clip_bounds`).
    """
    check_same_shape(log_ratio=log_ratio, advantage=advantage)
    weight = log_ratio.detach().clamp(log_low, log_high).exp()
    return weight * (log_ratio - log_ratio.detach()).exp() * advantage.detach()


def kl_trust_mask(
    log_prob: torch.Tensor, other_log_prob: torch.Tensor, threshold: Scalar
) -> torch.Tensor:
    """Token-wise trust region (TorchRL's ``kl_mask_threshold``): ``True`` where
    ``0.5 (log pi - log pi_other)^2 <= threshold``, the second-order estimate of the token's
    KL; no gradient."""
    check_same_shape(log_prob=log_prob, other_log_prob=other_log_prob)
    return 0.5 * (log_prob.detach() - other_log_prob.detach()).square() <= threshold


def group_relative_advantage(
    returns: torch.Tensor, scale: bool = True, eps: float = 1e-6, dim: int = -1
) -> torch.Tensor:
    r"""GRPO's outcome advantage ``(R_i - mean_g R) / std_g R`` over the ``G`` completions of one
    prompt laid along ``dim`` (arXiv:2402.03300, sec. 4.1.2; std with Bessel's correction and
    floored at ``eps``, as TorchRL's ``MCAdvantage``). ``scale=False``: Dr. GRPO's
    ``R_i - mean_g R``, no division by the std (arXiv:2503.20783, sec. 3.2).

    $$
    A_i = \frac{R_i - \mathrm{mean}_g(R)}{\mathrm{std}_g(R)}
    $$
    """
    centered = returns - returns.mean(dim, keepdim=True)
    if not scale:
        return centered
    return centered / returns.std(dim, keepdim=True).clamp_min(eps)


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""GSPO's length-normalised sequence log-ratio ``log s_i = (1/|y_i|) sum_t log r_{i,t}`` over
    the valid tokens (arXiv:2507.18071, eq. 7), shape ``[*B, 1]``; 0 for an empty sequence.

    $$
    \log s_i = \frac{1}{|y_i|} \sum_t \log r_{i,t}
    $$
    """
    check_same_shape(log_ratio=log_ratio, mask=mask)
    total = torch.where(mask, log_ratio, 0.0).sum(-1, keepdim=True)
    return total / mask.sum(-1, keepdim=True).clamp_min(1)


def gspo_token_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's per-token log-ratio ``log s_{i,t} = sg(log s_i) + log r_{i,t} - sg(log
    r_{i,t})`` (arXiv:2507.18071, eq. 13): each token carries its sequence's ratio as value,
    so a clip of it clips the whole sequence, and its own gradient; with one advantage per
    sequence the clipped objective's gradient is GSPO's."""
    sequence = sequence_log_ratio(log_ratio, mask).detach()
    token = torch.where(mask, log_ratio, 0.0)
    return torch.where(mask, sequence + token - token.detach(), 0.0)


def sequence_log_likelihood(
    log_prob: torch.Tensor, mask: torch.Tensor, normalize: bool = True
) -> torch.Tensor:
    """``log p(y) = sum_t log pi(y_t | y_<t)`` over a sequence's valid tokens, ``[*B]``; with
    ``normalize``, divided by their number (at least 1): the per-token negative log-likelihood
    of supervised fine-tuning, sign flipped."""
    check_same_shape(log_prob=log_prob, mask=mask)
    total = torch.where(mask, log_prob, 0.0).sum(-1)
    return total / mask.sum(-1).clamp_min(1) if normalize else total


def minor_sft_loss(
    log_likelihood: torch.Tensor, ref_log_likelihood: torch.Tensor, beta: Scalar
) -> torch.Tensor:
    """MinorSFT's loss ``-log sigmoid(beta (log p(y) - log p_ref(y)))`` per sequence (Xie et al.,
    "Minor SFT loss for LLM fine-tune to increase performance and reduce model deviation",
    arXiv:2408.10642, eq. 6: DPO's implicit reward of the demonstration alone)."""
    check_same_shape(log_likelihood=log_likelihood, ref_log_likelihood=ref_log_likelihood)
    return -torch.nn.functional.logsigmoid(beta * (log_likelihood - ref_log_likelihood.detach()))


CHUNK_ELEMENTS = 1 << 16  # logits entries a token chunk of token_log_prob_entropy spans


class _TokenLogProbEntropy(torch.autograd.Function):
    """``log softmax(logits)[token]`` and the entropy, token chunk by token chunk: no
    ``[tokens, vocab]`` tensor but the logits' gradient, one ``[chunk, vocab]`` at a time (the
    log-softmax recomputed in the backward, not saved)."""

    @staticmethod
    def forward(ctx, logits, tokens, with_entropy, chunk):
        if logits.shape[0] <= chunk:
            picked, entropy = _chunk_forward(logits, tokens, with_entropy)
        else:
            parts = [
                _chunk_forward(logits[i : i + chunk], tokens[i : i + chunk], with_entropy)
                for i in range(0, logits.shape[0], chunk)
            ]
            picked, entropy = (torch.cat(p) for p in zip(*parts, strict=True))
        ctx.save_for_backward(logits, tokens, entropy)
        ctx.chunk = chunk
        return picked, entropy

    @staticmethod
    def backward(ctx, grad_picked, grad_entropy):
        logits, tokens, entropy = ctx.saved_tensors
        if logits.shape[0] <= ctx.chunk:
            return _chunk_backward(logits, tokens, entropy, grad_picked, grad_entropy), *[None] * 3
        grad = torch.empty_like(logits)
        for i in range(0, logits.shape[0], ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            entropy_rows = entropy[rows] if entropy.numel() else entropy
            grad[rows] = _chunk_backward(
                logits[rows], tokens[rows], entropy_rows, grad_picked[rows], grad_entropy[rows]
            )
        return grad, None, None, None


def _chunk_forward(logits, tokens, with_entropy):
    log_p = logits.log_softmax(-1)
    picked = log_p.gather(-1, tokens[:, None]).squeeze(-1)
    if not with_entropy:
        return picked, logits.new_zeros(0)
    return picked, -(log_p.exp() * log_p).sum(-1)


def _chunk_backward(logits, tokens, entropy, grad_picked, grad_entropy):
    """``g_y (onehot(y) - p) - g_H p (log p + H)`` per row: d log p_y / dz and dH / dz."""
    log_p = logits.log_softmax(-1)
    p = log_p.exp()
    if entropy.numel():
        coeff = log_p.add_(entropy[:, None]).mul_(grad_entropy[:, None]).add_(grad_picked[:, None])
        grad = p.mul_(coeff).neg_()
    else:
        grad = p.mul_(-grad_picked[:, None])
    return grad.scatter_add_(-1, tokens[:, None], grad_picked[:, None])


def token_log_prob_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A language model's token log-probs ``log pi(y_t) = z_{y_t} - logsumexp(z)`` (0 where
    ``mask`` is off) and, with ``entropy``, its entropy ``H_t = -sum_v pi_v log pi_v`` per
    position, computed over chunks of ``CHUNK_ELEMENTS`` logits: the only ``[*B, T, V]``
    tensor created is the logits' gradient (the memory contract of issue 36).

    Args:
        logits: ``[*B, T, V]`` the actor's logits.
        tokens: ``[*B, T]`` integer tokens (any value where ``mask`` is off).
        mask: ``[*B, T]`` boolean, the positions to score.
        entropy: whether to compute the entropy (else ``None``).
    """
    vocab = logits.shape[-1]
    flat_tokens = torch.where(mask, tokens, 0).reshape(-1)
    chunk = max(1, CHUNK_ELEMENTS // vocab)
    picked, ent = _TokenLogProbEntropy.apply(logits.reshape(-1, vocab), flat_tokens, entropy, chunk)
    log_prob = torch.where(mask, picked.reshape(mask.shape), 0.0)
    return log_prob, ent.reshape(mask.shape) if entropy else None
