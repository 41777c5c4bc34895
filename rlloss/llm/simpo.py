"""Simple preference optimisation, reference-free: :class:`SimPOLoss` (Meng et al.,
arXiv:2405.14734). TorchRL has no preference loss: this one is rlloss's own."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss.common import accepts_tensor_arguments
from rlloss.llm.preference import PreferenceLoss, reward_diagnostics


class SimPOLoss(PreferenceLoss):
    r"""SimPO (Meng et al., "SimPO: Simple Preference Optimization with a Reference-Free
    Reward", arXiv:2405.14734): DPO without a reference model, the implicit reward being the
    length-normalised log-likelihood ``beta / |y| log pi(y)``, with a target margin ``gamma``.

    $$
    \mathcal{L}_{\text{simpo}} = -(1 - \epsilon) \log \sigma(m) - \epsilon \log \sigma(-m),
    \qquad
    m = \frac{\beta}{|y_w|} \log \pi(y_w) - \frac{\beta}{|y_l|} \log \pi(y_l) - \gamma
    $$

    per pair (eq. 6; $\epsilon$ = ``label_smoothing``, 0 in the paper; TRL's
    ``CPOTrainer(loss_type="simpo")`` formula).
    Diagnostics (detached): ``reward_chosen``, ``reward_rejected`` (the mean rewards ``beta
    mean_t log pi``), ``reward_margin``, ``reward_accuracy``.

    Args:
        actor_network: a ``torchrl.modules.llm`` wrapper with ``generate=False``.

    Keyword Args:
        beta: ``beta > 0``; the paper uses 2 to 2.5.
        gamma: the target reward margin ``gamma >= 0``; the paper recommends ``gamma / beta``
            about 0.5.
        label_smoothing: ``eps`` in ``[0, 0.5)``.
        masking_strategy: ``"sft"``, ``"rlhf"`` or ``"generic"`` (see :class:`DPOLoss`).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` over the pairs.
        device: where the coefficients live.

    The keys (``loss.set_keys(name=key)``; ``tokens`` inside each response entry):

    | name | default | read | shape |
    |---|---|---|---|
    | ``chosen`` | ``"chosen"`` | the preferred responses | TensorDict ``[*B]`` |
    | ``rejected`` | ``"rejected"`` | the dispreferred responses | TensorDict ``[*B]`` |
    | ``tokens`` | ``("tokens", "full")`` | the token ids | ``[*B, T]`` |

    Written: ``loss_simpo`` (``[]``, ``[*B]`` with ``reduction="none"``), ``reward_chosen``,
    ``reward_rejected``, ``reward_margin``, ``reward_accuracy`` (``[]``).

    Differences from TorchRL: TorchRL 0.14 has no preference loss.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules.distributions import LLMMaskedCategorical
        >>> from rlloss.llm import SimPOLoss
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
        ...     full = torch.randint(8, (4, 6), generator=torch.Generator().manual_seed(seed))
        ...     return TensorDict(tokens={"full": full, "prompt": full[:, :2]}, batch_size=[4])
        >>> loss = SimPOLoss(Bigram(), beta=2.0, gamma=1.0)
        >>> out = loss(TensorDict(chosen=responses(0), rejected=responses(1), batch_size=[4]))
        >>> out["loss_simpo"].backward()
        >>> out["loss_simpo"].shape
        torch.Size([])
    """

    @dataclasses.dataclass
    class _AcceptedKeys(PreferenceLoss._AcceptedKeys):
        """The responses (see :class:`DPOLoss`); ``ref_log_probs`` is not read."""

        chosen: NestedKey = "chosen"  # the preferred responses, [*B]
        rejected: NestedKey = "rejected"  # the dispreferred responses, [*B]

    beta = Coefficient(low=0.0, low_open=True, buffer=True)
    gamma = Coefficient(low=0.0, buffer=True)
    label_smoothing = Coefficient(low=0.0, high=0.5, high_open=True, buffer=True)

    def __init__(
        self,
        actor_network: torch.nn.Module,
        *,
        beta: float = 2.0,
        gamma: float = 1.0,
        label_smoothing: float = 0.0,
        masking_strategy: str = "sft",
        reduction: str = "mean",
        device: torch.device | None = None,
    ) -> None:
        super().__init__(actor_network, None, masking_strategy, reduction)
        self._register_coefficients(device, beta=beta, gamma=gamma, label_smoothing=label_smoothing)

    @property
    def in_keys(self) -> list:
        return [self.tensor_keys.chosen, self.tensor_keys.rejected]

    @property
    def out_keys(self) -> list:
        return [
            "loss_simpo",
            "reward_chosen",
            "reward_rejected",
            "reward_margin",
            "reward_accuracy",
        ]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """``loss_simpo`` and the reward diagnostics of a batch of pairs."""
        chosen = self._policy_log_probs(self._response(tensordict, "chosen"))[0]
        rejected = self._policy_log_probs(self._response(tensordict, "rejected"))[0]
        beta, gamma, eps = self._coefficient_values(
            chosen.total, "beta", "gamma", "label_smoothing"
        )
        loss = rlf.simpo_loss(chosen.mean, rejected.mean, beta, gamma, eps)
        return self._output(
            {
                "loss_simpo": rlf.reduce(loss, self.reduction),
                **reward_diagnostics(beta * chosen.mean, beta * rejected.mean),
            }
        )
