"""The LLM post-training family on a tiny token model: GRPOLoss (the clipped token-level
surrogate with the k3 KL to a reference policy, token mean) against TorchRL's ``GRPOLoss`` and
a hand-written plain-torch GRPO step, on the same model and padded batch.

The model is a per-position network (embedding, tanh layer, vocabulary logits) with TorchRL's
``LLMWrapperBase`` distribution contract (``get_dist``, ``_get_sft_dist``: a masked categorical
over the response tokens, the prompt and the left padding masked), so that the rows measure
the loss, not a transformer: the per-token work of a real model is the same for all methods.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torchrl.objectives.llm
from tensordict import MetaData, TensorDict
from torch import nn
from torchrl.modules.distributions import LLMMaskedCategorical
from torchrl.modules.llm.policies.common import Masks, Tokens

from benchmarks import harness
from benchmarks.cases.common import described, loss_module_method, prefixed, rlloss_attr
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (8, 128)  # sequences of TOKENS tokens each
VOCAB, HIDDEN, TOKENS, PROMPT = 128, 64, 64, 16
GRPO_KWARGS = dict(clip_epsilon=0.2, kl_to_ref_coeff=0.1, entropy_bonus=False)
LOSS_KEYS = ("loss_objective", "loss_kl_to_ref")


class TinyTokenModel(nn.Module):
    """Per-position logits ``head(tanh(embed(token)))`` with the distribution methods TorchRL's
    LLM losses call: ``_get_sft_dist`` (the response tokens: attended and past the prompt) and
    ``get_dist`` (every attended token)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))

    def get_dist(self, tensordict, **kwargs) -> LLMMaskedCategorical:
        mask = tensordict["masks", "all_attention_mask"]
        return LLMMaskedCategorical(logits=self(tensordict["tokens", "full"]), mask=mask)

    def _get_sft_dist(self, tensordict) -> LLMMaskedCategorical:
        mask = response_mask(
            tensordict["masks", "all_attention_mask"], tensordict["tokens", "prompt"].shape[-1]
        )
        return LLMMaskedCategorical(logits=self(tensordict["tokens", "full"]), mask=mask)


def response_mask(attention: torch.Tensor, prompt: int) -> torch.Tensor:
    """The tokens a GRPO step trains on: attended and past the prompt's ``prompt`` positions."""
    positions = torch.arange(attention.shape[-1], device=attention.device)
    return attention & (positions >= prompt)


def token_batch(model: TinyTokenModel, batch_size: int, seed: int) -> dict[str, TensorDict]:
    """Sampled sequences in TorchRL's layout (``("tokens", "full")``, ``("masks", ...)``; every
    other sequence left padded by an eighth of its length), the sampling log-probs (the model's,
    so the ratios start at 1), the reference's (shifted) and a per-token advantage. The gate-only
    ``off-policy`` batch shifts the sampling log-probs so that the clip is active."""
    g = torch.Generator().manual_seed(seed + 1)
    full = torch.randint(1, VOCAB, (batch_size, TOKENS), generator=g)
    attention = torch.ones(batch_size, TOKENS, dtype=torch.bool)
    attention[::2, : TOKENS // 8] = False
    full[~attention] = 0
    with torch.no_grad():
        log_probs = model(full).log_softmax(-1).gather(-1, full.unsqueeze(-1)).squeeze(-1)
    data = TensorDict(
        {
            "tokens": Tokens(
                full=full, prompt=full[:, :PROMPT], padded=MetaData(True), batch_size=[batch_size]
            ),
            "masks": Masks(
                all_attention_mask=attention,
                all_assistant_mask=None,
                padded=MetaData(True),
                batch_size=[batch_size],
            ),
            "advantage": torch.randn(batch_size, TOKENS, 1, generator=g),
            "log_probs": {"full": log_probs},
            "next": {
                "ref_log_probs": {
                    "full": log_probs + 0.3 * torch.randn(log_probs.shape, generator=g)
                }
            },
        },
        [batch_size],
    )
    offpolicy = data.clone()
    offpolicy["log_probs", "full"] = log_probs + 0.4 * torch.randn(log_probs.shape, generator=g)
    return {"on-policy": data.to(harness.DEVICE), "off-policy": offpolicy.to(harness.DEVICE)}


def kl_mean(mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The per-token KL's average: over every position of the padded batch, the response's
    tokens and the zeros elsewhere (what both libraries compute)."""
    return value.mean()


def plain_grpo_loss(model: TinyTokenModel, batch) -> Callable:
    """GRPO's step written by hand on tensors (arXiv:2402.03300, eq. 3, with DAPO's token
    mean): the token log-ratio to the sampling policy over the response tokens, the clipped
    surrogate ``min(r A, clip(r, 1 - eps, 1 + eps) A)`` averaged over those tokens, and ``coeff``
    times the k3 estimate of ``KL(pi || pi_ref)`` averaged over every padded position (as both
    libraries do), and the clip fraction, the approximate KL and the ESS."""
    tokens = batch["tokens", "full"]
    mask = response_mask(batch["masks", "all_attention_mask"], batch["tokens", "prompt"].shape[-1])
    old, ref = batch["log_probs", "full"], batch["next", "ref_log_probs", "full"]
    advantage = batch["advantage"].squeeze(-1)
    eps, coeff = GRPO_KWARGS["clip_epsilon"], GRPO_KWARGS["kl_to_ref_coeff"]
    count = mask.sum()

    def loss() -> torch.Tensor:
        log_prob = model(tokens).log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        log_ratio = torch.where(mask, log_prob - old, 0.0)
        ratio = log_ratio.exp()
        surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - eps, 1 + eps) * advantage)
        loss_objective = -torch.where(mask, surrogate, 0.0).sum() / count
        diff = torch.where(mask, ref - log_prob, 0.0)
        loss_kl = coeff * kl_mean(mask, diff.exp() - 1 - diff)
        # computed as the libraries report them, then dropped
        with torch.no_grad():
            lr = log_ratio.detach()
            weight = torch.where(mask, lr.exp(), 0.0)
            _ = [
                ((lr.abs() > eps) & mask).sum() / count,  # clip fraction
                -torch.where(mask, lr, 0.0).sum() / count,  # kl_approx
                weight.sum().square() / weight.square().sum() / count,  # ESS
            ]
        return loss_objective + loss_kl

    return loss


def build_grpo(batch_size: int, seed: int) -> CaseSetup:
    """``GRPOLoss`` on ``batch_size`` sequences of ``TOKENS`` tokens."""
    torch.manual_seed(seed)
    model = TinyTokenModel()
    batches = token_batch(model, batch_size, seed)
    model.to(harness.DEVICE)

    def module_factory(cls_getter: Callable[[], type]) -> Callable:
        def make(batch) -> Method:
            m = copy.deepcopy(model)
            loss = cls_getter()(m, **GRPO_KWARGS)
            return loss_module_method(loss, batch, prefixed("model", m), LOSS_KEYS)

        return make

    def plain(batch) -> Method:
        m = copy.deepcopy(model)
        return Method(plain_grpo_loss(m, batch), prefixed("model", m), tuple(m.parameters()))

    return CaseSetup(
        batches=batches,
        factories={
            "plain": plain,
            "rlloss": module_factory(lambda: rlloss_attr("GRPOLoss")),
            "torchrl": module_factory(lambda: torchrl.objectives.llm.GRPOLoss),
        },
        description=(
            f"{described('GRPOLoss', GRPO_KWARGS)} (token_mean, masking_strategy='sft'); "
            f"a per-position token model (embedding {VOCAB}->{HIDDEN}, tanh, {VOCAB} logits) with "
            f"TorchRL's LLM distribution contract; {TOKENS} tokens per sequence, {PROMPT} of prompt, "
            "every other sequence left padded by an eighth; per-token advantages"
        ),
    )


CASES = {"GRPOLoss": build_grpo}
