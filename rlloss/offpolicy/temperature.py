"""The entropy temperature of the soft actor-critic losses, shared by
:class:`~rlloss.offpolicy.soft_actor_critic.ContinuousSoftActorCritic` (``SACLoss``,
``REDQLoss``, ``TQCLoss``, ``CQLLoss``, ``CrossQLoss``) and ``DiscreteSACLoss``: the checks of
``alpha_init`` / ``min_alpha`` / ``max_alpha``, the projection of ``log_alpha`` onto its bounds
before each use, ``done`` transitions zeroed with ``skip_done_states``, and the outputs with
``alpha`` and ``entropy``. Plain functions: the losses keep ``log_alpha`` and its bounds in their
own parameters / buffers (TorchRL's ``state_dict`` names) and pass them in.

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905."""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

from rlloss._checks import check_in_range

OUT_KEYS = ["loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"]
SCALAR_OUTPUT_MODES = ("exclude", "non_tensor")


def log_temperatures(
    alpha_init: float, min_alpha: float | None, max_alpha: float | None
) -> tuple[float, float | None, float | None]:
    """``log alpha_init`` and the log-bounds (``None``: unbounded), after checking the three
    (positive, ``min_alpha <= max_alpha``)."""
    check_in_range("alpha_init", alpha_init, 0.0, low_open=True)
    for name, bound in (("min_alpha", min_alpha), ("max_alpha", max_alpha)):
        if bound is not None:
            check_in_range(name, bound, 0.0, low_open=True)
    if min_alpha is not None and max_alpha is not None:
        check_in_range("max_alpha", max_alpha, min_alpha)
    return (
        math.log(alpha_init),
        None if min_alpha is None else math.log(min_alpha),
        None if max_alpha is None else math.log(max_alpha),
    )


def projected_alpha(
    log_alpha: torch.Tensor,
    min_log_alpha: torch.Tensor | None,
    max_log_alpha: torch.Tensor | None,
) -> torch.Tensor:
    """``exp(log_alpha)`` (no gradient), after projecting ``log_alpha`` in place onto
    ``[min_log_alpha, max_log_alpha]`` (TorchRL's behaviour; no host sync)."""
    if min_log_alpha is not None or max_log_alpha is not None:
        with torch.no_grad():
            log_alpha.clamp_(min_log_alpha, max_log_alpha)
    return log_alpha.detach().exp()


def zero_where_done(value: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """``value`` (``[*B, ...]``) with 0 where ``done`` (``[*B]``) holds: ``skip_done_states``'
    next-state terms, as TorchRL's (which does not run the actor there)."""
    done = done.reshape(*done.shape, *(1,) * (value.ndim - done.ndim))
    return torch.where(done, torch.zeros((), dtype=value.dtype, device=value.device), value)


def soft_outputs(
    losses: dict,
    log_alpha: torch.Tensor,
    log_prob: torch.Tensor,
    reduction: str,
    scalar_output_mode: str,
    batch_size: torch.Size,
):
    """The losses with ``alpha`` and ``entropy`` (``-mean(log pi)``): one TensorDict of scalars,
    or with ``reduction="none"`` of per-sample losses (the two scalars as non-tensor entries with
    ``scalar_output_mode="non_tensor"``, else left out, as TorchRL)."""
    scalars = {"alpha": log_alpha.detach().exp(), "entropy": -log_prob.mean()}
    if reduction != "none":
        return TensorDict({**losses, **scalars}, batch_size=[])
    out = TensorDict(losses, batch_size=batch_size)  # per-sample losses
    if scalar_output_mode == "non_tensor":
        for name, value in scalars.items():
            out.set_non_tensor(name, value)
    return out
