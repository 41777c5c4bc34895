"""Every tutorial runs end to end on a tiny budget and keeps its output contract: a CSV of
episode returns, a PNG, and a last line ``final_return=...``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("[!_]*.py"))


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
