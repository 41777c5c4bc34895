"""A tiny language model and batches for the LLM losses' tests: a 2-layer Qwen2 built from a
config (random weights, nothing downloaded), a word-level tokenizer built in memory, TorchRL's
``TransformersWrapper`` around them, and padded token batches in TorchRL's layout."""

from __future__ import annotations

import pytest
import torch
from tensordict import MetaData, TensorDict

VOCAB = 32


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


def tiny_model(seed: int = 0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
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


def tiny_actor(seed: int = 0):
    from torchrl.modules.llm import TransformersWrapper

    return TransformersWrapper(
        tiny_model(seed),
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
