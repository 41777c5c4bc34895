"""tools/remeasure_tutorials.py: the ``[figures]`` lines it reads from the tutorials' docstrings
(the reruns themselves are slow runs, not CI)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import remeasure_tutorials as tool  # noqa: E402


def test_a_figures_line_gives_the_library_arguments_metric_and_seeds():
    doc = """Results.

        [figures] torchrl, seeds 0 2 5, --total-frames 20000 --per: final_return = 500.0 -3.5 nan
    """
    (figures,) = tool.parse_figures("dqn", doc)
    assert (figures.library, figures.args, figures.metric) == (
        "torchrl",
        ("--total-frames", "20000", "--per"),
        "final_return",
    )
    assert list(figures.documented) == [0, 2, 5]
    assert figures.documented[2] == -3.5


@pytest.mark.parametrize(
    "line",
    [
        "[figures] rlloss, seeds 0 1, --total-frames 10: final_return = 500.0",  # 2 seeds
        "[figures] tf, seeds 0, --total-frames 10: final_return = 500.0",  # no such library
        "[figures] rlloss seeds 0: final_return 500.0",  # not the format
    ],
)
def test_a_malformed_figures_line_is_refused_with_the_tutorial_and_line(line):
    with pytest.raises(ValueError, match=r"dqn: .*\[figures\]"):
        tool.parse_figures("dqn", line)


def test_the_dqn_tutorial_documents_both_libraries_and_both_swap():
    figures = tool.documented_figures(["dqn_cartpole"])
    assert {fig.library for fig in figures} == {"rlloss", "torchrl"}
    for fig in figures:
        assert fig.metric == "final_return" and len(fig.documented) >= 5


def test_the_torchrl_script_imports_torchrls_loss(tmp_path):
    script = tool.script_for("dqn_cartpole", "torchrl", tmp_path)
    source = script.read_text()
    assert "from torchrl.objectives import DQNLoss" in source
    assert "from rlloss import DQNLoss" not in source
    assert tool.script_for("dqn_cartpole", "rlloss", tmp_path).name == "dqn_cartpole.py"


def test_a_run_reports_the_last_printed_value_and_a_failure_as_nan(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text("print('final_return=1.0')\nprint('final_return=475.5')\n")
    assert tool.run_one(script, (), 0, "final_return", tmp_path / "out") == 475.5
    script.write_text("raise SystemExit(3)\n")
    assert math.isnan(tool.run_one(script, (), 0, "final_return", tmp_path / "out"))
