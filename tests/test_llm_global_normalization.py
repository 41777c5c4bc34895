"""The LLM losses' global normaliser, ``loss(batch, num_items_in_batch=N)``: a batch of sequences
of different lengths cut into 4 micro-batches of different sizes and padded widths, each loss
divided by the whole batch's count ``N`` and the micro-batch losses summed, gives the whole
batch's loss and gradient (gradient accumulation); without it, the mean of the micro-batch
losses does not. GRPO, DAPO, CISPO, Dr. GRPO and GSPO on a bigram stand-in (its logits do not
depend on the padding), SFT (NLL and MinorSFT, with a KL to a reference) and distillation on a
tiny Qwen2 through TorchRL's ``TransformersWrapper``.

Tolerance: float32 sums taken in another order, ``rtol=1e-5, atol=1e-7``; the measured maximum
differences are printed (``pytest -s``). The two-process (gloo) and sharded (FSDP2) checks are in
``test_llm_distributed.py``.
"""

from __future__ import annotations

import pytest
import tensordict
import torch

pytest.importorskip("transformers")

import rlloss.llm as rl_llm  # noqa: E402
from rlloss.llm.base import chat_masks  # noqa: E402
from tests.llm_nets import (  # noqa: E402
    ResponseTokenActor,
    chat_batch,
    history_actor,
    left_padded,
    ragged_token_batch,
    tiny_model,
    tiny_tokenizer,
    varied_chats,
    with_ref_log_probs,
)

TOL = {"rtol": 1e-5, "atol": 1e-7}
# (prompt, response) lengths of the 8 sequences, and the micro-batches' sizes
SHAPES = [(3, 2), (2, 7), (4, 3), (3, 9), (2, 4), (3, 1), (4, 6), (2, 5)]
SPLITS = [1, 3, 2, 2]
# (user words, assistant words) of the 8 chats
CHAT_SHAPES = [(2, 3), (4, 1), (1, 6), (3, 2), (2, 8), (5, 2), (1, 4), (3, 5)]
GRPO_CASES = {  # name -> (class, keywords, what num_items_in_batch counts)
    "GRPO-token_mean": ("GRPOLoss", {}, "tokens"),
    "GRPO-prompt_mean": ("GRPOLoss", {"aggregation": "prompt_mean"}, "sequences"),
    "DAPO": ("DAPO", {"clip_epsilon": (0.2, 0.28)}, "tokens"),
    "CISPO": ("CISPOLoss", {"clip_epsilon": (0.1, 0.1)}, "tokens"),
    "DrGRPO": ("DrGRPOLoss", {"max_tokens": 16}, "sequences"),
    "GSPO": ("GSPOLoss", {"clip_epsilon": (0.02, 0.03)}, "sequences"),
}
GRPO_LOSSES = ("loss_objective", "loss_entropy", "loss_kl_to_ref", "loss_kl_to_inference")


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


def micro_batches(items: list, splits=SPLITS) -> list:
    starts = [sum(splits[:i]) for i in range(len(splits))]
    return [items[a : a + n] for a, n in zip(starts, splits, strict=True)]


def total_and_grads(loss, batches, keys, module, **call) -> tuple[torch.Tensor, list]:
    """The sum over ``batches`` of ``loss``'s ``keys`` and the gradient of that sum on
    ``module``'s parameters (each batch's backward accumulated, as in training)."""
    module.zero_grad()
    total = 0.0
    for batch in batches:
        out = loss(batch, **call)
        value = sum(out.get(k) for k in keys if out.get(k) is not None)
        value.backward()
        total = total + value.detach()
    return total, [p.grad.clone() for p in module.parameters()]


def differences(ours, reference) -> tuple[float, float]:
    """The maximum absolute and relative differences over tensors."""
    pairs = list(zip(ours, reference, strict=True))
    absolute = max(float((a - b).abs().max()) for a, b in pairs)
    relative = absolute / max(float(b.abs().max()) for _, b in pairs)
    return absolute, relative


def assert_equal_report(name, ours, reference):
    (loss, grads), (ref_loss, ref_grads) = ours, reference
    absolute, relative = differences(grads, ref_grads)
    print(f"{name}: loss {float(loss):.6g} vs {float(ref_loss):.6g}; gradient max abs ", end="")
    print(f"{absolute:.2e}, relative to the largest entry {relative:.2e}")
    torch.testing.assert_close(loss, ref_loss, **TOL)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def grpo_setup(count_of: str):
    actor = ResponseTokenActor()
    sequences = ragged_token_batch(actor, SHAPES)
    whole = left_padded(sequences)
    parts = [left_padded(part) for part in micro_batches(sequences)]
    tokens = int(whole["masks", "all_assistant_mask"].sum())
    return actor, whole, parts, tokens if count_of == "tokens" else len(SHAPES)


@pytest.mark.parametrize("case", GRPO_CASES)
def test_grpo_family_micro_batches_sum_to_the_whole_batch(case):
    """The objective and entropy terms of 4 micro-batches (widths 5, 12, 10, 9 against the
    whole batch's 12) divided by the global count: the whole batch's default loss and
    gradient. The mean of the micro-batches' own losses differs."""
    name, keywords, count_of = GRPO_CASES[case]
    actor, whole, parts, count = grpo_setup(count_of)
    loss = getattr(rl_llm, name)(actor, **keywords)
    keys = ("loss_objective", "loss_entropy")
    reference = total_and_grads(loss, [whole], keys, actor)
    ours = total_and_grads(loss, parts, keys, actor, num_items_in_batch=count)
    assert_equal_report(case, ours, reference)
    as_tensor = total_and_grads(loss, parts, keys, actor, num_items_in_batch=torch.tensor(count))
    torch.testing.assert_close(as_tensor[0], ours[0])
    naive, _ = total_and_grads(loss, parts, keys, actor)
    assert not torch.allclose(naive / len(parts), reference[0], rtol=1e-3)


@pytest.mark.parametrize("case", ["GRPO-token_mean", "GRPO-prompt_mean", "GSPO"])
def test_grpo_kl_terms_and_trust_mask_sum_to_the_whole_batch(case):
    """With both KL terms and the KL trust mask, every loss term of the micro-batches sums to
    the whole batch's with the same global count; the KL terms are then the objective's
    aggregation of the per-token k3 (checked against a naive sum)."""
    name, keywords, count_of = GRPO_CASES[case]
    actor, whole, parts, count = grpo_setup(count_of)
    extra = {"kl_to_ref_coeff": 0.3, "kl_to_inference_coeff": 0.2, "kl_mask_threshold": 0.02}
    loss = getattr(rl_llm, name)(actor, **keywords, **extra)
    reference = total_and_grads(loss, [whole], GRPO_LOSSES, actor, num_items_in_batch=count)
    ours = total_and_grads(loss, parts, GRPO_LOSSES, actor, num_items_in_batch=count)
    assert_equal_report(case + "+kl", ours, reference)
    out = loss(whole, num_items_in_batch=count)
    dist = actor._get_sft_dist(whole)
    log_prob = dist.log_prob(whole["tokens", "full"]).detach()
    old, ref = whole["log_probs", "full"], whole["next", "ref_log_probs", "full"]
    keep = dist.mask & (0.5 * (log_prob - old).square() <= 0.02)
    assert 0 < keep.sum() < dist.mask.sum()  # the trust mask drops some tokens
    diff = torch.where(keep, ref - log_prob, 0.0)
    k3 = diff.exp() - diff - 1
    if count_of == "tokens":
        expected = k3.sum() / count
    else:
        expected = (k3.sum(-1) / keep.sum(-1).clamp_min(1)).sum() / count
    torch.testing.assert_close(out.loss_kl_to_ref, 0.3 * expected, **TOL)
    torch.testing.assert_close(out.kl_to_ref, k3.sum() / keep.sum(), **TOL)


def test_grpo_global_normaliser_errors():
    actor, whole, _, count = grpo_setup("tokens")
    with pytest.raises(ValueError, match="aggregation='none'"):
        rl_llm.GRPOLoss(actor, aggregation="none")(whole, num_items_in_batch=count)
    with pytest.raises(ValueError, match="max_tokens"):
        rl_llm.DrGRPOLoss(actor)(whole, num_items_in_batch=8)
    with pytest.raises(ValueError, match=r"num_items_in_batch must be > 0.*got 0"):
        rl_llm.GRPOLoss(actor)(whole, num_items_in_batch=0)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        rl_llm.GRPOLoss(actor)(whole, num_items_in_batch=torch.tensor([3, 4]))
    with pytest.raises(TypeError, match="num_items_in_batch must be a number"):
        rl_llm.GRPOLoss(actor)(whole, num_items_in_batch="all")


def test_global_normaliser_compiles_without_recompiling():
    """A tensor count is a graph input: new counts and new batches of the same width run the
    same graph, equal to eager."""
    actor, whole, _, count = grpo_setup("tokens")
    loss = rl_llm.GRPOLoss(actor, kl_to_ref_coeff=0.1)

    def total(batch, n):
        out = loss(batch, num_items_in_batch=n)
        return out.loss_objective + out.loss_entropy + out.loss_kl_to_ref

    compiled = torch.compile(total, fullgraph=True)
    torch.testing.assert_close(compiled(whole, torch.tensor(count)), total(whole, count))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (count + 5, 2 * count):
            torch.testing.assert_close(compiled(whole, torch.tensor(n)), total(whole, n))


# ----------------------------------------------------------------- SFT and distillation
@pytest.fixture(scope="module")
def chats():
    with tensordict.set_list_to_stack(True):
        tokenizer, model = tiny_tokenizer(), tiny_model()
        batch = chat_batch(tokenizer, varied_chats(CHAT_SHAPES))
        batch = with_ref_log_probs(batch, model, tokenizer)
        batch = with_ref_log_probs(batch, model, tokenizer, key="teacher_log_probs")
        return history_actor(model, tokenizer), tokenizer, model, batch


def chat_parts(batch) -> list:
    starts = [sum(SPLITS[:i]) for i in range(len(SPLITS))]
    return [batch[a : a + n] for a, n in zip(starts, SPLITS, strict=True)]


def assistant_tokens(loss, batch) -> int:
    assistant, attention = chat_masks("test", loss, batch)
    return sum(int((a & m).sum()) for a, m in zip(assistant, attention, strict=True))


CHAT_CASES = {  # name -> (class, keywords, what num_items_in_batch counts)
    "SFT": ("SFTLoss", {}, "sequences"),
    "SFT-token-level": ("SFTLoss", {"normalize_by_seq_length": False}, "tokens"),
    "SFT-kl": ("SFTLoss", {"kl_to_ref_coeff": 0.5}, "sequences"),
    "MinorSFT": ("SFTLoss", {"loss_function": "minor_sft", "beta": 0.5}, "sequences"),
    "Distillation": ("DistillationLoss", {}, "sequences"),
    "Distillation-token-level": (
        "DistillationLoss",
        {"normalize_by_seq_length": False},
        "tokens",
    ),
}
CHAT_LOSSES = ("loss_sft", "loss_kl_to_ref", "loss_distill")


@pytest.mark.parametrize("case", CHAT_CASES)
def test_chat_losses_micro_batches_sum_to_the_whole_batch(chats, case):
    """SFT, MinorSFT, SFT with a KL to the reference and distillation on 8 chats of different
    lengths in 4 micro-batches: the sum of the micro-batch losses divided by the global count
    is the whole batch's loss and gradient; counting sequences, it is the default (TorchRL's)
    whole-batch loss."""
    actor, tokenizer, model, batch = chats
    name, keywords, count_of = CHAT_CASES[case]
    template = {"chat_template_name": "qwen"}
    keywords = {"tokenizer": tokenizer, "tokenizer_kwargs": template, **keywords}
    loss = getattr(rl_llm, name)(actor, **keywords)
    count = assistant_tokens(loss, batch) if count_of == "tokens" else len(CHAT_SHAPES)
    reference = total_and_grads(loss, [batch], CHAT_LOSSES, model, num_items_in_batch=count)
    ours = total_and_grads(loss, chat_parts(batch), CHAT_LOSSES, model, num_items_in_batch=count)
    assert_equal_report(case, ours, reference)
    if count_of == "sequences" and "kl_to_ref_coeff" not in keywords:
        default = total_and_grads(loss, [batch], CHAT_LOSSES, model)
        assert_equal_report(case + " (default)", ours, default)
    naive, _ = total_and_grads(loss, chat_parts(batch), CHAT_LOSSES, model)
    assert not torch.allclose(naive / len(SPLITS), reference[0], rtol=1e-3)


def test_chat_losses_refuse_a_normaliser_without_a_mean(chats):
    actor, tokenizer, _, batch = chats
    for name in ("SFTLoss", "DistillationLoss"):
        loss = getattr(rl_llm, name)(actor, tokenizer=tokenizer, reduction="sum")
        with pytest.raises(ValueError, match="reduction='sum'.*use reduction='mean'"):
            loss(batch, num_items_in_batch=8)


def test_an_empty_micro_batch_is_refused_with_the_keyword_too():
    """The call with ``num_items_in_batch`` runs the same batch checks as the plain call."""
    actor, whole, _, count = grpo_setup("tokens")
    loss = rl_llm.GRPOLoss(actor)
    for call in ({}, {"num_items_in_batch": count}):
        with pytest.raises(ValueError, match="the batch is empty"):
            loss(whole[:0], **call)
