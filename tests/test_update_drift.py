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


def test_both_libraries_draw_the_critics_from_one_law():
    law = update_drift.init_law("td3", range(2))
    keys = {key for _, _, key in law}
    assert keys == {f"module.{layer}.{kind}" for layer in (0, 2, 4) for kind in ("weight", "bias")}
    for key in keys - {"module.4.bias"}:  # a one-element tensor has no spread
        spreads = [
            law[(library, member, key)][0] for library in ("torchrl", "rlloss") for member in (0, 1)
        ]
        assert max(spreads) < 1.1 * min(spreads), (key, spreads)
    # TorchRL redraws between a tensor's min and max: a one-element bias stays the same in both
    assert law[("torchrl", 0, "module.4.bias")] == law[("torchrl", 1, "module.4.bias")]
