"""rlloss.functional.llm against the naive references written from the papers: token log-ratios,
clip-higher, CISPO's stop-gradient weight, the KL trust mask, group-relative advantages (GRPO,
Dr. GRPO), token aggregations, GSPO's sequence ratio, the token ESS, and
the chunked token log-prob and entropy."""

from __future__ import annotations

import math

import pytest
import torch

from rlloss.functional import clip_bounds, clipped_surrogate, kl_k3
from rlloss.functional.llm import (
    cispo_surrogate,
    group_relative_advantage,
    gspo_token_log_ratio,
    kl_trust_mask,
    masked_log_ratio,
    minor_sft_loss,
    sequence_log_likelihood,
    sequence_log_ratio,
    token_log_prob_entropy,
)
from rlloss.functional.reduce import aggregate_tokens, masked_token_ess
from tests import reference

EPSILONS = [(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)]
SHAPES = [(1, 5), (4, 7), (2, 3, 6)]


def batch(shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(shape, generator=g, dtype=dtype) * 3
    old = log_prob + 0.4 * torch.randn(shape, generator=g, dtype=dtype)
    mask = torch.rand(shape, generator=g) > 0.3
    mask[..., 0] = True  # one valid token per row at least (an empty row is tested apart)
    advantage = torch.randn(shape, generator=g, dtype=dtype)
    return log_prob, old, mask, advantage


@pytest.mark.parametrize("shape", SHAPES)
def test_masked_log_ratio_and_nan_padding(shape):
    log_prob, old, mask, _ = batch(shape)
    old = torch.where(mask, old, torch.nan)  # TorchRL pads alignment holes with NaN
    log_prob.requires_grad_(True)
    out = masked_log_ratio(log_prob, old, mask)
    expected = torch.where(mask, log_prob.detach() - torch.nan_to_num(old), 0.0)
    torch.testing.assert_close(out.detach(), expected)
    out.sum().backward()
    torch.testing.assert_close(log_prob.grad, mask.to(log_prob.dtype))


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_clip_higher_token_surrogate(shape, eps):
    log_prob, old, mask, advantage = batch(shape, 1)
    log_low, log_high = clip_bounds(*eps)
    lr = masked_log_ratio(log_prob, old, mask)
    out = clipped_surrogate(lr, advantage, log_low, log_high)
    expected = reference.elementwise(
        lambda x, a: reference.clipped_surrogate(x, a, *eps), lr, advantage
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cispo_value_and_stop_gradient(shape, eps):
    log_prob, old, _, advantage = batch(shape, 2)
    log_prob = (old + 0.5 * torch.randn_like(old)).requires_grad_(True)  # many clipped tokens
    lr = log_prob - old
    out = cispo_surrogate(lr, advantage, *clip_bounds(*eps))
    expected = reference.elementwise(lambda x, a: reference.cispo_value(x, a, *eps), lr, advantage)
    torch.testing.assert_close(out.detach(), expected)
    out.sum().backward()
    grad = reference.elementwise(
        lambda x, a: reference.cispo_log_ratio_gradient(x, a, *eps), lr, advantage
    )
    torch.testing.assert_close(log_prob.grad, grad)
    clipped = (lr.detach() < clip_bounds(*eps)[0]) | (lr.detach() > clip_bounds(*eps)[1])
    assert clipped.any() and (log_prob.grad[clipped] != 0).all()  # PPO's clip would zero them


@pytest.mark.parametrize("threshold", [0.01, 0.1, 1.0])
def test_kl_trust_mask(threshold):
    log_prob, old, _, _ = batch((4, 9), 3)
    out = kl_trust_mask(log_prob, old, threshold)
    expected = reference.elementwise(
        lambda a, b: float(reference.kl_trust(a, b, threshold)), log_prob, old
    )
    assert torch.equal(out, expected.bool())


def test_k3_to_reference_policy():
    log_prob, ref, mask, _ = batch((3, 8), 4)
    out = kl_k3(masked_log_ratio(ref, log_prob, mask))  # log(pi_ref / pi), samples of pi
    expected = reference.elementwise(reference.kl_k3, torch.where(mask, ref - log_prob, 0.0))
    torch.testing.assert_close(out, expected)
    assert (out >= 0).all() and (out[~mask] == 0).all()


@pytest.mark.parametrize("scale", [True, False], ids=["grpo", "dr_grpo"])
@pytest.mark.parametrize("shape", [(1, 4), (3, 8), (2, 2, 5)])
def test_group_relative_advantage(shape, scale):
    returns = torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out = group_relative_advantage(returns, scale=scale)
    flat = returns.reshape(-1, shape[-1]).tolist()
    expected = torch.tensor([reference.group_advantage(r, scale) for r in flat])
    torch.testing.assert_close(out, expected.reshape(shape).to(out.dtype))


def test_group_relative_advantage_constant_group_is_zero():
    out = group_relative_advantage(torch.ones(2, 4))
    assert torch.equal(out, torch.zeros(2, 4))


@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean", "seq_sum_constant"])
@pytest.mark.parametrize("shape", [(1, 5), (4, 7), (3, 6)])
def test_aggregate_tokens(shape, aggregation):
    _, _, mask, value = batch(shape, 6)
    value = torch.where(mask, value, torch.nan)  # padding must not leak
    out = aggregate_tokens(value, mask, aggregation)
    expected = reference.token_aggregate(value.tolist(), mask.tolist(), aggregation)
    assert math.isclose(out.item(), expected, rel_tol=1e-10, abs_tol=1e-12)
    none = aggregate_tokens(value, mask, "none")
    torch.testing.assert_close(none, torch.where(mask, value, 0.0))


@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean", "seq_sum_constant"])
def test_aggregate_tokens_with_a_global_count_sums_over_parts(aggregation):
    """``num_items``: the sum of the batch's terms (tokens, or per-sequence means / constant
    sums) over the given count, written out by hand; the rows cut in 3 parts, each over the
    whole batch's count, add up to the whole batch's default mean."""
    _, _, mask, value = batch((7, 6), 6)
    value = torch.where(mask, value, torch.nan)
    pairs = zip(value.tolist(), mask.tolist(), strict=True)
    rows = [[v for v, m in zip(vs, ms, strict=True) if m] for vs, ms in pairs]
    if aggregation == "token_mean":
        terms, count = [v for row in rows for v in row], int(mask.sum())
    elif aggregation == "prompt_mean":
        terms, count = [sum(row) / max(len(row), 1) for row in rows], len(rows)
    else:
        terms, count = [sum(row) / 10 for row in rows], len(rows)
    out = aggregate_tokens(value, mask, aggregation, max_tokens=10, num_items=2.5)
    assert math.isclose(out.item(), sum(terms) / 2.5, rel_tol=1e-10)
    parts = [(0, 1), (1, 5), (5, 7)]
    pieces = [
        aggregate_tokens(value[a:b], mask[a:b], aggregation, 10, torch.tensor(float(count)))
        for a, b in parts
    ]
    whole = aggregate_tokens(value, mask, aggregation, max_tokens=10)
    torch.testing.assert_close(sum(pieces), whole, rtol=1e-12, atol=1e-12)


def test_aggregate_tokens_dr_grpo_constant_and_empty_rows():
    value, mask = torch.ones(2, 4), torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]]).bool()
    assert aggregate_tokens(value, mask, "seq_sum_constant", max_tokens=8).item() == 2 / 8 / 2
    assert aggregate_tokens(value, mask, "prompt_mean").item() == 0.5  # empty row counts 0
    with pytest.raises(ValueError, match="aggregation must be one of"):
        aggregate_tokens(value, mask, "mean")


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.28)])
@pytest.mark.parametrize("shape", [(4, 7), (6, 5)])
def test_gspo_sequence_ratio_value_and_gradient(shape, eps):
    log_prob, old, mask, _ = batch(shape, 7)
    log_prob = (old + 0.05 * torch.randn_like(old)).requires_grad_(True)
    advantage = torch.randn(shape[0], 1, dtype=old.dtype).expand(shape)  # one per sequence
    lr = masked_log_ratio(log_prob, old, mask)
    seq = sequence_log_ratio(lr, mask)
    expected_seq = [
        sum(x for x, m in zip(r, k, strict=True) if m) / sum(k)
        for r, k in zip(lr.tolist(), mask.tolist(), strict=True)
    ]
    torch.testing.assert_close(seq.detach().squeeze(-1), torch.tensor(expected_seq).double())
    token = gspo_token_log_ratio(lr, mask)
    objective = clipped_surrogate(token, advantage, *clip_bounds(*eps))
    out = aggregate_tokens(objective, mask, "prompt_mean")
    expected = [
        reference.gspo_sequence_objective(r, k, a[0], *eps)
        for r, k, a in zip(lr.tolist(), mask.tolist(), advantage.tolist(), strict=True)
    ]
    assert math.isclose(out.item(), sum(expected) / len(expected), rel_tol=1e-10)
    (grad,) = torch.autograd.grad(out, log_prob)
    # the sequence-level objective written directly from eq. 5, differentiated by autograd
    log_prob2 = log_prob.detach().clone().requires_grad_(True)
    lr2 = torch.where(mask, log_prob2 - old, 0.0)
    s = (lr2.sum(-1) / mask.sum(-1)).exp()
    a = advantage[:, 0]
    direct = torch.minimum(s * a, s.clamp(1 - eps[0], 1 + eps[1]) * a).mean()
    (grad2,) = torch.autograd.grad(direct, log_prob2)
    torch.testing.assert_close(grad, grad2)


def test_masked_token_ess():
    log_weight, _, mask, _ = batch((3, 9), 8)
    out = masked_token_ess(log_weight, mask)
    n = int(mask.sum())
    expected = reference.normalized_ess(log_weight.flatten().tolist(), mask.flatten().tolist())
    assert math.isclose(out.item(), expected * n, rel_tol=1e-10)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("shape", [(1, 5), (4, 7), (2, 3, 6)])
def test_sequence_log_likelihood(shape, normalize):
    log_prob, _, mask, _ = batch(shape, 9)
    log_prob = torch.where(mask, log_prob, torch.nan)
    out = sequence_log_likelihood(log_prob, mask, normalize)
    expected = reference.per_row(
        lambda lp, m: reference.sequence_log_likelihood(lp, [bool(x) for x in m], normalize),
        log_prob,
        mask.double(),
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("beta", [0.1, 1.0, 5.0])
def test_minor_sft_loss(beta):
    g = torch.Generator().manual_seed(10)
    ll = -torch.rand(6, generator=g, dtype=torch.float64) * 20
    ref = -torch.rand(6, generator=g, dtype=torch.float64) * 20
    out = minor_sft_loss(ll, ref, beta)
    expected = reference.elementwise(lambda a, b: reference.minor_sft_loss(a, b, beta), ll, ref)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk_elements", [8, 64, 1 << 16])
def test_token_log_prob_entropy_matches_the_softmax(shape, chunk_elements, monkeypatch):
    """Values and gradients against the naive ones from the full softmax: ``log pi(y) =
    log(exp(z_y) / sum_v exp(z_v))`` and ``H = -sum_v pi_v log pi_v``, over 1, a few or
    one-row chunks; masked positions give 0 and no gradient."""
    from rlloss.functional import llm

    monkeypatch.setattr(llm, "CHUNK_ELEMENTS", chunk_elements)
    g = torch.Generator().manual_seed(sum(shape))
    logits = torch.randn(*shape, 11, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 11, shape, generator=g)
    mask = torch.rand(shape, generator=g) > 0.3
    tokens = torch.where(mask, tokens, -100)  # TorchRL's padding token id
    weights = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    log_prob, entropy = token_log_prob_entropy(logits, tokens, mask)
    (weights[0] * log_prob + weights[1] * entropy).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    probs = logits.exp() / logits.exp().sum(-1, keepdim=True)
    picked = probs.gather(-1, tokens.clamp(min=0)[..., None]).squeeze(-1).log()
    naive_log_prob = torch.where(mask, picked, torch.zeros(()))
    naive_entropy = -(probs * probs.log()).sum(-1)
    (weights[0] * naive_log_prob + weights[1] * naive_entropy).sum().backward()
    torch.testing.assert_close(log_prob, naive_log_prob)
    torch.testing.assert_close(entropy, naive_entropy)
    torch.testing.assert_close(ours, logits.grad)
    only_log_prob, none = token_log_prob_entropy(logits, tokens, mask, entropy=False)
    assert none is None
    torch.testing.assert_close(only_log_prob, naive_log_prob)
