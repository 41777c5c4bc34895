"""Replay-buffer components on the storage's device, without host synchronisation (both can be
recorded in a CUDA graph): :class:`PrioritizedSampler`, proportional prioritized replay, a
drop-in for ``torchrl.data.PrioritizedSampler``, and :class:`RandomSampler`, uniform replay, a
drop-in for ``torchrl.data.RandomSampler``."""

from rlloss.data.prioritized_sampler import PrioritizedSampler
from rlloss.data.random_sampler import RandomSampler

__all__ = ["PrioritizedSampler", "RandomSampler"]
