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


def chat_batch(tokenizer):
    """Two chats (system, user, assistant) in TorchRL's layout for SFT, lazily stacked."""
    from tensordict import lazy_stack
    from torchrl.data import History
    from torchrl.modules.llm.policies.common import ChatHistory, Text

    history = History.from_chats(CHATS)
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
            reward=torch.zeros(2, 1),
            done=torch.zeros(2, dtype=torch.bool),
            history=ChatHistory(prompt=history),
        ),
        batch_size=(2,),
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
