"""Uniform replay on the storage's device, without host synchronisation: capturable."""

from __future__ import annotations

import math
from typing import Any

import torch
from torchrl.data import RandomSampler as TorchRLRandomSampler
from torchrl.data import SamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.utils import unravel_index

from rlloss._compat import dispatch_without_replacement
from rlloss.data.on_device import OnDeviceSampler, storage_device

# Draws are taken modulo the number of stored items: with 2^62 possible draws the bias of the
# modulo is below count / 2^62 (< 1e-12 for a billion items).
DRAW_RANGE = 2**62


class RandomSampler(OnDeviceSampler, TorchRLRandomSampler):
    """Uniform sampling with replacement among the items written so far, on the storage's
    device, that a CUDA graph can record.

    TorchRL's ``RandomSampler`` draws ``torch.randint(0, len(storage), ...)``: the number of
    stored items is a Python int, so a CUDA graph that records the draw keeps the length it had
    when it was recorded, and never samples what is written after. This sampler keeps the
    number of items written as a tensor on the storage's device, raised by the buffer's writes
    (:meth:`add` / :meth:`extend`, eager, outside any graph) and read by the draw
    (:meth:`sample_index`), which has no host synchronisation and fixed shapes: an
    ``rlloss.compile_update(..., cuda_graph=True)`` update records sampling into its graph
    (``capturable``), and every replay draws among the items stored at that moment.

    A drop-in for ``torchrl.data.RandomSampler`` in a ``(TensorDict)ReplayBuffer``: same
    ``sample(storage, batch_size)`` (indices, ``{}``), ``state_dict``, ``dumps`` / ``loads``,
    and an instance of TorchRL's class. On a storage with several dims (``ndim > 1``) it draws,
    as TorchRL does, among every entry of the storage's shape (fixed by the capacity, so that
    draw is capturable too).

    Args:
        device: where the count lives before the sampler first sees its storage; afterwards it
            follows the storage's device.

    Differences from TorchRL:
        - The draws are other numbers than TorchRL's for a given seed (a draw in
          ``[0, 2^62)`` modulo the count, not ``torch.randint(0, len(storage))``): the same
          distribution.
        - ``state_dict`` holds the count (TorchRL's is empty).

    ``RandomSampler(replacement=False, **kwargs)`` builds TorchRL's
    ``SamplerWithoutReplacement(**kwargs)``, as TorchRL's ``RandomSampler`` does (that sampler
    reads its permutation on the host: a compiled update samples it eagerly, outside the graph).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from rlloss.data import RandomSampler
        >>> device = "cuda" if torch.cuda.is_available() else "cpu"
        >>> buffer = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(10_000, device=device),
        ...     sampler=RandomSampler(),
        ...     batch_size=256,
        ... )
        >>> buffer.extend(TensorDict(observation=torch.randn(1000, 3), batch_size=[1000]))
        >>> batch = buffer.sample()  # indices drawn on the storage's device, no host sync
        >>> # with rlloss.compile_update(loss, optimizer, replay_buffer=buffer, cuda_graph=True),
        >>> # the sampling replays inside the recorded graph
    """

    #: sampling has no host synchronisation and fixed shapes: a CUDA graph can record it.
    capturable = True

    _state_file = "random_sampler.pt"  # in a ``dumps`` folder

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._count = torch.zeros((), dtype=torch.long, device=device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self._count.device})"

    @property
    def device(self) -> torch.device:
        return self._count.device

    def _follow_storage(self, storage: Storage) -> None:
        """Move the count to the storage's device (once, when the storage first has one)."""
        device = storage_device(storage)
        if device is not None and device != self.device:
            self._count = self._count.to(device)

    # ---- writes (eager, called by the buffer) ----

    def add(self, index: int | torch.Tensor) -> None:
        """Count the item written at ``index``."""
        self.extend(torch.as_tensor(index).reshape(-1))

    def extend(self, index: torch.Tensor) -> None:
        """Count the items written at ``index`` (``[K]`` positions in a one-dim storage; a
        storage with several dims gives coordinates, not needed: its draws cover its shape)."""
        index = torch.as_tensor(index)
        if index.numel() == 0 or index.ndim > 1:
            return
        written = index.max().to(device=self.device, dtype=torch.long) + 1
        torch.maximum(self._count, written, out=self._count)

    # ---- sampling ----

    def sample_index(self, batch_size: int, size: int | None = None) -> torch.Tensor:
        """``batch_size`` indices drawn uniformly in ``[0, size)`` (default: the number of items
        written so far, a tensor), on the count's device; no host synchronisation."""
        size = self._count.clamp_min(1) if size is None else size
        draws = torch.randint(0, DRAW_RANGE, (batch_size,), device=self.device, generator=self._rng)
        return draws % size

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict]:
        """``batch_size`` flat indices among the items written, and ``{}`` (what :meth:`sample`
        returns for a one-dim storage), without reading the storage: a compiled update traces
        it (after :meth:`check_storage`)."""
        return self.sample_index(batch_size), {}

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        """Indices into ``storage`` (``[B]``, or one tensor per dim for ``ndim > 1``) and
        ``{}``."""
        self.check_storage(storage)
        if storage.ndim == 1:
            return self.draw(batch_size)
        shape = tuple(storage.shape)  # on the host: fixed by the capacity
        return unravel_index(self.sample_index(batch_size, math.prod(shape)), shape), {}

    # ---- state ----

    def _empty(self) -> None:
        self._count.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"_count": self._count.clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._count.copy_(state_dict["_count"])


dispatch_without_replacement(RandomSampler, SamplerWithoutReplacement)
