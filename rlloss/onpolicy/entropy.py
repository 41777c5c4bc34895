"""The on-policy entropy bonus: ``-entropy_coeff * H[pi(.|s)]`` reduced over the valid steps,
analytic where the distribution has a closed form, Monte-Carlo otherwise; for a composite
(multi-head) action, one entropy per head, weighted by TorchRL's per-head coefficient map.
"""

from __future__ import annotations

import torch
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


def entropy_loss(
    distribution: D.Distribution,
    coeff: torch.Tensor,
    coeff_map: dict | None,
    samples: int,
    reduction: str,
    mask: torch.Tensor | None,
    diagnostics: bool,
    shape: torch.Size | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-coeff * H`` reduced (``samples``: draws of the Monte-Carlo entropy), and the mean
    entropy (detached) with ``diagnostics``; a composite action's heads summed to ``shape``
    (PPO: the advantage's, TorchRL's ``adv_shape``) when given."""
    if isinstance(distribution, CompositeDistribution):
        return _composite_entropy_loss(
            distribution, coeff, coeff_map, samples, reduction, mask, diagnostics, shape
        )
    entropy = _distributions.entropy(distribution, samples)  # [*B]
    reduced = rlf.reduce(entropy, reduction, mask)
    if not diagnostics:
        return -(coeff * reduced), {}
    mean = reduced if reduction == "mean" else rlf.reduce(entropy, "mean", mask)
    return -(coeff * reduced), {"entropy": mean.detach()}


def _composite_entropy_loss(
    distribution, coeff, coeff_map, samples, reduction, mask, diagnostics, shape=None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The entropy loss of a multi-head action: ``-sum_h c_h H_h`` reduced, with ``c_h`` from
    the coefficient map (TorchRL's), or ``coeff`` for every head; the per-head entropies are
    reported as ``composite_entropy`` (with ``shape``: TorchRL's PPO layout, ``[*shape, 1]``)."""
    with set_composite_lp_aggregate(False):
        heads = composite_entropy(distribution, samples)
    per_advantage = shape is not None
    if per_advantage:
        heads = heads.clone(recurse=False)
        heads.batch_size = shape
    else:
        shape = distribution.batch_shape if heads.batch_size == () else heads.batch_size
    if coeff_map is None:
        weighted = coeff * sum_heads(heads, shape)
    else:
        weighted = sum(
            _head_coeff(coeff_map, key) * sum_heads(value, shape)
            for key, value in heads.items(True, True)
        )
    reduced = rlf.reduce(weighted, reduction, mask)
    if not diagnostics:
        return -reduced, {}
    entropy = rlf.reduce(sum_heads(heads, shape), "mean", mask)
    reported = heads.detach().unsqueeze(-1) if per_advantage else heads.detach()
    return -reduced, {"entropy": entropy.detach(), "composite_entropy": reported}


def _head_coeff(coeff_map: dict, head: NestedKey) -> float:
    head = _compat.unravel_key(head)
    if head not in coeff_map:
        raise KeyError(
            f"entropy_coeff has no coefficient for the head {head!r}; its keys are "
            f"{list(coeff_map)}."
        )
    return coeff_map[head]
