"""The LLM losses' memory contract (issue 36): a loss never materialises a ``[batch, tokens,
vocab]`` tensor beyond what the actor returns.

Every aten op of a forward and backward runs under a ``TorchDispatchMode`` that records the
ops outside the actor creating a new tensor (not a view of an input) of ``batch * tokens *
vocab`` elements or more. "Inside the actor" is, in the forward, the actor's calls
(``forward``, ``_get_*_dist``, ``get_dist``: the tiny Qwen2 and TorchRL's wrapper around it);
in the backward, the autograd nodes those calls created (their sequence numbers). The vocabulary
(512) is large enough that only a per-vocabulary-entry tensor reaches the threshold.

In the backward, the gradient of the actor's logits is ``[batch, tokens, vocab]`` by definition
and is built by the loss's nodes: that one tensor is allowed (the GRPO family computes its
log-probs and entropies in one function, :func:`rlloss.functional.token_log_prob_entropy`,
whose backward writes the gradient chunk by chunk into it), nothing else.
"""

from __future__ import annotations

import pytest
import tensordict
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

pytest.importorskip("transformers")

import rlloss.llm as rl_llm  # noqa: E402
from rlloss.llm import grpo as grpo_module  # noqa: E402
from tests.llm_nets import (  # noqa: E402
    chat_batch,
    history_actor,
    tiny_actor,
    tiny_model,
    tiny_tokenizer,
    token_batch,
    with_ref_log_probs,
)

WIDE_VOCAB = 512
BATCH, TOKENS = 16, 16  # 256 positions: more than one chunk of token_log_prob_entropy
ACTOR_METHODS = ("forward", "get_dist", "_get_sft_dist", "_get_rlhf_dist", "_get_generic_dist")
GRPO_FAMILY = ["GRPOLoss", "DAPO", "CISPOLoss", "DrGRPOLoss", "GSPOLoss"]
GRPO_KEYWORDS = {"kl_to_ref_coeff": 0.1, "kl_to_inference_coeff": 0.05}


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


def _sequence_nr() -> int:
    """The autograd sequence number the next node will get."""
    return (torch.zeros(1, requires_grad=True) * 1).grad_fn._sequence_nr()


class VocabTensors(TorchDispatchMode):
    """Records ``(phase, op, shape)`` of every new tensor of ``threshold`` elements or more that
    an op outside the actor creates (:func:`watch_actor` marks the actor's calls)."""

    def __init__(self, threshold: int):
        super().__init__()
        self.threshold, self.in_actor, self.actor_nodes, self.found = threshold, False, [], []

    def _inside_actor(self, node) -> bool:
        if node is None:
            return self.in_actor
        nr = node._sequence_nr()
        return any(low <= nr < high for low, high in self.actor_nodes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        node = torch._C._current_autograd_node()
        if self._inside_actor(node):
            return out
        inputs = tree_flatten((args, kwargs))[0]
        storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.numel() >= self.threshold
                and tensor.untyped_storage().data_ptr() not in storages
            ):
                phase = "forward" if node is None else "backward"
                self.found.append((phase, str(func), tuple(tensor.shape)))
        return out


def watch_actor(actor, mode: VocabTensors) -> None:
    """Wraps the actor's methods (on the instance) to mark their calls as the actor's."""
    for name in ACTOR_METHODS:
        method = getattr(actor, name, None)
        if method is None:
            continue

        def marked(*args, _method=method, **kwargs):
            mode.in_actor, start = True, _sequence_nr()
            try:
                return _method(*args, **kwargs)
            finally:
                mode.in_actor = False
                mode.actor_nodes.append((start, _sequence_nr()))

        setattr(actor, name, marked)


def vocab_tensors(loss, actor, batch, loss_keys, tokens: int) -> list:
    """The ``[batch, tokens, vocab]``-sized tensors the loss creates in a forward and a
    backward of the sum of ``loss_keys``."""
    mode = VocabTensors(batch.batch_size[0] * tokens * WIDE_VOCAB)
    watch_actor(actor, mode)
    with mode:
        out = loss(batch)
        total = sum(out.get(k).sum() for k in loss_keys if out.get(k) is not None)
        total.backward()
    for name in ACTOR_METHODS:
        actor.__dict__.pop(name, None)
    return mode.found


def check(found: list, logits_gradients: int) -> None:
    forward = [f for f in found if f[0] == "forward"]
    assert not forward, f"the loss's forward materialised [batch, tokens, vocab] tensors: {forward}"
    backward = [f for f in found if f[0] == "backward"]
    assert len(backward) <= logits_gradients, (
        f"the loss's backward built {backward}, beyond the logits' gradient ({logits_gradients})"
    )


def grpo_case(name: str, **keywords):
    actor, batch = tiny_actor(vocab=WIDE_VOCAB), token_batch(batch=BATCH, length=TOKENS)
    return getattr(rl_llm, name)(actor, **GRPO_KEYWORDS, **keywords), actor, batch


LOSS_KEYS = ("loss_objective", "loss_entropy", "loss_kl_to_ref", "loss_kl_to_inference")


@pytest.mark.parametrize("entropy_bonus", [True, False])
@pytest.mark.parametrize("name", GRPO_FAMILY)
def test_grpo_family_creates_no_vocabulary_sized_tensor(name, entropy_bonus):
    loss, actor, batch = grpo_case(name, entropy_bonus=entropy_bonus)
    found = vocab_tensors(loss, actor, batch, LOSS_KEYS, tokens=TOKENS)
    check(found, logits_gradients=1)


def test_a_full_softmax_in_the_loss_is_caught(monkeypatch):
    """The check fails on a loss that computes the softmax over the vocabulary (the entropy
    from ``dist.logits.softmax``): the test above can fail."""
    loss, actor, batch = grpo_case("GRPOLoss", entropy_bonus=False)

    def full_softmax_log_probs(self, tensordict, action):
        dist = self.actor_network._get_sft_dist(tensordict)
        _, entropy, old, mask = original(self, tensordict, action)
        log_prob = dist.logits.log_softmax(-1).gather(-1, tensordict["tokens", "full"][..., None])
        return log_prob.squeeze(-1), entropy, old, mask

    original = grpo_module.GRPOLoss._token_log_probs
    monkeypatch.setattr(grpo_module.GRPOLoss, "_token_log_probs", full_softmax_log_probs)
    found = vocab_tensors(loss, actor, batch, LOSS_KEYS, tokens=TOKENS)
    assert ("forward", "aten._log_softmax.default", (BATCH, TOKENS, WIDE_VOCAB)) in found
    with pytest.raises(AssertionError, match="forward materialised"):
        check(found, logits_gradients=1)


@pytest.fixture(scope="module")
def chats():
    with tensordict.set_list_to_stack(True):
        tokenizer, model = tiny_tokenizer(), tiny_model(vocab=WIDE_VOCAB)
        batch = with_ref_log_probs(chat_batch(tokenizer), model, tokenizer)
        batch = with_ref_log_probs(batch, model, tokenizer, "teacher_log_probs")
        return model, tokenizer, batch


def chat_tokens(batch) -> int:
    """The longest chat's token count (its reference log-probs' length)."""
    return max(lp.shape[-1] for lp in batch.get(("next", "ref_log_probs", "full"), as_list=True))


@pytest.mark.parametrize(
    ("name", "keywords", "loss_keys"),
    [
        ("SFTLoss", {"kl_to_ref_coeff": 0.1}, ("loss_sft", "loss_kl_to_ref")),
        ("DistillationLoss", {}, ("loss_distill",)),
    ],
)
def test_chat_losses_create_no_vocabulary_sized_tensor(chats, name, keywords, loss_keys):
    model, tokenizer, batch = chats
    actor = history_actor(model, tokenizer)
    loss = getattr(rl_llm, name)(
        actor, tokenizer=tokenizer, tokenizer_kwargs={"chat_template_name": "qwen"}, **keywords
    )
    found = vocab_tensors(loss, actor, batch.clone(), loss_keys, tokens=chat_tokens(batch))
    check(found, logits_gradients=0)
