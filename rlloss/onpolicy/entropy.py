"""The on-policy entropy bonus ``-entropy_coeff * H[pi(.|s)]``
(:meth:`rlloss.onpolicy.OnPolicyLoss.loss_entropy`), and its pieces for a composite (multi-head)
action: TorchRL's per-head coefficient map, checked; one entropy per head; their weighted sum.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import CompositeDistribution, set_composite_lp_aggregate
from tensordict.utils import NestedKey
from torch import distributions as D
from torchrl.modules.distributions.utils import composite_entropy

from rlloss import _compat, _distributions
from rlloss import functional as rlf
from rlloss._checks import check_in_range
from rlloss._networks import sum_heads


def entropy_coefficients(entropy_coeff: float | dict) -> tuple[float, dict | None]:
    """The ``entropy_coeff`` buffer's value and the per-head map: a map (TorchRL's, for a
    composite action) is checked and returned with 0 for the buffer."""
    if not isinstance(entropy_coeff, dict):
        return entropy_coeff, None
    for head, coeff in entropy_coeff.items():
        check_in_range(f"entropy_coeff[{head!r}]", coeff, 0.0)
    return 0.0, {_compat.unravel_key(k): float(c) for k, c in entropy_coeff.items()}


def policy_entropy(distribution: D.Distribution, samples: int) -> torch.Tensor:
    """The policy's entropy ``[*B]``: analytic where the distribution has a closed form, else
    the Monte-Carlo estimate over ``samples`` draws; summed over the heads of a composite one."""
    if isinstance(distribution, CompositeDistribution):
        return sum_heads(*head_entropies(distribution, samples))
    return _distributions.entropy(distribution, samples)


def entropy_bonus(
    distribution: D.Distribution,
    mask: torch.Tensor | None,
    shape: torch.Size | None = None,
    *,
    coeff: torch.Tensor,
    coeff_map: dict | None,
    samples: int,
    reduction: str,
    diagnostics: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-coeff * H[pi(.|s)]`` reduced over the valid steps of ``mask`` (``[*B]``; ``None``:
    all) as ``reduction`` says, the entropy analytic where the distribution has a closed form,
    else ``samples`` draws; with ``diagnostics``, the mean entropy as ``entropy`` (detached). A
    composite distribution: :func:`composite_entropy_bonus` (``coeff_map``: TorchRL's per-head
    coefficients, ``shape``: the shape the heads are summed to)."""
    if isinstance(distribution, CompositeDistribution):
        return composite_entropy_bonus(
            distribution,
            mask,
            shape,
            coeff=coeff,
            coeff_map=coeff_map,
            samples=samples,
            reduction=reduction,
            diagnostics=diagnostics,
        )
    entropy = policy_entropy(distribution, samples)  # [*B]
    reduced = rlf.reduce(entropy, reduction, mask)
    if not diagnostics:
        return -(coeff * reduced), {}
    mean = reduced if reduction == "mean" else rlf.reduce(entropy, "mean", mask)
    return -(coeff * reduced), {"entropy": mean.detach()}


def composite_entropy_bonus(
    distribution: CompositeDistribution,
    mask: torch.Tensor | None,
    shape: torch.Size | None,
    *,
    coeff: torch.Tensor,
    coeff_map: dict | None,
    samples: int,
    reduction: str,
    diagnostics: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-sum_h c_h H_h`` reduced, ``c_h`` from TorchRL's per-head map or ``coeff``, and with
    ``diagnostics`` the entropies: their sum's mean, and per head as ``composite_entropy``
    (with ``shape``: TorchRL's PPO layout, ``[*shape, 1]``). Arguments as
    :func:`entropy_bonus`'s."""
    heads, summed_to = head_entropies(distribution, samples, shape)
    reduced = rlf.reduce(weighted_entropy(heads, summed_to, coeff, coeff_map), reduction, mask)
    if not diagnostics:
        return -reduced, {}
    entropy = rlf.reduce(sum_heads(heads, summed_to), "mean", mask)
    reported = heads.detach().unsqueeze(-1) if shape is not None else heads.detach()
    return -reduced, {"entropy": entropy.detach(), "composite_entropy": reported}


def head_entropies(
    distribution: CompositeDistribution, samples: int, shape: torch.Size | None = None
) -> tuple[TensorDictBase, torch.Size]:
    """The entropy of each head of a composite (multi-head) policy (``samples``: draws of the
    Monte-Carlo estimate where a head has no closed form), and the shape the heads are summed
    to: ``shape`` when given (PPO: the advantage's, TorchRL's ``adv_shape``, set as the heads'
    batch size), else the heads' batch shape (the distribution's when the heads have none)."""
    with set_composite_lp_aggregate(False):
        heads = composite_entropy(distribution, samples)
    if shape is None:
        return heads, distribution.batch_shape if heads.batch_size == () else heads.batch_size
    heads = heads.clone(recurse=False)
    heads.batch_size = shape
    return heads, shape


def weighted_entropy(
    heads: TensorDictBase, shape: torch.Size, coeff: torch.Tensor, coeff_map: dict | None
) -> torch.Tensor:
    """``sum_h c_h H_h`` over the heads of :func:`head_entropies`, ``[*shape]``: ``c_h`` from
    the per-head map (TorchRL's ``entropy_coeff`` dict), else ``coeff`` for every head."""
    if coeff_map is None:
        return coeff * sum_heads(heads, shape)
    return sum(
        _head_coeff(coeff_map, key) * sum_heads(value, shape)
        for key, value in heads.items(True, True)
    )


def _head_coeff(coeff_map: dict, head: NestedKey) -> float:
    head = _compat.unravel_key(head)
    if head not in coeff_map:
        raise KeyError(
            f"entropy_coeff has no coefficient for the head {head!r}; its keys are "
            f"{list(coeff_map)}."
        )
    return coeff_map[head]
