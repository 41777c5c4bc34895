"""rl8's piecewise schedules: :class:`PiecewiseSchedule`, ``"step"`` / ``"interp"`` schedules
over ``(step, value)`` breakpoints, applied to an optimizer's lr or to a loss coefficient buffer
in place.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import torch
from torch import nn

from rlloss._checks import Coefficient, check_choice, check_in_range
from rlloss.training.schedulers import set_group_lr

SCHEDULE_KINDS = ("step", "interp")


class PiecewiseSchedule:
    """A value that follows ``(step, value)`` breakpoints (rl8's ``"step"`` and ``"interp"``).

    - ``kind="step"``: the value of the last breakpoint reached (``step >= breakpoint step``);
      before the first breakpoint, the first value.
    - ``kind="interp"``: linear interpolation between neighbouring breakpoints, clamped to the
      first and last values outside them (``numpy.interp``).

    rl8 requires the first breakpoint at step 0; here any strictly increasing steps are accepted.
    The schedule is stateless: call it with the current step (environment steps, updates...).

    Args:
        breakpoints: ``[(step, value), ...]`` with strictly increasing steps.
        kind: ``"step"`` or ``"interp"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import ClipPPOLoss, PiecewiseSchedule
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> loss = ClipPPOLoss(actor, critic)
        >>> optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
        >>> lr = PiecewiseSchedule([(0, 3e-4), (1_000_000, 0.0)])
        >>> entropy = PiecewiseSchedule([(0, 0.01), (200_000, 0.001)], kind="step")
        >>> frames = 500_000
        >>> lr.apply(frames, optimizer)  # 1.5e-4
        >>> entropy.apply(frames, (loss, "entropy_coeff"))  # 0.001
        >>> print(optimizer.param_groups[0]["lr"], loss.entropy_coeff)
    """

    def __init__(self, breakpoints: Sequence[tuple[float, float]], kind: str = "interp") -> None:
        check_choice("kind", kind, SCHEDULE_KINDS)
        if not isinstance(breakpoints, Sequence) or isinstance(breakpoints, str):
            raise TypeError(
                "breakpoints must be a list of (step, value) pairs, got "
                f"{type(breakpoints).__name__}."
            )
        if len(breakpoints) == 0:
            raise ValueError("breakpoints must hold at least one (step, value) pair, got none.")
        for index, pair in enumerate(breakpoints):
            if not isinstance(pair, Sequence) or len(pair) != 2:
                raise ValueError(
                    f"breakpoints[{index}] must be a (step, value) pair, got {pair!r}."
                )
            for number in pair:
                check_in_range(f"breakpoints[{index}]", number)  # a number, not NaN
            if not all(math.isfinite(float(number)) for number in pair):
                raise ValueError(f"breakpoints[{index}] must hold finite numbers, got {pair!r}.")
        steps = [pair[0] for pair in breakpoints]
        for index in range(1, len(steps)):
            if steps[index] <= steps[index - 1]:
                raise ValueError(
                    "breakpoint steps must be strictly increasing, got breakpoints"
                    f"[{index}] at step {steps[index]} after step {steps[index - 1]}."
                )
        self.steps = tuple(steps)
        self.values = tuple(float(pair[1]) for pair in breakpoints)
        self.kind = kind

    def __call__(self, step: float) -> float:
        """The scheduled value at ``step`` (a finite number: a NaN would compare false with every
        breakpoint and silently give the last value)."""
        if not math.isfinite(step):
            raise ValueError(
                f"PiecewiseSchedule: step must be a finite number, got {step!r}; pass the current "
                "step count (environment steps or updates)."
            )
        last = bisect.bisect_right(self.steps, step) - 1  # last breakpoint reached, -1 if none
        if last < 0:
            return self.values[0]
        if self.kind == "step" or last == len(self.steps) - 1:
            return self.values[last]
        step0, step1 = self.steps[last], self.steps[last + 1]
        value0, value1 = self.values[last], self.values[last + 1]
        return value0 + (value1 - value0) * (step - step0) / (step1 - step0)

    def apply(
        self,
        step: float,
        target: torch.optim.Optimizer | torch.Tensor | tuple[nn.Module, str],
    ) -> float:
        """Write the value at ``step`` into ``target`` and return it.

        Args:
            step: the current step.
            target: an optimizer (every param group's lr is set; in place with ``fill_`` when the
                lr is a tensor), a tensor (filled in place), or a ``(module, "name")`` pair naming
                a tensor attribute such as a loss's ``entropy_coeff`` buffer (filled in place, so
                a compiled loss that reads it does not recompile; a value outside an rlloss
                coefficient's range raises ``ValueError`` and writes nothing).

        Returns:
            The value written.
        """
        value = self(step)
        if isinstance(target, torch.optim.Optimizer):
            for group in target.param_groups:
                set_group_lr(group, value)
            return value
        if isinstance(target, tuple):
            module, name = target
            coefficient = getattr(type(module), name, None)
            if isinstance(coefficient, Coefficient):  # an rlloss coefficient: its range checked
                coefficient.check(value)
            target = getattr(module, name)
            if not isinstance(target, torch.Tensor):
                raise TypeError(
                    f"PiecewiseSchedule.apply: {type(module).__name__}.{name} is a "
                    f"{type(target).__name__}, not a tensor; store it as a buffer "
                    f"(register_buffer({name!r}, torch.tensor(...))) so it can be updated in place."
                )
        if not isinstance(target, torch.Tensor):
            raise TypeError(
                "PiecewiseSchedule.apply: target must be an optimizer, a tensor or a "
                f"(module, attribute_name) pair, got {type(target).__name__}."
            )
        with torch.no_grad():
            target.fill_(value)
        return value

    def __repr__(self) -> str:
        pairs = list(zip(self.steps, self.values, strict=True))
        return f"{type(self).__name__}({pairs}, kind={self.kind!r})"
