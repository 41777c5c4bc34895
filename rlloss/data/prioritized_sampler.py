"""Proportional prioritized replay on the storage's device, without host synchronisation."""

from __future__ import annotations

import math
from typing import Any

import torch
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.utils import unravel_index

from rlloss._compat import assert_all
from rlloss.data.on_device import OnDeviceSampler, storage_device
from rlloss.data.segment_tree import (
    MAX,
    MIN,
    SUM,
    empty_trees,
    last_write_wins,
    leaves,
    prefix_search,
    rebuild,
    tree_capacity,
    write_leaves,
)

REDUCTIONS = ("max", "min", "median", "mean")
DTYPES = (torch.float32, torch.float64)


def _sampleable(mass: torch.Tensor) -> torch.Tensor:
    """The MIN row's entry for a leaf of ``mass``: the mass, or ``inf`` for a zero mass (an item
    that is never drawn must not set the smallest probability the importance weights divide by:
    with ``eps=0`` one zero priority would make every weight 0)."""
    return torch.where(mass > 0, mass, float("inf"))


def _check_exponent(name: str, value: float | torch.Tensor) -> float:
    """``value`` as a float: a number, or a one-element tensor (TorchRL's parameter schedulers
    may set one; read on the host, as TorchRL reads it), finite and >= 0."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ValueError(
            f"{name} must be a finite number, got {name}={value!r} "
            f"(typical values: alpha=0.6, beta=0.4 annealed to 1)."
        )
    if value < 0:  # TorchRL's words
        raise ValueError(f"{name} must be greater or equal than 0, got {name}={value}.")
    return float(value)


class PrioritizedSampler(OnDeviceSampler, TorchRLPrioritizedSampler):
    r"""Proportional prioritized experience replay, in pure torch on the storage's device.

    Item ``i`` is drawn with probability and importance weight

    .. math::

        P(i) = \frac{(p_i + \epsilon)^\alpha}{\sum_j (p_j + \epsilon)^\alpha}, \qquad
        w_i = \frac{(N P(i))^{-\beta}}{\max_j (N P(j))^{-\beta}}
            = \left(\frac{(p_i + \epsilon)^\alpha}{\min_j (p_j + \epsilon)^\alpha}\right)^{-\beta}

    (Schaul et al., "Prioritized Experience Replay", arXiv:1511.05952, Sec. 3.3 and 3.4), ``N``
    the number of stored items. New items get the largest priority seen so far
    (:attr:`default_priority`), so each is likely to be replayed soon after it is written.

    A drop-in for ``torchrl.data.PrioritizedSampler`` inside a ``(TensorDict)ReplayBuffer``: same
    constructor, same ``priority_weight`` and ``index`` in the sample, same
    ``update_priority`` / ``update_tensordict_priority`` / ``mark_update`` / ``state_dict``, and
    an instance of TorchRL's class, so the buffer treats it as prioritized. The sum, min and max
    trees are one float64 tensor on the storage's device (:mod:`rlloss.data.segment_tree`);
    ``sample`` and ``update_priority`` are O(log N) rounds of batched tensor operations that never
    read a value back to the host, and both compile with ``torch.compile(fullgraph=True)``
    (:meth:`sample_index_and_weight`, :meth:`set_priority`).

    Args:
        max_capacity: the capacity of the storage.
        alpha: how much prioritisation is used (0: uniform).
        beta: the importance-sampling exponent (0: no correction, 1: full correction).
        eps: added to every priority, so no item has probability 0.
        dtype: the dtype of the weights and of the stored masses ``(p + eps) ** alpha``
            (``torch.float32`` or ``torch.float64``); the tree sums are always float64.
        reduction: how ``TensorDictReplayBuffer`` reduces a multi-element priority
            (``"max"``, ``"min"``, ``"median"``, ``"mean"``).
        max_priority_within_buffer: the default priority of new items is the largest priority
            of the items stored now (``True``) or the largest ever given (``False``).
        device: where the trees live before the sampler first sees its storage; afterwards they
            follow the storage's device.
        compile: run :meth:`sample_index_and_weight` and :meth:`set_priority` under
            ``torch.compile(fullgraph=True)`` (not a TorchRL keyword). Inductor fuses the walk
            down the tree into one kernel and each level's update into one: on one CPU thread at
            N = 10^6, batch 256, a sample takes ~3x less time and a priority update ~1.3x less
            (``benchmarks/per_sampler.py --compiled``); on a GPU, far fewer launches. The
            compiled draws use inductor's generator: the same distribution, other numbers than
            eager for a given seed. The first call compiles (seconds).

    Differences from TorchRL:
        - Negative, NaN or infinite priorities and indices past ``max_capacity`` raise a
          ``RuntimeError`` (a check without host sync: immediately on CPU, as a device-side
          assert on a GPU) instead of corrupting the trees.
        - Sampling is restricted to items that have a priority, not clamped to ``len(storage)``
          (the two agree whenever the buffer's writer set the priorities, as it does).
        - With ``max_priority_within_buffer=True`` the default priority is the exact maximum of
          the stored priorities (a max tree); TorchRL forgets its maximum when the item holding
          it is overwritten and uses 1.0 until the next update.
        - ``dumps``/``loads`` write one ``torch.save`` file instead of memory-mapped trees.
        - A ``max_capacity`` smaller than the storage is refused at the first index past it
          (TorchRL's trees round the capacity up to a power of two and accept indices up to it).
        - Annealing ``alpha`` away from 0 re-weights every item exactly (the raw priorities are
          kept); TorchRL warns and keeps uniform masses until the next update.
        - TorchRL's private ``_sum_tree`` / ``_min_tree`` do not exist (one tensor, ``_trees``);
          ``_max_priority`` gives the index holding the largest priority now.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from rlloss.data import PrioritizedSampler
        >>> sampler = PrioritizedSampler(1000, alpha=0.6, beta=0.4)
        >>> buffer = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(1000),
        ...     sampler=sampler,
        ...     priority_key="td_error",
        ...     batch_size=64,
        ... )
        >>> buffer.extend(TensorDict(observation=torch.randn(256, 3), batch_size=[256]))
        >>> batch = buffer.sample()  # batch["priority_weight"]: the importance weights
        >>> batch["td_error"] = torch.rand(64)  # what a loss writes, e.g. DQNLoss's forward
        >>> buffer.update_tensordict_priority(batch)  # new priorities from batch["td_error"]
    """

    #: sampling and priority updates have no host synchronisation and fixed shapes: they can be
    #: recorded in a CUDA graph (``rlloss.compile_update(..., cuda_graph=True)`` does).
    capturable = True

    _state_file = "prioritized_sampler.pt"  # in a ``dumps`` folder

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: torch.device | str | None = None,
        compile: bool = False,
    ) -> None:
        if not (isinstance(max_capacity, int) and max_capacity > 0):
            raise ValueError(
                f"max_capacity must be a positive int (the storage's capacity), got "
                f"{max_capacity!r}."
            )
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}.")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
        if not (eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite number >= 0, got eps={eps!r}.")
        self._max_capacity = max_capacity
        self._index_error = (  # built here: a compiled set_priority formats no string
            f"PrioritizedSampler.update_priority: an index is >= max_capacity ({max_capacity}). "
            f"Build the sampler with the storage's capacity (a ReplayBuffer without a storage "
            f"gets ListStorage(max_size=1000)), and give indices into the storage (the "
            f"sample's 'index')."
        )
        self._alpha = _check_exponent("alpha", alpha)
        self._beta = _check_exponent("beta", beta)
        self._eps = float(eps)
        self.dtype = dtype
        self.reduction = reduction
        self._max_priority_within_buffer = max_priority_within_buffer
        self._init(torch.device("cpu") if device is None else torch.device(device))
        self._sample_op, self._set_op = self.sample_index_and_weight, self.set_priority
        if compile:  # fused kernels: one walk down the tree per sample instead of ~5 ops a level
            self._sample_op = torch.compile(self.sample_index_and_weight, fullgraph=True)
            self._set_op = torch.compile(self.set_priority, fullgraph=True)

    def _init(self, device: torch.device | None = None) -> None:
        """Empty trees; the exponents as 0-d tensors, so changing them recompiles nothing."""
        device = self.device if device is None else device
        self._trees = empty_trees(self._max_capacity, device)
        # the largest priority given since the last _empty (-inf: none yet)
        self._max_seen = torch.full((), float("-inf"), dtype=torch.float64, device=device)
        self._alpha_tensor = torch.tensor(self._alpha, dtype=torch.float64, device=device)
        self._beta_tensor = torch.tensor(self._beta, dtype=torch.float64, device=device)

    def _empty(self) -> None:
        self._init()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self._alpha}, "
            f"beta={self._beta}, eps={self._eps}, reduction={self.reduction!r})"
        )

    @property
    def device(self) -> torch.device:
        return self._trees.device

    @property
    def alpha(self) -> float:
        """The priority exponent; setting it re-weights every stored item from its raw priority
        (one O(N) pass)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = _check_exponent("alpha", value)
        self._alpha_tensor.fill_(self._alpha)
        rows = leaves(self._trees)
        stored = rows[MAX] > float("-inf")
        mass = self._mass(rows[MAX].clamp_min(0))
        rows[SUM] = torch.where(stored, mass, 0.0)
        rows[MIN] = torch.where(stored, _sampleable(mass), float("inf"))
        rebuild(self._trees)

    @property
    def _max_priority(self) -> tuple[float | None, int | None]:
        """TorchRL's ``(largest raw priority, its index)``: the one new items get (see
        :attr:`default_priority`), and where it is stored (``None`` when no item holds it any
        more); ``(None, None)`` before any priority. Reads the trees on the host."""
        if not bool(self._trees[MAX, 1] > float("-inf")):
            return (None, None)
        largest = float(self.default_priority)
        holders = (leaves(self._trees)[MAX] == largest).nonzero()
        return (largest, int(holders[0, 0]) if len(holders) else None)

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _check_exponent("beta", value)
        self._beta_tensor.fill_(self._beta)

    @property
    def default_priority(self) -> torch.Tensor:
        """The priority of new items (a 0-d float64 tensor on the trees' device): the largest
        priority given so far (or stored now, with ``max_priority_within_buffer``), 1.0 before
        any."""
        largest = self._trees[MAX, 1] if self._max_priority_within_buffer else self._max_seen
        return torch.where(largest > float("-inf"), largest, 1.0)

    def _follow_storage(self, storage: Storage | None) -> None:
        """Move the trees to the storage's device (once, when the storage first has one)."""
        device = storage_device(storage)
        if device is not None and device != self.device:
            for name in ("_trees", "_max_seen", "_alpha_tensor", "_beta_tensor"):
                setattr(self, name, getattr(self, name).to(device))

    def _mass(self, priority: torch.Tensor) -> torch.Tensor:
        """The sampling mass ``(p + eps) ** alpha``, rounded to ``dtype`` as the trees store it."""
        return (priority + self._eps).pow(self._alpha_tensor).to(self.dtype).double()

    # ---- sampling ----

    def sample_index_and_weight(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``batch_size`` flat indices with probability ``P(i)`` and their importance
        weights ``w_i`` (``dtype``), all on the trees' device; no host synchronisation."""
        sums = self._trees[SUM]
        mass = (
            torch.rand(batch_size, dtype=torch.float64, device=self.device, generator=self._rng)
            * sums[1]
        )
        index = prefix_search(sums, mass)
        leaf_mass = sums[index + sums.shape[-1] // 2]
        weight = (leaf_mass / self._trees[MIN, 1]).pow(-self._beta_tensor)
        return index, weight.to(self.dtype)

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict]:
        """``batch_size`` flat indices and ``{"priority_weight": w}`` (what :meth:`sample`
        returns for a one-dim storage), without reading the storage: a compiled update traces
        it (after :meth:`check_storage`)."""
        index, weight = self._sample_op(batch_size)
        return index, {"priority_weight": weight}

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        """Indices into ``storage`` and ``{"priority_weight": w}`` (see the class docstring)."""
        self.check_storage(storage)
        index, info = self.draw(batch_size)
        if storage.ndim > 1:
            index = unravel_index(index, storage.shape)
        return index, info

    # ---- priorities ----

    def set_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Set the raw priority of the flat indices ``index`` (``[B]``, int64; entries < 0 are
        skipped, as TorchRL's ``MaxValueWriter`` marks them) to ``priority`` (``[B]``).

        A repeated index takes its last priority. Negative, NaN or infinite priorities and
        indices past the capacity raise (without synchronising the host on a GPU: a device-side
        assert). Compiles with ``torch.compile(fullgraph=True)``."""
        priority = priority.to(device=self.device, dtype=torch.float64)
        assert_all(
            (torch.isfinite(priority) & (priority >= 0)).all(),
            "PrioritizedSampler.update_priority: every priority must be finite and >= 0 (a "
            "negative, NaN or infinite priority was given). Pass |td_error|, and check the loss "
            "for NaNs.",
        )
        assert_all((index < self._max_capacity).all(), self._index_error)
        keep = index >= 0
        leaf = index.clamp_min(0)
        winner = last_write_wins(leaf, keep)
        chosen = priority[winner.clamp_min(0)]
        mass = self._mass(chosen)
        values = torch.stack((mass, _sampleable(mass), chosen))
        current = self._trees[:, leaf + self._trees.shape[-1] // 2]
        write_leaves(self._trees, leaf, torch.where(winner >= 0, values, current))
        given = torch.where(keep, priority, float("-inf")).amax(0, keepdim=False)
        torch.maximum(self._max_seen, given, out=self._max_seen)

    def _flat_index(self, index: torch.Tensor, storage: Storage | None) -> torch.Tensor:
        """``index`` as flat int64 indices into the trees (multi-dimensional storages give one
        coordinate per dimension in the last dim; a row with a negative coordinate is -1)."""
        if index.ndim <= 1:
            return index.reshape(-1)
        if storage is None:
            raise RuntimeError(
                "update_priority got multi-dimensional indices: pass storage= (the buffer does) "
                "so they can be flattened."
            )
        shape = tuple(storage.shape)  # on the host: the strides are Python ints
        flat = sum(index[..., dim] * math.prod(shape[dim + 1 :]) for dim in range(len(shape)))
        return torch.where((index >= 0).all(-1), flat, -1)

    @torch.no_grad()
    def update_priority(
        self,
        index: int | torch.Tensor,
        priority: float | torch.Tensor,
        *,
        storage: Storage | None = None,
    ) -> None:
        """Set the priority of the items at ``index`` (int, ``[B]``, or ``[B, ndim]`` for an
        N-d storage) to ``priority`` (a number or ``B`` values, any shape with ``B`` elements).

        With ``storage`` (the buffer passes it), an index of an item the storage has not written
        yet raises (a device-side assert on a GPU): its priority would make ``sample`` draw an
        item the storage cannot return."""
        self._set_priorities(index, priority, storage, written_only=True)

    def _set_priorities(self, index, priority, storage: Storage | None, written_only: bool):
        self._follow_storage(storage)
        index = torch.as_tensor(index, dtype=torch.long, device=self.device)
        index = self._flat_index(index, storage)
        if index.numel() == 0:  # a shape, known on the host
            return
        if written_only and storage is not None and storage.ndim == 1:
            written = len(storage)  # on the host, as sample() reads it
            assert_all(
                (index < written).all(),
                f"PrioritizedSampler.update_priority: an index is >= {written}, the number of "
                f"items the storage holds (capacity {self._max_capacity}): that item has not "
                "been written yet, and sampling it would fail. Give indices of written items "
                "(the sample's 'index').",
            )
        priority = torch.as_tensor(priority, device=self.device).detach()
        if priority.numel() == 1:
            priority = priority.reshape(()).expand(index.shape)
        elif priority.numel() != index.numel():
            raise ValueError(
                f"update_priority got {index.numel()} indices but priority of shape "
                f"{tuple(priority.shape)}: give one priority per index, or a single number."
            )
        self._set_op(index, priority.reshape(index.shape))

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        """Give newly written items the default priority (the writer calls this)."""
        self._set_priorities(index, self.default_priority, storage, written_only=False)

    def add(self, index: int) -> None:
        """Nothing to do: the writer's :meth:`mark_update` already set the priority."""

    def extend(self, index: torch.Tensor) -> None:
        """Nothing to do: the writer's :meth:`mark_update` already set the priorities."""

    # ---- state ----

    def state_dict(self) -> dict[str, Any]:
        return {
            "_alpha": self._alpha,
            "_beta": self._beta,
            "_eps": self._eps,
            "_max_seen": self._max_seen.clone(),
            "_trees": self._trees.clone(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        trees = state_dict["_trees"]
        if trees.shape != self._trees.shape:
            raise ValueError(
                f"the state holds trees for {trees.shape[-1] // 2} leaves, this sampler has "
                f"{tree_capacity(self._max_capacity)} (max_capacity={self._max_capacity}): load "
                f"it into a sampler of the same max_capacity."
            )
        self._eps = state_dict["_eps"]
        self.beta = state_dict["_beta"]
        self._alpha = _check_exponent("alpha", state_dict["_alpha"])
        self._alpha_tensor.fill_(self._alpha)
        self._trees.copy_(trees)
        self._max_seen.copy_(state_dict["_max_seen"])
