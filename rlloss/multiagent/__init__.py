"""Multi-agent losses: ``MAPPOLoss`` and ``IPPOLoss`` (multi-agent PPO, centralised and
independent critics), ``QMixerLoss`` (QMIX / VDN value decomposition). TorchRL's multi-agent
networks (``MultiAgentMLP``, ``QMixer``, ``VDNMixer``) plug in as they do in TorchRL."""

from rlloss.multiagent.mappo import IPPOLoss, MAPPOLoss
from rlloss.multiagent.qmixer import QMixerLoss

__all__ = ["IPPOLoss", "MAPPOLoss", "QMixerLoss"]
