"""What both of rlloss's samplers share: the storage's device, the eager check before a draw that
a compiled update traces, and saving their state to a folder."""

from __future__ import annotations

from pathlib import Path

import torch
from torchrl.data.replay_buffers.storages import Storage


def storage_device(storage: Storage | None) -> torch.device | None:
    """The device of ``storage``'s tensors, ``None`` while it has none (not yet, or ``"auto"``)."""
    device = getattr(storage, "device", None)
    return None if device is None or device == "auto" else torch.device(device)


class OnDeviceSampler:
    """Mixin of :class:`~rlloss.data.PrioritizedSampler` and :class:`~rlloss.data.RandomSampler`:
    each defines ``_follow_storage`` (move its tensors to the storage's device), ``state_dict``,
    ``load_state_dict``, ``device`` and ``_state_file`` (the file name in a ``dumps`` folder)."""

    _state_file: str

    def check_storage(self, storage: Storage) -> None:
        """What ``sample`` does before drawing (eager: it reads the storage's length on the
        host): refuse an empty storage, and keep the sampler's tensors on the storage's device."""
        self._follow_storage(storage)
        if len(storage) == 0:
            raise RuntimeError("Cannot sample from an empty storage: extend the buffer first.")

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / self._state_file)

    def loads(self, path: str | Path) -> None:
        self.load_state_dict(torch.load(Path(path) / self._state_file, map_location=self.device))
