"""Lines of ``rlloss/`` fit in 100 characters, docstrings included (ruff's E501 at the project's
``line-length``): a limit met by splitting, never by squeezing (STYLE.md, rule 12)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_rlloss_lines_fit_in_100_characters():
    pytest.importorskip("ruff", reason="pip install '.[docs]' (ruff is the docs' formatter)")
    ruff = [sys.executable, "-m", "ruff"] if shutil.which("ruff") is None else ["ruff"]
    result = subprocess.run(
        [*ruff, "check", "--select", "E501", "--line-length", "100", "--output-format",
         "concise", "rlloss"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
