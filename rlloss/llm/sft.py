"""Supervised fine-tuning of a language model on chat histories: :class:`SFTLoss`, a drop-in for
``torchrl.objectives.llm.SFTLoss`` (negative log-likelihood of the assistant tokens, or MinorSFT,
Xie et al., arXiv:2408.10642), with an optional k3 KL to a reference model."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.objectives.llm import SFTLossOutput

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice
from rlloss.common import accepts_tensor_arguments
from rlloss.llm.base import (
    ChatHistoryLoss,
    actor_log_probs,
    chat_masks,
    other_log_probs,
    padded,
)

LOSS_FUNCTIONS = ("sft", "minor_sft")


class SFTLoss(ChatHistoryLoss):
    r"""Supervised fine-tuning loss over chat histories (TorchRL's ``SFTLoss``: same keywords,
    keys and output class).

    $$
    \mathcal{L}_{\text{sft}} = -\frac{1}{|y|} \sum_t \log \pi(y_t \mid x, y_{<t}), \qquad
    \mathcal{L}_{\text{minor\_sft}} = -\log \sigma\Big(\beta \big(\log \pi(y)
    - \log \pi_{\text{ref}}(y)\big)\Big)
    $$

    per sequence over the assistant tokens (the sum with ``normalize_by_seq_length=False``),
    reduced by ``reduction``; the second with ``loss_function="minor_sft"`` (MinorSFT),
    the reference log-probs read from ``("next", "ref_log_probs", "full")`` (set to 0 outside
    the assistant tokens before any arithmetic: a value or NaN at a prompt position changes
    nothing), ``beta > 0``. With
    ``kl_to_ref_coeff``, ``loss_kl_to_ref`` is the k3 estimate of ``KL(pi || pi_ref)`` over the
    sequences' tokens. The assistant mask comes from ``("masks", "all_assistant_mask")`` when
    the batch has it, else from the tokenizer's chat template.

    Reference: Ouyang et al., "Training language models to follow instructions with human
    feedback", arXiv:2203.02155 (the supervised fine-tuning step).

    Args:
        actor_network: a ``torchrl.modules.llm`` wrapper (``TransformersWrapper``) with
            ``generate=False``, ``input_mode="history"``.
        tokenizer: defaults to the actor's.
        tokenizer_kwargs: for ``History.apply_chat_template`` (``chat_template_name``...).
        reduction: as
            TorchRL's.
        normalize_by_seq_length: as ``reduction``.
        kl_to_ref_coeff: as ``reduction``.
        loss_function: as ``reduction``.
        beta: as ``reduction``.
        device: as ``reduction``.

    Gradient accumulation and several processes: ``loss(batch, num_items_in_batch=N)``
    (:meth:`forward`).

    Examples:
        >>> import tensordict
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from tokenizers.pre_tokenizers import Whitespace
        >>> from torchrl.data import History
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import ChatHistory
        >>> from rlloss import SFTLoss
        >>> words = Tokenizer(
        ...     WordLevel(
        ...         {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 32)}},
        ...         unk_token="<pad>",
        ...     )
        ... )
        >>> words.pre_tokenizer = Whitespace()
        >>> tokenizer = (
        ...     transformers.PreTrainedTokenizerFast(  # a tiny model built here, nothing downloaded
        ...         tokenizer_object=words,
        ...         pad_token="<pad>",
        ...         eos_token="<eos>",
        ...         padding_side="left",
        ...     )
        ... )
        >>> model = transformers.Qwen2ForCausalLM(
        ...     transformers.Qwen2Config(
        ...         vocab_size=32,
        ...         hidden_size=16,
        ...         intermediate_size=32,
        ...         num_hidden_layers=1,
        ...         num_attention_heads=2,
        ...         num_key_value_heads=1,
        ...         pad_token_id=0,
        ...         eos_token_id=1,
        ...     )
        ... )
        >>> actor = TransformersWrapper(
        ...     model,
        ...     tokenizer=tokenizer,
        ...     generate=False,
        ...     input_mode="history",
        ...     chat_template_name="qwen",
        ...     pad_output=False,
        ... )
        >>> chats = History.from_chats(
        ...     [
        ...         [
        ...             {"role": "user", "content": "t4 t5 t6"},
        ...             {"role": "assistant", "content": "t7 t8"},
        ...         ],
        ...         [
        ...             {"role": "user", "content": "t4 t5"},
        ...             {"role": "assistant", "content": "t9 t10 t11"},
        ...         ],
        ...     ]
        ... )
        >>> loss = SFTLoss(
        ...     actor, tokenizer=tokenizer, tokenizer_kwargs={"chat_template_name": "qwen"}
        ... )
        >>> with tensordict.set_list_to_stack(
        ...     True
        ... ):  # TorchRL's LLM setting: stored lists are stacked
        ...     batch = TensorDict(history=ChatHistory(full=chats), batch_size=[2])
        ...     out = loss(batch)  # the assistant tokens' negative log-likelihood
        >>> out.loss_sft.backward()
    """

    output_type = SFTLossOutput

    @dataclasses.dataclass
    class _AcceptedKeys(ChatHistoryLoss._AcceptedKeys):
        """ref_log_prob: the reference model's token log-probs."""

        ref_log_prob: NestedKey = ("next", "ref_log_probs", "full")  # with kl_to_ref_coeff, [*B, T]

    beta = Coefficient(low=0.0, low_open=True)  # MinorSFT: beta > 0
    _choices = {**ChatHistoryLoss._choices, "loss_function": LOSS_FUNCTIONS}  # and on assignment
    kl_to_ref_coeff = Coefficient(low=0.0)

    def __init__(
        self,
        actor_network: torch.nn.Module,
        tokenizer: Any | None = None,
        tokenizer_kwargs: dict | None = None,
        reduction: str = "mean",
        normalize_by_seq_length: bool = True,
        kl_to_ref_coeff: float | None = None,
        loss_function: str = "sft",
        beta: float = 0.1,
        device: torch.device | None = None,
    ):
        super().__init__(
            actor_network, tokenizer, tokenizer_kwargs, reduction, normalize_by_seq_length, device
        )
        if self.tokenizer is None:
            raise ValueError("Tokenizer must be provided (or an actor_network with a tokenizer).")
        check_choice("loss_function", loss_function, LOSS_FUNCTIONS)
        self.loss_function = loss_function
        if loss_function == "minor_sft" and kl_to_ref_coeff:
            warnings.warn(
                "kl_to_ref_coeff should not be set when using minor_sft loss, as KL "
                "regularization is implicit. Setting kl_to_ref_coeff to 0.0.",
                stacklevel=2,
            )
            kl_to_ref_coeff = 0.0
        self._register_coefficients(beta=beta, kl_to_ref_coeff=kl_to_ref_coeff)

    @property
    def in_keys(self) -> list:
        keys = [self.tensor_keys.history]
        if self.kl_to_ref_coeff is not None or self.loss_function == "minor_sft":
            keys.append(self.tensor_keys.ref_log_prob)
        return keys

    @property
    def out_keys(self) -> list:
        """The entries of the output (TorchRL's ``SFTLoss`` declares none)."""
        kl = ["loss_kl_to_ref", "kl_to_ref"] if self.kl_to_ref_coeff is not None else []
        return ["loss_sft", *kl]

    @accepts_tensor_arguments
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        num_items_in_batch: int | float | torch.Tensor | None = None,
    ) -> SFTLossOutput:
        """``loss_sft`` (and ``loss_kl_to_ref``, ``kl_to_ref`` with a KL coefficient).

        ``num_items_in_batch`` (``reduction="mean"`` only): the count that replaces this
        batch's number of sequences in the mean, over the whole optimisation batch (every
        micro-batch of every rank): its number of sequences, or with
        ``normalize_by_seq_length=False`` its number of assistant tokens (the token-level
        mean). Each loss term is this batch's sum over its sequences divided by
        ``num_items_in_batch / world_size`` (the default process group's size): summed over
        micro-batches, with gradients averaged over ranks by DDP or FSDP, it is the whole
        batch's. ``loss_kl_to_ref`` is then each sequence's k3 sum over its assistant tokens
        (divided by their number with ``normalize_by_seq_length``) aggregated the same way;
        ``kl_to_ref`` stays this batch's mean."""
        count = self._per_rank_count(num_items_in_batch)
        log_prob, mask, valid = self._assistant_log_probs(tensordict)
        normalize = self.normalize_by_seq_length
        log_likelihood = rlf.sequence_log_likelihood(log_prob, mask, normalize)
        out = {}
        ref = None
        if self.loss_function == "minor_sft" or self.kl_to_ref_coeff is not None:
            # masked before any arithmetic: a reference scored on the whole chat (or NaN on
            # the prompt) changes nothing
            ref = torch.where(mask, self._ref_log_probs(tensordict, log_prob), 0.0)
        if self.loss_function == "sft":
            loss = -log_likelihood
        else:
            ref_likelihood = rlf.sequence_log_likelihood(ref.to(log_prob), mask, normalize)
            loss = rlf.minor_sft_loss(log_likelihood, ref_likelihood, self.beta)
        out["loss_sft"] = self._reduce(loss, count)
        if self.kl_to_ref_coeff is not None:
            grad = contextlib.nullcontext() if self.loss_function == "sft" else torch.no_grad()
            with grad:
                cur = torch.where(mask, log_prob, 0.0)
                per_token = rlf.kl_k3(ref.to(cur) - cur)
                kl = rlf.reduce(per_token, "mean", mask=valid)
                loss_kl = kl
                if count is not None:
                    per_sequence = rlf.sequence_log_likelihood(per_token, mask, normalize)
                    loss_kl = self._reduce(per_sequence, count)
            out["loss_kl_to_ref"], out["kl_to_ref"] = self.kl_to_ref_coeff * loss_kl, kl.detach()
        return self.output_type(**out, batch_size=[])

    def _assistant_log_probs(self, tensordict: TensorDictBase):
        """The actor's token log-probs ``[B, T]`` (right padded), the assistant mask and the
        mask of the sequences' real tokens."""
        owner = type(self).__name__
        assistant, attention = chat_masks(owner, self, tensordict)
        masks = [m & a for m, a in zip(assistant, attention, strict=True)]
        log_prob = padded(actor_log_probs(owner, self, tensordict, masks))
        mask = padded(masks, log_prob)
        if mask.device.type == "cpu" and not mask.any():  # on a device: no check (a sync)
            raise ValueError("Some inputs have no valid assistant masks.")
        valid = padded([torch.ones_like(m) for m in masks], log_prob)
        return log_prob, mask, valid

    def _ref_log_probs(self, tensordict: TensorDictBase, like: torch.Tensor) -> torch.Tensor:
        key = self.tensor_keys.ref_log_prob
        reason = (
            "kl_to_ref_coeff was set"
            if self.loss_function == "sft"
            else "loss_function is minor_sft"
        )
        missing = ValueError(
            f"Reference log probs not found in tensordict at key {key} but {reason}. Existing "
            f"keys in tensordict: {set(tensordict.keys(True, True))}"
        )
        return other_log_probs(type(self).__name__, tensordict, key, like, missing)
