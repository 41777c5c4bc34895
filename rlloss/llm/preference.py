"""What the preference losses (:class:`~rlloss.llm.DPOLoss`, :class:`~rlloss.llm.SimPOLoss`,
:class:`~rlloss.llm.KTOLoss`) share: a response's sequence log-probability under the actor
(and under a reference), read from a TensorDict entry laid out as TorchRL's LLM wrappers take
their input.

A preference batch holds each response as a sub-TensorDict in the actor's input layout
(``input_mode="tokens"``: ``("tokens", "full")``, ``("tokens", "prompt")``,
``("masks", "all_attention_mask")``; ``input_mode="history"``: ``("history", "full")`` and, for
``masking_strategy="sft"``, ``("history", "prompt")``): DPO and SimPO read ``"chosen"`` and
``"rejected"``, KTO ``"response"`` and ``"kl_response"``. The actor's masked distribution
(``masking_strategy``: the response tokens, the assistant turns or every attended token) gives
the token log-probs chunk by chunk (:func:`rlloss.functional.token_log_prob_entropy`: no
``[*B, T, V]`` tensor beyond the actor's logits); padding is masked before any arithmetic.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from rlloss import functional as rlf
from rlloss._checks import MissingKeyError, missing_key_message
from rlloss.common import LossModule
from rlloss.llm.base import check_masking_strategy, per_token, read_padded, token_distribution


@dataclasses.dataclass
class SequenceLogProb:
    """A batch of responses scored by a model: ``total`` ``[*B]`` the summed token log-probs,
    ``length`` ``[*B]`` the number of scored tokens (float)."""

    total: torch.Tensor
    length: torch.Tensor

    @property
    def mean(self) -> torch.Tensor:
        """The mean token log-prob (0 for a response without a scored token)."""
        return self.total / self.length.clamp_min(1)


class PreferenceLoss(LossModule):
    """The base of the preference losses: the actor, an optional frozen reference actor, the
    masking strategy and the reduction; reads a response entry's sequence log-probs."""

    _reads_loss_mask = False  # the actor's token masks select the tokens, as in the LLM losses

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read inside each response entry; the reference log-probs are padded on the left
        as the actor's, or one summed value per response (``[*B]`` / ``[*B, 1]``)."""

        tokens: NestedKey = ("tokens", "full")  # a response's token ids, [*B, T]
        ref_log_probs: NestedKey = ("ref_log_probs", "full")  # its reference log-probs, [*B, T]

    def __init__(self, actor_network, reference_network, masking_strategy, reduction) -> None:
        super().__init__()
        self.actor_network = actor_network
        self.reference_network = reference_network
        self.masking_strategy = check_masking_strategy(masking_strategy)
        self.reduction = self._check_reduction(reduction)

    def _response(self, tensordict: TensorDictBase, name: str) -> TensorDictBase:
        """The response entry ``tensor_keys.<name>``: a ``MissingKeyError`` naming it if
        absent, a ``TypeError`` if it is a tensor rather than a TensorDict."""
        response = self._get(tensordict, name)
        if not isinstance(response, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__}: the entry {getattr(self.tensor_keys, name)!r} is a "
                f"{type(response).__name__}; it must be a TensorDict holding the response in "
                "the actor's input layout (('tokens', 'full'), ('masks', ...), or ('history', "
                "'full'))."
            )
        return response

    def _token_log_probs(self, network, response: TensorDictBase):
        """``network``'s token log-probs ``[*B, T]`` (0 off the mask) and its token mask."""
        owner = type(self).__name__
        dist = token_distribution(owner, network, response, self.masking_strategy)
        mask, logits = dist.mask, dist.logits
        if mask.shape != logits.shape[:-1]:
            raise ValueError(
                f"{owner}: the actor's token mask has shape {tuple(mask.shape)}, its logits "
                f"{tuple(logits.shape)}: give a position mask [*B, T]."
            )
        tokens = read_padded(response, self.tensor_keys.tokens, padding_value=0)
        if tokens is None:
            key = self.tensor_keys.tokens
            raise MissingKeyError(
                missing_key_message(owner, "tokens", key, response)
                + " In history mode, store the chats' tokens with the responses (the "
                "wrapper's output when it scores them once, or History.apply_chat_template)."
            )
        if tokens.shape != mask.shape:
            raise ValueError(
                f"{owner}: the tokens {self.tensor_keys.tokens!r} have shape "
                f"{tuple(tokens.shape)}, the actor's token mask {tuple(mask.shape)}: store the "
                "tokens the actor scores, padded on the left."
            )
        log_prob, _ = rlf.token_log_prob_entropy(logits, tokens, mask, entropy=False)
        return log_prob, mask

    def _policy_log_probs(self, response: TensorDictBase):
        """The actor's :class:`SequenceLogProb` of a response entry, its token mask and its
        token log-probs."""
        log_prob, mask = self._token_log_probs(self.actor_network, response)
        length = mask.sum(-1).to(log_prob.dtype)
        return SequenceLogProb(log_prob.sum(-1), length), mask, log_prob

    def _sequence_log_probs(self, tensordict: TensorDictBase, name: str):
        """The actor's and the reference's :class:`SequenceLogProb` of the response entry
        ``tensor_keys.<name>``; the reference's from ``reference_network`` (no gradient) when
        the loss has one, else from the entry's ``tensor_keys.ref_log_probs``."""
        response = self._response(tensordict, name)
        policy, mask, log_prob = self._policy_log_probs(response)
        length = policy.length
        if self.reference_network is None:
            return policy, SequenceLogProb(self._stored_reference(response, mask, log_prob), length)
        with torch.no_grad():
            ref_log_prob, ref_mask = self._token_log_probs(self.reference_network, response)
        if ref_mask.shape != mask.shape:
            raise ValueError(
                f"{type(self).__name__}: the reference network's token mask has shape "
                f"{tuple(ref_mask.shape)}, the actor's {tuple(mask.shape)}: both must score "
                "the same tokens with the same tokenizer."
            )
        return policy, SequenceLogProb(torch.where(mask, ref_log_prob, 0.0).sum(-1), length)

    def _stored_reference(self, response, mask: torch.Tensor, like: torch.Tensor):
        """The reference's summed log-probs ``[*B]`` stored in the response entry: per token
        (masked as the actor's tokens, padding never reaching the sum) or per sequence."""
        key = self.tensor_keys.ref_log_probs
        stored = read_padded(response, key)
        if stored is None:
            raise MissingKeyError(
                missing_key_message(type(self).__name__, "ref_log_probs", key, response)
                + " Or give the loss a reference_network to score the responses."
            )
        if stored.requires_grad:
            raise RuntimeError(
                f"{type(self).__name__}: the stored reference log-probs {key!r} require grad; "
                "store them detached."
            )
        batch = mask.shape[:-1]
        if stored.shape in (batch, (*batch, 1)) and stored.shape != mask.shape:
            return stored.reshape(batch).to(like)
        token = per_token(type(self).__name__, "ref_log_probs", key, stored, mask)
        return torch.where(mask, token.to(like), 0.0).sum(-1)

    def _coefficient_values(self, like: torch.Tensor, *names: str) -> tuple:
        """The coefficient buffers ``names`` in ``like``'s dtype: float32 buffers would round
        the arithmetic of a float64 batch (``1 / (2 beta)``, ``1 - eps``)."""
        return tuple(getattr(self, name).to(like.dtype) for name in names)

    def _output(self, values: dict) -> TensorDict:
        return TensorDict(values, batch_size=[])


def masked_mean(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``value`` over ``mask`` (0 with none), no gradient: a diagnostic."""
    value = value.detach()
    return torch.where(mask, value, 0.0).sum() / mask.sum().clamp_min(1)


def reward_diagnostics(reward_chosen: torch.Tensor, reward_rejected: torch.Tensor) -> dict:
    """The means of the implicit rewards of the chosen and rejected responses, of their
    margin, and the fraction of pairs ranked right (all detached)."""
    chosen, rejected = reward_chosen.detach(), reward_rejected.detach()
    return {
        "reward_chosen": chosen.mean(),
        "reward_rejected": rejected.mean(),
        "reward_margin": (chosen - rejected).mean(),
        "reward_accuracy": (chosen > rejected).to(chosen.dtype).mean(),
    }
