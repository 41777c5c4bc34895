"""Which ``group_size`` trajectories of an oversampled group :class:`~rlloss.llm.MCAdvantage`
keeps: :class:`MCAdvantageSelector`, a drop-in for ``torchrl.objectives.llm``'s.

DAPO's dynamic sampling (Yu et al., arXiv:2503.14476, sec. 3.2) drops a group whose
completions all succeed or all fail; oversampling a group and choosing a subset whose mean
return lies inside the accepted interval keeps some of those groups. The choice runs on the
host (a replay-buffer write, not a loss forward), so it reads the returns as Python floats.
"""

from __future__ import annotations

from itertools import combinations
from math import comb

from tensordict import NestedKey, TensorDictBase

STRATEGIES = ("first", "uniform", "balanced")
Bounds = tuple[float, float]


def mean_in_bounds(values: list[float], indices: list[int], bounds: Bounds | None) -> bool:
    """Whether the mean of ``values`` at ``indices`` lies strictly inside ``bounds`` (``True``
    without bounds)."""
    if bounds is None:
        return True
    mean = sum(values[i] for i in indices) / len(indices)
    return bounds[0] < mean < bounds[1]


def spread_indices(values: list[float], group_size: int) -> list[int]:
    """``group_size`` indices evenly spaced along the order of ``values`` (ascending, ties by
    position), the median for one."""
    order = sorted(range(len(values)), key=values.__getitem__)
    if group_size == 1:
        return [order[len(order) // 2]]
    last = len(order) - 1
    return [order[round(k * last / (group_size - 1))] for k in range(group_size)]


def best_subset(values: list[float], group_size: int, bounds: Bounds) -> list[int] | None:
    """Of every ``group_size``-subset (in lexicographic order) whose mean is inside
    ``bounds``, the one whose mean is nearest the interval's middle, the widest on a tie, the
    first on a further tie; ``None`` if none is inside."""
    middle = 0.5 * (bounds[0] + bounds[1])
    best, best_score = None, None
    for subset in combinations(range(len(values)), group_size):
        chosen = [values[i] for i in subset]
        mean = sum(chosen) / group_size
        if not bounds[0] < mean < bounds[1]:
            continue
        score = (abs(mean - middle), min(chosen) - max(chosen))
        if best_score is None or score < best_score:
            best, best_score = list(subset), score
    return best


def swap_toward_bounds(values: list[float], indices: list[int], bounds: Bounds) -> list[int] | None:
    """Greedy repair of ``indices`` for a pool too large to enumerate: while the mean is at or
    below the interval, replace the lowest chosen value by the highest unchosen one (above it,
    the highest by the lowest), one swap at a time, until the mean is inside; ``None`` when
    the swaps run out."""
    indices = list(indices)
    low_side = sum(values[i] for i in indices) / len(indices) <= bounds[0]
    order = sorted(range(len(values)), key=values.__getitem__)
    incoming = reversed(order) if low_side else iter(order)
    outgoing = sorted(indices, key=values.__getitem__, reverse=not low_side)
    for new in incoming:
        if new in indices:
            continue
        if not outgoing:
            break
        indices[indices.index(outgoing.pop(0))] = new
        if mean_in_bounds(values, indices, bounds):
            return indices
    return None


class MCAdvantageSelector:
    """Chooses ``group_size`` of a group's candidate trajectories (TorchRL's
    ``MCAdvantageSelector``: same strategies, keywords and choices).

    Args:
        strategy: ``"first"`` (the first ``group_size`` candidates), ``"uniform"`` (evenly
            spaced along the order of the returns), ``"balanced"`` (default: the subset whose
            mean return is inside ``keep_return_bounds`` and nearest their middle; the
            uniform choice without bounds).

    Keyword Args:
        max_combinations: the most subsets ``"balanced"`` enumerates; a larger pool starts
            from the uniform choice and swaps greedily toward the bounds.
        in_keys: the candidate entries :meth:`select` reads (default ``["return"]``, one
            scalar per candidate); :class:`~rlloss.llm.MCAdvantage` also passes the
            candidates' trajectories, stacked, under ``"trajectories"``, for a subclass that
            chooses by them.
    """

    def __init__(
        self,
        strategy: str = "balanced",
        *,
        max_combinations: int = 100_000,
        in_keys: list[NestedKey] | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of 'first', 'uniform' or 'balanced', got {strategy!r}."
            )
        if max_combinations < 1:
            raise ValueError(
                f"max_combinations must be strictly positive, got {max_combinations}: it "
                "bounds the subsets the 'balanced' strategy scores."
            )
        if in_keys is not None and not in_keys:
            raise ValueError("in_keys must contain at least one key (default: ['return']).")
        self.strategy = strategy
        self.max_combinations = int(max_combinations)
        self.in_keys = ["return"] if in_keys is None else list(in_keys)

    def values(self, candidates: TensorDictBase) -> list[float]:
        """The first ``in_keys`` entry, one float per candidate."""
        key = self.in_keys[0]
        values = candidates.select(key, strict=True).get(key)
        if values.numel() != candidates.numel():
            raise ValueError(
                f"MCAdvantageSelector's strategies read one scalar per candidate under {key!r}, "
                f"got shape {tuple(values.shape)} for {candidates.numel()} candidates: override "
                "select() to choose by a richer entry."
            )
        return [float(v) for v in values.detach().reshape(-1).cpu()]

    def select(
        self,
        candidates: TensorDictBase,
        *,
        group_size: int,
        keep_return_bounds: Bounds | None = None,
    ) -> list[int] | None:
        """The chosen candidates' indices, or ``None`` to drop the group (no choice has its
        mean return strictly inside ``keep_return_bounds``)."""
        values = self.values(candidates)
        if len(values) < group_size:
            raise ValueError(f"Need at least {group_size} candidates, got {len(values)}.")
        if len(values) == group_size or self.strategy == "first":
            indices = list(range(group_size))
        elif self.strategy == "uniform" or keep_return_bounds is None:
            indices = spread_indices(values, group_size)
        elif comb(len(values), group_size) <= self.max_combinations:
            return best_subset(values, group_size, keep_return_bounds)
        else:
            indices = spread_indices(values, group_size)
            if not mean_in_bounds(values, indices, keep_return_bounds):
                return swap_toward_bounds(values, indices, keep_return_bounds)
        return indices if mean_in_bounds(values, indices, keep_return_bounds) else None
