"""The learning runs' task table and its preparation step (the offline tasks' dataset)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import tutorial_learning as learning  # noqa: E402
from tutorial_learning import OFFLINE, TASKS, Task, everything_on_disk  # noqa: E402


def test_every_task_names_an_existing_tutorial_and_preparation():
    for name, task in TASKS.items():
        assert (learning.TUTORIALS_DIR / task.script).is_file(), name
        if task.prepare:
            assert (learning.TUTORIALS_DIR / task.prepare[0]).is_file(), name
            assert task.prepared is not None, name
    offline = [name for name, task in TASKS.items() if task.prepare == OFFLINE["prepare"]]
    assert sorted(offline) == ["bc_offline", "cql_offline", "iql_offline", "td3bc_offline"]
    for name in offline:  # each learns from the dataset the preparation writes
        assert TASKS[name].extra_args == ("--dataset", OFFLINE["prepared"])


def test_preparation_runs_once_and_is_skipped_when_its_output_exists(tmp_path, monkeypatch):
    made, log = tmp_path / "dataset", tmp_path / "calls.txt"
    script = tmp_path / "prepare.py"
    script.write_text(
        "import pathlib, sys\n"
        f"pathlib.Path({str(made)!r}).mkdir()\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
    )
    task = Task(
        "ppo_cartpole.py", (), 10, 0.0, "", prepare=(str(script), "--seed", "0"), prepared=str(made)
    )
    monkeypatch.setitem(learning.TASKS, "a", task)
    monkeypatch.setitem(learning.TASKS, "b", task)  # shares the preparation
    learning.prepare_tasks(["a", "b"])
    assert made.is_dir() and log.read_text() == "--seed 0\n"
    learning.prepare_tasks(["a"])  # already there: not run again
    assert log.read_text() == "--seed 0\n"


def test_a_failed_preparation_stops_with_its_error(tmp_path, monkeypatch):
    script = tmp_path / "prepare.py"
    script.write_text("raise RuntimeError('no environment')\n")
    task = Task(
        "ppo_cartpole.py",
        (),
        10,
        0.0,
        "",
        prepare=(str(script),),
        prepared=str(tmp_path / "dataset"),
    )
    monkeypatch.setitem(learning.TASKS, "a", task)
    with pytest.raises(SystemExit, match="a: the preparation .*RuntimeError: no environment"):
        learning.prepare_tasks(["a"])


def test_the_summary_after_a_run_keeps_every_task_and_seed_on_disk(tmp_path):
    """Running some tasks or seeds must not drop the others from ``learning.json``."""
    for name in ("td3_pendulum", "ppo_cartpole", "not_a_task"):
        (tmp_path / name).mkdir()
    cfg = argparse.Namespace(results_dir=tmp_path, tasks=["ppo_cartpole"], seeds=[1], jobs=1)
    summary = everything_on_disk(cfg)
    assert summary.tasks == ["ppo_cartpole", "td3_pendulum"]  # TASKS order, known tasks only
    assert summary.seeds is None and summary.jobs == 1
    assert cfg.tasks == ["ppo_cartpole"]  # the run's own configuration is left alone
