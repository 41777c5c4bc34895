"""``tools/mujoco_results.py``, which writes the Results page: a run folder read back, the rows
and the per-task summaries (a variant such as a swapped start keeps a row of its own), and the
page's blocks replaced between their markers."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import mujoco_results  # noqa: E402


def run_folder(path: Path, *, seed: int, final: float, variant: str | None = None) -> Path:
    """A TD3 Hopper run folder as the tutorial writes it: 12 training episodes (returns 0..11
    plus ``seed``), evaluations at 10k and 20k, and the summary."""
    path.mkdir(parents=True)
    summary = {
        "algorithm": "TD3",
        "env_id": "Hopper-v5",
        "losses": "rlloss",
        "seed": seed,
        "frames": 30_000,
        "final_eval_return": final,
        "best_eval_return": final,
        "wall_time_s": 120.0,
        "cpu_time_s": 60.0,
        "subnormals": "flushed",
        "updates": 5_000,
        "updates_per_s": 99.6,
    }
    if variant:
        summary["variant"] = variant
    (path / "summary.json").write_text(json.dumps(summary))
    episodes = "".join(f"{1_000 * (i + 1)},{i + seed}\n" for i in range(12))
    (path / "returns.csv").write_text("frames,episode_return\n" + episodes)
    (path / "eval_returns.csv").write_text("frames,eval_return\n10000,5.0\n20000,4000.0\n")
    return path


def test_a_run_is_read_with_its_curve_and_training_return(tmp_path):
    run = mujoco_results.read_run(run_folder(tmp_path / "r", seed=1, final=300.0))
    assert run["evaluations"] == [[10_000, 5.0], [20_000, 4_000.0]]
    assert run["final_train_return"] == pytest.approx(statistics.fmean(range(3, 13)))
    assert mujoco_results.best_return(run) == 4_000.0  # an evaluation beats the final one
    assert mujoco_results.run_row(run) == (
        "| Hopper-v5 | rlloss | 1 | 300.0 | 4000.0 | 7.5 | 2.0 | 1.0 | 100 | flushed |"
    )


def test_a_variant_is_summarised_apart_from_the_plain_seeds(tmp_path):
    runs = [
        mujoco_results.read_run(run_folder(tmp_path / name, seed=seed, final=final, variant=v))
        for name, seed, final, v in [
            ("a", 0, 1_000.0, None),
            ("b", 1, 2_000.0, None),
            ("c", 0, 3_000.0, "torchrl's start"),
        ]
    ]
    assert len({mujoco_results.run_key(run) for run in runs}) == 3
    plain, swapped = mujoco_results.summary_rows(runs, "TD3")
    assert plain == "| Hopper-v5 | rlloss | 0, 1 | 1500.0 ± 707.1 | 7.0 ± 0.7 | 3134.6 | 1405 |"
    assert swapped.startswith("| Hopper-v5 | rlloss (torchrl's start) | 0 | 3000.0 | 6.5 |")
    assert mujoco_results.tables([], "TD3") == "No run has finished yet."
    assert "figures/results_td3_hopper.png" in mujoco_results.tables(runs, "TD3")


def test_main_replaces_only_the_blocks_between_the_markers(tmp_path, monkeypatch):
    page = tmp_path / "results.md"
    page.write_text("intro\n<!-- results:TD3 -->\nold\n<!-- /results:TD3 -->\nafter\n")
    monkeypatch.setattr(mujoco_results, "PAGE", page)
    monkeypatch.setattr(mujoco_results, "RUNS", tmp_path / "runs.json")
    monkeypatch.setattr(mujoco_results, "FIGURES", tmp_path)
    monkeypatch.setattr(mujoco_results, "ROOT", tmp_path)  # figures are printed relative to it
    folder = run_folder(tmp_path / "run", seed=0, final=1_234.5)
    monkeypatch.setattr(sys, "argv", ["mujoco_results.py", str(folder)])
    mujoco_results.main()
    text = page.read_text()
    assert text.startswith("intro\n<!-- results:TD3 -->\n") and text.endswith("after\n")
    assert "old" not in text and "| Hopper-v5 | rlloss | 0 | 1234.5 |" in text
    assert (tmp_path / "results_td3_hopper.png").stat().st_size > 0
    assert [run["seed"] for run in json.loads((tmp_path / "runs.json").read_text())] == [0]


def test_a_cleanrl_run_shows_its_training_return_and_stays_off_the_figures(
    tmp_path, monkeypatch
):
    """A run of CleanRL's own script (tools/cleanrl_reference.py): no evaluation, so its rows
    read "-" there, its training return is summarised, and no figure draws it."""
    folder = run_folder(tmp_path / "cleanrl", seed=2, final=0.0)
    (folder / "eval_returns.csv").unlink()
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(losses="cleanrl", env_id="Hopper-v4", final_eval_return=None)
    for key in ("best_eval_return", "subnormals", "updates", "updates_per_s"):
        del summary[key]
    (folder / "summary.json").write_text(json.dumps(summary))
    run = mujoco_results.read_run(folder)
    assert run["evaluations"] == [] and mujoco_results.best_return(run) is None
    row = "| Hopper-v4 | cleanrl | 2 | - | - | 8.5 | 2.0 | 1.0 | - | - |"
    assert mujoco_results.run_row(run) == row
    plain = mujoco_results.read_run(run_folder(tmp_path / "plain", seed=0, final=10.0))
    rows = mujoco_results.summary_rows([run, plain], "TD3")
    assert rows[0] == "| Hopper-v4 | cleanrl | 2 | - | 8.5 | 3134.6 | 1405 |"
    assert rows[1].startswith("| Hopper-v5 | rlloss | 0 | 10.0 | 6.5 |")
    monkeypatch.setattr(mujoco_results, "FIGURES", tmp_path)
    assert mujoco_results.draw([run]) == []
    assert len(mujoco_results.draw([run, plain])) == 1
