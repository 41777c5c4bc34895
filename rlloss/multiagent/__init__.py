"""Multi-agent losses: ``QMixerLoss`` (QMIX / VDN value decomposition). TorchRL's multi-agent
networks (``MultiAgentMLP``, ``QMixer``, ``VDNMixer``) plug in as they do in TorchRL."""

from rlloss.multiagent.qmixer import QMixerLoss

__all__ = ["QMixerLoss"]
