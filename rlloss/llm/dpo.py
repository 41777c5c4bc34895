"""Direct preference optimisation on pairs of responses: :class:`DPOLoss` (Rafailov et al.,
arXiv:2305.18290) with TRL's ``sigmoid``, ``ipo``, ``hinge`` and ``robust`` variants. TorchRL
has no preference loss: this one is rlloss's own."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice
from rlloss.common import accepts_tensor_arguments
from rlloss.llm.preference import PreferenceLoss, reward_diagnostics

LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust")


class DPOLoss(PreferenceLoss):
    r"""Direct preference optimisation (Rafailov et al., "Direct Preference Optimization: Your
    Language Model is Secretly a Reward Model", arXiv:2305.18290) on a language model's
    chosen and rejected responses to the same prompts.

    With the margin

    $$
    h = \big(\log \pi(y_w) - \log \pi_{\text{ref}}(y_w)\big)
    - \big(\log \pi(y_l) - \log \pi_{\text{ref}}(y_l)\big)
    $$

    (the chosen $y_w$, the rejected $y_l$, log-probs summed over the response tokens),
    ``loss_dpo`` per pair is, by ``loss_type`` ($\epsilon$ = ``label_smoothing``):

    - ``"sigmoid"``: $-(1 - \epsilon) \log \sigma(\beta h) - \epsilon \log \sigma(-\beta h)$
      (eq. 7; conservative DPO);
    - ``"robust"``: $\big(-(1 - \epsilon) \log \sigma(\beta h) +
      \epsilon \log \sigma(-\beta h)\big) / (1 - 2 \epsilon)$
      (Chowdhury et al., "Provably Robust DPO", arXiv:2403.00409, eq. 12);
    - ``"hinge"``: $\max(0, 1 - \beta h)$ (SLiC-HF, arXiv:2305.10425);
    - ``"ipo"``: $\big(h' - \frac{1}{2 \beta}\big)^2$ (Azar et al., arXiv:2310.12036, eq. 17),
      $h'$ the margin of the per-token log-ratios (each divided by its response's token count,
      as TRL).

    The reference log-probs come from ``reference_network`` (scored without gradient) or, when
    it is ``None``, from each response entry's ``ref_log_probs`` (per token or per response).
    Diagnostics (detached): ``reward_chosen`` and ``reward_rejected`` (the mean implicit rewards
    ``beta (log pi - log pi_ref)``), ``reward_margin``, ``reward_accuracy`` (the fraction of
    pairs whose chosen response has the higher implicit reward).

    Args:
        actor_network: a ``torchrl.modules.llm`` wrapper (``TransformersWrapper``) with
            ``generate=False`` (or a module with its ``_get_*_dist`` contract).

    Keyword Args:
        reference_network: the frozen reference model, same contract; ``None``: read the
            stored reference log-probs.
        beta: ``beta > 0`` (IPO's ``tau``).
        loss_type: ``"sigmoid"``, ``"ipo"``, ``"hinge"`` or ``"robust"``.
        label_smoothing: ``eps`` in ``[0, 0.5)``, for ``"sigmoid"`` and ``"robust"``.
        masking_strategy: the tokens scored: ``"sft"`` (the response), ``"rlhf"`` (the
            assistant turns), ``"generic"`` (every attended token).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[*B]``) over the pairs.
        device: where the coefficients live.

    The keys (``loss.set_keys(name=key)``; ``tokens`` and ``ref_log_probs`` inside each
    response entry):

    | name | default | read | shape |
    |---|---|---|---|
    | ``chosen`` | ``"chosen"`` | the preferred responses | TensorDict ``[*B]`` |
    | ``rejected`` | ``"rejected"`` | the dispreferred responses | TensorDict ``[*B]`` |
    | ``tokens`` | ``("tokens", "full")`` | the token ids | ``[*B, T]`` |
    | ``ref_log_probs`` | ``("ref_log_probs", "full")`` | if no reference network | ``[*B(, T)]`` |

    Written: ``loss_dpo`` (``[]``, ``[*B]`` with ``reduction="none"``), ``reward_chosen``,
    ``reward_rejected``, ``reward_margin``, ``reward_accuracy`` (``[]``).

    Differences from TorchRL: TorchRL 0.14 has no preference loss. TRL 1.16's ``sigmoid``
    ignores ``label_smoothing``; here it is conservative DPO's (equal to TRL's at 0).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules.distributions import LLMMaskedCategorical
        >>> from rlloss.llm import DPOLoss
        >>> class Bigram(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.logits = torch.nn.Embedding(8, 8)
        ...     def _get_sft_dist(self, td):
        ...         tokens = td["tokens", "full"]
        ...         mask = torch.arange(tokens.shape[-1]) >= td["tokens", "prompt"].shape[-1]
        ...         mask = mask.expand_as(tokens)
        ...         return LLMMaskedCategorical(logits=self.logits(tokens), mask=mask)
        >>> def responses(seed):
        ...     g = torch.Generator().manual_seed(seed)
        ...     full = torch.randint(8, (4, 6), generator=g)
        ...     return TensorDict(
        ...         tokens={"full": full, "prompt": full[:, :2]},
        ...         ref_log_probs={"full": -torch.rand(4, 6, generator=g) - 1.0},
        ...         batch_size=[4],
        ...     )
        >>> loss = DPOLoss(Bigram(), beta=0.1)
        >>> batch = TensorDict(chosen=responses(0), rejected=responses(1), batch_size=[4])
        >>> out = loss(batch)
        >>> out["loss_dpo"].backward()
        >>> sorted(out.keys())
        ['loss_dpo', 'reward_accuracy', 'reward_chosen', 'reward_margin', 'reward_rejected']
    """

    @dataclasses.dataclass
    class _AcceptedKeys(PreferenceLoss._AcceptedKeys):
        """The responses: one TensorDict each in the actor's input layout, row i of both
        answering the same prompt."""

        chosen: NestedKey = "chosen"  # the preferred responses, [*B]
        rejected: NestedKey = "rejected"  # the dispreferred responses, [*B]

    beta = Coefficient(low=0.0, low_open=True, buffer=True)
    label_smoothing = Coefficient(low=0.0, high=0.5, high_open=True, buffer=True)

    def __init__(
        self,
        actor_network: torch.nn.Module,
        *,
        reference_network: torch.nn.Module | None = None,
        beta: float = 0.1,
        loss_type: str = "sigmoid",
        label_smoothing: float = 0.0,
        masking_strategy: str = "sft",
        reduction: str = "mean",
        device: torch.device | None = None,
    ) -> None:
        super().__init__(actor_network, reference_network, masking_strategy, reduction)
        check_choice("loss_type", loss_type, LOSS_TYPES)
        if loss_type in ("ipo", "hinge") and label_smoothing:
            raise ValueError(
                f"label_smoothing={label_smoothing} has no meaning for loss_type={loss_type!r}: "
                "it applies to 'sigmoid' (conservative DPO) and 'robust'; leave it at 0."
            )
        self.loss_type = loss_type
        self._register_coefficients(device, beta=beta, label_smoothing=label_smoothing)

    @property
    def in_keys(self) -> list:
        return [self.tensor_keys.chosen, self.tensor_keys.rejected]

    @property
    def out_keys(self) -> list:
        return ["loss_dpo", "reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy"]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """``loss_dpo`` and the implicit-reward diagnostics of a batch of pairs."""
        chosen, ref_chosen = self._sequence_log_probs(tensordict, "chosen")
        rejected, ref_rejected = self._sequence_log_probs(tensordict, "rejected")
        margin = rlf.dpo_log_ratio_margin(
            chosen.total, rejected.total, ref_chosen.total, ref_rejected.total
        )
        beta, eps = self._coefficient_values(margin, "beta", "label_smoothing")
        if self.loss_type == "sigmoid":
            loss = rlf.dpo_sigmoid_loss(margin, beta, eps)
        elif self.loss_type == "robust":
            loss = rlf.robust_dpo_loss(margin, beta, eps)
        elif self.loss_type == "hinge":
            loss = rlf.dpo_hinge_loss(margin, beta)
        else:
            chosen_ratio = chosen.total - ref_chosen.total.detach()
            rejected_ratio = rejected.total - ref_rejected.total.detach()
            loss = rlf.ipo_loss(chosen_ratio, rejected_ratio, chosen.length, rejected.length, beta)
        reward_chosen = beta * (chosen.total - ref_chosen.total).detach()
        reward_rejected = beta * (rejected.total - ref_rejected.total).detach()
        return self._output(
            {
                "loss_dpo": rlf.reduce(loss, self.reduction),
                **reward_diagnostics(reward_chosen, reward_rejected),
            }
        )
