"""GRPO's variants, :class:`rlloss.llm.GRPOLoss` with another surrogate or other defaults, as
drop-ins for ``torchrl.objectives.llm`` where TorchRL has them: :class:`DAPO` (clip-higher),
:class:`CISPOLoss` (clipped importance weight, stop-gradient), and two TorchRL lacks:
:class:`DrGRPOLoss` (no length normalisation) and :class:`GSPOLoss` (sequence-level ratio).

Yu et al., arXiv:2503.14476 (DAPO); MiniMax, arXiv:2506.13585 (CISPO); Liu et al.,
arXiv:2503.20783 (Dr. GRPO); Zheng et al., arXiv:2507.18071 (GSPO). The formulas are
:mod:`rlloss.functional.llm`'s.
"""

from __future__ import annotations

from typing import Literal

import torch
from torchrl.objectives.llm import CISPOLossOutput, DAPOLossOutput

from rlloss import functional as rlf
from rlloss.llm.grpo import GRPOLoss


class DAPO(GRPOLoss):
    r"""DAPO (Yu et al., arXiv:2503.14476): GRPO with clip-higher, ``clip_epsilon=(eps_low,
    eps_high)``, recommended ``(0.2, 0.28)`` (eq. 10), and the token-level mean (eq. 12) of
    GRPO's per-token loss $\mathcal{L}_{i,t}$ over the $G$ sequences $o_i$:

    $$
    \mathcal{L} = \frac{1}{\sum_{i=1}^{G} |o_i|} \sum_{i=1}^{G} \sum_{t=1}^{|o_i|}
    \mathcal{L}_{i,t}
    $$

    TorchRL's ``DAPO``, same defaults (``clip_epsilon=0.2`` unless given).

    Examples:
        >>> import torch
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import MetaData, TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import Masks, Tokens
        >>> from rlloss import DAPO
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
        >>> loss = DAPO(actor)
        >>> out = loss(batch)
        >>> (out.loss_objective + out.loss_entropy).backward()
    """

    output_type = DAPOLossOutput


class CISPOLoss(GRPOLoss):
    r"""CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4), per token:

    $$
    \mathcal{L}_t = -\mathrm{sg}\Big(\operatorname{clip}(r_t, 1 - \epsilon_{\text{low}},
    1 + \epsilon_{\text{high}})\Big) A \log \pi_\theta(y_t \mid x, y_{<t})
    $$

    The clipped weight is a constant ($\mathrm{sg}$: no gradient), so a clipped token keeps
    its gradient $\operatorname{clip}(r_t) A \nabla \log \pi$ (TorchRL's ``CISPOLoss`` clamps
    the ratio inside the graph and so drops it, as PPO's clip does; the values agree).

    Examples:
        >>> import torch
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import MetaData, TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import Masks, Tokens
        >>> from rlloss import CISPOLoss
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
        >>> loss = CISPOLoss(actor)
        >>> out = loss(batch)
        >>> (out.loss_objective + out.loss_entropy).backward()
    """

    output_type = CISPOLossOutput

    def _objective(self, log_weight: torch.Tensor, advantage: torch.Tensor):
        low, high = self._clip_bounds
        gain = rlf.cispo_surrogate(log_weight, advantage, low, high)
        return gain, rlf.clipped(log_weight.detach(), low, high)


class DrGRPOLoss(GRPOLoss):
    r"""Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training", arXiv:2503.20783, sec. 3.2):
    GRPO without its length normalisation, each sequence's summed token loss divided by one
    constant (``max_tokens``, default the padded length), then the mean over the sequences
    (``aggregation="seq_sum_constant"``):

    $$
    \mathcal{L} = \frac{1}{G} \sum_{i=1}^{G} \frac{1}{T_{\max}} \sum_{t=1}^{|o_i|}
    \mathcal{L}_{i,t}
    $$

    Its other half, no std in the group advantage, is the
    advantage's: ``MCAdvantage(..., scale=False)`` or
    :func:`rlloss.functional.group_relative_advantage` with ``scale=False``. Same keywords as
    :class:`GRPOLoss`, another default aggregation.

    Examples:
        >>> import torch
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import MetaData, TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import Masks, Tokens
        >>> from rlloss import DrGRPOLoss
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
        >>> loss = DrGRPOLoss(actor)
        >>> out = loss(batch)
        >>> (out.loss_objective + out.loss_entropy).backward()
    """

    def __init__(
        self,
        actor_network: torch.nn.Module | None = None,
        *,
        clip_epsilon: float | tuple[float, float] = 0.2,
        kl_mask_threshold: float | None = None,
        aggregation: str | None = "seq_sum_constant",
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
        super().__init__(
            actor_network,
            clip_epsilon=clip_epsilon,
            kl_mask_threshold=kl_mask_threshold,
            aggregation=aggregation,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            gamma=gamma,
            reduction=reduction,
            clip_value=clip_value,
            kl_to_ref_coeff=kl_to_ref_coeff,
            kl_to_inference_coeff=kl_to_inference_coeff,
            device=device,
            masking_strategy=masking_strategy,
            ref_log_prob_padding_side=ref_log_prob_padding_side,
            ref_log_prob_padding_value=ref_log_prob_padding_value,
            max_tokens=max_tokens,
            sequence_ratio=sequence_ratio,
        )


class GSPOLoss(GRPOLoss):
    r"""GSPO (Zheng et al., "Group Sequence Policy Optimization", arXiv:2507.18071): the ratio
    of a sequence is the geometric mean of its valid tokens' ratios (eq. 7), clipped per
    sequence:

    $$
    s = \exp\Big(\frac{1}{|y|} \sum_{t} \log r_t\Big), \qquad
    \mathcal{L} = -\min\Big(s A,\; \operatorname{clip}(s, 1 - \epsilon_{\text{low}},
    1 + \epsilon_{\text{high}}) A\Big)
    $$

     computed as GSPO-token (eq. 13), whose gradient is GSPO's when the advantage is
    one per sequence. The paper's clip range is small: default ``clip_epsilon=(3e-4, 4e-4)``;
    the default aggregation is the mean over sequences (``"prompt_mean"``). Same keywords as
    :class:`GRPOLoss`, other defaults.

    Examples:
        >>> import torch
        >>> import transformers  # pip install "rlloss[llm]"
        >>> from tensordict import MetaData, TensorDict
        >>> from tokenizers import Tokenizer
        >>> from tokenizers.models import WordLevel
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from torchrl.modules.llm.policies.common import Masks, Tokens
        >>> from rlloss import GSPOLoss
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
        >>> loss = GSPOLoss(actor)
        >>> out = loss(batch)
        >>> (out.loss_objective + out.loss_entropy).backward()
    """

    def __init__(
        self,
        actor_network: torch.nn.Module | None = None,
        *,
        clip_epsilon: float | tuple[float, float] = (3e-4, 4e-4),
        kl_mask_threshold: float | None = None,
        aggregation: str | None = "prompt_mean",
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
        sequence_ratio: bool = True,
    ):
        super().__init__(
            actor_network,
            clip_epsilon=clip_epsilon,
            kl_mask_threshold=kl_mask_threshold,
            aggregation=aggregation,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=entropy_coeff,
            gamma=gamma,
            reduction=reduction,
            clip_value=clip_value,
            kl_to_ref_coeff=kl_to_ref_coeff,
            kl_to_inference_coeff=kl_to_inference_coeff,
            device=device,
            masking_strategy=masking_strategy,
            ref_log_prob_padding_side=ref_log_prob_padding_side,
            ref_log_prob_padding_value=ref_log_prob_padding_value,
            max_tokens=max_tokens,
            sequence_ratio=sequence_ratio,
        )
