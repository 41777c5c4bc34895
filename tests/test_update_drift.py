"""``tools/update_drift.py``, behind the Results page's Hopper paragraphs: from one start, on the
same batches and draws, rlloss's and TorchRL's TD3 and SAC updates stay at rounding level in
float64, and in float32 a one-step nudge of TorchRL's own weights makes them part."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mujoco", reason="pip install '.[tutorials]'")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import update_drift  # noqa: E402


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_rlloss_and_torchrl_updates_stay_together_in_float64(float64_default, algo):
    ((update, critics, policies),) = update_drift.drift(
        "rlloss", updates=20, algo=algo, transitions=500, every=20
    )
    assert update == 20 and critics < 1e-12 and policies < 1e-12, (critics, policies)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_a_rounding_nudge_makes_float32_updates_part(algo):
    ((_, critics, _),) = update_drift.drift(
        "nudged", updates=20, algo=algo, transitions=500, every=20
    )
    assert 0 < critics < 1e-2, critics
