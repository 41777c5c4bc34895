"""The learning benchmark's tasks: one tutorial run each, with a frame budget, a target on the
final return and a published reference."""

from __future__ import annotations

from dataclasses import dataclass

RL_ZOO = "rl-baselines3-zoo"  # benchmark.md: one training run each, deterministic evaluation


@dataclass(frozen=True)
class Task:
    """One tutorial run: its script, extra arguments, frame budget, target and reference;
    ``prepare``: a tutorial command (script and arguments, run from the repository root) that
    must have run once before the task's runs, skipped when the path ``prepared`` exists (the
    offline tasks' dataset)."""

    script: str
    extra_args: tuple[str, ...]
    total_frames: int
    target: float
    reference: str
    prepare: tuple[str, ...] = ()
    prepared: str | None = None


# The offline tasks learn from one dataset (tutorials/offline_dataset.py, seed 0: SAC after
# 3,000 steps, 50,000 transitions, mean return -839.2 +- 110.1); their target is to beat its
# mean (and behaviour cloning, the bc_offline task, on the same data).
OFFLINE_DIR = "runs/pendulum_offline"
OFFLINE_DATASET_MEAN = -839.2
OFFLINE = {
    "prepare": ("offline_dataset.py", "--seed", "0", "--out", OFFLINE_DIR),
    "prepared": f"{OFFLINE_DIR}/dataset",
}
OFFLINE_REFERENCE = (
    "the dataset's mean return -839.2 +- 110.1; behaviour cloning (bc_offline) -797.6, -812.0, "
    "-851.8 on seeds 0-2 (benchmarks/results/offline.json)"
)


TASKS: dict[str, Task] = {
    "ppo_cartpole": Task(
        "ppo_cartpole.py", (), 100_000, 475.0, f"{RL_ZOO} PPO: 500.0 +- 0.0 at 100k"
    ),
    "klpen_cartpole": Task(
        "klpen_cartpole.py",
        (),
        150_000,
        475.0,
        f"none for KLPEN; {RL_ZOO} clipped PPO: 500.0 +- 0.0 at 100k",
    ),
    "torchrl_pipeline": Task(
        "torchrl_pipeline.py", (), 100_000, 475.0, f"{RL_ZOO} PPO: 500.0 +- 0.0 at 100k"
    ),
    "recurrent_ppo_cartpole": Task(
        "recurrent_ppo_cartpole.py",
        (),
        150_000,
        475.0,
        "not looked up for RecurrentPPO on CartPoleNoVel-v1 (rl-baselines3-zoo's ppo_lstm.yml "
        "trains it for 100k)",
    ),
    "recurrent_ppo_cartpole_no_rnn": Task(
        "recurrent_ppo_cartpole.py",
        ("--no-rnn",),
        150_000,
        475.0,
        "the feed-forward baseline of recurrent_ppo_cartpole: not expected to reach the target",
    ),
    "rpo_pendulum": Task(
        "rpo_pendulum.py",
        (),
        300_000,
        -250.0,
        f"none for RPO; {RL_ZOO} PPO: -172.2 +- 104.2 at 100k",
    ),
    "a2c_cartpole": Task(
        "a2c_cartpole.py", (), 500_000, 475.0, f"{RL_ZOO} A2C: 500.0 +- 0.0 at 500k"
    ),
    "reinforce_cartpole": Task(
        "reinforce_cartpole.py",
        (),
        500_000,
        475.0,
        f"none for REINFORCE; {RL_ZOO} A2C: 500.0 +- 0.0 at 500k",
    ),
    "dqn_cartpole": Task(
        "dqn_cartpole.py", (), 50_000, 475.0, f"{RL_ZOO} DQN: 500.0 +- 0.0 at 50k"
    ),
    "c51_cartpole": Task(
        "c51_cartpole.py", (), 50_000, 475.0, f"none for C51; {RL_ZOO} DQN: 500.0 +- 0.0 at 50k"
    ),
    "sac_pendulum": Task(
        "sac_pendulum.py", (), 20_000, -200.0, f"{RL_ZOO} SAC: -157.0 +- 88.7 at 20k"
    ),
    "redq_pendulum": Task(
        "redq_pendulum.py",
        (),
        20_000,
        -200.0,
        f"none for REDQ; {RL_ZOO} SAC: -157.0 +- 88.7 at 20k",
    ),
    "tqc_pendulum": Task(
        "tqc_pendulum.py",
        (),
        20_000,
        -200.0,
        f"not looked up for TQC; {RL_ZOO} SAC: -157.0 +- 88.7 at 20k",
    ),
    "crossq_pendulum": Task(
        "crossq_pendulum.py",
        (),
        20_000,
        -200.0,
        f"none for CrossQ; {RL_ZOO} SAC: -157.0 +- 88.7 at 20k",
    ),
    "td3_pendulum": Task(
        "td3_pendulum.py", (), 20_000, -200.0, f"{RL_ZOO} TD3: -151.9 +- 90.2 at 20k"
    ),
    "ddpg_pendulum": Task(
        "td3_pendulum.py", ("--ddpg",), 20_000, -200.0, f"{RL_ZOO} DDPG: -152.1 +- 94.3 at 20k"
    ),
    "mpo_pendulum": Task(
        "mpo_pendulum.py", (), 30_000, -200.0, "none found for MPO on Pendulum-v1"
    ),
    "mpo_cartpole": Task(
        "mpo_cartpole.py", (), 100_000, 475.0, "none found for categorical MPO on CartPole-v1"
    ),
    **{
        name: Task(
            f"{name}.py",
            ("--dataset", OFFLINE["prepared"]),
            20_000,  # gradient steps: an offline learner collects no frames
            OFFLINE_DATASET_MEAN,
            OFFLINE_REFERENCE,
            **OFFLINE,
        )
        for name in ("iql_offline", "cql_offline", "td3bc_offline", "bc_offline")
    },
}
