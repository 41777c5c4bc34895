"""pytest plugin: TorchRL's LLM objective tests without network access.

TorchRL's ``test/llm/test_llm_objectives.py`` builds its models from configs but loads two
tokenizers from the Hugging Face hub (``Qwen/Qwen2.5-0.5B``, ``facebook/opt-125m``); offline,
38 of its tests fail on the download in both modes (TorchRL's classes and rlloss's). Load with
``-p offline_tokenizers`` (this folder on ``PYTHONPATH``), next to ``-p swap_plugin``:
``AutoTokenizer.from_pretrained`` of those two names returns a word-level tokenizer built in
memory (words and punctuation of the tests' chats, ChatML's markers, ``<pad>`` and ``</s>``),
the same object in both modes, so the tests compare the two implementations on identical
tokens. Any other name goes to the hub as before.
"""

from __future__ import annotations

import functools

OFFLINE_NAMES = ("Qwen/Qwen2.5-0.5B", "facebook/opt-125m")
WORDS = (
    "You are a useful assistant . What is 2 + = 4 ? Hello , how you I ' m doing well thank very "
    "much ! system user im_start im_end < > | \\n Paris capital of France The"
).split()


@functools.cache
def _tokenizer():
    import tokenizers
    import transformers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    special = ["<pad>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(special + WORDS))}
    backend = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        padding_side="left",
    )
    return tokenizer


def pytest_configure(config):
    import copy

    import transformers

    original = transformers.AutoTokenizer.from_pretrained.__func__

    def from_pretrained(cls, name, *args, **kwargs):
        if name in OFFLINE_NAMES:
            return copy.deepcopy(_tokenizer())  # tests set attributes (pad_token) on it
        return original(cls, name, *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = classmethod(from_pretrained)
