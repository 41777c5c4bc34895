"""SFTLoss (drop-in for torchrl.objectives.llm.SFTLoss) on a tiny Qwen2 and chat histories:
parity with TorchRL's class (values and gradients) over its keywords, the per-sequence
likelihood written out, and the errors."""

from __future__ import annotations

import itertools

import pytest
import tensordict
import torch

pytest.importorskip("transformers")

import torchrl.objectives.llm as torchrl_llm  # noqa: E402

import rlloss.llm as rl_llm  # noqa: E402
from tests.llm_nets import (  # noqa: E402
    chat_batch,
    history_actor,
    tiny_model,
    tiny_tokenizer,
    with_ref_log_probs,
)

GRID = list(
    itertools.product(["sft", "minor_sft"], ["mean", "sum", "none"], [True, False], [None, 0.1])
)


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


@pytest.fixture(scope="module")
def setup():
    with tensordict.set_list_to_stack(True):
        tokenizer, model = tiny_tokenizer(), tiny_model()
        batch = with_ref_log_probs(chat_batch(tokenizer), model, tokenizer)
        return history_actor(model, tokenizer), tokenizer, batch


def run(loss, batch, model):
    model.zero_grad()
    out = loss(batch)
    total = out.loss_sft.sum() + (0 if out.loss_kl_to_ref is None else out.loss_kl_to_ref)
    total.backward()
    return out, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(("loss_function", "reduction", "normalize", "kl"), GRID)
def test_parity_with_torchrl(setup, loss_function, reduction, normalize, kl):
    actor, tokenizer, batch = setup
    keywords = dict(
        tokenizer=tokenizer,
        reduction=reduction,
        normalize_by_seq_length=normalize,
        kl_to_ref_coeff=kl if loss_function == "sft" else None,
        loss_function=loss_function,
        beta=0.1,
        tokenizer_kwargs={"chat_template_name": "qwen"},
    )
    theirs, their_grad = run(torchrl_llm.SFTLoss(actor, **keywords), batch, actor.model)
    ours, our_grad = run(rl_llm.SFTLoss(actor, **keywords), batch, actor.model)
    assert type(ours) is type(theirs)
    for key in ("loss_sft", "loss_kl_to_ref", "kl_to_ref"):
        if theirs.get(key) is None:
            assert ours.get(key) is None
        else:
            torch.testing.assert_close(ours.get(key), theirs.get(key))
    for mine, reference in zip(our_grad, their_grad, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-7)


def test_sft_is_the_assistant_tokens_negative_log_likelihood(setup):
    actor, tokenizer, batch = setup
    loss = rl_llm.SFTLoss(actor, reduction="none", tokenizer_kwargs={"chat_template_name": "qwen"})
    out = loss(batch)
    tokens = batch["history", "full"].apply_chat_template(
        tokenizer=tokenizer, **loss.tokenizer_kwargs
    )
    masks = tokens.get("assistant_masks", as_list=True)
    log_probs = actor(batch.select(("history", "full"))).get(("log_probs", "full"), as_list=True)
    expected = [-(lp[m.bool()]).mean() for lp, m in zip(log_probs, masks, strict=True)]
    torch.testing.assert_close(out.loss_sft, torch.stack(expected))
    assert [int(m.sum()) for m in masks] == [2, 5]  # the words of each answer


def test_errors(setup):
    actor, tokenizer, batch = setup
    with pytest.raises(ValueError, match="loss_function must be one of"):
        rl_llm.SFTLoss(actor, loss_function="dpo")
    with pytest.raises(ValueError, match="reduction must be one of"):
        rl_llm.SFTLoss(actor, reduction="max")
    with pytest.warns(UserWarning, match="kl_to_ref_coeff should not be set"):
        loss = rl_llm.SFTLoss(actor, loss_function="minor_sft", kl_to_ref_coeff=0.1)
    assert loss.kl_to_ref_coeff == 0.0
    loss = rl_llm.SFTLoss(
        actor, kl_to_ref_coeff=0.1, tokenizer_kwargs={"chat_template_name": "qwen"}
    )
    assert loss.in_keys == [("history", "full"), ("next", "ref_log_probs", "full")]
    with pytest.raises(ValueError, match="Reference log probs not found"):
        loss(batch.exclude(("next", "ref_log_probs")))


def test_tokenizer_kwargs_dict_is_left_as_given(setup):
    """The loss adds its chat-template defaults to a copy of ``tokenizer_kwargs``: a dict the
    caller shares with ``History.apply_chat_template`` keeps only its own keys (TorchRL's
    ``SFTLoss`` writes them into the caller's dict)."""
    actor = setup[0]
    kwargs = {"chat_template_name": "qwen"}
    loss = rl_llm.SFTLoss(actor, tokenizer_kwargs=kwargs)
    assert kwargs == {"chat_template_name": "qwen"}
    assert loss.tokenizer_kwargs["return_assistant_tokens_mask"] is True
    torchrl_llm.SFTLoss(actor, tokenizer_kwargs=kwargs)
    assert "return_assistant_tokens_mask" in kwargs  # TorchRL's: the caller's dict changed


def _with_reference_outside_the_answers(batch, loss, fill):
    """``batch`` with its reference log-probs replaced by ``fill(shape)`` off the assistant
    tokens (``RetrieveLogProb(assistant_only=True)`` writes zeros there)."""
    from tensordict import lazy_stack

    from rlloss.llm.base import chat_masks

    key = ("next", "ref_log_probs", "full")
    assistant, attention = chat_masks("test", loss, batch)
    masks = [a & m for a, m in zip(assistant, attention, strict=True)]
    rows = []
    for row, mask in zip(batch.unbind(0), masks, strict=True):
        row = row.clone()
        ref = row[key]
        row[key] = torch.where(mask.bool(), ref, fill(ref.shape))
        rows.append(row)
    return lazy_stack(rows)


@pytest.mark.parametrize("loss_function", ["sft", "minor_sft"])
def test_reference_log_probs_outside_the_assistant_mask_do_not_count(setup, loss_function):
    """NaN or any value at the prompt positions of the reference log-probs reaches neither
    ``loss_sft`` (MinorSFT), ``loss_kl_to_ref`` nor the gradient: the loss equals the one
    with zeros there (TorchRL's RetrieveLogProb layout, where it equals TorchRL's)."""
    actor, tokenizer, batch = setup
    kl = 0.5 if loss_function == "sft" else None
    loss = rl_llm.SFTLoss(
        actor,
        loss_function=loss_function,
        kl_to_ref_coeff=kl,
        tokenizer_kwargs={"chat_template_name": "qwen"},
    )
    reference, reference_grad = run(loss, batch, actor.model)
    fills = {"nan": lambda s: torch.full(s, torch.nan), "noise": lambda s: torch.randn(s) - 3.0}
    for name, fill in fills.items():
        shifted = _with_reference_outside_the_answers(batch, loss, fill)
        ours, grad = run(loss, shifted, actor.model)
        for key in ("loss_sft", "loss_kl_to_ref", "kl_to_ref"):
            if reference.get(key) is not None:
                torch.testing.assert_close(ours.get(key), reference.get(key), msg=f"{name} {key}")
        for a, b in zip(grad, reference_grad, strict=True):
            torch.testing.assert_close(a, b)


def test_minor_sft_beta_must_be_positive(setup):
    """``beta`` scales MinorSFT's implicit reward: 0 or a negative value (which would reward
    moving away from the demonstration) is refused at construction and on assignment."""
    actor, tokenizer, _ = setup
    for beta in (-1.0, 0.0):
        with pytest.raises(ValueError, match=r"beta.*\(0"):
            rl_llm.SFTLoss(actor, loss_function="minor_sft", beta=beta)
    loss = rl_llm.SFTLoss(actor, loss_function="minor_sft", beta=0.2)
    with pytest.raises(ValueError, match=r"beta.*\(0"):
        loss.beta = -1.0
    assert loss.beta == 0.2
