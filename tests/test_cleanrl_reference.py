"""``tools/cleanrl_reference.py``, which runs CleanRL's own script at the tutorials' budget for the
Results page: it passes the run's settings to the script, turns the episodes the script prints
into ``returns.csv`` and writes a summary; a stand-in for CleanRL's script (same name, same
output lines, a ``cleanrl_utils`` beside it) plays the script here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import cleanrl_reference  # noqa: E402

# What CleanRL's scripts print: numpy's one-element array for the return, SPS lines between.
STAND_IN = '''
import json, os, sys
print("SPS: 120")
for step, ret in ((999, 12.5), (1999, -3.25), (2500, 1e3)):
    print(f"global_step={step}, episodic_return=[{ret}]")
json.dump({"argv": sys.argv[1:], "threads": os.environ["OMP_NUM_THREADS"],
           "path": os.environ["PYTHONPATH"]}, open("seen.json", "w"))
sys.exit(int(os.environ.get("STAND_IN_STATUS", "0")))
'''


def stand_in(tmp_path: Path, name: str = "td3_continuous_action.py") -> Path:
    repo = tmp_path / "cleanrl_checkout"
    (repo / "cleanrl_utils").mkdir(parents=True)
    script = repo / "cleanrl" / name
    script.parent.mkdir()
    script.write_text(STAND_IN)
    return script


def test_runs_the_script_and_writes_the_run(tmp_path):
    script, out = stand_in(tmp_path), tmp_path / "run"
    cleanrl_reference.main(["--script", str(script), "--python", sys.executable,
                            "--source", "vwxyzjn/cleanrl@test", "--env-id", "Hopper-v4",
                            "--seed", "3", "--total-frames", "2600", "--out", str(out)])
    seen = json.loads((out / "seen.json").read_text())  # the script ran in OUT
    assert seen["argv"] == ["--env-id", "Hopper-v4", "--seed", "3", "--total-timesteps", "2600",
                            "--no-cuda"]
    assert seen["threads"] == "1" and seen["path"] == str(script.parent.parent.resolve())
    assert (out / "returns.csv").read_text().splitlines() == [
        "frames,episode_return", "1000,12.5", "2000,-3.25", "2501,1000.0"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "TD3" and summary["losses"] == "cleanrl"
    assert summary["final_train_return"] == pytest.approx((12.5 - 3.25 + 1000) / 3)
    assert summary["final_eval_return"] is None and summary["episodes"] == 3
    assert summary["source"] == "vwxyzjn/cleanrl@test" and summary["seed"] == 3
    assert {"python", "torch", "gymnasium", "mujoco", "numpy"} <= summary["versions"].keys()


def test_the_mean_is_over_the_last_ten_episodes():
    lines = [f"global_step={i}, episodic_return=[{float(i)}]" for i in range(20)]
    episodes = cleanrl_reference.episodes_of(["SPS: 3", *lines])
    assert episodes[0] == (1, 0.0) and len(episodes) == 20
    summary = cleanrl_reference.summary_of(
        type("Args", (), {"script": Path("sac_continuous_action.py"), "env_id": "Hopper-v4",
                          "seed": 0, "total_frames": 20, "source": "s"})(),
        episodes, 1.0, 1.0, {})
    assert summary["algorithm"] == "SAC" and summary["final_train_return"] == 14.5


def test_a_failing_script_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_STATUS", "3")
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"exited with status 3: see .*stdout.txt"):
        cleanrl_reference.main(["--script", str(stand_in(tmp_path)), "--python", sys.executable,
                                "--source", "s", "--out", str(out)])
    assert "global_step=999" in (out / "stdout.txt").read_text()


def test_bad_scripts_are_refused(tmp_path, capsys):
    wrong = stand_in(tmp_path, "ppo_continuous_action.py")
    with pytest.raises(SystemExit):
        cleanrl_reference.parse_args(["--script", str(wrong), "--source", "s", "--out", "o"])
    assert "expected one of CleanRL's" in capsys.readouterr().err
    alone = tmp_path / "sac_continuous_action.py"
    alone.write_text("")
    with pytest.raises(SystemExit):
        cleanrl_reference.parse_args(["--script", str(alone), "--source", "s", "--out", "o"])
    assert "no cleanrl_utils/ beside its folder" in capsys.readouterr().err
