"""tools/tutorial_runs.py: the ``[figures]`` lines it reads from the tutorials' docstrings (the
reruns themselves are slow runs, not CI), one tutorial run read back, and its command line."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import tutorial_figures as tool  # noqa: E402
import tutorial_runs  # noqa: E402
from tutorial_process import Finished, printed_values, run_tutorial, script_for  # noqa: E402


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
    path = tool.TUTORIALS_DIR / "dqn_cartpole.py"
    source = script_for(path, "torchrl", tmp_path).read_text()
    assert "from torchrl.objectives import DQNLoss" in source
    assert "from rlloss import DQNLoss" not in source
    assert script_for(path, "rlloss", tmp_path) == path


def test_a_run_reports_the_last_printed_value_and_a_failure_as_nan(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text("print('final_return=1.0')\nprint('final_return=475.5')\n")
    assert tool.run_one(script, (), 0, "final_return", tmp_path / "out") == 475.5
    script.write_text("raise SystemExit(3)\n")
    assert math.isnan(tool.run_one(script, (), 0, "final_return", tmp_path / "out"))


def test_a_prerequisite_becomes_a_placeholder_and_is_written_back():
    line = (
        "[figures] rlloss, seeds 0 1, --total-frames 10 --dataset "
        "<offline_dataset --seed 0 --agent-frames 5000>/dataset: final_return = -125.1 -109.5"
    )
    (figures,) = tool.parse_figures("bc_offline", line)
    assert figures.args == ("--total-frames", "10", "--dataset", "{0}/dataset")
    assert figures.prerequisites == (
        ("offline_dataset", ("--seed", "0", "--agent-frames", "5000")),
    )
    assert tool.written_args(figures) == (
        "--total-frames 10 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset"
    )


@pytest.mark.parametrize(
    "args, match",
    [
        ("--dataset <no_such_tutorial --seed 0>/dataset", "no_such_tutorial"),
        ("--config {x}", "braces"),
    ],
)
def test_a_bad_prerequisite_or_brace_is_refused(args, match):
    with pytest.raises(ValueError, match=rf"bc_offline: .*{match}"):
        tool.parse_figures("bc_offline", f"[figures] rlloss, seeds 0, {args}: final_return = 1.0")


def test_the_documented_rounding_is_each_values_own():
    (figures,) = tool.parse_figures(
        "dpo", "[figures] rlloss, seeds 0 1 2, --x 1: final_return = 500 0.604 -0.29"
    )
    assert figures.decimals == {0: 0, 1: 3, 2: 2}


class _Done:
    """A finished run, as ``compare`` reads it from a future."""

    def __init__(self, stdout: str):
        self.finished = Finished(["python", "t.py"], 0, 12.0, stdout)

    def result(self) -> Finished:
        return self.finished


@pytest.mark.parametrize(
    "documented, printed, agree",
    [
        ("500", "500.0", True),
        ("500", "499.4", False),
        ("0.604", "0.604", True),
        ("0.604", "0.605", False),
        ("0.59", "0.6", True),  # the script prints one decimal: the coarser rounding counts
        ("0.59", "0.7", False),
        ("4000", "none", False),
        ("-13.5", None, False),  # the run printed no such line
    ],
)
def test_a_value_agrees_within_the_coarser_of_both_roundings(documented, printed, agree, capsys):
    (figures,) = tool.parse_figures("t", f"[figures] rlloss, seeds 3, --x 1: m = {documented}")
    runs = {(figures, 3): _Done("" if printed is None else f"m={printed}\n")}
    assert tool.compare(figures, runs, tolerance=None) is agree
    assert ("differs" in capsys.readouterr().out) is not agree
    assert tool.compare(figures, runs, tolerance=100.0) is (printed not in (None, "none"))


def test_a_run_reads_every_printed_name_its_first_word_and_brackets(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(
        "print('first_eval_at_target=4000 (target -200, evaluated every 1000 steps)')\n"
        "print('return_at_target[-144.1]=-403.5')\n"
        "print('wall_time=12.5s')\n"
        "print('frames=10 return=-3.0')\n"
    )
    finished = run_tutorial(script, (), tmp_path / "out", seed=1)
    printed = finished.printed
    assert printed["first_eval_at_target"] == "4000"
    assert printed["return_at_target[-144.1]"] == "-403.5"
    assert printed["wall_time"] == "12.5"
    assert printed["frames"] == "10 return=-3.0".split()[0]
    assert finished.wall_s > 0 and finished.command[-2:] == ["--out", str(tmp_path / "out")]
    assert (tmp_path / "out" / "stdout.txt").read_text().startswith("first_eval_at_target=4000")
    assert printed_values("final_return=1.0\nfinal_return=-2.5 (eval)\n") == {
        "final_return": "-2.5"
    }


def test_remeasure_runs_a_prerequisite_once_and_a_shared_run_once(tmp_path, monkeypatch, capsys):
    tutorials = tmp_path / "tutorials"
    tutorials.mkdir()
    log = tmp_path / "runs.log"
    (tutorials / "maker.py").write_text(
        "import sys, pathlib\n"
        f"open({str(log)!r}, 'a').write('maker\\n')\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
        "out.mkdir(parents=True, exist_ok=True)\n"  # the run dir holds stdout.txt already
        "(out / 'value').write_text(sys.argv[sys.argv.index('--value') + 1])\n"
    )
    (tutorials / "reader.py").write_text(
        "import sys\n"
        f"open({str(log)!r}, 'a').write('reader\\n')\n"
        "seed = int(sys.argv[sys.argv.index('--seed') + 1])\n"
        "value = float(open(sys.argv[sys.argv.index('--data') + 1]).read())\n"
        "print(f'final_return={value + seed:.1f}')\n"
        "print(f'train_return={-seed:.1f}')\n"
    )
    monkeypatch.setattr(tool, "TUTORIALS_DIR", tutorials)
    doc = """
        [figures] rlloss, seeds 0 1, --data <maker --value 5>/value: final_return = 5.0 6.0
        [figures] rlloss, seeds 0 1, --data <maker --value 5>/value: train_return = 0.0 -2.0
    """
    figures = tool.parse_figures("reader", doc)
    assert not tool.remeasure(figures, None, jobs=1, tolerance=None, work=tmp_path / "work")
    out = capsys.readouterr().out
    assert "final_return documented 6.0, measured 6.0" in out
    assert "train_return documented -2.0, measured -1.0" in out and "differs" in out
    assert (
        "[figures] rlloss, seeds 0 1, --data <maker --value 5>/value: train_return = 0.0 -1.0"
        in out
    )
    assert log.read_text().split() == ["maker", "reader", "reader"]  # 2 seeds, 2 metrics each


def test_every_tutorial_line_parses_and_every_uncovered_result_is_named():
    figures = tool.documented_figures()
    covered = {fig.tutorial for fig in figures}
    for fig in figures:
        for script, _ in fig.prerequisites:
            assert (tool.TUTORIALS_DIR / f"{script}.py").is_file()
    docstring = tool.__doc__
    for path in sorted(tool.TUTORIALS_DIR.glob("[!_]*.py")):
        if path.stem not in covered and not path.stem.endswith("_mujoco"):
            assert f"``{path.stem}``" in docstring, f"{path.stem}: no [figures] line, no reason"


def test_the_command_line_keeps_each_uses_options_apart(capsys):
    listing = tutorial_runs.parse_args(["--list"])
    assert listing.figures and listing.jobs == 2
    learning = tutorial_runs.parse_args(["--smoke"])
    assert not learning.figures and learning.seeds == [0] and learning.jobs == 1
    assert learning.tasks == list(tutorial_runs.SMOKE_TASKS)
    for argv, option in (
        (["--figures", "--smoke"], "--smoke goes with the learning runs"),
        (["--tutorials", "dqn_cartpole"], "--tutorials goes with --figures"),
        (["--rnd-runs", "/tmp"], "give its path with --out FIGURE.png"),
    ):
        with pytest.raises(SystemExit):
            tutorial_runs.parse_args(argv)
        assert option in capsys.readouterr().err
