"""Replay-buffer components: :class:`PrioritizedSampler`, proportional prioritized replay in pure
torch on the storage's device, a drop-in for ``torchrl.data.PrioritizedSampler``."""

from rlloss.data.prioritized_sampler import PrioritizedSampler

__all__ = ["PrioritizedSampler"]
