"""GRPOLoss, DAPO and CISPOLoss in TorchRL's chat-history input mode: a ``TransformersWrapper``
with ``input_mode="history"`` (unpadded, ragged outputs) around the tiny Qwen2, a word-level
tokenizer built in memory with TorchRL's "qwen" chat template (nothing downloaded), and the
batch the wrapper itself writes when it scores the chats (tokens, masks, log-probs): parity
with TorchRL's classes (values and gradients) under every masking strategy, and the alignment
of a ragged per-token advantage."""

from __future__ import annotations

import pytest
import tensordict
import torch
from tensordict import lazy_stack

pytest.importorskip("transformers")

import torchrl.objectives.llm as torchrl_llm  # noqa: E402

import rlloss.llm as rl_llm  # noqa: E402
from tests.llm_nets import (  # noqa: E402
    chat_batch,
    history_actor,
    lists_stacked,  # noqa: F401 (an autouse fixture)
    tiny_model,
    tiny_tokenizer,
)

LOSS_KEYS = ("loss_objective", "loss_entropy", "loss_kl_to_ref")


@pytest.fixture(scope="module")
def setup():
    """The history-mode actor and a batch as a GRPO pipeline holds it: the chats scored by the
    actor (ragged ``tokens``, ``masks``, ``log_probs``), the sampling log-probs moved away from
    the current ones, a reference's, and a per-token advantage ``[T_i, 1]`` per chat."""
    with tensordict.set_list_to_stack(True):
        tokenizer, model = tiny_tokenizer(), tiny_model()
        actor = history_actor(model, tokenizer, return_log_probs=True)
        batch = chat_batch(tokenizer)
        with torch.no_grad():
            scored = actor(batch.select(("history", "full")))
        g = torch.Generator().manual_seed(0)
        rows = []
        for row in scored.unbind(0):
            log_probs = row["log_probs", "full"]
            noise = torch.randn((2, *log_probs.shape), generator=g)
            row["log_probs", "full"] = log_probs + 0.3 * noise[0]
            row["next", "ref_log_probs", "full"] = log_probs + 0.2 * noise[1]
            row["advantage"] = torch.randn(log_probs.shape[0], 1, generator=g)
            rows.append(row)
        return actor, lazy_stack(rows)


def with_advantage(batch, advantage):
    """``batch`` with the dense advantage ``[B, T, 1]`` stored row by row."""
    rows = [
        row.clone().set("advantage", adv)
        for row, adv in zip(batch.unbind(0), advantage, strict=True)
    ]
    return lazy_stack(rows)


def run(loss, batch, model):
    model.zero_grad()
    out = loss(batch.clone())
    sum(out.get(k).sum() for k in LOSS_KEYS).backward()
    return out, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["GRPOLoss", "DAPO", "CISPOLoss"])
@pytest.mark.parametrize("strategy", ["rlhf", "sft", "generic"])
def test_parity_with_torchrl_in_history_mode(setup, name, strategy):
    actor, batch = setup
    # the advantage stored padded on the left, as the log-probs are: both libraries align it
    advantage = batch.get("advantage", as_padded_tensor=True, padding_side="left")
    batch = with_advantage(batch, advantage)
    keywords = dict(masking_strategy=strategy, kl_to_ref_coeff=0.1)
    theirs, their_grad = run(getattr(torchrl_llm, name)(actor, **keywords), batch, actor.model)
    ours, our_grad = run(getattr(rl_llm, name)(actor, **keywords), batch, actor.model)
    assert type(ours) is type(theirs)
    for key in (*LOSS_KEYS, "ESS", "kl_to_ref"):
        torch.testing.assert_close(ours.get(key), theirs.get(key).reshape(ours.get(key).shape))
    if name == "CISPOLoss":
        return  # the gradients of clipped tokens differ on purpose (tests/test_llm_grpo.py)
    for mine, reference in zip(our_grad, their_grad, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-7)


def test_a_ragged_advantage_is_aligned_with_the_tokens(setup):
    """A per-token advantage stored ragged (one ``[T_i, 1]`` per chat) is padded on the side the
    actor pads its log-probs (left), so each token keeps its own advantage; TorchRL pads it on
    the right (``as_padded_tensor``'s default) against left-padded log-probs, which shifts the
    advantages of every shorter chat (docs/differences.md)."""
    actor, batch = setup
    left = batch.get("advantage", as_padded_tensor=True, padding_side="left")
    right = batch.get("advantage", as_padded_tensor=True, padding_side="right")
    assert not torch.equal(left, right)  # the chats have different lengths
    ours = rl_llm.GRPOLoss(actor, masking_strategy="rlhf")
    theirs = torchrl_llm.GRPOLoss(actor, masking_strategy="rlhf")
    aligned = ours(with_advantage(batch, left)).loss_objective
    torch.testing.assert_close(ours(batch.clone()).loss_objective, aligned)
    shifted = theirs(batch.clone()).loss_objective.reshape(())
    torch.testing.assert_close(shifted, ours(with_advantage(batch, right)).loss_objective)
    assert not torch.allclose(shifted, aligned)
