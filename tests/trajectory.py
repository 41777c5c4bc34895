"""The trajectory check shared by ``tests/test_trajectories.py``: rlloss's and TorchRL's loss of
the same name, on copies of the same networks in float64, trained side by side for a few hundred
Adam steps on identical batches (each loss's target update after every step), end with the same
parameters.

A one-call parity test shows that the maths agree at one point; a trajectory shows they agree
along training, where a difference of maths compounds (a wrong discount, a missed target update,
a gradient through the wrong network) and a difference of rounding does not (float64: parameters
equal within 1e-8 after hundreds of steps). So a change that breaks a trajectory test changed
the maths; one that only moves float32 training runs (a tutorial's per-seed figures) changed the
rounding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.objectives import SoftUpdate

STEPS = 200
TOLERANCE = 1e-8


def float64(batch: TensorDictBase) -> TensorDictBase:
    """``batch`` with its floating-point entries in float64 (the others kept)."""
    return batch.apply(lambda x: x.double() if x.is_floating_point() else x)


def trained_parameters(
    loss: nn.Module,
    batches: Sequence[TensorDictBase],
    *,
    steps: int,
    lr: float,
    updater: Callable[[nn.Module], object] | None,
    seeded: bool,
    after_step: Callable[[nn.Module], None] | None = None,
) -> list[torch.Tensor]:
    """``loss``'s parameters (registration order) after ``steps`` Adam steps on the sum of its
    ``loss*`` outputs, cycling over ``batches`` (a fresh clone each step), the target update
    ``updater(loss)`` stepped after each optimiser step; ``seeded``: the global seed set to the
    step's index before each forward (the same draws in both libraries); ``after_step(loss)``
    after each step (e.g. a KL-adaptive coefficient's schedule)."""
    target_updater = updater(loss) if updater is not None else None
    parameters = list(loss.parameters())
    optimizer = torch.optim.Adam(parameters, lr=lr)
    for step, batch in zip(range(steps), itertools.cycle(batches), strict=False):
        if seeded:
            torch.manual_seed(step)
        out = loss(batch.clone())
        total = sum(value.sum() for key, value in out.items() if key.startswith("loss"))
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        if target_updater is not None:
            target_updater.step()
        if after_step is not None:
            after_step(loss)
    return [p.detach().clone() for p in parameters]


def soft_update(loss: nn.Module) -> SoftUpdate:
    """TorchRL's Polyak update of every target of ``loss`` (tau = 0.05)."""
    return SoftUpdate(loss, tau=0.05)


def assert_same_trajectory(
    ours: nn.Module,
    theirs: nn.Module,
    batches: Sequence[TensorDictBase],
    *,
    steps: int = STEPS,
    lr: float = 1e-3,
    updater: Callable[[nn.Module], object] | None = None,
    seeded: bool = False,
    after_step: Callable[[nn.Module], None] | None = None,
    tolerance: float = TOLERANCE,
    float32: bool = False,
) -> None:
    """Train ``ours`` and ``theirs`` (converted to float64 here, unless ``float32``: a loss
    that computes in float32 whatever its inputs) side by side on ``batches`` (converted too)
    and compare every parameter, paired in registration order, within ``tolerance``; also that
    training moved them (a trajectory that stays put compares nothing)."""
    if not float32:
        ours, theirs = ours.double(), theirs.double()
        batches = [float64(batch) for batch in batches]
    before = [p.detach().clone() for p in ours.parameters()]
    common = dict(steps=steps, lr=lr, updater=updater, seeded=seeded, after_step=after_step)
    mine = trained_parameters(ours, batches, **common)
    reference = trained_parameters(theirs, batches, **common)
    assert len(mine) == len(reference), (len(mine), len(reference))
    names = [name for name, _ in ours.named_parameters()]
    moved = 0.0
    for name, start, a, b in zip(names, before, mine, reference, strict=True):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        torch.testing.assert_close(
            a, b, rtol=0.0, atol=tolerance, msg=lambda message, name=name: f"{name}: {message}"
        )
        moved = max(moved, float((a - start).abs().max()))
    assert moved > 100 * tolerance, f"training moved no parameter by more than {moved:g}"
