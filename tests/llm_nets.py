"""A tiny language model and batches for the LLM losses' tests: a 2-layer Qwen2 built from a
config (random weights, nothing downloaded), a word-level tokenizer built in memory, TorchRL's
``TransformersWrapper`` around them, and padded token batches in TorchRL's layout."""

from __future__ import annotations

import pytest
import torch
from tensordict import MetaData, TensorDict

VOCAB = 32


@pytest.fixture(autouse=True)
def lists_stacked():
    """Lists stored in a TensorDict are stacked (TorchRL's LLM tests' setting); autouse in the
    test modules that import it."""
    import tensordict

    with tensordict.set_list_to_stack(True):
        yield


def tiny_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tokenizer = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


def tiny_model(seed: int = 0, vocab: int = VOCAB):
    """The 2-layer Qwen2; ``vocab`` above the tokenizer's ``VOCAB`` widens the logits only."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def tiny_actor(seed: int = 0, vocab: int = VOCAB):
    from torchrl.modules.llm import TransformersWrapper

    return TransformersWrapper(
        tiny_model(seed, vocab),
        tokenizer=tiny_tokenizer(),
        generate=False,
        pad_output=True,
        input_mode="tokens",
    )


def token_batch(
    batch: int = 3, length: int = 10, prompt: int = 4, seed: int = 0, spread: float = 0.3
) -> TensorDict:
    """Prompt + response tokens, left padded (row 0 has two pad tokens), the sampling
    log-probs, a per-token advantage and reference log-probs, in TorchRL's layout."""
    from torchrl.modules.llm.policies.common import Masks, Tokens

    g = torch.Generator().manual_seed(seed)
    full = torch.randint(2, VOCAB, (batch, length), generator=g)
    attention = torch.ones(batch, length, dtype=torch.bool)
    attention[0, :2] = False
    full[0, :2] = 0
    log_probs = -torch.rand(batch, length, generator=g) * 3 - 2
    return TensorDict(
        {
            "tokens": Tokens(
                full=full, prompt=full[:, :prompt], padded=MetaData(True), batch_size=[batch]
            ),
            "masks": Masks(
                all_attention_mask=attention,
                all_assistant_mask=None,
                padded=MetaData(True),
                batch_size=[batch],
            ),
            "advantage": torch.randn(batch, length, 1, generator=g),
            "log_probs": {"full": log_probs},
            "next": {
                "ref_log_probs": {
                    "full": log_probs + spread * torch.randn(batch, length, generator=g)
                }
            },
        },
        [batch],
    )


CHATS = [
    [
        {"role": "system", "content": "t2 t3"},
        {"role": "user", "content": "t4 t5 t6"},
        {"role": "assistant", "content": "t7 t8"},
    ],
    [
        {"role": "system", "content": "t2 t3"},
        {"role": "user", "content": "t4 t5"},
        {"role": "assistant", "content": "t9 t10 t11 t12 t13"},
    ],
]


def varied_chats(shapes, seed: int = 0) -> list:
    """One chat (system, user, assistant) per ``(user words, assistant words)`` of ``shapes``,
    random words of the tiny vocabulary: chats of different lengths."""
    g = torch.Generator().manual_seed(seed)

    def words(n):
        return " ".join(f"t{int(i)}" for i in torch.randint(2, VOCAB, (n,), generator=g))

    return [
        [
            {"role": "system", "content": "t2 t3"},
            {"role": "user", "content": words(user)},
            {"role": "assistant", "content": words(assistant)},
        ]
        for user, assistant in shapes
    ]


def chat_batch(tokenizer, chats=None):
    """Chats (system, user, assistant; default the two of ``CHATS``) in TorchRL's layout for
    SFT, lazily stacked."""
    from tensordict import lazy_stack
    from torchrl.data import History
    from torchrl.modules.llm.policies.common import ChatHistory, Text

    chats = CHATS if chats is None else chats
    history = History.from_chats(chats)
    prompt = history[:, :-1].apply_chat_template(
        tokenizer=tokenizer, chat_template_name="qwen", add_generation_prompt=True
    )
    full = history.apply_chat_template(
        tokenizer=tokenizer, chat_template_name="qwen", add_generation_prompt=False
    )
    response = [f[len(p) :] for f, p in zip(full, prompt, strict=True)]
    batch = TensorDict(
        text=Text(prompt=prompt, response=response, full=full),
        history=ChatHistory(full=history, prompt=history[..., :-1], response=history[..., -1:]),
        next=TensorDict(
            reward=torch.zeros(len(chats), 1),
            done=torch.zeros(len(chats), dtype=torch.bool),
            history=ChatHistory(prompt=history),
        ),
        batch_size=(len(chats),),
    )
    return lazy_stack(list(batch.unbind(0)))


def history_actor(model, tokenizer, **kwargs):
    from torchrl.modules.llm import TransformersWrapper

    return TransformersWrapper(
        model,
        tokenizer=tokenizer,
        generate=False,
        chat_template_name="qwen",
        input_mode="history",
        pad_output=False,
        **kwargs,
    )


def with_ref_log_probs(batch, model, tokenizer, key="ref_log_probs", assistant_only=True):
    """``("next", key, "full")`` from a perturbed copy of ``model`` (a reference or a teacher,
    through TorchRL's ``RetrieveLogProb``, on the assistant tokens only by default)."""
    import copy

    from torchrl.envs.llm.transforms.kl import RetrieveLogProb

    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    transform = RetrieveLogProb(
        history_actor(reference, tokenizer, return_log_probs=True),
        assistant_only=assistant_only,
        tokenizer_kwargs={"chat_template_name": "qwen"},
        tokenizer=tokenizer,
        log_probs_full_key=(key, "full"),
    )
    with torch.no_grad():
        transform(batch)
    return batch


class TokenActor(torch.nn.Module):
    """A stand-in language model with TorchRL's ``LLMWrapperBase`` distribution contract and
    no ``transformers``: each position's logits are a learned embedding of its token (a bigram
    model), the masks those of TorchRL's wrappers (``_get_sft_dist``: the response tokens, past
    the prompt and the padding; ``_get_generic_dist``: every attended token). It reads nothing
    on the host, so the contract's host-read and compile checks see the loss alone."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.logits = torch.nn.Embedding(VOCAB, VOCAB)

    def _dist(self, tensordict, mask):
        from torchrl.modules.distributions import LLMMaskedCategorical

        return LLMMaskedCategorical(logits=self.logits(tensordict["tokens", "full"]), mask=mask)

    def _get_generic_dist(self, tensordict):
        return self._dist(tensordict, tensordict["masks", "all_attention_mask"])

    def _get_sft_dist(self, tensordict):
        attention = tensordict["masks", "all_attention_mask"]
        prompt = tensordict["tokens", "prompt"].shape[-1]
        response = torch.arange(attention.shape[-1], device=attention.device) >= prompt
        return self._dist(tensordict, attention & response)


class ResponseTokenActor(TokenActor):
    """:class:`TokenActor` whose ``"sft"`` mask is the batch's ``("masks",
    "all_assistant_mask")`` (the response of each left-padded sequence, whatever its length)."""

    def _get_sft_dist(self, tensordict):
        return self._dist(tensordict, tensordict["masks", "all_assistant_mask"])


def ragged_token_batch(actor, shapes, seed: int = 0, spread: float = 0.2) -> list:
    """One sequence per ``(prompt length, response length)`` of ``shapes``, as a list of
    ``[1, L]`` batches for :func:`left_padded`: tokens, the response mask, sampling and
    reference log-probs (``actor``'s plus noise of std ``spread``, NaN on the prompt as
    TorchRL writes them), and a per-token advantage."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for prompt, response in shapes:
        tokens = torch.randint(2, VOCAB, (1, prompt + response), generator=g)
        with torch.no_grad():
            log_prob = actor.logits(tokens).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
        assistant = torch.arange(prompt + response)[None] >= prompt
        old = log_prob + spread * torch.randn(log_prob.shape, generator=g)
        ref = log_prob + spread * torch.randn(log_prob.shape, generator=g)
        out.append(
            {
                "tokens": tokens,
                "assistant": assistant,
                "old": torch.where(assistant, old, torch.nan),
                "ref": torch.where(assistant, ref, torch.nan),
                "advantage": torch.randn(1, prompt + response, generator=g),
            }
        )
    return out


def left_padded(sequences: list) -> TensorDict:
    """The sequences of :func:`ragged_token_batch` left padded to the longest, in TorchRL's
    token layout (``("tokens", "full")``, ``("masks", ...)``, ``("log_probs", "full")``,
    ``("next", "ref_log_probs", "full")``, ``"advantage"`` ``[B, T, 1]``)."""
    width = max(seq["tokens"].shape[-1] for seq in sequences)

    def pad(name, value):
        rows = []
        for seq in sequences:
            entry = seq[name]
            fill = torch.full((1, width - entry.shape[-1]), value, dtype=entry.dtype)
            rows.append(torch.cat([fill, entry], -1))
        return torch.cat(rows)

    attention = pad("tokens", -1) >= 0
    return TensorDict(
        {
            "tokens": {"full": pad("tokens", 0)},
            "masks": {"all_attention_mask": attention, "all_assistant_mask": pad("assistant", 0)},
            "log_probs": {"full": pad("old", 0.0)},
            "next": {"ref_log_probs": {"full": pad("ref", 0.0)}},
            "advantage": pad("advantage", 0.0)[..., None],
        },
        [len(sequences)],
    )
