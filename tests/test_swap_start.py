"""``tools/swap_start.py``, behind the Results page's TD3 Hopper experiment: a loss module built
through it holds the other library's initial draws and leaves torch's random stream where the
other library's construction left it, so a tutorial run with it is the other library's run of
that seed until rounding parts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch
import torchrl.objectives

pytest.importorskip("mujoco", reason="pip install '.[tutorials]'")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import swap_start  # noqa: E402
import update_drift  # noqa: E402


def built(constructor, algo: str):
    """``constructor`` called on the tutorial's networks for ``algo`` (seed 0), and torch's
    random state after it."""
    torch.manual_seed(0)
    env = gym.make("Hopper-v5")
    library = SimpleNamespace(
        **{f"{algo.upper()}Loss": constructor}, SoftUpdate=torchrl.objectives.SoftUpdate
    )
    module = update_drift.BUILDERS[algo](library, env)[0]
    return module, torch.get_rng_state()


def parameters(module, names) -> dict:
    return {
        (name, key): value
        for name in names
        for key, value in update_drift.tensors(module, name).items()
    }


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("own_name", ["rlloss", "torchrl"])
def test_a_module_built_through_it_starts_where_the_other_library_does(algo, own_name):
    class_name = f"{algo.upper()}Loss"
    own = getattr(swap_start.LIBRARIES[own_name], class_name)
    other = getattr(swap_start.LIBRARIES[swap_start.other_name(own_name)], class_name)
    names = update_drift.PARAMS[algo]
    reference, reference_state = built(other, algo)
    plain, plain_state = built(own, algo)
    swapped, swapped_state = built(swap_start.from_start_of(own, other, names), algo)

    assert type(swapped) is own
    assert torch.equal(swapped_state, reference_state)
    expected, got, plain = (parameters(m, names) for m in (reference, swapped, plain))
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[key], got[key]) for key in expected)
    # without the stand-in the same seed starts elsewhere: the critics differ
    assert not all(torch.equal(expected[key], plain[key]) for key in expected)


def test_flags_are_read_as_argparse_would():
    assert swap_start.flag(["--seed", "1", "--losses", "torchrl"], "--losses") == "torchrl"
    assert swap_start.flag(["--losses=torchrl"], "--losses") == "torchrl"
    assert swap_start.flag(["--seed", "1"], "--losses", "rlloss") == "rlloss"
    assert swap_start.flag(["--seed", "1"], "--out") is None


def episode_returns(out: Path) -> list[float]:
    rows = (out / "returns.csv").read_text().splitlines()[1:]
    return [float(row.split(",")[1]) for row in rows]


@pytest.mark.slow
def test_rlloss_from_torchrls_start_retraces_torchrls_run(tmp_path):
    """TD3 on Hopper, 1,000 random steps then 400 updates: the swapped rlloss run's training
    episodes are TorchRL's (float32 rounding apart), the plain rlloss run's are not."""
    common = (
        "--env-id Hopper-v5 --seed 0 --total-frames 1400 --learning-starts 1000 "
        "--eval-every 0 --eval-episodes 1"
    ).split()
    tutorial = str(ROOT / "tutorials" / "td3_mujoco.py")
    runs = {
        "torchrl": [tutorial, "--losses", "torchrl"],
        "swapped": [str(ROOT / "tools" / "swap_start.py"), tutorial, "--losses", "rlloss"],
        "rlloss": [tutorial, "--losses", "rlloss"],
    }
    for name, command in runs.items():
        subprocess.run(
            [sys.executable, *command, *common, "--out", str(tmp_path / name)],
            check=True,
            capture_output=True,
            cwd=ROOT / "tutorials",
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    torchrl_run, swapped, plain = (episode_returns(tmp_path / n) for n in runs)
    assert len(swapped) == len(torchrl_run) > 30
    assert swapped == pytest.approx(torchrl_run, rel=1e-3, abs=1e-3)
    assert plain != pytest.approx(torchrl_run, rel=1e-3, abs=1e-3)
    summary = json.loads((tmp_path / "swapped" / "summary.json").read_text())
    assert summary["losses"] == "rlloss" and summary["variant"] == "torchrl's start", summary
