"""Rewards and done / termination flags given per team or per agent, as one entry per agent.

A multi-agent batch holds per-agent values ``[*B, n_agents, 1]`` while the environment may give
the reward and the flags for the whole group (``[*B, 1]``, the team's) or per agent. One
function decides, for every loss and estimator that bootstraps per-agent values, which shapes
are broadcast and which are refused (issue 35; TorchRL users hit the silent broadcasts of
pytorch/rl #1599). It compares shapes only: no host-device sync, and under ``torch.compile`` it
runs once, at trace time.

This module imports nothing from rlloss (a leaf, as ``_checks``).
"""

from __future__ import annotations

import torch
from tensordict.utils import NestedKey


def broadcast_to_agents(
    tensor: torch.Tensor,
    values_shape: torch.Size,
    agent_dim: int = -2,
    *,
    name: str = "reward",
    key: NestedKey | None = None,
    owner: str = "MultiAgentGAE",
) -> torch.Tensor:
    """``tensor`` (a reward, done or terminated entry) as one entry per agent of values of shape
    ``values_shape``:

    - the values' shape, or that shape with singleton dims (``[*B, 1, 1]`` for one entry shared
      by the agents): expanded to the values' shape;
    - the values' shape without ``agent_dim`` (``[*B, 1]``, the team's): copied along it;
    - any other shape (``[*B, n_agents]`` without the trailing dim, another agent count, a time
      dim too many) raises a ``ValueError`` naming the entry, its shape, the two shapes it may
      have and the fix.
    """
    dim = agent_dim % len(values_shape)
    team_shape = values_shape[:dim] + values_shape[dim + 1 :]
    if tensor.shape == team_shape:
        return tensor.unsqueeze(dim).expand(values_shape)
    fits = all(t in (1, n) for t, n in zip(tensor.shape, values_shape, strict=False))
    if tensor.ndim == len(values_shape) and fits:
        return tensor.expand(values_shape)
    entry = name if key is None else f"{name} (entry {key!r})"
    raise ValueError(
        f"{owner} expected the reward/done/terminated tensor to have either the shape of the "
        f"value tensor, {tuple(values_shape)} (per agent), or that shape without the agent dim "
        f"{agent_dim}, {tuple(team_shape)} (team-shared, copied to every agent); got {entry} "
        f"of shape {tuple(tensor.shape)}. {_fix(tensor.shape, values_shape, team_shape, dim, name)}"
    )


def _fix(shape: torch.Size, values_shape: torch.Size, team_shape: torch.Size, dim: int, name):
    """What to change in an entry of ``shape`` refused by :func:`broadcast_to_agents`."""
    if shape in (values_shape[:-1], team_shape[:-1]):
        return f"Add the trailing singleton dim: {name}.unsqueeze(-1)."
    agents = values_shape[dim]
    if len(shape) == len(values_shape) and len(shape) > dim and shape[dim] not in (1, agents):
        return (
            f"It holds {shape[dim]} agents, the values {agents}: give this group's {name} (set "
            f"its key with loss.set_keys({name}=...)), or one {name} for the team."
        )
    return (
        f"Reshape it to {tuple(values_shape)} (one per agent) or {tuple(team_shape)} (one for "
        "the team)."
    )
