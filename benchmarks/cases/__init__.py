"""Every benchmark case: one loss configuration, built at a batch size.

A case is a function ``build(batch_size, seed) -> CaseSetup`` (see
:class:`benchmarks.harness.CaseSetup`): it builds the template networks, the batch(es) and one
method factory per implementation (``plain``, ``rlloss``, ``torchrl``...). Each
family module holds its cases' builders beside the hand-written plain-torch baseline they time
against, and exports ``CASES`` (name -> builder) and ``BATCH_SIZES`` (its small, overhead-bound
and large, compute-bound batch sizes).

Adding a loss: write its builder and baseline in the module of its family (or a new module
listed in ``FAMILIES``) and add it to that module's ``CASES``.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.cases import (
    crossq,
    ddpg_td3,
    dqn,
    ensembles,
    imitation,
    llm,
    mpo,
    multiagent,
    offline,
    ppo,
    sac,
)
from benchmarks.harness import CaseSetup

# in the order the reports list them
FAMILIES = (ppo, dqn, ddpg_td3, sac, crossq, ensembles, offline, mpo, multiagent, imitation, llm)
CASES: dict[str, Callable[[int, int], CaseSetup]] = {
    name: build for family in FAMILIES for name, build in family.CASES.items()
}
# Each case's (small, large) default batch sizes: overhead-bound and compute-bound.
BATCH_SIZES: dict[str, tuple[int, int]] = {
    name: family.BATCH_SIZES for family in FAMILIES for name in family.CASES
}
# The hand-written comparison (methods ``hand`` / ``hand-min``): each case at its batch sizes.
HAND_WRITTEN: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "A2CLoss"), (64,)),
    "DQNLoss": (64, 256),
    **dict.fromkeys(
        (
            f"{name}-custom-critic"
            for name in ("DDPGLoss", "TD3Loss", "SACLoss", "REDQLoss", "TQCLoss")
        ),
        (256,),
    ),
}
HAND_WRITTEN_METHODS = ("rlloss", "rlloss-min", "hand", "hand-min")  # what it gates and times
