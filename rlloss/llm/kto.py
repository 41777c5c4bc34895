"""Kahneman-Tversky optimisation on unpaired responses labelled desirable or undesirable:
:class:`KTOLoss` (Ethayarajh et al., arXiv:2402.01306). TorchRL has no preference loss: this
one is rlloss's own."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss.common import accepts_tensor_arguments
from rlloss.llm.preference import PreferenceLoss, masked_mean


class KTOLoss(PreferenceLoss):
    r"""KTO (Ethayarajh et al., "KTO: Model Alignment as Prospect Theoretic Optimization",
    arXiv:2402.01306): each response is labelled desirable or not, no pairs needed.

    $$
    \mathcal{L}_{\text{kto}} =
    \begin{cases}
    \lambda_D \big(1 - \sigma(\beta (r - z_0))\big) & \text{desirable} \\
    \lambda_U \big(1 - \sigma(\beta (z_0 - r))\big) & \text{undesirable}
    \end{cases}
    \qquad
    r = \log \frac{\pi(y)}{\pi_{\text{ref}}(y)}, \quad
    z_0 = \max\Big(0, \frac{1}{m} \sum_j \log \frac{\pi(y'_j)}{\pi_{\text{ref}}(y'_j)}\Big)
    $$

    per example, the reference point $z_0$ over mismatched responses $y'$ (the batch's
    ``kl_response`` entry: each prompt with another example's response; no gradient) (eq. 7,
    the formula of TRL's ``KTOTrainer``), reduced over all examples. Diagnostics (detached): ``kl``
    (``z_0``), ``reward_chosen`` and ``reward_rejected`` (the mean ``beta r`` over the desirable
    and the undesirable examples, 0 without one).

    Args:
        actor_network: a ``torchrl.modules.llm`` wrapper with ``generate=False``.

    Keyword Args:
        reference_network: the frozen reference model; ``None``: read the stored reference
            log-probs of ``response`` and ``kl_response``.
        beta: ``beta > 0``.
        desirable_weight: ``lambda_D >= 0`` (the paper keeps ``lambda_D n_D / (lambda_U n_U)``
            in ``[1, 4/3]``).
        undesirable_weight: ``lambda_U >= 0``.
        masking_strategy: ``"sft"``, ``"rlhf"`` or ``"generic"`` (see :class:`DPOLoss`).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` over the examples.
        device: where the coefficients live.

    The keys (``loss.set_keys(name=key)``; ``tokens`` and ``ref_log_probs`` inside each
    response entry):

    | name | default | read | shape |
    |---|---|---|---|
    | ``response`` | ``"response"`` | the labelled responses | TensorDict ``[*B]`` |
    | ``label`` | ``"label"`` | desirable or not | bool ``[*B(, 1)]`` |
    | ``kl_response`` | ``"kl_response"`` | mismatched responses (``z_0``) | TensorDict |
    | ``tokens`` | ``("tokens", "full")`` | the token ids | ``[*B, T]`` |
    | ``ref_log_probs`` | ``("ref_log_probs", "full")`` | if no reference network | ``[*B(, T)]`` |

    Written: ``loss_kto`` (``[]``, ``[*B]`` with ``reduction="none"``), ``kl``,
    ``reward_chosen``, ``reward_rejected`` (``[]``).

    Differences from TorchRL: TorchRL 0.14 has no preference loss. TRL averages ``z_0`` over
    the ranks (a gather); here it is the batch's on each process.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules.distributions import LLMMaskedCategorical
        >>> from rlloss.llm import KTOLoss
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
        >>> batch = TensorDict(
        ...     response=responses(0),
        ...     kl_response=responses(1),
        ...     label=torch.tensor([True, False, True, False]),
        ...     batch_size=[4],
        ... )
        >>> out = KTOLoss(Bigram(), beta=0.1)(batch)
        >>> out["loss_kto"].backward()
        >>> sorted(out.keys())
        ['kl', 'loss_kto', 'reward_chosen', 'reward_rejected']
    """

    @dataclasses.dataclass
    class _AcceptedKeys(PreferenceLoss._AcceptedKeys):
        """The responses, TensorDicts in the actor's input layout, and their labels."""

        response: NestedKey = "response"  # the responses, [*B]
        label: NestedKey = "label"  # True where the response is desirable, [*B]
        kl_response: NestedKey = "kl_response"  # mismatched responses (reference point), [*B]

    beta = Coefficient(low=0.0, low_open=True, buffer=True)
    desirable_weight = Coefficient(low=0.0, buffer=True)
    undesirable_weight = Coefficient(low=0.0, buffer=True)

    def __init__(
        self,
        actor_network: torch.nn.Module,
        *,
        reference_network: torch.nn.Module | None = None,
        beta: float = 0.1,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        masking_strategy: str = "sft",
        reduction: str = "mean",
        device: torch.device | None = None,
    ) -> None:
        super().__init__(actor_network, reference_network, masking_strategy, reduction)
        self._register_coefficients(
            device,
            beta=beta,
            desirable_weight=desirable_weight,
            undesirable_weight=undesirable_weight,
        )

    @property
    def in_keys(self) -> list:
        return [self.tensor_keys.response, self.tensor_keys.label, self.tensor_keys.kl_response]

    @property
    def out_keys(self) -> list:
        return ["loss_kto", "kl", "reward_chosen", "reward_rejected"]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """``loss_kto``, the reference point and the reward diagnostics of a batch."""
        policy, reference = self._sequence_log_probs(tensordict, "response")
        desirable = self._labels(tensordict, policy.total)
        with torch.no_grad():
            kl_policy, kl_reference = self._sequence_log_probs(tensordict, "kl_response")
        z0 = rlf.kto_reference_point(kl_policy.total, kl_reference.total)
        log_ratio = policy.total - reference.total.detach()
        names = ("beta", "desirable_weight", "undesirable_weight")
        beta, weight_desirable, weight_undesirable = self._coefficient_values(log_ratio, *names)
        loss = rlf.kto_loss(log_ratio, desirable, z0, beta, weight_desirable, weight_undesirable)
        reward = beta * log_ratio.detach()
        return self._output(
            {
                "loss_kto": rlf.reduce(loss, self.reduction),
                "kl": z0,
                "reward_chosen": masked_mean(reward, desirable),
                "reward_rejected": masked_mean(reward, ~desirable),
            }
        )

    def _labels(self, tensordict: TensorDictBase, like: torch.Tensor) -> torch.Tensor:
        """The desirability labels as ``[*B]`` booleans; a ``ValueError`` naming the entry
        and both shapes when they are not one per response."""
        label = self._get(tensordict, "label")
        if label.shape == (*like.shape, 1):
            label = label.squeeze(-1)
        if label.shape != like.shape:
            raise ValueError(
                f"{type(self).__name__}: the label entry {self.tensor_keys.label!r} has shape "
                f"{tuple(label.shape)}, the responses' batch {tuple(like.shape)}: give one "
                "boolean per response ([*B] or [*B, 1])."
            )
        return label.to(torch.bool)
