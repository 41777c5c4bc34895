"""GRPO's group-relative Monte-Carlo advantage as a replay-buffer transform:
:class:`MCAdvantage`, a drop-in for ``torchrl.objectives.llm.MCAdvantage``.

The trajectories a buffer receives are queued by group (the prompt, or a group id); when a
group is complete its advantage is written and the whole group goes to the storage (Shao et
al., "DeepSeekMath", arXiv:2402.03300, sec. 4.1.2). The maths is
:func:`rlloss.functional.group_relative_advantage`'s; the rest is bookkeeping on the host, at
write time, never in a loss's forward.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os

import torch
from tensordict import (
    NestedKey,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    lazy_stack,
)
from torchrl.envs import Transform

from rlloss import functional as rlf
from rlloss.llm.selection import MCAdvantageSelector, mean_in_bounds

TRAJECTORY_RETURNS = {"sum": torch.sum, "max": torch.amax, "mean": torch.mean}
STATS = (
    "completed_trajectories",
    "completed_decisions",
    "trajectory_return_sum",
    "trajectory_return_max",
    "successful_trajectories",
    "completed_groups",
    "written_groups",
    "dropped_groups",
    "rescued_groups",
    "selected_trajectories",
    "unselected_trajectories",
)
LOCAL_QUEUES_ENV = "TORCHRL_MC_ADVANTAGE_LOCAL_QUEUES"
EPS = 1e-6


class _Stat:
    """A counter kept in the transform's ``_stats`` mapping (a manager's dict once shared)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else obj._stats[self.name]

    def __set__(self, obj, value):
        obj._stats[self.name] = value


def check_group_sizes(grpo_size, trajectory_return, candidate_group_size, min_size, bounds):
    """MCAdvantage's keywords checked together: ``(candidate_group_size, min_size, bounds)``
    with their defaults filled in."""
    if isinstance(grpo_size, bool) or not isinstance(grpo_size, int) or grpo_size < 1:
        raise ValueError(f"grpo_size must be an integer >= 1, got {grpo_size!r}.")
    if trajectory_return not in (None, *TRAJECTORY_RETURNS):
        raise ValueError(
            "trajectory_return must be one of 'sum', 'max', 'mean' or None, "
            f"got {trajectory_return!r}."
        )
    if trajectory_return is not None and grpo_size < 2:
        raise ValueError(
            "trajectory_return requires grpo_size >= 2: the std of the group's returns is "
            f"undefined for one trajectory, got grpo_size={grpo_size}."
        )
    size = grpo_size if candidate_group_size is None else int(candidate_group_size)
    if size < grpo_size:
        raise ValueError(f"candidate_group_size must be >= grpo_size, got {size} and {grpo_size}.")
    if size > grpo_size and trajectory_return is None:
        raise ValueError(
            "candidate_group_size > grpo_size requires trajectory_return: the candidates are "
            "chosen by their returns."
        )
    min_size = grpo_size if min_size is None else int(min_size)
    if not grpo_size <= min_size <= size:
        raise ValueError(
            "candidate_selection_min_size must lie between grpo_size and candidate_group_size, "
            f"got {min_size} (grpo_size={grpo_size}, candidate_group_size={size})."
        )
    if bounds is not None:
        if trajectory_return is None:
            raise ValueError(
                "keep_return_bounds (dynamic sampling) filters on trajectory-level returns: "
                "set trajectory_return to 'sum', 'max' or 'mean'."
            )
        if len(bounds) != 2 or not bounds[0] < bounds[1]:
            raise ValueError(
                f"keep_return_bounds must be an increasing (low, high) pair, got {bounds}."
            )
        bounds = (float(bounds[0]), float(bounds[1]))
    return size, min_size, bounds


def group_id(value):
    """A hashable group identifier: a string as is, a tensor by value."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else tuple(value.reshape(-1).tolist())
    if isinstance(value, str):
        return value
    raise TypeError(
        f"MCAdvantage groups trajectories by a string or a tensor under prompt_key, got "
        f"{type(value).__name__}: point prompt_key at the prompt or at a group-id tensor."
    )


def _leaves(td: TensorDictBase) -> set:
    """Every leaf key, a non-tensor entry counted as a leaf."""

    def is_leaf(cls):
        return not issubclass(cls, TensorDictBase) or issubclass(
            cls, (NonTensorData, NonTensorStack)
        )

    return set(td.keys(True, True, is_leaf=is_leaf))


def materialise(td: TensorDictBase) -> TensorDictBase:
    """``td`` as one contiguous TensorDict, or unchanged where its leaves are ragged or the
    copy would lose a non-tensor entry."""
    try:
        out = td.contiguous()
    except RuntimeError:
        return td
    return td if _leaves(td) - _leaves(out) else out


def cat_trajectories(tds: list[TensorDictBase]) -> TensorDictBase:
    """The trajectories end to end, contiguous if their leaves allow, else stacked lazily."""
    try:
        return torch.cat([materialise(td) for td in tds], 0)
    except RuntimeError:
        return lazy_stack([step for td in tds for step in td.unbind(0)], 0)


def per_step_advantage(reward: torch.Tensor, scale: bool = True) -> torch.Tensor:
    """Every step's reward normalised over all the group's rewards (a ragged, nested reward
    over all its values), with the reward's structure; ``scale=False``: centred only."""
    if not reward.is_nested:
        flat = rlf.group_relative_advantage(reward.reshape(-1), scale=scale, eps=EPS, dim=0)
        return flat.reshape(reward.shape)
    pieces = reward.unbind()
    values = torch.cat([p.reshape(-1) for p in pieces])
    flat = rlf.group_relative_advantage(values, scale=scale, eps=EPS, dim=0)
    parts = flat.split([p.numel() for p in pieces])
    return torch.nested.as_nested_tensor(
        [a.reshape(p.shape) for a, p in zip(parts, pieces, strict=True)], layout=torch.jagged
    )


class MCAdvantage(Transform):
    """GRPO's group-relative advantage, written when a group of trajectories is complete
    (TorchRL's ``MCAdvantage``: same arguments, keys, counters and replay-buffer contract).

    Attached to a replay buffer (``rb.append_transform(MCAdvantage(grpo_size=G))``), each
    complete trajectory written (ending with a done step; several in one call are split on
    their done flags) joins the queue of its group, read at ``prompt_key`` (a string, or a
    tensor grouped by value). The write returns nothing until the group is complete; then
    the group, its advantage at ``advantage_key``, is what the buffer stores.

    - ``trajectory_return=None``: every step's reward normalised over all the steps of the
      group's ``G`` trajectories (dense per-step rewards).
    - ``"sum"`` / ``"max"`` / ``"mean"``: each trajectory's return, normalised over the group,
      ``(R_i - mean R) / std R``, broadcast to its steps (outcome rewards).

    ``scale=False`` (rlloss's keyword; TorchRL's class always scales): the advantage is only
    centred, ``R_i - mean R`` (``rlloss.functional.group_relative_advantage(..., scale=False)``,
    TRL's ``scale_rewards="none"``): Dr. GRPO's advantage (Liu et al., arXiv:2503.20783,
    sec. 3.2), for :class:`~rlloss.llm.DrGRPOLoss`.

    With a trajectory return, ``keep_return_bounds=(low, high)`` drops a group whose mean
    return is outside the open interval (DAPO's dynamic sampling), and
    ``candidate_group_size > grpo_size`` queues more candidates, choosing ``grpo_size`` of
    them (``candidate_selector``, default :class:`MCAdvantageSelector`) once
    ``candidate_selection_min_size`` have arrived, dropping the group when the last candidate
    leaves no acceptable choice.

    ``share_memory_()`` (called by ``ReplayBuffer.share``) moves the queues and counters to a
    multiprocessing manager so that several writer processes complete one group; the
    environment variable ``TORCHRL_MC_ADVANTAGE_LOCAL_QUEUES=1`` keeps them local.
    """

    requires_shared_write_state = True

    def __init__(
        self,
        grpo_size: int,
        prompt_key: NestedKey = "query",
        rewards_key: NestedKey = ("next", "reward"),
        advantage_key: NestedKey = "advantage",
        done_key: NestedKey = ("next", "done"),
        verbose: bool = False,
        *,
        trajectory_return: str | None = None,
        keep_return_bounds: tuple[float, float] | None = None,
        candidate_group_size: int | None = None,
        candidate_selection_min_size: int | None = None,
        candidate_selector: MCAdvantageSelector | None = None,
        scale: bool = True,
    ):
        sizes = check_group_sizes(
            grpo_size,
            trajectory_return,
            candidate_group_size,
            candidate_selection_min_size,
            keep_return_bounds,
        )
        super().__init__(in_keys=[prompt_key, rewards_key, done_key], out_keys=[advantage_key])
        self.prompt_key, self.rewards_key = prompt_key, rewards_key
        self.advantage_key, self.done_key = advantage_key, done_key
        self.grpo_size, self.verbose, self.trajectory_return = grpo_size, verbose, trajectory_return
        self.candidate_group_size, self.candidate_selection_min_size = sizes[:2]
        self.keep_return_bounds = sizes[2]
        self.candidate_selector = candidate_selector or MCAdvantageSelector()
        if not isinstance(scale, bool):
            raise TypeError(
                f"MCAdvantage: scale must be True (divide by the group's std, GRPO) or False "
                f"(centre only, Dr. GRPO), got {scale!r}."
            )
        self.scale = scale
        self.queues = {}
        self._stats = {}
        self._state_lock = contextlib.nullcontext()
        self._shared_manager = None
        self.reset_stats()

    # --- shared state -------------------------------------------------------------------

    @property
    def is_shared(self) -> bool:
        """Whether the queues and counters live in a multiprocessing manager."""
        return not isinstance(self.queues, dict)

    def share_memory_(self) -> MCAdvantage:
        """Move the queues and counters to a multiprocessing manager (a no-op when shared
        already, or with ``TORCHRL_MC_ADVANTAGE_LOCAL_QUEUES=1``)."""
        if self.is_shared or os.environ.get(LOCAL_QUEUES_ENV) == "1":
            return self
        manager = mp.Manager()
        self.queues = manager.dict(self.queues)
        self._stats = manager.dict(self._stats)
        self._state_lock = manager.RLock()
        self._shared_manager = manager
        return self

    def __getstate__(self):
        state = super().__getstate__()
        state["_shared_manager"] = None
        return state

    def reset_stats(self) -> None:
        """Zero the counters (the queues stay)."""
        with self._state_lock:
            for name in STATS:
                self._stats[name] = 0
            self._stats["trajectory_return_sum"] = 0.0
            self._stats["trajectory_return_max"] = float("-inf")

    def clear_queues(self) -> None:
        """Forget the incomplete groups (the counters stay)."""
        with self._state_lock:
            self.queues.clear()

    def get_stats(self) -> dict[str, float | int]:
        """The counters and the queue sizes, as plain numbers."""
        with self._state_lock:
            stats = {name: self._stats[name] for name in STATS}
            stats.update(
                queued_groups=self.queued_groups,
                queued_trajectories=self.queued_trajectories,
                max_queued_trajectories_per_group=self.max_queued_trajectories_per_group,
            )
        return stats

    @property
    def queued_groups(self) -> int:
        """Incomplete groups held in memory."""
        return len(self.queues)

    @property
    def queued_trajectories(self) -> int:
        """Trajectories of incomplete groups held in memory."""
        return sum(len(queue) for queue in self.queues.values())

    @property
    def max_queued_trajectories_per_group(self) -> int:
        """The longest queue."""
        return max((len(queue) for queue in self.queues.values()), default=0)

    def _queue_list(self, group) -> list[TensorDictBase]:
        return list(self.queues[group])

    def _enqueue(self, group, trajectory: TensorDictBase) -> int:
        queue = list(self.queues.get(group, ()))
        queue.append(trajectory)
        self.queues[group] = queue[-self.candidate_group_size :]
        return len(self.queues[group])

    # --- the write path -----------------------------------------------------------------

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        present = tensordict.keys(include_nested=True)  # no read (a ragged stack stays lazy)
        for name in ("prompt_key", "rewards_key", "done_key"):
            key = getattr(self, name)
            if key not in present:
                raise KeyError(
                    f"MCAdvantage: the trajectory written has no entry {key!r} ({name}). "
                    f"Entries present: {sorted(map(str, tensordict.keys(True, True)))}. Store "
                    f"it, or build MCAdvantage({name}=<the entry holding it>)."
                )
        if tensordict.ndim == 1 and int(tensordict[self.done_key].sum()) <= 1:
            with self._state_lock:
                return self._add_trajectory(tensordict)
        if tensordict.ndim == 1:
            done = tensordict[self.done_key].reshape(tensordict.shape[0], -1).any(-1)
            ends = (done.nonzero().squeeze(-1) + 1).tolist()
            pieces = tensordict.split([b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)])
        else:
            pieces = (
                tensordict.flatten(0, -2).unbind(0) if tensordict.ndim > 2 else tensordict.unbind(0)
            )
        written = [out for out in map(self._inv_call, pieces) if out is not None]
        return cat_trajectories(written) if written else None

    def _count(self, trajectory: TensorDictBase) -> None:
        self.completed_trajectories += 1
        self.completed_decisions += trajectory.numel()
        reward = trajectory.get(self.rewards_key, None) if self.trajectory_return else None
        if reward is not None:
            total = float(reward.sum())
            self.trajectory_return_sum += total
            self.trajectory_return_max = max(self.trajectory_return_max, total)
            self.successful_trajectories += int(total > 0.0)

    def _add_trajectory(self, trajectory: TensorDictBase) -> TensorDictBase | None:
        if not trajectory[-1][self.done_key].all():
            raise RuntimeError(
                "MCAdvantage expects complete trajectories: the last step written has no done "
                f"flag at {self.done_key!r}. Write a trajectory once it has ended."
            )
        trajectory = materialise(trajectory)
        group = group_id(trajectory[0][self.prompt_key])
        self._count(trajectory)
        size = self._enqueue(group, trajectory)
        if self.trajectory_return is None:
            return self._write_per_step(group) if size == self.candidate_group_size else None
        if size < self.candidate_selection_min_size:
            return None
        out = self._write_selected(self._queue_list(group))
        if out is not None or size == self.candidate_group_size:
            del self.queues[group]
            self.completed_groups += 1
            self.written_groups += out is not None
            self.dropped_groups += out is None
        return out

    def _write_per_step(self, group) -> TensorDictBase:
        group_td = cat_trajectories(self._queue_list(group))
        del self.queues[group]
        self.completed_groups += 1
        self.written_groups += 1
        reward = group_td.get(self.rewards_key, as_nested_tensor=True)
        group_td.set(self.advantage_key, per_step_advantage(reward, self.scale))
        return group_td

    def _write_selected(self, trajs: list[TensorDictBase]) -> TensorDictBase | None:
        rewards = [traj.get(self.rewards_key) for traj in trajs]
        returns = torch.stack([TRAJECTORY_RETURNS[self.trajectory_return](r) for r in rewards])
        candidates = TensorDict(
            {"return": returns, "trajectories": lazy_stack(trajs, 0)}, [len(trajs)]
        )
        chosen = self.candidate_selector.select(
            candidates.select(*self.candidate_selector.in_keys, strict=True),
            group_size=self.grpo_size,
            keep_return_bounds=self.keep_return_bounds,
        )
        if chosen is None:
            return None
        if len(trajs) > self.grpo_size:
            first = [float(r) for r in returns[: self.grpo_size]]
            self.rescued_groups += not mean_in_bounds(
                first, list(range(self.grpo_size)), self.keep_return_bounds
            )
            self.unselected_trajectories += len(trajs) - self.grpo_size
        self.selected_trajectories += len(chosen)
        returns = returns[chosen]
        if not mean_in_bounds(
            [float(r) for r in returns], list(range(len(chosen))), self.keep_return_bounds
        ):
            return None
        advantage = rlf.group_relative_advantage(returns, scale=self.scale, eps=EPS, dim=0)
        for index, adv in zip(chosen, advantage.unbind(0), strict=True):
            trajs[index].set(self.advantage_key, adv.expand(rewards[index].shape).clone())
        return cat_trajectories([trajs[index] for index in chosen])


for _name in STATS:
    setattr(MCAdvantage, _name, _Stat(_name))
del _name
