"""Supervised fine-tuning of a language model on chat histories: :class:`SFTLoss`, a drop-in for
``torchrl.objectives.llm.SFTLoss`` (negative log-likelihood of the assistant tokens, or MinorSFT,
Xie et al., arXiv:2408.10642), with an optional k3 KL to a reference model."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch
from tensordict import NestedKey, TensorDictBase
from torch.nn.utils.rnn import pad_sequence
from torchrl.objectives.llm import SFTLossOutput

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice
from rlloss.common import LossModule, accepts_tensor_arguments
from rlloss.llm.base import runtime_device

LOSS_FUNCTIONS = ("sft", "minor_sft")


class SFTLoss(LossModule):
    """Supervised fine-tuning loss over chat histories (TorchRL's ``SFTLoss``: same keywords,
    keys and output class).

    ``loss_sft = -(1/|y|) sum_t log pi(y_t)`` per sequence over the assistant tokens (the sum
    with ``normalize_by_seq_length=False``), reduced by ``reduction``; with
    ``loss_function="minor_sft"``, ``-log sigmoid(beta (log p(y) - log p_ref(y)))`` (MinorSFT),
    the reference log-probs read from ``("next", "ref_log_probs", "full")``. With
    ``kl_to_ref_coeff``, ``loss_kl_to_ref`` is the k3 estimate of ``KL(pi || pi_ref)`` over the
    sequences' tokens. The assistant mask comes from ``("masks", "all_assistant_mask")`` when
    the batch has it, else from the tokenizer's chat template.

    Args:
        actor_network: a ``torchrl.modules.llm`` wrapper (``TransformersWrapper``) with
            ``generate=False``, ``input_mode="history"``.
        tokenizer: defaults to the actor's.
        tokenizer_kwargs: for ``History.apply_chat_template`` (``chat_template_name``...).
        reduction, normalize_by_seq_length, kl_to_ref_coeff, loss_function, beta, device: as
            TorchRL's.
    """

    output_type = SFTLossOutput

    @dataclasses.dataclass
    class _AcceptedKeys:
        """history: the chat; ref_log_prob: the reference model's token log-probs; log_probs:
        where the actor writes its token log-probs."""

        history: NestedKey = ("history", "full")
        ref_log_prob: NestedKey = ("next", "ref_log_probs", "full")
        log_probs: NestedKey = ("log_probs", "full")

    beta = Coefficient()
    kl_to_ref_coeff = Coefficient(low=0.0)

    def __init__(
        self,
        actor_network,
        tokenizer=None,
        tokenizer_kwargs: dict | None = None,
        reduction: str = "mean",
        normalize_by_seq_length: bool = True,
        kl_to_ref_coeff: float | None = None,
        loss_function: str = "sft",
        beta: float = 0.1,
        device: torch.device | None = None,
    ):
        super().__init__()
        self.actor_network = actor_network
        self.tokenizer = actor_network.tokenizer if tokenizer is None else tokenizer
        if self.tokenizer is None:
            raise ValueError("Tokenizer must be provided (or an actor_network with a tokenizer).")
        self.tokenizer_kwargs = _chat_template_kwargs(tokenizer_kwargs)
        self.reduction = self._check_reduction(reduction)
        self.normalize_by_seq_length = normalize_by_seq_length
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
        self.register_buffer("_device_fallback", torch.empty(0, device=device), persistent=False)

    @property
    def in_keys(self) -> list:
        keys = [self.tensor_keys.history]
        if self.kl_to_ref_coeff is not None or self.loss_function == "minor_sft":
            keys.append(self.tensor_keys.ref_log_prob)
        return keys

    @property
    def out_keys(self) -> list:
        return []

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> SFTLossOutput:
        """``loss_sft`` (and ``loss_kl_to_ref``, ``kl_to_ref`` with a KL coefficient)."""
        log_prob, mask, valid = self._assistant_log_probs(tensordict)
        normalize = self.normalize_by_seq_length
        log_likelihood = rlf.sequence_log_likelihood(log_prob, mask, normalize)
        out = {}
        ref = None
        if self.loss_function == "minor_sft" or self.kl_to_ref_coeff is not None:
            ref = self._ref_log_probs(tensordict, log_prob)
        if self.loss_function == "sft":
            out["loss_sft"] = rlf.reduce(-log_likelihood, self.reduction)
        else:
            # TorchRL sums the reference log-probs over every token, normalised by the number
            # of assistant tokens
            ref_total = ref.sum(-1)
            if normalize:
                ref_total = ref_total / mask.sum(-1).clamp_min(1)
            loss = rlf.minor_sft_loss(log_likelihood, ref_total.to(log_likelihood), self.beta)
            out["loss_sft"] = rlf.reduce(loss, self.reduction)
        if self.kl_to_ref_coeff is not None:
            grad = contextlib.nullcontext() if self.loss_function == "sft" else torch.no_grad()
            with grad:
                cur = torch.where(mask, log_prob, 0.0)
                kl = rlf.reduce(rlf.kl_k3(ref.to(cur) - cur), "mean", mask=valid)
            out["loss_kl_to_ref"], out["kl_to_ref"] = self.kl_to_ref_coeff * kl, kl.detach()
        return self.output_type(**out, batch_size=[])

    def _assistant_log_probs(self, tensordict: TensorDictBase):
        """The actor's token log-probs ``[B, T]`` (right padded), the assistant mask and the
        mask of the sequences' real tokens."""
        masks = tensordict.get(("masks", "all_assistant_mask"), as_list=True)
        attention = tensordict.get(("masks", "all_attention_mask"), as_list=True)
        fallback = self._device_fallback
        device = runtime_device(self.actor_network, tensordict, fallback, masks, attention)
        in_device = torch.device(device) if device is not None else contextlib.nullcontext()
        if masks is None:
            history = tensordict[self.tensor_keys.history]
            with in_device:
                tokens = history.apply_chat_template(
                    tokenizer=self.tokenizer, **self.tokenizer_kwargs
                )
            if "assistant_masks" not in tokens:
                raise ValueError(
                    f"{type(self).__name__}: the chat template gave no assistant masks ({tokens=}): "
                    "use a template with {% generation %} blocks (chat_template_name='qwen', "
                    "'chatml_format'...) or store ('masks', 'all_assistant_mask')."
                )
            masks = tokens.get("assistant_masks", as_list=True)
            attention = tokens.get("attention_mask", as_list=True)
        masks = [m.bool() & a.bool() for m, a in zip(masks, attention, strict=True)]
        with in_device:
            output = self.actor_network(tensordict.select(self.tensor_keys.history))
        log_probs = output.get(self.tensor_keys.log_probs, as_list=True)
        shapes = [(tuple(m.shape), tuple(lp.shape)) for m, lp in zip(masks, log_probs, strict=True)]
        if any(m != lp for m, lp in shapes):
            raise ValueError(
                f"{type(self).__name__}: the assistant masks and the actor's log-probs "
                f"{self.tensor_keys.log_probs!r} differ in shape (mask, log-prob per sequence: "
                f"{shapes}): tokenize with the actor's tokenizer and chat template "
                "(tokenizer_kwargs={'chat_template_name': ...})."
            )
        mask = pad_sequence(masks, batch_first=True)
        if mask.device.type == "cpu" and not mask.any():  # on a device: no check (a sync)
            raise ValueError("Some inputs have no valid assistant masks.")
        log_prob = pad_sequence(log_probs, batch_first=True)
        valid = pad_sequence([torch.ones_like(m) for m in masks], batch_first=True)
        return log_prob, mask.to(log_prob.device), valid.to(log_prob.device)

    def _ref_log_probs(self, tensordict: TensorDictBase, like: torch.Tensor) -> torch.Tensor:
        key = self.tensor_keys.ref_log_prob
        ref = tensordict.get(key, None, as_list=True)
        if ref is None:
            raise ValueError(
                f"Reference log probs not found in tensordict at key {key} but "
                f"{'kl_to_ref_coeff was set' if self.loss_function == 'sft' else 'loss_function is minor_sft'}"
                f". Existing keys in tensordict: {set(tensordict.keys(True, True))}"
            )
        ref = pad_sequence(list(ref), batch_first=True)
        if ref.shape != like.shape:
            raise ValueError(
                f"{type(self).__name__}: the reference log-probs {key!r} have shape "
                f"{tuple(ref.shape)} once padded, the actor's {tuple(like.shape)}: store one "
                "reference log-prob per token of the same tokenization (RetrieveLogProb)."
            )
        return ref


def _chat_template_kwargs(tokenizer_kwargs: dict | None) -> dict:
    kwargs = dict(tokenizer_kwargs or {})
    kwargs.setdefault("return_assistant_tokens_mask", True)
    kwargs.setdefault("tokenize", True)
    kwargs.setdefault("return_tensors", "pt")
    kwargs.setdefault("padding", False)
    kwargs.setdefault("add_generation_prompt", False)
    return kwargs
