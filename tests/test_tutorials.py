"""Every tutorial runs end to end on a tiny budget and keeps its output contract: a CSV of
episode returns, a PNG, and a last line ``final_return=...``. The compile tutorial trains
nothing: it has its own contract (``updates_per_second=...``, compiled losses equal to eager)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS_DIR = Path(__file__).resolve().parents[1] / "tutorials"
COMPILE_TUTORIAL = TUTORIALS_DIR / "compile_and_cudagraphs.py"
TUTORIALS = sorted(p for p in TUTORIALS_DIR.glob("[!_]*.py") if p != COMPILE_TUTORIAL)


@pytest.mark.parametrize("script", TUTORIALS, ids=lambda path: path.stem)
def test_tutorial_smoke(script, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--total-frames",
            "2048",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    assert last_line.startswith("final_return="), result.stdout[-2000:]
    float(last_line.split("=", 1)[1])  # a number (nan when no episode finished)
    assert (tmp_path / "returns.csv").read_text().startswith("frames,episode_return")
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_compile_tutorial_smoke(tmp_path):
    """A compiled SAC update gives the eager losses and runs without recompiling (about 50 s
    with an empty inductor cache on a small CPU, 15 s with a warm one)."""
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        env["TORCHINDUCTOR_CACHE_DIR"] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    result = subprocess.run(
        [
            sys.executable,
            str(COMPILE_TUTORIAL),
            "--updates",
            "10",
            "--check-updates",
            "2",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    assert last_line.startswith("updates_per_second="), result.stdout[-2000:]
    float(last_line.split("=", 1)[1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["max_loss_difference"] < 1e-4
    assert summary["recompiles_while_timed"] == 0
    assert (tmp_path / "updates_per_second.csv").read_text().startswith("mode,updates_per_second")
