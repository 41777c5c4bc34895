"""GRPO for language-model post-training, as a drop-in for ``torchrl.objectives.llm``:
:class:`GRPOLoss`; its variants (DAPO, CISPO, Dr. GRPO, GSPO) build on it in
``llm/grpo_variants.py``.

Shao et al., "DeepSeekMath", arXiv:2402.03300 (GRPO). The formulas are
:mod:`rlloss.functional.llm`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.objectives.llm import GRPOLossOutput, LLMLossOutput

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice
from rlloss.common import LossModule, accepts_tensor_arguments
from rlloss.llm.base import (
    MASKING_STRATEGIES,
    check_masking_strategy,
    per_rank_count,
    per_token,
    read_padded,
    token_advantage,
    token_distribution,
)

AGGREGATIONS = ("token_mean", "prompt_mean", "seq_sum_constant", "none")


class GRPOLoss(LossModule):
    r"""GRPO's clipped token-level objective over a language model's sampled completions
    (arXiv:2402.03300, eq. 3; TorchRL's ``GRPOLoss``, same keywords, keys and output class).

    $$
    \mathcal{L}_t = -\min\Big(r_t A,\; \operatorname{clip}(r_t, 1 - \epsilon_{\text{low}},
    1 + \epsilon_{\text{high}}) A\Big), \qquad
    r_t = \frac{\pi_\theta(y_t \mid x, y_{<t})}{\pi_{\text{old}}(y_t \mid x, y_{<t})}
    $$

    per token, $r_t$ the ratio of the actor's token probability to the one stored at sampling
    (``("log_probs", "full")``),
    over the tokens the actor's mask keeps (``masking_strategy``), aggregated by
    ``aggregation``: ``"token_mean"`` (DAPO's), ``"prompt_mean"`` (GRPO's: each sequence's mean,
    then the mean), ``"seq_sum_constant"`` (Dr. GRPO's: each sequence's sum over ``max_tokens``,
    default the padded length), ``"none"`` (per token, ``[*B, T, 1]``, 0 off the mask).

    Keyword Args:
        clip_epsilon: ``eps`` or ``(eps_low, eps_high)`` (DAPO's clip-higher, e.g. (0.2, 0.28)).
        kl_mask_threshold: drop the tokens with ``0.5 (log pi - log pi_sampling)^2`` above it
            from the loss; the diagnostics ``clip_fraction``, ``kl_approx``, ``entropy`` and
            ``ESS`` are then means over the tokens kept (those the loss counts).
        aggregation: see above.
        max_tokens: the constant of ``"seq_sum_constant"`` (default the padded length).
        entropy_bonus: add the entropy term ``loss_entropy = -entropy_coeff H`` per token,
            aggregated as the objective.
        entropy_coeff: its weight.
        samples_mc_entropy: TorchRL's, unused (the entropy is exact, from the logits).
        gamma: TorchRL's, accepted and unused.
        clip_value: TorchRL's, accepted and unused.
        reduction: ``"none"`` gives per-token losses as ``aggregation="none"``.
        kl_to_ref_coeff: k3 KL to the reference policy (``("next", "ref_log_probs", "full")``).
        kl_to_inference_coeff: k3 KL to the sampling policy.
        device: where the clip bounds (buffers) live.
        masking_strategy: ``"sft"`` (response tokens), ``"rlhf"`` (assistant turns),
            ``"generic"`` (every attended token).
        ref_log_prob_padding_side: the side a ragged reference log-prob entry is padded on.
        ref_log_prob_padding_value: the value it is padded with.
        sequence_ratio: GSPO's sequence-level ratio (:class:`GSPOLoss`).

    Gradient accumulation and several processes: ``loss(batch, num_items_in_batch=N)``, ``N``
    the tokens (``"token_mean"``) or sequences (the other aggregations) of the whole
    optimisation batch, divides every loss term by the global count (see :meth:`forward` and
    the guide "GRPO on several processes").

    The advantage may be per token (``[*B, T]`` / ``[*B, T, 1]``) or per sequence (``[*B]`` /
    ``[*B, 1]``); any other shape raises a ``ValueError`` naming the entries and shapes.

    Examples:
        >>> import torch
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import MetaData, TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import Masks, Tokens
        >>> from rlloss import GRPOLoss
        >>> words = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 32)}}
        >>> tokenizer = (
        ...     transformers.PreTrainedTokenizerFast(  # a tiny model built here, nothing downloaded
        ...         tokenizer_object=Tokenizer(WordLevel(words, unk_token="<pad>")),
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
        ...     model, tokenizer=tokenizer, generate=False, pad_output=True, input_mode="tokens"
        ... )
        >>> full = torch.randint(
        ...     2, 32, (3, 10)
        ... )  # 3 sequences: a prompt of 4 tokens, a response of 6
        >>> batch = TensorDict(
        ...     {
        ...         "tokens": Tokens(
        ...             full=full, prompt=full[:, :4], padded=MetaData(True), batch_size=[3]
        ...         ),
        ...         "masks": Masks(
        ...             all_attention_mask=torch.ones(3, 10, dtype=torch.bool),
        ...             all_assistant_mask=None,
        ...             padded=MetaData(True),
        ...             batch_size=[3],
        ...         ),
        ...         "log_probs": {
        ...             "full": -torch.rand(3, 10) - 2
        ...         },  # the sampling policy's, per token
        ...         "advantage": torch.randn(3, 10, 1),
        ...     },  # e.g. MCAdvantage's group-normalised rewards
        ...     [3],
        ... )
        >>> loss = GRPOLoss(actor, clip_epsilon=0.2)
        >>> out = loss(batch)
        >>> (out.loss_objective + out.loss_entropy).backward()
    """

    output_type: type[LLMLossOutput] = GRPOLossOutput

    @dataclasses.dataclass
    class _AcceptedKeys:
        """advantage: per token or per sequence; action: the tokens; sample_log_prob: their
        log-probs at sampling; ref_log_probs: under the reference policy."""

        advantage: NestedKey = "advantage"  # per sequence or token, [*B, 1]
        action: NestedKey = ("tokens", "full")  # the tokens, [*B, T]
        sample_log_prob: NestedKey = ("log_probs", "full")  # at sampling, [*B, T]
        ref_log_probs: NestedKey = ("next", "ref_log_probs", "full")  # reference, [*B, T]

    _choices = {  # checked on assignment as at construction
        **LossModule._choices,
        "aggregation": AGGREGATIONS,
        "masking_strategy": MASKING_STRATEGIES,
    }
    clip_epsilon_low = Coefficient(low=0.0, high=1.0, low_open=True, high_open=True, buffer=True)
    clip_epsilon_high = Coefficient(low=0.0, low_open=True, buffer=True)
    entropy_coeff = Coefficient(low=0.0)
    kl_mask_threshold = Coefficient(low=0.0)
    kl_to_ref_coeff = Coefficient(low=0.0)
    kl_to_inference_coeff = Coefficient(low=0.0)
    max_tokens = Coefficient(low=1, integer=True)
    # the tokens counted are the actor's token mask's (and kl_mask_threshold's); the batch's
    # loss_mask_key masks are not read (docs/differences.md)
    _reads_loss_mask = False

    def __init__(
        self,
        actor_network: torch.nn.Module | None = None,
        *,
        clip_epsilon: float | tuple[float, float] = 0.2,
        kl_mask_threshold: float | None = None,
        aggregation: str | None = "token_mean",
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = 0.01,
        gamma: float | None = None,
        reduction: str | None = None,
        clip_value: bool | float | None = None,
        kl_to_ref_coeff: float | None = None,
        kl_to_inference_coeff: float | None = None,
        device: torch.device | None = None,
        masking_strategy: Literal["sft", "rlhf", "generic"] = "sft",
        ref_log_prob_padding_side: Literal["left", "right"] = "left",
        ref_log_prob_padding_value: float = 0.0,
        max_tokens: int | None = None,
        sequence_ratio: bool = False,
    ):
        """``gamma`` and ``clip_value`` are accepted and unused, as in TorchRL's class;
        ``max_tokens`` and ``sequence_ratio`` are rlloss's."""
        super().__init__()
        self.actor_network = actor_network
        low, high = _clip_pair(clip_epsilon)
        self._register_coefficients(device, clip_epsilon_low=low, clip_epsilon_high=high)
        check_choice("aggregation", aggregation or "token_mean", AGGREGATIONS)
        self.aggregation = aggregation or "token_mean"
        self.reduction = self._check_reduction(reduction)
        self.masking_strategy = check_masking_strategy(masking_strategy)
        self.entropy_bonus = entropy_bonus
        self.samples_mc_entropy = samples_mc_entropy
        self.sequence_ratio = sequence_ratio
        self.ref_log_prob_padding_side = ref_log_prob_padding_side
        self.ref_log_prob_padding_value = ref_log_prob_padding_value
        self._register_coefficients(
            entropy_coeff=entropy_coeff,
            kl_mask_threshold=kl_mask_threshold,
            kl_to_ref_coeff=kl_to_ref_coeff,
            kl_to_inference_coeff=kl_to_inference_coeff,
            max_tokens=max_tokens,
        )

    @property
    def in_keys(self) -> list:
        actor_keys = getattr(self.actor_network, "in_keys", None)
        keys = list(actor_keys) if isinstance(actor_keys, (list, tuple)) else []
        names = ("action", "sample_log_prob", "advantage", "ref_log_probs")  # TorchRL's order
        keys += [getattr(self.tensor_keys, name) for name in names]
        return list(dict.fromkeys(keys))

    @property
    def out_keys(self) -> list:
        keys = ["loss_objective", "clip_fraction", "ESS", "kl_approx"]
        keys += ["entropy", "loss_entropy"] if self.entropy_bonus else []
        return keys + ["loss_kl_to_ref", "kl_to_ref", "loss_kl_to_inference", "kl_to_inference"]

    @property
    def _clip_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        return rlf.clip_bounds(self.clip_epsilon_low, self.clip_epsilon_high)

    def _tokens(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The sampled token ids (padded with -100); TorchRL's ``ValueError`` when absent, a
        ``TypeError`` naming the entry for ids of a floating dtype."""
        key = self.tensor_keys.action
        action = read_padded(tensordict, key, padding_value=-100)
        if action is None:
            raise ValueError(f"Action key {key} not in tensordict.")
        if action.is_floating_point():
            raise TypeError(
                f"{type(self).__name__}: the tokens {key!r} have dtype {action.dtype}; token ids "
                "must be integers: store them as sampled (torch.long)."
            )
        return action

    @accepts_tensor_arguments
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        num_items_in_batch: int | float | torch.Tensor | None = None,
    ) -> LLMLossOutput:
        """The losses (``loss_objective``, ``loss_entropy``, ``loss_kl_to_ref``,
        ``loss_kl_to_inference``) and diagnostics of one batch of sampled sequences.

        ``num_items_in_batch``: the count the aggregation divides by, over the whole
        optimisation batch (every micro-batch of every rank): its valid tokens for
        ``"token_mean"``, its sequences for ``"prompt_mean"`` and ``"seq_sum_constant"``
        (then ``max_tokens`` must be set). Each loss term is then this batch's sum divided by
        ``num_items_in_batch / world_size`` (the default process group's size, 1 without
        ``torch.distributed``): summed over micro-batches, with gradients averaged over ranks
        by DDP or FSDP, it is the whole batch's loss and gradient. The KL terms are then
        aggregated as the objective (over the tokens the loss counts), and every diagnostic
        stays this batch's mean. ``None`` (default): this batch's own count (TorchRL's)."""
        owner = type(self).__name__
        count = self._per_rank_count(num_items_in_batch)
        action = self._tokens(tensordict)
        advantage = read_padded(tensordict, self.tensor_keys.advantage)
        if advantage is None:
            raise ValueError(f"Advantage key {self.tensor_keys.advantage} not in tensordict.")
        log_prob, entropy, old_log_prob, mask = self._token_log_probs(tensordict, action)
        advantage = token_advantage(owner, self.tensor_keys.advantage, advantage, mask)
        log_ratio = rlf.masked_log_ratio(log_prob, old_log_prob, mask)
        loss_mask = mask
        if self.kl_mask_threshold is not None and self.kl_mask_threshold > 0:
            loss_mask = mask & rlf.kl_trust_mask(log_prob, old_log_prob, self.kl_mask_threshold)
        log_weight = rlf.gspo_token_log_ratio(log_ratio, mask) if self.sequence_ratio else log_ratio
        gain, clipped = self._objective(log_weight, advantage)
        out = {"loss_objective": self._aggregate(-gain, loss_mask, count)}
        tokens = loss_mask.sum()  # the diagnostics average the tokens the loss counts
        divisor = tokens.clamp_min(1)
        out["clip_fraction"] = _valid_mean(clipped.to(gain.dtype), loss_mask, divisor)
        out["kl_approx"] = _valid_mean(-log_ratio.detach(), loss_mask, divisor)
        out["ESS"] = rlf.masked_token_ess(log_ratio, loss_mask) / tokens  # NaN with no token
        if self.entropy_bonus:
            out["entropy"] = _valid_mean(entropy.detach(), loss_mask, divisor)
            loss_entropy = -self.entropy_coeff * entropy
            out["loss_entropy"] = self._aggregate(loss_entropy, loss_mask, count)
        if self.kl_to_ref_coeff is not None and self.kl_to_ref_coeff > 0:
            out["loss_kl_to_ref"], out["kl_to_ref"] = self._kl_term(
                tensordict, "ref_log_probs", log_prob, loss_mask, self.kl_to_ref_coeff, count
            )
        coeff = self.kl_to_inference_coeff
        if coeff is not None:
            out["loss_kl_to_inference"], out["kl_to_inference"] = self._kl_term(
                tensordict, "sample_log_prob", log_prob, loss_mask, coeff, count
            )
        return self.output_type(**out, batch_size=[])

    def _per_rank_count(self, num_items_in_batch):
        """The denominator of the loss terms (:func:`rlloss.llm.base.per_rank_count`), with
        the aggregations that cannot take one refused."""
        if num_items_in_batch is None:
            return None
        owner = type(self).__name__
        if self.aggregation == "none" or self.reduction == "none":
            raise ValueError(
                f"{owner}: num_items_in_batch was given with aggregation={self.aggregation!r}, "
                f"reduction={self.reduction!r}: a per-token loss has no denominator; use "
                "'token_mean', 'prompt_mean' or 'seq_sum_constant'."
            )
        if self.aggregation == "seq_sum_constant" and self.max_tokens is None:
            raise ValueError(
                f"{owner}: num_items_in_batch with aggregation='seq_sum_constant' needs "
                "max_tokens: the default constant, each batch's padded length, differs "
                "between micro-batches; set max_tokens (e.g. the generation budget)."
            )
        return per_rank_count(owner, num_items_in_batch)

    def _token_log_probs(self, tensordict: TensorDictBase, action: torch.Tensor):
        """The current token log-probs and entropies (``None`` without the entropy bonus) and
        the sampling log-probs ``[*B, T]``, with the token mask (the actor's, less the tokens
        whose sampling log-prob is not finite: TorchRL pads alignment holes with NaN). The
        log-probs and entropies come from the logits chunk by chunk
        (:func:`rlloss.functional.token_log_prob_entropy`): no ``[*B, T, V]`` tensor."""
        owner = type(self).__name__
        dist = token_distribution(owner, self.actor_network, tensordict, self.masking_strategy)
        mask, logits = dist.mask, dist.logits
        if mask.shape != logits.shape[:-1]:
            raise ValueError(
                f"{owner}: the actor's token mask has shape {tuple(mask.shape)}, its logits "
                f"{tuple(logits.shape)}: a token-level mask [*B, T, V] is not supported, "
                "give a position mask [*B, T]."
            )
        log_prob, entropy = rlf.token_log_prob_entropy(logits, action, mask, self.entropy_bonus)
        old_log_prob = read_padded(tensordict, self.tensor_keys.sample_log_prob)
        if old_log_prob is None:
            raise KeyError(
                f"Couldn't find the log-prob {self.tensor_keys.sample_log_prob} in the input "
                f"data: {owner} needs the tokens' log-probs at sampling (set_keys("
                "sample_log_prob=...) to read another entry)."
            )
        if old_log_prob.requires_grad:
            raise RuntimeError(
                f"{owner}: the stored {self.tensor_keys.sample_log_prob} requires grad; store "
                "the sampling log-probs detached."
            )
        if old_log_prob.shape != log_prob.shape:
            raise ValueError(
                f"{owner}: the actor's log-probs have shape {tuple(log_prob.shape)} (masking "
                f"strategy {self.masking_strategy!r}), the stored "
                f"{self.tensor_keys.sample_log_prob} {tuple(old_log_prob.shape)}: compute both "
                "with the same masking strategy and padding (left), or set masking_strategy "
                "to the one the sampling used ('sft', 'rlhf' or 'generic')."
            )
        return log_prob, entropy, old_log_prob, mask & torch.isfinite(old_log_prob)

    def _objective(self, log_weight: torch.Tensor, advantage: torch.Tensor):
        """The per-token objective (to maximise) and which tokens the clip changed."""
        low, high = self._clip_bounds
        gain = rlf.clipped_surrogate(log_weight, advantage, low, high)
        return gain, rlf.clipped(log_weight.detach(), low, high)

    def _aggregate(self, value: torch.Tensor, mask: torch.Tensor, count=None) -> torch.Tensor:
        if self.aggregation == "none" or self.reduction == "none":
            return rlf.aggregate_tokens(value, mask, "none").unsqueeze(-1)
        return rlf.aggregate_tokens(value, mask, self.aggregation, self.max_tokens, count)

    def _aggregate_loss_value(self, value, mask, tensordict=None) -> torch.Tensor:
        """TorchRL's name: ``value`` ``[*B, T, 1]`` or ``[*B, T]`` aggregated over ``mask``."""
        value = per_token(type(self).__name__, "loss", "value", value, mask)
        return self._aggregate(value, mask)

    def _kl_term(self, tensordict, name, cur, mask, coeff, count=None):
        """``coeff`` times the k3 estimate of ``KL(pi || pi_other)`` (``pi_other``: the
        entry ``name``), averaged over every position of the padded batch as TorchRL does;
        with a global ``count``, aggregated as the objective over ``mask`` (the diagnostic:
        this batch's mean over ``mask``)."""
        key = getattr(self.tensor_keys, name)
        side, fill = self.ref_log_prob_padding_side, self.ref_log_prob_padding_value
        other = read_padded(tensordict, key, side, fill)
        if other is None:
            raise KeyError(
                f"Couldn't find the ref log-prob {key} in the input data: "
                f"{type(self).__name__} with a KL coefficient needs it (set_keys({name}=...) "
                "to read another entry)."
            )
        other = per_token(type(self).__name__, name, key, other, cur)
        diff = torch.where(mask, other, 0.0) - torch.where(mask, cur, 0.0)
        if count is None:
            kl = rlf.kl_k3(diff).mean()
            return coeff * kl, kl.detach()
        per_token_kl = rlf.kl_k3(diff)
        local = _valid_mean(per_token_kl.detach(), mask, mask.sum().clamp_min(1))
        return coeff * self._aggregate(per_token_kl, mask, count), local


def _clip_pair(clip_epsilon) -> tuple[float, float]:
    if isinstance(clip_epsilon, (tuple, list)):
        if len(clip_epsilon) != 2:
            raise ValueError(
                "clip_epsilon must be a float or a (low, high) pair of length 2, got "
                f"{clip_epsilon}."
            )
        return clip_epsilon[0], clip_epsilon[1]
    return clip_epsilon, clip_epsilon


def _valid_mean(value: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The mean of ``value`` over ``mask``'s ``count`` tokens (``aggregate_tokens``' token
    mean, its count given)."""
    return torch.where(mask, value, 0.0).sum() / count
