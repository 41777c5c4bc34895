"""The MuJoCo tutorials' speed diagnostics (tutorials/_helpers.py): subnormal floats in Adam's
state, flushing them, the per-interval update rate, and ``benchmarks/denormals.py``; and the
package versions a run records."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tutorials"))

import _helpers as helpers  # noqa: E402

from benchmarks import denormals  # noqa: E402

TINY = torch.finfo(torch.float32).tiny


@pytest.fixture
def restore_flush():
    """``torch.set_flush_denormal`` is process-wide: leave it off for the other tests."""
    yield
    torch.set_flush_denormal(False)


def adam_after_zero_gradients(steps: int) -> torch.optim.Adam:
    """Adam on a 4x4 weight whose first row then gets zero gradients for ``steps`` steps, as the
    weights of a ReLU unit that stopped firing do."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 4))
    optimizer = torch.optim.Adam([weight], lr=1e-3)
    weight.grad = torch.randn(4, 4)
    optimizer.step()
    for _ in range(steps):
        weight.grad = torch.randn(4, 4)
        weight.grad[0] = 0.0
        optimizer.step()
    return optimizer


def test_zero_gradients_leave_adams_first_moment_stuck_subnormal(restore_flush):
    torch.set_flush_denormal(False)
    state = adam_after_zero_gradients(2_000).state
    exp_avg = next(iter(state.values()))["exp_avg"]
    # 0.9 ** 2000 would underflow to zero; rounding keeps a few units of the last place instead.
    assert torch.all((exp_avg[0] != 0) & (exp_avg[0].abs() < TINY))
    assert torch.all(exp_avg[1:].abs() > TINY)
    # 4 of 16 entries of exp_avg, none of exp_avg_sq (0.999 ** 2000 is still normal).
    assert helpers.subnormal_share([adam_after_zero_gradients(2_000)]) == pytest.approx(4 / 32)


def test_flushing_makes_them_zero(restore_flush):
    if not helpers.flush_denormals(argparse.Namespace(keep_denormals=False)):
        pytest.skip("this CPU cannot flush subnormals (torch.set_flush_denormal)")
    exp_avg = next(iter(adam_after_zero_gradients(2_000).state.values()))["exp_avg"]
    assert torch.all(exp_avg[0] == 0)
    assert helpers.subnormal_share([adam_after_zero_gradients(2_000)]) == 0.0
    assert (torch.tensor([1e-39]) * 1.0).item() == 0.0


def test_keep_denormals_keeps_them(restore_flush):
    parser = argparse.ArgumentParser()
    helpers.denormal_flag(parser)
    helpers.flush_denormals(parser.parse_args(["--keep-denormals"]))
    assert (torch.tensor([1e-39]) * 1.0).item() == pytest.approx(1e-39)
    assert not parser.parse_args([]).keep_denormals


def test_subnormal_share_of_an_optimizer_without_state_is_zero():
    weight = torch.nn.Parameter(torch.ones(3))
    assert helpers.subnormal_share([torch.optim.Adam([weight])]) == 0.0


def test_update_rate_is_per_interval():
    rate = helpers.UpdateRate()
    assert rate(0, 0.0) == 0.0  # no update time yet
    assert rate(100, 2.0) == pytest.approx(50.0)
    assert rate(400, 4.0) == pytest.approx(150.0)  # (400 - 100) / (4 - 2), not 400 / 4


def test_denormals_benchmark_makes_the_dead_share_subnormal(restore_flush):
    torch.set_flush_denormal(False)
    update = denormals.TD3Update(share=0.5)
    update()
    share = helpers.subnormal_share([update.q_optimizer, update.actor_optimizer])
    assert 0.45 < share < 0.55
    assert helpers.subnormal_share([denormals.TD3Update(share=0.0).q_optimizer]) == 0.0


def test_denormals_benchmark_writes_its_rows(tmp_path, monkeypatch, restore_flush):
    out = tmp_path / "denormals.json"
    monkeypatch.setattr(sys, "argv", ["denormals.py", "--shares", "0", "0.5", "--warmup", "1",
                                      "--repeats", "1", "--inner", "1", "--out", str(out)])
    denormals.main()
    rows = json.loads(out.read_text())["rows"]
    assert [row["dead_share"] for row in rows] == [0.0, 0.5]
    assert all(row["kept_ms"] > 0 and row["flushed_ms"] > 0 for row in rows)


def test_package_versions_are_the_installed_ones():
    versions = helpers.package_versions()
    assert versions["torch"] == torch.__version__, versions
    assert versions["python"] == ".".join(map(str, sys.version_info[:3])), versions
    assert all(isinstance(v, str) and v[0].isdigit() for v in versions.values()), versions
