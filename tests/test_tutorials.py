"""Every tutorial runs end to end on a tiny budget and keeps its output contract: a CSV of
episode returns, a PNG, and a last line ``final_return=...``. The compile tutorial trains
nothing: it has its own contract (``updates_per_second=...``, compiled losses equal to eager).
The policy-gradient tutorials also run with TorchRL's losses swapped in, as
``tools/tutorial_runs.py`` runs them.

Each run is a subprocess of several seconds to a minute, so all but two are marked ``slow``
(run by CI and by ``--runslow``): the default run keeps the README's PPO tutorial (on-policy)
and the DQN tutorial (off-policy, replay buffer, evaluation)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from tutorial_process import swap_to_torchrl  # noqa: E402

SLOW = pytest.mark.slow

TUTORIALS_DIR = Path(__file__).resolve().parents[1] / "tutorials"
COMPILE_TUTORIAL = TUTORIALS_DIR / "compile_and_cudagraphs.py"
TUTORIALS = sorted(p for p in TUTORIALS_DIR.glob("[!_]*.py") if p != COMPILE_TUTORIAL)
# The offline tutorials learn from the dataset offline_dataset.py writes (made once, small).
OFFLINE_DATASET = TUTORIALS_DIR / "offline_dataset.py"
OFFLINE = {"bc_offline", "cql_offline", "iql_offline", "td3bc_offline", "dt_offline"}
# Online imitation from the same dataset (the expert pairs only; evaluated once at the end).
IMITATION = {"gail_pendulum"}
# The SAC-family tutorials also log periodic greedy evaluations.
SAC_FAMILY = {"sac_pendulum", "redq_pendulum", "tqc_pendulum", "crossq_pendulum"}
# Tutorials whose TorchRL swap (tools/tutorial_process.py) must play the very same episodes.
SWAP_IDENTICAL = ["a2c_cartpole", "reinforce_cartpole"]


def _caller_pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def tutorial_env() -> dict[str, str]:
    """One thread, no display, torchrun's processes on the loopback, and on the path the
    tutorials' helper module (_helpers.py) for scripts outside tutorials/, a checkout's
    rlloss where PYTHONPATH names one, and the run's inductor cache where one is set."""
    env = {
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
        "MPLBACKEND": "Agg",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join([str(TUTORIALS_DIR), *_caller_pythonpath()]),
    }
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        env["TORCHINDUCTOR_CACHE_DIR"] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    return env


def run_tutorial(
    script: Path, out: Path, *args: str, frames: int = 2048, launcher: tuple[str, ...] = ()
) -> str:
    """Run ``script`` on a tiny budget (through ``python -m <launcher>`` if given) and check its
    output contract; return its standard output."""
    result = subprocess.run(
        [sys.executable, *launcher, str(script), "--total-frames", str(frames), "--seed", "1"]
        + ["--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=tutorial_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    assert last_line.startswith("final_return="), result.stdout[-2000:]
    float(last_line.split("=", 1)[1])  # a number (nan when no episode finished)
    assert (out / "returns.csv").read_text().startswith("frames,episode_return")
    assert (out / "curve.png").stat().st_size > 1000
    return result.stdout


@pytest.fixture(scope="session")
def offline_dataset(tmp_path_factory) -> Path:
    """A small dataset (SAC trained for 1,100 steps, 2,000 transitions: one whole 200-step
    episode of each of the 10 environments, which dt_offline.py cuts the dataset into), the
    smoke test of offline_dataset.py itself."""
    out = tmp_path_factory.mktemp("offline")
    run_tutorial(OFFLINE_DATASET, out, "--agent-frames", "1100", frames=2000)
    return out / "dataset"


# Smoke budgets (frames; gradient steps for the offline tutorials): the off-policy tutorials on
# Pendulum act at random for their first 1,000 steps, so 1,280 frames give 280 updates; the
# offline learners take a few hundred updates (CQL's penalty evaluates 30 actions per state: 0.15 s
# an update on one CPU thread). The rest run 2,048 frames.
SMOKE_FRAMES = {
    **dict.fromkeys(SAC_FAMILY | {"td3_pendulum", "mpo_pendulum", "compose_losses"}, 1280),
    **dict.fromkeys(OFFLINE, 256),
    "cql_offline": 128,
    "dt_offline": 64,  # a transformer step, and each evaluation episode 200 transformer calls
    "mappo_vmas": 6000,  # one iteration: 60 VMAS environments x 100 steps
    "grpo_tiny_transformer": 256,  # sampled completions: two GRPO updates (after 20 SFT steps)
    "dpo_tiny_transformer": 64,  # preference pairs: two DPO steps (after 2 SFT steps)
    "dreamer_pointmass": 200,  # 4 episodes (2 random): 2 world-model + 3 DreamerV3 updates
}
# The MuJoCo tutorials: PPO's smoke is one 2,048-step rollout and its 320 updates; SAC's and
# TD3's act at random for 300 steps, then make 300 updates.
MUJOCO = {"ppo_mujoco": 2048, "sac_mujoco": 600, "td3_mujoco": 600}
SMOKE_FRAMES.update(MUJOCO)
# Extra flags of a tutorial's smoke run.
SMOKE_ARGS = {
    "dpo_tiny_transformer": ["--sft-steps", "2"],
    "dreamer_pointmass": ["--train-every", "50", "--pretrain", "2", "--prefill", "100",
                          "--eval-episodes", "2"],
    **dict.fromkeys(MUJOCO, ["--eval-episodes", "2"]),
    **dict.fromkeys(["sac_mujoco", "td3_mujoco"],
                    ["--eval-episodes", "2", "--learning-starts", "300"]),
}
# Tutorials that need an optional extra: the module it installs and the extra.
NEEDS_EXTRA = {
    "mappo_vmas": ("vmas", "marl"),
    "grpo_tiny_transformer": ("transformers", "llm"),
    "dpo_tiny_transformer": ("transformers", "llm"),
}


# The smokes of the default run; the others are slow.
DEFAULT_RUN_SMOKES = {"ppo_cartpole", "dqn_cartpole"}


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(path, id=path.stem, marks=[] if path.stem in DEFAULT_RUN_SMOKES else [SLOW])
        for path in TUTORIALS
    ],
)
def test_tutorial_smoke(script, tmp_path, request):
    if script == OFFLINE_DATASET:
        request.getfixturevalue("offline_dataset")
        return
    if script.stem in NEEDS_EXTRA:
        module, extra = NEEDS_EXTRA[script.stem]
        pytest.importorskip(module, reason=f"pip install '.[{extra}]'")
    frames = SMOKE_FRAMES.get(script.stem, 2048)
    eval_every = frames // 2
    extra = []
    if script.stem in OFFLINE | IMITATION:
        extra = ["--dataset", str(request.getfixturevalue("offline_dataset"))]
    if script.stem in IMITATION:
        extra += ["--eval-episodes", "2"]
    if script.stem in OFFLINE | SAC_FAMILY:
        extra += ["--eval-every", str(eval_every), "--eval-episodes", "2"]
    extra += SMOKE_ARGS.get(script.stem, [])
    run_tutorial(script, tmp_path, *extra, frames=frames)
    if script.stem in SAC_FAMILY:
        rows = (tmp_path / "eval_returns.csv").read_text().splitlines()
        assert rows[0] == "frames,eval_return" and rows[1].startswith(f"{eval_every},"), rows
        assert len(rows) == 3, rows  # halfway and at the end


@SLOW
@pytest.mark.parametrize("stem", sorted(MUJOCO))
def test_mujoco_tutorial_with_torchrls_losses(stem, tmp_path):
    """``--losses torchrl`` runs the same loop with TorchRL's classes and writes the summary the
    Results page is made from."""
    script = TUTORIALS_DIR / f"{stem}.py"
    run_tutorial(script, tmp_path, "--losses", "torchrl", *SMOKE_ARGS[stem], frames=MUJOCO[stem])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["losses"] == "torchrl" and summary["frames"] == MUJOCO[stem], summary
    updates = summary.get("gradient_steps", summary.get("updates"))
    expected = 320 if stem == "ppo_mujoco" else 300
    assert updates == expected, summary
    versions = summary["versions"]  # what the numbers depend on, recorded with them
    assert versions["torchrl"] == importlib.metadata.version("torchrl"), versions
    assert {"python", "torch", "tensordict", "gymnasium", "mujoco"} <= versions.keys(), versions


@SLOW
def test_sac_mujoco_compiled_update(tmp_path):
    """``sac_mujoco.py --compile`` (the Results page's compiled twin) makes its updates through
    ``compile_update`` and records the run as the compiled variant (about a minute: one cold
    compile)."""
    script = TUTORIALS_DIR / "sac_mujoco.py"
    run_tutorial(script, tmp_path, "--compile", *SMOKE_ARGS["sac_mujoco"],
                 frames=MUJOCO["sac_mujoco"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["variant"] == "compiled" and summary["updates"] == 300, summary
    assert math.isfinite(summary["final_eval_return"]), summary


@SLOW
@pytest.mark.parametrize("losses", ["rlloss", "torchrl"])
def test_sac_mujoco_cleanrl_schedule(losses, tmp_path):
    """``sac_mujoco.py --schedule cleanrl`` steps the critics once per update and the policy and
    the temperature twice every second step, with either library's ``SACLoss``: 301 updates
    (steps 301 to 601, 150 of them even) make 301 critic steps and 300 policy and temperature
    steps, where the one-pass schedule makes 301 of each."""
    script = TUTORIALS_DIR / "sac_mujoco.py"
    expected = {"cleanrl": {"qvalue": 301, "actor": 300, "alpha": 300},
                "one-pass": {"qvalue": 301, "actor": 301, "alpha": 301}}
    for schedule, steps in expected.items():
        out = tmp_path / schedule
        run_tutorial(script, out, "--schedule", schedule, "--losses", losses,
                     *SMOKE_ARGS["sac_mujoco"], frames=601)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["adam_steps"] == steps and summary["updates"] == 301, summary
        assert summary["variant"] == ("cleanrl schedule" if schedule == "cleanrl" else "")


@SLOW
@pytest.mark.parametrize("stem", SWAP_IDENTICAL)
def test_torchrl_swap_plays_the_same_episodes(stem, tmp_path):
    """The script with its ``from rlloss import`` line importing TorchRL's losses and estimator
    runs, and on a tiny budget (same seed) plays the same episodes as with rlloss's."""
    swap = swap_to_torchrl((TUTORIALS_DIR / f"{stem}.py").read_text())
    assert swap["ok"], swap
    swapped = tmp_path / f"torchrl_{stem}.py"
    swapped.write_text(swap["source"])
    run_tutorial(TUTORIALS_DIR / f"{stem}.py", tmp_path / "rlloss")
    run_tutorial(swapped, tmp_path / "torchrl")
    rlloss_returns = (tmp_path / "rlloss" / "returns.csv").read_text()
    assert rlloss_returns.count("\n") > 10  # episodes finished
    assert (tmp_path / "torchrl" / "returns.csv").read_text() == rlloss_returns


@SLOW
@pytest.mark.parametrize(
    "flags", [["--variant", "simpo"], ["--loss-type", "robust"]], ids=["simpo", "robust"]
)
def test_dpo_tutorial_variants(flags, tmp_path):
    """``dpo_tiny_transformer.py --variant simpo`` (SimPOLoss) and ``--loss-type robust``
    train end to end and print the preference accuracy and the rewards after SFT and after the
    preference phase, each in [0, 1]."""
    pytest.importorskip("transformers", reason="pip install '.[llm]'")
    script = TUTORIALS_DIR / "dpo_tiny_transformer.py"
    stdout = run_tutorial(script, tmp_path, "--sft-steps", "2", *flags, frames=64)
    values = dict(
        line.split("=", 1)
        for line in stdout.splitlines()
        if "_reward=" in line or "_accuracy=" in line
    )
    names = {
        f"{phase}_{name}"
        for phase in ("sft", "dpo")
        for name in ("preference_accuracy", "reward", "greedy_reward")
    }
    assert set(values) == names
    assert all(0.0 <= float(v) <= 1.0 for v in values.values()), values


@SLOW
@pytest.mark.parametrize("variant", ["drgrpo", "gspo"])
def test_grpo_tutorial_variants(variant, tmp_path):
    """``grpo_tiny_transformer.py --variant drgrpo|gspo`` (DrGRPOLoss, GSPOLoss) trains end to
    end and prints the reward after SFT and after GRPO, each a mean reward in [0, 1]."""
    pytest.importorskip("transformers", reason="pip install '.[llm]'")
    stdout = run_tutorial(
        TUTORIALS_DIR / "grpo_tiny_transformer.py",
        tmp_path,
        "--variant",
        variant,
        "--sft-steps",
        "2",
        frames=128,
    )
    values = dict(line.split("=", 1) for line in stdout.splitlines() if "_reward=" in line)
    assert set(values) == {"sft_reward", "sft_greedy_reward", "grpo_reward", "grpo_greedy_reward"}
    assert all(0.0 <= float(v) <= 1.0 for v in values.values()), values


@SLOW
def test_grpo_tutorial_swaps_to_torchrl(tmp_path):
    """The swap rewrites the GRPO tutorial's ``from rlloss import GRPOLoss, SFTLoss`` to
    ``torchrl.objectives.llm`` (TorchRL has no Dr. GRPO or GSPO: those imports stay rlloss's),
    and the swapped script trains end to end with TorchRL's losses."""
    pytest.importorskip("transformers", reason="pip install '.[llm]'")
    swap = swap_to_torchrl((TUTORIALS_DIR / "grpo_tiny_transformer.py").read_text())
    assert swap["ok"], swap
    assert swap["imports"] == [
        [
            "from rlloss import GRPOLoss, SFTLoss",
            "from torchrl.objectives.llm import GRPOLoss, SFTLoss",
        ]
    ]
    assert "from rlloss.llm import DrGRPOLoss, GSPOLoss" in swap["kept"]
    swapped = tmp_path / "torchrl_grpo_tiny_transformer.py"
    swapped.write_text(swap["source"])
    run_tutorial(swapped, tmp_path / "torchrl", "--sft-steps", "2", frames=128)


@SLOW
def test_compile_tutorial_smoke(tmp_path):
    """A compiled SAC update gives the eager losses and runs without recompiling (about 50 s
    with an empty inductor cache on a small CPU, 15 s with a warm one)."""
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
        env=tutorial_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    assert last_line.startswith("updates_per_second="), result.stdout[-2000:]
    float(last_line.split("=", 1)[1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["max_loss_difference"] < 1e-4
    assert summary["recompiles_while_timed"] == 0
    assert (tmp_path / "updates_per_second.csv").read_text().startswith("mode,updates_per_second")


@SLOW
def test_dqn_tutorial_with_prioritized_replay(tmp_path):
    """``dqn_cartpole.py --per`` (rlloss.data.PrioritizedSampler) trains end to end."""
    run_tutorial(TUTORIALS_DIR / "dqn_cartpole.py", tmp_path, "--per")


@SLOW
def test_ppo_ddp_tutorial_on_two_processes(tmp_path):
    """``ppo_ddp.py`` under ``torchrun --standalone --nproc_per_node 2`` (gloo, loopback) trains
    end to end with 2 ranks, each stepping 4 of the 8 environments."""
    stdout = run_tutorial(
        TUTORIALS_DIR / "ppo_ddp.py",
        tmp_path,
        frames=1024,
        launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"),
    )
    assert "processes=2" in stdout.splitlines(), stdout[-2000:]


@SLOW
def test_recurrent_ppo_tutorial_feed_forward_and_rpo(tmp_path):
    """``recurrent_ppo_cartpole.py --no-rnn`` (the feed-forward baseline) trains end to end;
    ``--rpo-alpha`` stops with RPOLoss's reason: CartPole's policy is categorical, RPO perturbs
    a continuous location."""
    script = TUTORIALS_DIR / "recurrent_ppo_cartpole.py"
    run_tutorial(script, tmp_path, "--no-rnn", frames=512)
    result = subprocess.run(
        [sys.executable, str(script), "--rpo-alpha", "0.5", "--out", str(tmp_path / "rpo")],
        capture_output=True,
        text=True,
        timeout=600,
        env=tutorial_env(),
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--rpo-alpha: RPOLoss perturbs the 'loc'" in result.stderr
    assert "RPO's noise is defined for continuous actions" in result.stderr


@SLOW
def test_ppo_rnd_tutorial_without_rnd_and_with_torchrls_classes(tmp_path):
    """``ppo_rnd_sparse.py --no-rnd`` (plain PPO, the baseline) trains end to end, and the
    script swapped to TorchRL's ``GAE``, ``ClipPPOLoss`` and ``RNDLoss`` runs with RND (the
    reward normaliser stays rlloss's: TorchRL has none)."""
    script = TUTORIALS_DIR / "ppo_rnd_sparse.py"
    run_tutorial(script, tmp_path / "ppo", "--no-rnd")
    swap = swap_to_torchrl(script.read_text())
    assert swap["ok"], swap
    assert swap["kept"] == ["from rlloss.training import RewardNormalizer"], swap
    swapped = tmp_path / "torchrl_ppo_rnd_sparse.py"
    swapped.write_text(swap["source"])
    run_tutorial(swapped, tmp_path / "torchrl")


@SLOW
def test_ppo_rnd_tutorial_on_deep_sea(tmp_path):
    """``ppo_rnd_sparse.py --task deepsea --size 6`` trains end to end, and every episode's
    return is Deep Sea's: minus 0.01 / N per "right" taken (k of N steps), plus 1 only when all
    N were "right" (return 0.99)."""
    size = 6
    script = TUTORIALS_DIR / "ppo_rnd_sparse.py"
    run_tutorial(script, tmp_path, "--task", "deepsea", "--size", str(size))
    lines = (tmp_path / "returns.csv").read_text().splitlines()[1:]
    returns = [float(line.split(",")[1]) for line in lines]
    assert len(returns) == 16 * (128 // size)  # 16 envs, 128 steps, every episode N steps
    allowed = [-0.01 * k / size for k in range(size + 1)] + [1.0 - 0.01]
    for value in returns:
        assert min(abs(value - a) for a in allowed) < 1e-9, value


def _printed(stdout: str, name: str) -> float:
    """The number a tutorial printed as ``name=<number> ...``."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"{name}=")]
    assert lines, stdout[-2000:]
    return float(lines[-1].split("=", 1)[1].split()[0])


@SLOW
def test_pilco_planning_reaches_the_target(tmp_path):
    """``pilco_planning.py``: receding-horizon planning on the expected saturating cost
    (``ExponentialQuadraticCost``) of a fitted linear-Gaussian model ends within 0.1 of the
    target and scores above the random actions and the open-loop plan, with rlloss's cost and
    with TorchRL's swapped in."""
    script = TUTORIALS_DIR / "pilco_planning.py"
    swap = swap_to_torchrl(script.read_text())
    assert swap["ok"] and swap["kept"] == [], swap
    swapped = tmp_path / "torchrl_pilco_planning.py"
    swapped.write_text(swap["source"])
    for path, out in ((script, tmp_path / "rlloss"), (swapped, tmp_path / "torchrl")):
        stdout = run_tutorial(path, out, "--episodes", "4", frames=500)
        assert _printed(stdout, "model_error") < 0.05
        assert _printed(stdout, "final_distance") < 0.1
        final = _printed(stdout, "final_return")
        assert final > _printed(stdout, "open_loop_return") > _printed(stdout, "random_return")


@SLOW
def test_dreamer_tutorial_swaps_to_torchrl(tmp_path):
    """``dreamer_pointmass.py`` with TorchRL's DreamerV3 losses and ``SoftUpdate`` swapped in
    (the comparison of its docstring) trains end to end on the smoke budget."""
    swap = swap_to_torchrl((TUTORIALS_DIR / "dreamer_pointmass.py").read_text())
    assert swap["ok"] and swap["kept"] == [], swap
    swapped = tmp_path / "torchrl_dreamer_pointmass.py"
    swapped.write_text(swap["source"])
    stdout = run_tutorial(swapped, tmp_path, *SMOKE_ARGS["dreamer_pointmass"], frames=200)
    assert "updates=5 " in stdout, stdout[-2000:]
@SLOW
def test_dt_tutorial_prompted_on_a_mixed_dataset(tmp_path):
    """``offline_dataset.py`` with two behaviour policies (uniform actions, then SAC after 1,100
    steps) writes each one's mean return; ``dt_offline.py`` on that dataset is prompted with each
    of them (``return_at_target[...]=``) and by default targets the better one."""
    data = tmp_path / "mixed"
    run_tutorial(OFFLINE_DATASET, data, "--agent-frames", "0", "1100", frames=4000)
    policies = json.loads((data / "dataset.json").read_text())["policies"]
    assert [p["agent_frames"] for p in policies] == [0, 1100]
    assert [p["episodes"] for p in policies] == [10, 10]
    stdout = run_tutorial(TUTORIALS_DIR / "dt_offline.py", tmp_path / "dt", "--dataset",
                          str(data / "dataset"), "--eval-every", "8", "--eval-episodes", "2",
                          frames=8)
    prompted = [line for line in stdout.splitlines() if line.startswith("return_at_target[")]
    targets = sorted(p["mean_return"] for p in policies)
    assert [float(line[17:].split("]")[0]) for line in prompted] == pytest.approx(targets, abs=0.05)
    assert f"target_return={targets[-1]:.1f}" in stdout
