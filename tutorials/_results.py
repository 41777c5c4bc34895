"""What every tutorial writes at the end: ``returns.csv``, the learning curve, and the last lines
``wall_time=...``, ``train_return=<mean return of the last 10 finished training episodes>``, for
tutorials that evaluate their final policy ``eval_return=<mean return of the evaluation
episodes>``, and last ``final_return=...``: the evaluation mean where there is one, else the
training mean."""

import csv
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed


def write_csv(path: Path, header: list[str], rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def plot_returns(ax, episodes, window: int = 20) -> None:
    """Episode returns (dots) and their running mean on ``ax``; ``episodes`` holds
    ``(frames, episode_return)`` rows."""
    if not len(episodes):
        return
    x, y = np.array(episodes, dtype=float).reshape(-1, 2).T
    window = max(1, min(window, len(y)))
    ax.plot(x, y, ".", alpha=0.3, label="episode return")
    ax.plot(x[window - 1:], np.convolve(y, np.ones(window) / window, "valid"),
            label=f"running mean ({window} episodes)")
    ax.legend()


def save_learning_curve(out: Path, episodes, title: str) -> None:
    """``out/returns.csv`` (a row ``frames, episode_return`` per finished episode) and
    ``out/curve.png`` (those returns and their running mean, titled ``title``)."""
    write_csv(out / "returns.csv", ["frames", "episode_return"], episodes)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    plot_returns(ax, episodes)
    ax.set(xlabel="environment steps", ylabel="episode return", title=title)
    fig.savefig(out / "curve.png", dpi=100, bbox_inches="tight")


def evaluate(env_id: str, policy: Callable, *, seed: int, episodes: int = 10) -> list[float]:
    """Returns of ``episodes`` full episodes of ``policy`` (an observation array in, an env action
    out; the caller makes it deterministic) on a fresh ``env_id`` environment whose resets are
    seeded ``seed, seed + 1, ...``: states no training episode was scored on."""
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        episode_return, finished = 0.0, False
        while not finished:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            episode_return += float(reward)
            finished = terminated or truncated
        returns.append(episode_return)
    env.close()
    return returns


def report(start_time: float, episodes, eval_returns: list[float] | None = None) -> None:
    """Print the wall time, the mean return of the last 10 finished training episodes, the mean
    evaluation return if given, and last ``final_return``: the evaluation mean if given, else the
    training mean."""
    recent = [episode_return for _, episode_return in episodes[-10:]]
    train_return = np.mean(recent) if recent else float("nan")
    print(f"wall_time={time.perf_counter() - start_time:.1f}s")
    print(f"train_return={train_return:.1f}")
    if eval_returns is not None:
        print(f"eval_return={np.mean(eval_returns):.1f}")
    final = np.mean(eval_returns) if eval_returns is not None else train_return
    print(f"final_return={final:.1f}")
