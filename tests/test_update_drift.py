"""``tools/update_drift.py``, behind the Results page's Hopper paragraphs: from one start, on the
same batches and draws, rlloss's and TorchRL's TD3 and SAC updates stay at rounding level in
float64, and in float32 a one-step nudge of TorchRL's own weights makes them part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
import torchrl.objectives

import rlloss

pytest.importorskip("mujoco", reason="pip install '.[tutorials]'")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import late_state  # noqa: E402
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


def trained_sac(library):
    """The SAC update of ``library`` after five Adam steps on random Hopper transitions, and
    those transitions."""
    torch.manual_seed(0)
    update = update_drift.sac_update(library, gym.make("Hopper-v5"))
    data = update_drift.random_transitions("Hopper-v5", 300, seed=0)
    for _ in range(5):
        update_drift.step(update, data[torch.randint(300, (256,))], policy_step=True)
    return update, data


def test_a_saved_state_gives_the_other_library_its_parameters_and_adam_states(tmp_path):
    update, data = trained_sac(torchrl.objectives)
    path = tmp_path / "state.pt"
    torch.save(update_drift.state_of(update, "sac", "Hopper-v5", data), path)
    state = torch.load(path, weights_only=True)
    fresh = update_drift.sac_update(rlloss, gym.make("Hopper-v5"))
    transitions = update_drift.load_state(fresh, state)

    for name in update_drift.PARAMS["sac"]:
        theirs, mine = (update_drift.tensors(u[0], name) for u in (update, fresh))
        assert all(torch.equal(theirs[key], mine[key]) for key in theirs), name
    (saved,), (loaded,) = (update_drift.optimiser_states(u, "sac") for u in (update, fresh))
    assert saved.keys() == loaded.keys() and len(saved) == 13  # 12 network tensors, log alpha
    for name, entry in saved.items():
        assert int(entry["step"]) == int(loaded[name]["step"]) == 5
        assert torch.equal(entry["exp_avg_sq"], loaded[name]["exp_avg_sq"]), name
    assert (transitions == data.select(*transitions.keys(True, True))).all()
    # copies, not shared tensors: a step of one leaves the other's moments as they were
    update_drift.step(fresh, data[:256], policy_step=True)
    (after,) = update_drift.optimiser_states(update, "sac")
    assert all(torch.equal(after[n]["exp_avg"], saved[n]["exp_avg"]) for n in saved)


def test_from_a_saved_state_the_float64_updates_stay_together(float64_default):
    update, data = trained_sac(torchrl.objectives)
    state = update_drift.state_of(update, "sac", "Hopper-v5", data)
    ((_, critics, policies),) = update_drift.drift("rlloss", updates=20, every=20, state=state)
    assert critics < 1e-12 and policies < 1e-12, (critics, policies)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_late_state_keeps_a_tutorial_runs_end_for_update_drift(algo, tmp_path, float64_default):
    """``tools/late_state.py`` runs a tutorial (300 random steps, 300 updates) and writes its end
    state; ``update_drift.py --from-state`` starts from it."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [
            sys.executable,
            str(root / "tools" / "late_state.py"),
            "--transitions",
            "400",
            f"{algo}_mujoco.py",
            "--env-id",
            "Hopper-v5",
            "--total-frames",
            "600",
            "--learning-starts",
            "300",
            "--eval-every",
            "0",
            "--eval-episodes",
            "1",
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=root / "tutorials",
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert f"state={tmp_path / 'state.pt'}" in run.stdout
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert (state["algo"], state["env_id"], state["frames"]) == (algo, "Hopper-v5", 600)
    assert len(state["transitions"]["observation"]) == 400
    steps = {int(entry["step"]) for entries in state["optimisers"] for entry in entries.values()}
    assert steps == ({300} if algo == "sac" else {300, 150})  # TD3: the policy every second step
    ((_, critics, policies),) = update_drift.drift("rlloss", updates=10, every=10, state=state)
    assert critics < 1e-12 and policies < 1e-12, (critics, policies)


def test_late_state_refuses_what_update_drift_cannot_replay(capsys):
    for argv, message in (
        (["ppo_mujoco.py", "--out", "x"], "keeps the state of"),
        (["sac_mujoco.py"], "--out"),
        (["sac_mujoco.py", "--out", "x", "--schedule", "cleanrl"], "one-pass"),
        (["--transitions", "10", "sac_mujoco.py", "--out", "x"], "at least one batch"),
    ):
        with pytest.raises(SystemExit):
            late_state.parse(argv)
        assert message in capsys.readouterr().err, argv
