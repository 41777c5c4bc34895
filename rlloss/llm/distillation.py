"""On-policy distillation of a student language model toward a teacher's token log-probs:
:class:`DistillationLoss`, a drop-in for ``torchrl.objectives.llm.DistillationLoss``."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.objectives.llm import DistillationLossOutput

from rlloss import functional as rlf
from rlloss._checks import check_choice
from rlloss.common import accepts_tensor_arguments
from rlloss.llm.base import (
    ChatHistoryLoss,
    actor_log_probs,
    chat_masks,
    other_log_probs,
    padded,
)

KL_DIRECTIONS = ("reverse", "forward")


class DistillationLoss(ChatHistoryLoss):
    r"""The k3 estimate of the KL between the student (the actor) and a teacher, per sequence over
    its assistant tokens (every attended token with ``assistant_only=False``), averaged over them
    (``normalize_by_seq_length``, else summed), reduced by ``reduction`` (TorchRL's
    ``DistillationLoss``: same keywords, keys and output class).

    $$
    \mathrm{k3}(u) = e^{u} - 1 - u, \qquad
    \text{reverse: } \mathrm{k3}(\log p_T - \log p_S), \qquad
    \text{forward: } \mathrm{k3}(\log p_S - \log p_T)
    $$

    per token: ``kl_direction="reverse"`` estimates $\mathrm{KL}(p_S \,\|\, p_T)$ (Agarwal et al.,
    "On-Policy Distillation of Language Models", arXiv:2306.13649, with the student's samples),
    ``"forward"`` the other direction. The teacher's log-probs are
    read from ``("next", "teacher_log_probs", "full")`` and carry no gradient.

    Args:
        actor_network: the student, a ``torchrl.modules.llm`` wrapper with ``generate=False``
            (or any module writing ``("log_probs", "full")``).
        tokenizer: to recover the masks from the chat template when the batch
            has no ``("masks", ...)`` entries.
        tokenizer_kwargs: as ``tokenizer``.
        kl_direction: as TorchRL's.
        reduction: as TorchRL's.
        normalize_by_seq_length: as TorchRL's.
        assistant_only: as TorchRL's.
        device: as TorchRL's.

    Examples:
        >>> import copy
        >>> import tensordict
        >>> import torch
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from tokenizers.pre_tokenizers import Whitespace
        >>> from torchrl.data import History
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import ChatHistory
        >>> from rlloss import DistillationLoss
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
        >>> teacher = TransformersWrapper(
        ...     copy.deepcopy(model),
        ...     tokenizer=tokenizer,
        ...     generate=False,
        ...     input_mode="history",
        ...     chat_template_name="qwen",
        ...     pad_output=False,
        ...     return_log_probs=True,
        ... )
        >>> loss = DistillationLoss(
        ...     actor, assistant_only=False, tokenizer_kwargs={"chat_template_name": "qwen"}
        ... )
        >>> with tensordict.set_list_to_stack(
        ...     True
        ... ):  # TorchRL's LLM setting: stored lists are stacked
        ...     batch = TensorDict(history=ChatHistory(full=chats), batch_size=[2])
        ...     with torch.no_grad():  # the teacher's log-probabilities of every token
        ...         batch["next", "teacher_log_probs", "full"] = teacher(batch.copy())[
        ...             "log_probs", "full"
        ...         ]
        ...     out = loss(batch)  # KL(student || teacher) per token, averaged
        >>> out.loss_distill.backward()
    """

    output_type = DistillationLossOutput

    @dataclasses.dataclass
    class _AcceptedKeys(ChatHistoryLoss._AcceptedKeys):
        """teacher_log_prob: the teacher's token log-probs."""

        teacher_log_prob: NestedKey = ("next", "teacher_log_probs", "full")  # [*B, T]

    _choices = {**ChatHistoryLoss._choices, "kl_direction": KL_DIRECTIONS}  # and on assignment

    def __init__(
        self,
        actor_network: torch.nn.Module,
        tokenizer: Any | None = None,
        tokenizer_kwargs: dict | None = None,
        kl_direction: str = "reverse",
        reduction: str = "mean",
        normalize_by_seq_length: bool = True,
        assistant_only: bool = True,
        device: torch.device | None = None,
    ):
        check_choice("kl_direction", kl_direction, KL_DIRECTIONS)
        super().__init__(
            actor_network, tokenizer, tokenizer_kwargs, reduction, normalize_by_seq_length, device
        )
        self.kl_direction = kl_direction
        self.assistant_only = assistant_only

    @property
    def in_keys(self) -> list:
        return [self.tensor_keys.history, self.tensor_keys.teacher_log_prob]

    @property
    def out_keys(self) -> list:
        """The entries of the output (TorchRL's ``DistillationLoss`` declares none)."""
        return ["loss_distill", "kl_to_teacher"]

    @accepts_tensor_arguments
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        num_items_in_batch: int | float | torch.Tensor | None = None,
    ) -> DistillationLossOutput:
        """``loss_distill`` and the detached mean per-sequence KL, ``kl_to_teacher``.

        ``num_items_in_batch`` (``reduction="mean"`` only): the count that replaces this
        batch's number of sequences in the mean, over the whole optimisation batch (every
        micro-batch of every rank): its number of sequences, or with
        ``normalize_by_seq_length=False`` its number of distilled tokens. ``loss_distill`` is
        then this batch's sum over its sequences divided by ``num_items_in_batch /
        world_size`` (the default process group's size): summed over micro-batches, with
        gradients averaged over ranks by DDP or FSDP, it is the whole batch's;
        ``kl_to_teacher`` stays this batch's mean."""
        owner = type(self).__name__
        count = self._per_rank_count(num_items_in_batch)
        assistant, attention = chat_masks(owner, self, tensordict, self.assistant_only)
        masks = attention
        if self.assistant_only:
            masks = [m & a for m, a in zip(assistant, attention, strict=True)]
        mask = padded(masks)
        if mask.device.type == "cpu" and (~mask.any(-1)).any():  # on a device: a sync
            raise ValueError(
                f"{owner}: Some sequences have no tokens selected for distillation. Check the "
                "assistant/attention masks of the input."
            )
        log_prob = padded(actor_log_probs(owner, self, tensordict, masks))
        teacher = self._teacher_log_probs(tensordict, log_prob)
        mask = mask.to(log_prob.device)
        if not self.assistant_only and assistant is not None:
            _check_teacher_not_zero_filled(teacher, padded(attention, teacher), assistant)
        student = torch.where(mask, log_prob, 0.0)
        teacher = torch.where(mask, teacher.detach(), 0.0)
        if self.kl_direction == "reverse":
            kl = rlf.kl_k3(teacher - student)
        else:
            kl = rlf.kl_k3(student - teacher)
        per_sequence = kl.sum(-1)
        if self.normalize_by_seq_length:
            per_sequence = per_sequence / mask.sum(-1).clamp_min(1)
        return self.output_type(
            loss_distill=self._reduce(per_sequence, count),
            kl_to_teacher=per_sequence.detach().mean(),
            batch_size=[],
        )

    def _teacher_log_probs(self, tensordict: TensorDictBase, like: torch.Tensor) -> torch.Tensor:
        key = self.tensor_keys.teacher_log_prob
        missing = KeyError(
            f"Teacher log-probs not found at {key} in the input tensordict (keys: "
            f"{set(tensordict.keys(True, True))}). Use RetrieveLogProb(teacher, "
            "log_probs_full_key=('teacher_log_probs', 'full')) to compute them, or point the "
            "teacher_log_prob key to your data with set_keys()."
        )
        return other_log_probs(type(self).__name__, tensordict, key, like, missing)


def _check_teacher_not_zero_filled(teacher: torch.Tensor, attention: torch.Tensor, assistant):
    """Refuse teacher log-probs written with ``RetrieveLogProb(assistant_only=True)`` (exact
    zeros off the assistant turns) for a loss with ``assistant_only=False``: more than 90% of
    the attended non-assistant tokens at exactly 0.0. Checked on CPU only (a sync elsewhere)."""
    assistant = padded(assistant, teacher)
    if teacher.device.type != "cpu" or assistant.shape != teacher.shape:
        return
    outside = attention & ~assistant
    total, zeros = int(outside.sum()), int(((teacher == 0.0) & outside).sum())
    if total > 0 and zeros > 0.9 * total:
        raise RuntimeError(
            f"{zeros} out of {total} attended non-assistant tokens have a teacher "
            "log-probability of exactly 0.0: teacher log-probs written by "
            "RetrieveLogProb(assistant_only=True), which zero-fills non-assistant positions, "
            "for a loss constructed with assistant_only=False. Construct the loss with "
            "assistant_only=True, or recompute the teacher log-probs with "
            "RetrieveLogProb(assistant_only=False)."
        )
