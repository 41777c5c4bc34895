"""Reductions over the ranks of a ``torch.distributed`` process group, for the adaptive state that
data-parallel training must share: the KL that drives KLPEN's beta, :class:`KLAdaptiveLR` and
:class:`KLEarlyStopping`, the moments of the reward and value normalisers, and the global
advantage normalisation.

Which group: the ``process_group`` an rlloss object was given, else the default group when
``torch.distributed`` is initialised, else none. With no group (or a group of one rank) every
function here returns its input unchanged and issues no collective: single-process training is
untouched, and ``torch.compile(fullgraph=True)`` traces the no-group branch away. With a group,
the reductions are ``all_reduce`` calls on tensors (no ``.item()``, no host sync on GPU); every
rank gets the same result, so ranks cannot disagree on a decision taken from it.

``all_reduce`` is not autograd-aware: the reduced quantities here are statistics that carry no
gradient (a KL for a control rule, moments of returns, the mean and std of detached advantages);
gradients of the losses are averaged by ``DistributedDataParallel``.

To keep an object rank-local while a default group is initialised (e.g. a group that also holds
collector processes), pass ``process_group=dist.new_group([rank])``: a group of one rank is a
no-op.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlloss import functional as rlf


def check_process_group(owner: str, process_group) -> None:
    """``process_group`` is ``None`` or a ``torch.distributed`` group (a ``TypeError`` naming
    what was given otherwise, e.g. a backend name)."""
    if process_group is None:
        return
    group_type = getattr(dist, "ProcessGroup", None)
    if group_type is None or not isinstance(process_group, group_type):
        raise TypeError(
            f"{owner}: process_group must be a torch.distributed process group (e.g. "
            "torch.distributed.new_group(ranks) or torch.distributed.group.WORLD) or None for "
            f"the default group when one is initialised; got {process_group!r}. A backend name "
            "such as 'gloo' goes to torch.distributed.init_process_group(backend=...)."
        )


def resolve_group(process_group=None):
    """The group to reduce over: ``process_group`` when given, else the default group when
    ``torch.distributed`` is initialised, else ``None`` (and ``None`` for a group of one rank)."""
    if process_group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        process_group = dist.group.WORLD
    return process_group if dist.get_world_size(process_group) > 1 else None


def _reduction_device(group, device: torch.device) -> torch.device:
    """Where ``group``'s backend reduces: the current CUDA device for NCCL, else ``device``."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def all_sum(tensor: torch.Tensor, process_group=None) -> torch.Tensor:
    """The elementwise sum of ``tensor`` over the ranks (a new tensor, detached, on ``tensor``'s
    device); ``tensor`` itself without a group."""
    group = resolve_group(process_group)
    if group is None:
        return tensor
    total = tensor.detach().to(_reduction_device(group, tensor.device), copy=True)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total.to(tensor.device)


def all_mean(tensor: torch.Tensor, process_group=None) -> torch.Tensor:
    """The elementwise mean of ``tensor`` over the ranks (detached); ``tensor`` itself without a
    group. For a mean over samples this equals the global mean when every rank holds as many."""
    group = resolve_group(process_group)
    if group is None:
        return tensor
    return all_sum(tensor, group) / dist.get_world_size(group)


def all_moments(
    count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, process_group=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each rank's ``(count, mean, M2)`` merged into those of the union of the ranks' samples
    (Chan, Golub & LeVeque's pairwise formula over all ranks at once)::

        n = sum_r n_r,  mean = sum_r n_r mean_r / n,  M2 = sum_r (M2_r + n_r (mean_r - mean)^2)

    Two all-reduces; the inputs themselves without a group. A rank without samples (count 0)
    contributes nothing.
    """
    group = resolve_group(process_group)
    if group is None:
        return count, mean, m2
    count = torch.as_tensor(count, dtype=mean.dtype, device=mean.device)
    sums = all_sum(torch.stack([count, count * mean]), group)
    total = sums[0]
    merged_mean = sums[1] / total.clamp_min(1)
    merged_m2 = all_sum(m2 + count * (mean - merged_mean).square(), group)
    return total, merged_mean, merged_m2


def global_standardize(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    process_group=None,
    exclude_dims: tuple[int, ...] = (),
) -> torch.Tensor:
    """``(x - mean) / max(std, eps)`` with the mean and (Bessel-corrected) std of the valid
    elements of every rank's ``x``; ``mask`` (``[*B]`` or ``[*B, 1]``) marks the valid ones and
    padding enters no arithmetic. The statistics are computed on ``x.detach()``: they carry no
    gradient (advantages never do). ``exclude_dims``: dims with their own statistics, as
    :func:`rlloss.functional.standardize`'s. On one rank the value equals
    :func:`rlloss.functional.standardize`'s.
    """
    dims = rlf.reduced_dims(x.shape, exclude_dims)
    if dims == ():
        return x
    count, mean, m2 = rlf.masked_moments(x.detach(), mask, dims)
    total, mean, m2 = all_moments(count.to(mean.dtype), mean, m2, process_group)
    return rlf.standardized_with(x, total, mean, m2, mask=mask, eps=eps)
