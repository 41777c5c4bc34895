"""What the language-model losses share: the actor's masked token distribution (TorchRL's
``LLMWrapperBase`` contract), padded reads of ragged entries, and the mask / shape contract.

TorchRL's LLM actors (``torchrl.modules.llm.TransformersWrapper``, ``vLLMWrapper``) return a
``LLMMaskedCategorical`` over the padded sequence (left padding), its ``mask`` ``[*B, T]``
marking the tokens a loss counts: the response (``masking_strategy="sft"``), the assistant
turns (``"rlhf"``) or every attended token (``"generic"``). Every per-token entry a loss reads
is brought to that ``[*B, T]`` shape, or refused with an error naming the entry, its shape and
the shape expected.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
from tensordict import NestedKey, TensorDictBase
from torch.nn.utils.rnn import pad_sequence

from rlloss import functional as rlf
from rlloss.common import LossModule

MASKING_STRATEGIES = ("sft", "rlhf", "generic")
_DIST_METHODS = {"sft": "_get_sft_dist", "rlhf": "_get_rlhf_dist", "generic": "_get_generic_dist"}


def check_masking_strategy(masking_strategy: str) -> str:
    if masking_strategy not in MASKING_STRATEGIES:
        raise ValueError(
            f"masking_strategy must be one of {MASKING_STRATEGIES}, got {masking_strategy!r}: "
            "'sft' counts the response tokens, 'rlhf' the assistant turns, 'generic' every "
            "attended token."
        )
    return masking_strategy


def token_distribution(owner: str, actor, tensordict: TensorDictBase, masking_strategy: str):
    """The actor's masked distribution over the batch's tokens for ``masking_strategy``: its
    ``_get_sft_dist`` / ``_get_rlhf_dist`` / ``_get_generic_dist``, else ``get_dist``."""
    method = getattr(actor, _DIST_METHODS[masking_strategy], None)
    if method is not None:
        return method(tensordict)
    if hasattr(actor, "get_dist"):
        return actor.get_dist(tensordict, logits_key="logits")
    raise NotImplementedError(
        f"{owner}: the actor network ({type(actor).__name__}) has neither "
        f"{_DIST_METHODS[masking_strategy]} nor get_dist: pass a torchrl.modules.llm wrapper "
        "(TransformersWrapper, vLLMWrapper) built with generate=False, or a module with "
        "get_dist(tensordict) returning a masked categorical over the tokens."
    )


def read_padded(
    tensordict: TensorDictBase, key: NestedKey, padding_side: str = "left", padding_value=0.0
) -> torch.Tensor | None:
    """The entry ``key`` as one padded tensor (a ragged, lazily stacked entry is padded on
    ``padding_side`` with ``padding_value``), ``None`` if absent."""
    return tensordict.get(
        key, None, as_padded_tensor=True, padding_side=padding_side, padding_value=padding_value
    )


def per_token(owner: str, name: str, key, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``value`` as a ``[*B, T]`` tensor, the shape of the token ``mask``: a ``[*B, T, 1]``
    value loses its feature dim; a ``ValueError`` naming the entry and both shapes otherwise."""
    if value.ndim == mask.ndim + 1 and value.shape[-1] == 1:
        value = value.squeeze(-1)
    if value.shape != mask.shape:
        raise ValueError(
            f"{owner}: the {name} entry {key!r} has shape {tuple(value.shape)}, the actor's "
            f"token mask {tuple(mask.shape)}: give one value per token ([*B, T] or [*B, T, 1]), "
            "padded on the side the actor pads (left), and stored with the masking strategy "
            "the loss uses."
        )
    return value


def token_advantage(owner: str, key, advantage: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The advantage as ``[*B, T]``: per token (``[*B, T]``, ``[*B, T, 1]``) or per sequence
    (``[*B]``, ``[*B, 1]``, broadcast to the tokens); a ``ValueError`` naming both shapes
    otherwise."""
    batch = mask.shape[:-1]
    if advantage.shape in (batch, (*batch, 1)) and advantage.shape != mask.shape:
        return advantage.reshape(*batch, 1).expand(mask.shape)
    if advantage.shape == (*batch, 1, 1) and mask.shape[-1] != 1:
        return advantage.reshape(*batch, 1).expand(mask.shape)
    try:
        return per_token(owner, "advantage", key, advantage, mask)
    except ValueError:
        raise ValueError(
            f"{owner}: the advantage entry {key!r} has shape {tuple(advantage.shape)}, the "
            f"actor's token mask {tuple(mask.shape)}: give one advantage per token "
            f"({tuple(mask.shape)} or {(*mask.shape, 1)}) or one per sequence ({tuple(batch)} "
            f"or {(*batch, 1)})."
        ) from None


def data_parallel_size() -> int:
    """The number of ranks whose gradients DDP or FSDP average: the default process group's
    size when ``torch.distributed`` is initialised, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def per_rank_count(owner: str, num_items_in_batch) -> torch.Tensor | float | None:
    """A loss's denominator from the global count ``num_items_in_batch`` (tokens or sequences
    over every micro-batch of every rank): the count divided by :func:`data_parallel_size`, so
    that the gradients DDP / FSDP average over the ranks, summed over the micro-batches, are
    the whole batch's. ``None`` stays ``None`` (the batch's own count). No value of a tensor is
    read (no host sync)."""
    if num_items_in_batch is None:
        return None
    if isinstance(num_items_in_batch, torch.Tensor):
        if num_items_in_batch.numel() != 1 or num_items_in_batch.requires_grad:
            raise ValueError(
                f"{owner}: num_items_in_batch must be a number or a one-element tensor without "
                f"gradient, got a tensor of shape {tuple(num_items_in_batch.shape)} (requires "
                f"grad: {num_items_in_batch.requires_grad}): pass the count of tokens (or "
                "sequences) of the whole batch, e.g. all_sum(mask.sum()) summed over the "
                "micro-batches."
            )
        return num_items_in_batch.reshape(()) / data_parallel_size()
    if isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, (int, float)):
        raise TypeError(
            f"{owner}: num_items_in_batch must be a number or a one-element tensor, got "
            f"{type(num_items_in_batch).__name__}."
        )
    if not num_items_in_batch > 0:
        raise ValueError(
            f"{owner}: num_items_in_batch must be > 0 (the count of tokens or sequences of "
            f"the whole batch), got {num_items_in_batch}."
        )
    return num_items_in_batch / data_parallel_size()


def runtime_device(module, tensordict: TensorDictBase, fallback: torch.Tensor, *values):
    """Where a call runs: the batch's device, else the first tensor among ``values`` (lists
    searched), else the module's first parameter or buffer, else ``fallback``'s."""
    if tensordict.device is not None:
        return tensordict.device
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor):
                return item.device
    for tensor in (next(module.parameters(), None), next(module.buffers(), None)):
        if tensor is not None:
            return tensor.device
    return fallback.device


def chat_template_kwargs(tokenizer_kwargs: dict | None) -> dict:
    """TorchRL's defaults for tokenizing a chat with its assistant mask."""
    kwargs = dict(tokenizer_kwargs or {})
    kwargs.setdefault("return_assistant_tokens_mask", True)
    kwargs.setdefault("tokenize", True)
    kwargs.setdefault("return_tensors", "pt")
    kwargs.setdefault("padding", False)
    kwargs.setdefault("add_generation_prompt", False)
    return kwargs


class ChatHistoryLoss(LossModule):
    """What the losses over chat histories (``SFTLoss``, ``DistillationLoss``) share: the actor,
    its tokenizer and chat-template keywords (to rebuild the assistant masks when the batch has
    none), the reduction, the per-sequence normalisation, the device fallback, and the keys of
    the chat and of the actor's token log-probs."""

    @dataclasses.dataclass
    class _AcceptedKeys:
        """history: the chat; log_probs: where the actor writes its token log-probs."""

        history: NestedKey = ("history", "full")  # the chats (prompt and response), a History, [*B]
        log_probs: NestedKey = ("log_probs", "full")  # written: the actor's, [*B, T]

    _reads_loss_mask = False  # the assistant masks select the tokens, as in TorchRL

    def __init__(
        self, actor_network, tokenizer, tokenizer_kwargs, reduction, normalize_by_seq_length, device
    ) -> None:
        super().__init__()
        self.actor_network = actor_network
        self.tokenizer = (
            getattr(actor_network, "tokenizer", None) if tokenizer is None else tokenizer
        )
        self.tokenizer_kwargs = chat_template_kwargs(tokenizer_kwargs)
        self.reduction = self._check_reduction(reduction)
        self.normalize_by_seq_length = normalize_by_seq_length
        self.register_buffer("_device_fallback", torch.empty(0, device=device), persistent=False)

    def _per_rank_count(self, num_items_in_batch):
        """The denominator of the mean over sequences (:func:`per_rank_count`); refused with
        a reduction other than ``"mean"``."""
        if num_items_in_batch is not None and self.reduction != "mean":
            raise ValueError(
                f"{type(self).__name__}: num_items_in_batch was given with "
                f"reduction={self.reduction!r}; it replaces the count of the mean: use "
                "reduction='mean'."
            )
        return per_rank_count(type(self).__name__, num_items_in_batch)

    def _reduce(self, per_sequence: torch.Tensor, count=None) -> torch.Tensor:
        """A per-sequence loss reduced by ``reduction``; with a global ``count``, its sum over
        this batch's sequences divided by it."""
        if count is None:
            return rlf.reduce(per_sequence, self.reduction)
        return per_sequence.sum() / count


def chat_masks(owner: str, loss, tensordict: TensorDictBase, need_assistant: bool = True):
    """The assistant masks (``None`` if unknown and not needed) and attention masks of a chat
    batch, lists of one boolean tensor per sequence: ``("masks", ...)`` when the batch has
    them, else the loss's tokenizer's chat template over ``loss.tensor_keys.history``."""
    assistant = tensordict.get(("masks", "all_assistant_mask"), as_list=True)
    attention = tensordict.get(("masks", "all_attention_mask"), as_list=True)
    if (need_assistant and assistant is None) or attention is None:
        if loss.tokenizer is None:
            raise ValueError(
                f"{owner}: a tokenizer is required to recover the token masks because the "
                "input tensordict has no ('masks', ...) entries. Pass a tokenizer to the loss "
                "constructor or provide the masks in the input."
            )
        device = runtime_device(
            loss.actor_network, tensordict, loss._device_fallback, assistant, attention
        )
        history = tensordict[loss.tensor_keys.history]
        with torch.device(device) if device is not None else contextlib.nullcontext():
            tokens = history.apply_chat_template(tokenizer=loss.tokenizer, **loss.tokenizer_kwargs)
        if assistant is None and "assistant_masks" in tokens:
            assistant = tokens.get("assistant_masks", as_list=True)
        if need_assistant and assistant is None:
            raise ValueError(
                f"{owner}: the chat template gave no assistant masks ({tokens=}): use a "
                "template with {% generation %} blocks (chat_template_name='qwen', "
                "'chatml_format'...) or store ('masks', 'all_assistant_mask')."
            )
        if attention is None:
            attention = tokens.get("attention_mask", as_list=True)
    attention = [m.bool() for m in attention]
    return (None if assistant is None else [m.bool() for m in assistant]), attention


def actor_log_probs(owner: str, loss, tensordict: TensorDictBase, masks: list) -> list:
    """The actor's token log-probs of the batch's chats (one tensor per sequence), checked
    against ``masks``' shapes."""
    device = runtime_device(loss.actor_network, tensordict, loss._device_fallback, masks)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        output = loss.actor_network(tensordict.select(loss.tensor_keys.history))
    log_probs = output.get(loss.tensor_keys.log_probs, as_list=True)
    shapes = [(tuple(m.shape), tuple(lp.shape)) for m, lp in zip(masks, log_probs, strict=True)]
    if any(m != lp for m, lp in shapes):
        raise ValueError(
            f"{owner}: the token masks and the actor's log-probs {loss.tensor_keys.log_probs!r} "
            f"differ in shape (mask, log-prob per sequence: {shapes}): tokenize with the "
            "actor's tokenizer and chat template (tokenizer_kwargs={'chat_template_name': ...})."
        )
    return list(log_probs)


def padded(tensors: list, like: torch.Tensor | None = None) -> torch.Tensor:
    """One tensor per sequence, right padded with zeros along their first dim (the tokens of a
    1-d batch; the inner batch dims of a multi-dim one) into ``[*B, T]``."""
    out = pad_sequence(list(tensors), batch_first=True)
    return out if like is None else out.to(like.device)


def other_log_probs(owner: str, tensordict: TensorDictBase, key, like: torch.Tensor, missing):
    """Another model's token log-probs (a reference, a teacher) stored per sequence at ``key``,
    padded as the actor's ``like``; ``missing`` (an exception) raised when absent, a
    ``ValueError`` naming both shapes when they differ."""
    value = tensordict.get(key, None, as_list=True)
    if value is None:
        raise missing
    value = padded(value, like)
    if value.shape != like.shape:
        raise ValueError(
            f"{owner}: the log-probs at {key!r} have shape {tuple(value.shape)} once padded, "
            f"the actor's {tuple(like.shape)}: both models must score the same tokenized "
            "sequences, one log-prob per token (RetrieveLogProb)."
        )
    return value
