"""A causal bigram language model in TorchRL's LLM-wrapper contract and preference batches in
TorchRL's token layout, for the preference losses' tests (no ``transformers`` needed).

The bigram model predicts token ``t`` from token ``t - 1``: its distribution at position ``t``
is ``softmax(E[y_{t-1}])`` (TorchRL's wrappers return the distribution of each position's own
token, the causal shift done); a causal LM's logits of ``input_ids`` (position ``j``
predicting ``j + 1``, TRL's convention) are ``E[input_ids]``."""

from __future__ import annotations

import torch
from tensordict import TensorDict

VOCAB = 16


class CausalBigram(torch.nn.Module):
    """``_get_sft_dist`` (the response: attended tokens past the prompt), ``_get_generic_dist``
    (every attended token); ``lm_logits`` the same model in a causal LM's convention."""

    def __init__(self, seed: int = 0, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(seed)
        self.logits = torch.nn.Embedding(VOCAB, VOCAB, dtype=dtype)

    def lm_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.logits(input_ids)

    def _dist(self, tensordict, mask):
        from torchrl.modules.distributions import LLMMaskedCategorical

        tokens = tensordict["tokens", "full"]
        previous = self.logits(tokens[..., :-1])
        first = torch.zeros_like(previous[..., :1, :])
        return LLMMaskedCategorical(logits=torch.cat([first, previous], -2), mask=mask)

    def _get_generic_dist(self, tensordict):
        return self._dist(tensordict, tensordict["masks", "all_attention_mask"])

    def _get_sft_dist(self, tensordict):
        attention = tensordict["masks", "all_attention_mask"]
        prompt = tensordict["tokens", "prompt"].shape[-1]
        response = torch.arange(attention.shape[-1], device=attention.device) >= prompt
        return self._dist(tensordict, attention & response)


def responses(
    batch: int = 3, length: int = 10, prompt: int = 4, seed: int = 0, dtype=torch.float64
) -> TensorDict:
    """Responses in TorchRL's token layout: row 0 left padded by 2, the last row ending with
    2 padding tokens (a shorter response), per-token reference log-probs ``NaN`` wherever the
    attention mask is off (padding must never reach the arithmetic)."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randint(1, VOCAB, (batch, length), generator=g)
    attention = torch.ones(batch, length, dtype=torch.bool)
    attention[0, :2] = False
    attention[-1, -2:] = False
    full = torch.where(attention, full, 0)
    ref = -torch.rand(batch, length, generator=g, dtype=dtype) * 3 - 0.5
    ref = torch.where(attention, ref, torch.nan)
    return TensorDict(
        tokens={"full": full, "prompt": full[:, :prompt]},
        masks={"all_attention_mask": attention},
        ref_log_probs={"full": ref},
        batch_size=[batch],
    )


def response_mask(td: TensorDict, strategy: str = "sft") -> torch.Tensor:
    """The tokens the losses score: the attended ones, past the prompt for ``"sft"``."""
    attention = td["masks", "all_attention_mask"]
    if strategy == "generic":
        return attention
    return attention & (torch.arange(attention.shape[-1]) >= td["tokens", "prompt"].shape[-1])


def pair_batch(batch: int = 3, seed: int = 0, dtype=torch.float64) -> TensorDict:
    """Chosen (10 tokens) and rejected (7 tokens) responses to the same prompts."""
    return TensorDict(
        chosen=responses(batch, 10, seed=seed, dtype=dtype),
        rejected=responses(batch, 7, seed=seed + 1, dtype=dtype),
        batch_size=[batch],
    )


def kto_batch(batch: int = 4, seed: int = 0, dtype=torch.float64) -> TensorDict:
    """Responses labelled desirable or not, and mismatched responses for KTO's reference
    point (the reference of the mismatched ones below the policy's on average)."""
    labels = torch.arange(batch) % 2 == 0
    mismatched = responses(batch, 9, seed=seed + 7, dtype=dtype)
    mismatched["ref_log_probs", "full"] -= 2.5
    return TensorDict(
        response=responses(batch, 9, seed=seed, dtype=dtype),
        kl_response=mismatched,
        label=labels,
        batch_size=[batch],
    )
