"""rlloss.training.schedulers and rlloss.training.piecewise: KLAdaptiveLR, PiecewiseSchedule and
KL early stopping against naive rules."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rlloss.training.piecewise import PiecewiseSchedule
from rlloss.training.schedulers import (
    KLAdaptiveLR,
    KLEarlyStopping,
    kl_adaptive_lr,
    kl_exceeds,
)

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


@contextlib.contextmanager
def counting_host_reads(monkeypatch, forbid: bool = False):
    """Count (or forbid) the tensor methods that read a value on the host."""
    calls: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _name=name, _original=original, **kwargs):
            if forbid:
                raise AssertionError(f"host read: Tensor.{_name}")
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    try:
        yield calls
    finally:
        monkeypatch.undo()


# --------------------------------------------------------------------------- KLAdaptiveLR


def skrl_rule(lr, kl, kl_threshold=0.008, min_lr=1e-6, max_lr=1e-2, kl_factor=2.0, lr_factor=1.5):
    """skrl's rule written out with Python floats."""
    if kl > kl_factor * kl_threshold:
        return max(lr / lr_factor, min_lr)
    if kl < kl_threshold / kl_factor:
        return min(lr * lr_factor, max_lr)
    return lr


def make_optimizer(*lrs, tensor: bool = False) -> torch.optim.Optimizer:
    groups = [
        {"params": [nn.Parameter(torch.zeros(2))], "lr": torch.tensor(lr) if tensor else lr}
        for lr in lrs
    ]
    return torch.optim.Adam(groups)


# kl values around the band [0.004, 0.016] of the defaults; the band edges leave the lr unchanged.
KLS = [0.0, 0.001, 0.0039999, 0.004, 0.008, 0.016, 0.0160001, 0.05]


@pytest.mark.parametrize("kl", KLS)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_kl_adaptive_lr_matches_skrl_rule(kl, as_tensor):
    optimizer = make_optimizer(1e-3, 5e-4)
    scheduler = KLAdaptiveLR(optimizer)
    scheduler.step(torch.tensor(kl, dtype=torch.float64) if as_tensor else kl)
    expected = [skrl_rule(1e-3, kl), skrl_rule(5e-4, kl)]
    assert [group["lr"] for group in optimizer.param_groups] == expected
    assert scheduler.get_last_lr() == expected


def test_kl_adaptive_lr_boundaries_are_strict():
    optimizer = make_optimizer(1e-3)
    scheduler = KLAdaptiveLR(optimizer, kl_threshold=0.01, kl_factor=2.0, lr_factor=2.0)
    for kl in (0.02, 0.005):  # exactly kl_factor * threshold and threshold / kl_factor
        scheduler.step(kl)
        assert optimizer.param_groups[0]["lr"] == 1e-3
    scheduler.step(0.02 + 1e-9)
    assert optimizer.param_groups[0]["lr"] == 5e-4
    scheduler.step(0.005 - 1e-9)
    assert optimizer.param_groups[0]["lr"] == 1e-3


def test_kl_adaptive_lr_clamps_at_min_and_max():
    optimizer = make_optimizer(1e-3)
    scheduler = KLAdaptiveLR(optimizer, min_lr=1e-4, max_lr=2e-3)
    for _ in range(10):
        scheduler.step(1.0)
    assert optimizer.param_groups[0]["lr"] == 1e-4
    for _ in range(10):
        scheduler.step(0.0)
    assert optimizer.param_groups[0]["lr"] == 2e-3


def test_kl_adaptive_lr_none_changes_nothing():
    optimizer = make_optimizer(1e-3)
    scheduler = KLAdaptiveLR(optimizer)
    epoch = scheduler.last_epoch
    scheduler.step()
    scheduler.step(None)
    assert optimizer.param_groups[0]["lr"] == 1e-3
    assert scheduler.get_last_lr() == [1e-3]
    assert scheduler.last_epoch == epoch + 2


def test_kl_adaptive_lr_rejects_multi_element_kl():
    scheduler = KLAdaptiveLR(make_optimizer(1e-3))
    with pytest.raises(ValueError, match=r"one-element tensor.*kl\.mean\(\)"):
        scheduler.step(torch.full((4,), 0.01))
    scheduler.step(torch.tensor([0.1]))  # one element, any shape
    assert scheduler.get_last_lr() == [1e-3 / 1.5]


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kl_threshold": 0.0}, "kl_threshold"),
        ({"kl_threshold": -0.01}, "kl_threshold"),
        ({"min_lr": -1e-6}, "min_lr"),
        ({"min_lr": 1e-3, "max_lr": 1e-4}, "max_lr"),
        ({"kl_factor": 1.0}, "kl_factor"),
        ({"lr_factor": 0.5}, "lr_factor"),
    ],
)
def test_kl_adaptive_lr_validates_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be in"):
        KLAdaptiveLR(make_optimizer(1e-3), **kwargs)


def test_kl_adaptive_lr_tensor_lr_is_updated_in_place_and_matches_float_lr():
    kls = [torch.tensor(kl) for kl in (0.05, 0.016, 0.001, 0.0, 0.01, 0.004, 1.0)]  # float32
    float_optimizer = make_optimizer(1e-3, 2e-3)
    tensor_optimizer = make_optimizer(1e-3, 2e-3, tensor=True)
    lr_tensors = [group["lr"] for group in tensor_optimizer.param_groups]
    float_scheduler = KLAdaptiveLR(float_optimizer, max_lr=4e-3)
    tensor_scheduler = KLAdaptiveLR(tensor_optimizer, max_lr=4e-3)
    for kl in kls:
        float_scheduler.step(kl)
        tensor_scheduler.step(kl)
        for group, lr_tensor, float_group in zip(
            tensor_optimizer.param_groups, lr_tensors, float_optimizer.param_groups, strict=True
        ):
            assert group["lr"] is lr_tensor
            torch.testing.assert_close(lr_tensor.item(), float_group["lr"], rtol=1e-6, atol=0)
        last = tensor_scheduler.get_last_lr()
        assert all(lr is not tensor for lr, tensor in zip(last, lr_tensors, strict=True))


def test_kl_adaptive_lr_tensor_path_reads_nothing_on_the_host(monkeypatch):
    optimizer = make_optimizer(1e-3, tensor=True)
    scheduler = KLAdaptiveLR(optimizer)
    with counting_host_reads(monkeypatch, forbid=True):
        scheduler.step(torch.tensor(0.5))
        scheduler.step(torch.tensor([0.0]))
    assert optimizer.param_groups[0]["lr"].item() == pytest.approx(1e-3)


def test_kl_adaptive_lr_float_path_reads_kl_once(monkeypatch):
    scheduler = KLAdaptiveLR(make_optimizer(1e-3))
    with counting_host_reads(monkeypatch) as calls:
        scheduler.step(torch.tensor(0.5))
    assert calls.count("cpu") == 1


def test_kl_adaptive_lr_drives_an_adam_step():
    parameter = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([parameter], lr=torch.tensor(1e-2))
    scheduler = KLAdaptiveLR(optimizer, max_lr=1.0)
    parameter.grad = torch.ones(3)
    optimizer.step()
    scheduler.step(torch.tensor(0.0))  # lr 1e-2 -> 1.5e-2
    before = parameter.detach().clone()
    optimizer.step()
    # Adam's second step with a constant gradient moves each weight by exactly lr.
    torch.testing.assert_close(before - parameter.detach(), torch.full((3,), 1.5e-2))


@pytest.mark.parametrize("tensor", [False, True])
def test_kl_adaptive_lr_state_dict_round_trip(tensor):
    optimizer = make_optimizer(1e-3, 3e-3, tensor=tensor)
    scheduler = KLAdaptiveLR(
        optimizer, kl_threshold=0.02, min_lr=1e-5, max_lr=5e-3, kl_factor=3.0, lr_factor=2.0
    )
    for kl in (0.1, 0.1, 0.0):
        scheduler.step(torch.tensor(kl))
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)
    buffer.seek(0)

    restored_optimizer = make_optimizer(0.5, 0.5, tensor=tensor)
    restored = KLAdaptiveLR(restored_optimizer)
    restored.load_state_dict(torch.load(buffer, weights_only=False))
    for name in ("kl_threshold", "min_lr", "max_lr", "kl_factor", "lr_factor", "last_epoch"):
        assert getattr(restored, name) == getattr(scheduler, name)
    assert [float(lr) for lr in restored.get_last_lr()] == [
        float(lr) for lr in scheduler.get_last_lr()
    ]
    for kl in (0.5, 0.0, 0.0):
        scheduler.step(kl)
        restored.step(kl)
        assert [float(group["lr"]) for group in restored_optimizer.param_groups] == [
            float(group["lr"]) for group in optimizer.param_groups
        ]


def test_kl_adaptive_lr_function_on_tensors():
    lr = torch.full((5,), 1e-3, dtype=torch.float64)
    kl = torch.tensor([0.0, 0.004, 0.01, 0.016, 1.0], dtype=torch.float64)
    out = kl_adaptive_lr(lr, kl, 0.008, 1e-6, 1e-2, 2.0, 1.5)
    expected = [skrl_rule(1e-3, value) for value in kl.tolist()]
    assert out.tolist() == expected


# --------------------------------------------------------------------------- PiecewiseSchedule


def naive_step_schedule(breakpoints, step):
    value = breakpoints[0][1]
    for at, v in breakpoints:
        if step >= at:
            value = v
    return value


BREAKPOINTS = [(0, 1.0), (100, 0.5), (200, 0.25), (300, 0.0)]
STEPS = [-10, 0, 1, 50, 99, 100, 150, 200, 299, 300, 301, 10_000]


@pytest.mark.parametrize("step", STEPS)
def test_piecewise_step(step):
    schedule = PiecewiseSchedule(BREAKPOINTS, kind="step")
    assert schedule(step) == naive_step_schedule(BREAKPOINTS, step)


@pytest.mark.parametrize("step", STEPS)
def test_piecewise_interp(step):
    schedule = PiecewiseSchedule(BREAKPOINTS)
    steps, values = zip(*BREAKPOINTS, strict=True)
    assert schedule(step) == pytest.approx(float(np.interp(step, steps, values)), abs=1e-15)


def test_piecewise_values_at_breakpoints_and_outside():
    breakpoints = [(10, 2.0), (20, 4.0), (40, -4.0)]
    for kind in ("step", "interp"):
        schedule = PiecewiseSchedule(breakpoints, kind=kind)
        for at, value in breakpoints:
            assert schedule(at) == value
        assert schedule(0) == 2.0  # before the first breakpoint: the first value
        assert schedule(1e9) == -4.0
    interp = PiecewiseSchedule(breakpoints)
    assert interp(15) == 3.0
    assert interp(30) == 0.0
    step = PiecewiseSchedule(breakpoints, kind="step")
    assert step(19.9) == 2.0
    assert step(39) == 4.0


def test_piecewise_single_breakpoint_is_constant():
    for kind in ("step", "interp"):
        schedule = PiecewiseSchedule([(5, 0.3)], kind=kind)
        assert [schedule(s) for s in (0, 5, 6, 1e6)] == [0.3] * 4


@settings(max_examples=50, deadline=None)
@given(
    steps=st.lists(st.integers(-1000, 1000), min_size=1, max_size=6, unique=True),
    values=st.lists(st.floats(-10, 10), min_size=6, max_size=6),
    query=st.floats(-2000, 2000),
)
def test_piecewise_matches_numpy_and_naive_step(steps, values, query):
    breakpoints = list(zip(sorted(steps), values, strict=False))
    xs, ys = zip(*breakpoints, strict=True)
    interp = PiecewiseSchedule(breakpoints, kind="interp")(query)
    assert interp == pytest.approx(float(np.interp(query, xs, ys)), rel=1e-9, abs=1e-9)
    assert PiecewiseSchedule(breakpoints, kind="step")(query) == naive_step_schedule(
        breakpoints, query
    )


@pytest.mark.parametrize(
    "breakpoints, kind, match",
    [
        ([], "interp", "at least one"),
        ([(0, 1.0), (0, 2.0)], "interp", r"strictly increasing.*breakpoints\[1\]"),
        ([(0, 1.0), (10, 2.0), (5, 0.0)], "step", r"strictly increasing.*breakpoints\[2\]"),
        ([(0, 1.0, 2.0)], "interp", r"breakpoints\[0\] must be a \(step, value\) pair"),
        ([(0, 1.0)], "linear", r"kind must be one of \('step', 'interp'\)"),
    ],
)
def test_piecewise_validates(breakpoints, kind, match):
    with pytest.raises(ValueError, match=match):
        PiecewiseSchedule(breakpoints, kind=kind)


@pytest.mark.parametrize("tensor", [False, True])
def test_piecewise_drives_optimizer_lr(tensor):
    optimizer = make_optimizer(1e-3, 2e-3, tensor=tensor)
    lr_objects = [group["lr"] for group in optimizer.param_groups]
    schedule = PiecewiseSchedule([(0, 1e-3), (1000, 0.0)])
    assert schedule.apply(250, optimizer) == pytest.approx(7.5e-4)
    for group, lr_object in zip(optimizer.param_groups, lr_objects, strict=True):
        assert float(group["lr"]) == pytest.approx(7.5e-4)
        if tensor:
            assert group["lr"] is lr_object


class TinyLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("entropy_coeff", torch.tensor(0.01))
        self.not_a_buffer = 0.5


def test_piecewise_drives_a_loss_buffer_in_place():
    loss = TinyLoss()
    buffer = loss.entropy_coeff
    schedule = PiecewiseSchedule([(0, 0.01), (100, 0.001)], kind="step")
    assert schedule.apply(150, (loss, "entropy_coeff")) == 0.001
    assert loss.entropy_coeff is buffer
    assert buffer.item() == pytest.approx(0.001)
    assert loss.state_dict()["entropy_coeff"].item() == pytest.approx(0.001)
    schedule.apply(0, buffer)  # a tensor directly
    assert buffer.item() == pytest.approx(0.01)


def test_piecewise_drives_an_rlloss_loss_coefficient():
    from rlloss import ClipPPOLoss
    from tests.nets import make_actor, make_critic

    loss = ClipPPOLoss(make_actor(), make_critic(), entropy_coeff=0.01)
    buffer = loss.entropy_coeff
    PiecewiseSchedule([(0, 0.01), (10, 0.0)]).apply(5, (loss, "entropy_coeff"))
    assert loss.entropy_coeff is buffer
    assert buffer.item() == pytest.approx(0.005)


def test_piecewise_apply_rejects_non_tensor_targets():
    schedule = PiecewiseSchedule([(0, 1.0)])
    with pytest.raises(TypeError, match=r"TinyLoss\.not_a_buffer is a float, not a tensor"):
        schedule.apply(0, (TinyLoss(), "not_a_buffer"))
    with pytest.raises(TypeError, match="optimizer, a tensor or a"):
        schedule.apply(0, 3.0)


def test_piecewise_repr():
    schedule = PiecewiseSchedule([(0, 1), (10, 0)], kind="step")
    assert repr(schedule) == "PiecewiseSchedule([(0, 1.0), (10, 0.0)], kind='step')"


# --------------------------------------------------------------------------- KL early stopping


@pytest.mark.parametrize("as_tensor", [False, True])
def test_kl_early_stopping_is_strictly_above_one_and_a_half_target(as_tensor):
    def wrap(kl):
        return torch.tensor(kl, dtype=torch.float64) if as_tensor else kl

    early_stopping = KLEarlyStopping(target_kl=0.02)
    assert not early_stopping.should_stop(wrap(0.0))
    assert not early_stopping.should_stop(wrap(0.03))  # exactly 1.5 * target
    assert not early_stopping.stopped and early_stopping.stop_kl is None
    assert early_stopping.should_stop(wrap(0.0300001))
    assert early_stopping.stopped and early_stopping.stop_kl == 0.0300001


def test_kl_early_stopping_stays_stopped_until_reset():
    early_stopping = KLEarlyStopping(target_kl=0.01)
    assert early_stopping.should_stop(torch.tensor([0.5]))
    assert early_stopping.should_stop(0.0)  # the update stays stopped
    assert early_stopping.stop_kl == pytest.approx(0.5)
    early_stopping.reset()
    assert not early_stopping.stopped and early_stopping.stop_kl is None
    assert not early_stopping.should_stop(0.0)


def test_kl_early_stopping_one_host_read_per_call(monkeypatch):
    early_stopping = KLEarlyStopping(target_kl=0.01)
    with counting_host_reads(monkeypatch) as calls:
        early_stopping.should_stop(torch.tensor(0.001))
        assert len(calls) == 1
        early_stopping.should_stop(torch.tensor(0.5))
        assert len(calls) == 2
        early_stopping.should_stop(torch.tensor(0.001))  # already stopped: no read
        assert len(calls) == 2


def test_kl_early_stopping_validates():
    with pytest.raises(ValueError, match=r"^target_kl must be in \(0.0, inf\)"):
        KLEarlyStopping(target_kl=0.0)
    with pytest.raises(ValueError, match="^factor must be in"):
        KLEarlyStopping(target_kl=0.01, factor=-1.0)
    with pytest.raises(ValueError, match=r"kl\.mean\(\)"):
        KLEarlyStopping(target_kl=0.01).should_stop(torch.zeros(3))


def test_kl_exceeds_stays_on_device(monkeypatch):
    kl = torch.tensor([0.0, 0.015, 0.0151, 1.0], dtype=torch.float64)
    with counting_host_reads(monkeypatch, forbid=True):
        exceeded = kl_exceeds(kl, 0.01)
    assert exceeded.dtype == torch.bool and exceeded.device == kl.device
    assert exceeded.tolist() == [False, False, True, True]
    assert kl_exceeds(0.02, 0.01, factor=2.0) is False


def test_kl_adaptive_lr_with_torchrls_keywords_follows_torchrls_class():
    """``KLAdaptiveLR(optimizer, target_kl=, factor=)`` is TorchRL's class of the same name: the
    same learning rates over a KL sequence that crosses both band edges, zero and the clamps."""
    from torchrl.objectives.utils import KLAdaptiveLR as TorchRLKLAdaptiveLR

    ours_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    theirs_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ours = KLAdaptiveLR(ours_opt, target_kl=0.01, factor=2.0, max_lr=4e-3)
    theirs = TorchRLKLAdaptiveLR(theirs_opt, target_kl=0.01, factor=2.0, max_lr=4e-3)
    for kl in [0.05, 0.001, 0.0, 0.001, 0.001, 0.001, 0.03, 0.01, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]:
        ours.step(kl), theirs.step(kl)
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr())
    assert (ours.target_kl, ours.factor, ours.min_lr) == (0.01, 2.0, 1e-5)
    assert float(ours.last_kl) == theirs.last_kl
