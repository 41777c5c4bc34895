"""``tools/td3_drift.py``, behind the Results page's TD3 Hopper paragraph: from one start, on the
same batches and draws, rlloss's and TorchRL's TD3 updates stay at rounding level in float64,
and in float32 a one-step nudge of TorchRL's own weights makes them part."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mujoco", reason="pip install '.[tutorials]'")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import td3_drift  # noqa: E402


def test_rlloss_and_torchrl_updates_stay_together_in_float64(float64_default):
    (update, critics, policies), = td3_drift.drift("rlloss", updates=40, transitions=500, every=40)
    assert update == 40 and critics < 1e-12 and policies < 1e-12, (critics, policies)


def test_a_rounding_nudge_makes_float32_updates_part():
    (_, critics, _), = td3_drift.drift("nudged", updates=40, transitions=500, every=40)
    assert 0 < critics < 1e-2, critics
