"""The learning benchmark's tasks: one tutorial run each, with a frame budget, a target on the
final return and a published reference."""

from __future__ import annotations

from dataclasses import dataclass

RL_ZOO = "rl-baselines3-zoo"  # benchmark.md: one training run each, deterministic evaluation


@dataclass(frozen=True)
class Task:
    """One tutorial run: its script, extra arguments, frame budget, target and reference."""

    script: str
    extra_args: tuple[str, ...]
    total_frames: int
    target: float
    reference: str


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
}
