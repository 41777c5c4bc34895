"""What the tutorials share that is not the subject of a tutorial: their flags, their evaluation
and their plots (each tutorial imports it as ``import _helpers as helpers``). Every tutorial holds
its own environment, collector, networks, loop and update, top to bottom, as CleanRL's files do;
what is here draws no torch random number, so a tutorial's training is the same without it.

Command line
    ``tutorial_parser``: ``--seed``, ``--total-frames``, ``--device``, ``--out`` (a tutorial adds
    its own flags); ``offline_parser``: the offline tutorials' flags; ``evaluation_flags``:
    ``--eval-episodes``, ``--eval-every``, ``--save-actor``; ``start``: seeds torch with
    ``--seed``, one CPU thread, starts the clock.
Evaluation
    ``evaluate`` (full episodes of a deterministic policy on start states no training episode
    had), its policies ``deterministic_action``, ``most_probable_action`` and ``greedy_action``,
    ``Evaluator`` (periodic and final evaluations; ``deterministic_evaluator``).
Plots and report
    ``show_progress`` (the progress bar), ``write_csv``, ``plot_returns``, ``save_learning_curve``
    (``OUT/returns.csv``, ``OUT/eval_returns.csv`` when there are periodic evaluations,
    ``OUT/curve.png``) and ``report``: every tutorial's last lines ``wall_time=...``,
    ``train_return=<mean return of the last 10 finished training episodes>``, for tutorials that
    evaluate their final policy ``eval_return=<mean return of the evaluation episodes>``, and last
    ``final_return=...``: the evaluation mean where there is one, else the training mean.
    ``finish`` does a tutorial's last steps: the learning curve, the final evaluation, the report.
"""

import argparse
import csv
import platform
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

# ---------------------------------------------------------------- command line


def tutorial_parser(doc: str, default_out: str, total_frames: int,
                    frames_help: str = "env steps") -> argparse.ArgumentParser:
    """The flags every tutorial has: ``--seed``, ``--total-frames`` (default ``total_frames``),
    ``--device`` and ``--out`` (default ``default_out``); the description is ``doc``'s first
    line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-frames", type=int, default=total_frames, help=frames_help)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path(default_out))
    return parser


def offline_parser(doc: str, default_out: str) -> argparse.ArgumentParser:
    """The offline tutorials' flags: ``tutorial_parser``'s (``--total-frames`` counts gradient
    steps, 20,000), ``--dataset`` (what ``offline_dataset.py`` wrote), ``--eval-episodes`` and
    ``--eval-every`` (1,000 gradient steps)."""
    parser = tutorial_parser(doc, default_out, total_frames=20_000,
                             frames_help="gradient steps (an offline learner collects no frames)")
    parser.add_argument("--dataset", type=Path, default=Path("runs/pendulum_offline/dataset"),
                        help="written by offline_dataset.py")
    evaluation_flags(parser, every=1_000, unit="gradient steps")
    return parser


def evaluation_flags(parser: argparse.ArgumentParser, every: int | None = None,
                     unit: str = "env steps", save_actor: bool = False) -> None:
    """``--eval-episodes`` (10); with ``every``, ``--eval-every`` too (``every`` ``unit``; 0: only
    the final evaluation) for ``Evaluator``; with ``save_actor``, ``--save-actor PATH`` too."""
    what = "the final deterministic policy" if every is None else "the deterministic policy"
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help=f"episodes of {what}, on unseen start states")
    if every is not None:
        parser.add_argument("--eval-every", type=int, default=every,
                            help=f"{unit} between evaluations of the deterministic policy "
                                 "(OUT/eval_returns.csv; 0: only the final one)")
    if save_actor:
        parser.add_argument("--save-actor", type=Path, default=None,
                            help="also save the trained actor module there "
                                 "(offline_dataset.py uses it)")


def denormal_flag(parser: argparse.ArgumentParser) -> None:
    """``--keep-denormals``: without it, ``flush_denormals(args)`` makes the CPU flush subnormal
    floats to zero (see there)."""
    parser.add_argument("--keep-denormals", action="store_true",
                        help="keep subnormal floats (slow on CPU) instead of flushing them to zero")


def flush_denormals(args: argparse.Namespace) -> bool:
    """Flush subnormal floats (|x| < 1.2e-38) to zero unless ``--keep-denormals``.

    A ReLU unit that stops firing gets zero gradients; Adam's moments of its weights then decay
    (by 0.9 and 0.999 a step) into the subnormal range and stay there, rounding keeping a few
    units of the last place (tests/test_tutorial_helpers.py). Every x86 arithmetic instruction
    on a subnormal is many times slower. Long off-policy runs collect such entries
    (``subnormal_share`` measures them: 11% of Adam's state in a SAC run at 100k steps), at a
    cost of a few percent of the update (``benchmarks/denormals.py``); flushing changes no value
    above 1.2e-38. Returns False where the CPU cannot set the mode (not x86 with SSE3, nor
    AArch64).
    """
    return torch.set_flush_denormal(not args.keep_denormals)


def subnormal_share(optimizers) -> float:
    """The fraction of the floating-point optimiser state (Adam's moments) that is subnormal."""
    subnormal, total = 0, 0
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0:
                    tiny = torch.finfo(value.dtype).tiny
                    subnormal += int(((value != 0) & (value.abs() < tiny)).sum())
                    total += value.numel()
    return subnormal / total if total else 0.0


class UpdateRate:
    """Updates per CPU second of update time over the interval since the previous call."""

    def __init__(self) -> None:
        self.steps, self.seconds = 0, 0.0

    def __call__(self, steps: int, seconds: float) -> float:
        rate = (steps - self.steps) / (seconds - self.seconds) if seconds > self.seconds else 0.0
        self.steps, self.seconds = steps, seconds
        return rate


def package_versions() -> dict[str, str]:
    """Python's and the installed versions of what a run's numbers depend on (a tutorial's
    ``summary.json`` records them: MuJoCo's physics and gymnasium's tasks change across
    releases); a package not installed is left out."""
    versions = {"python": platform.python_version()}
    for package in ("torch", "tensordict", "torchrl", "gymnasium", "mujoco", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


def start(args: argparse.Namespace, one_thread: bool = True) -> tuple[torch.device, float]:
    """Seed torch with ``args.seed`` (network init, exploration, minibatch sampling), use one CPU
    thread unless ``one_thread`` is False (small MLPs: more threads only add synchronisation, and
    thrash), and return the device and the start time."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cpu" and one_thread:
        torch.set_num_threads(1)
    return device, time.perf_counter()


# ---------------------------------------------------------------- evaluation


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


def _observation(observation: np.ndarray, device: torch.device) -> TensorDict:
    return TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32,
                                                  device=device), device=device)


def deterministic_action(actor, device: torch.device, clip_to=None, *,
                         batch_of_one: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """An evaluation policy for ``evaluate``: ``actor``'s deterministic action (its mean, no
    sampling or noise) for an observation array, clipped to the bounds of ``clip_to`` (a TorchRL
    spec) where given. With ``batch_of_one``, the observation goes in as a batch of one with
    ``actor`` in eval mode (normalisation layers read their running statistics, as CrossQ's)."""

    def policy(observation: np.ndarray) -> np.ndarray:
        td = _observation(observation, device)
        was_training = actor.training
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            if batch_of_one:
                actor.eval()
                action = actor(td[None])["action"][0]
                actor.train(was_training)
            else:
                action = actor(td)["action"]
        if clip_to is not None:
            action = action.clamp(clip_to.space.low, clip_to.space.high)
        return action.cpu().numpy()

    return policy


def most_probable_action(actor, device: torch.device) -> Callable[[np.ndarray], int]:
    """An evaluation policy for ``evaluate``: ``argmax_a pi(a|s)`` of a categorical ``actor`` that
    writes ``"logits"`` (no sampling)."""

    def policy(observation: np.ndarray) -> int:
        with torch.no_grad():
            return int(actor(_observation(observation, device))["logits"].argmax(-1))

    return policy


def greedy_action(actor, device: torch.device) -> Callable[[np.ndarray], int]:
    """An evaluation policy for ``evaluate``: the greedy ``"action"`` (an index,
    ``argmax_a Q(s, a)``) of a TorchRL Q-value actor, without exploration."""

    def policy(observation: np.ndarray) -> int:
        with torch.no_grad():
            return int(actor(_observation(observation, device))["action"])

    return policy


class Evaluator:
    """Periodic and final evaluations of a deterministic ``policy`` (an observation array in, an
    env action out) on ``episodes`` start states of ``env_id`` no training episode had (seeded
    from ``seed``; the same ones every time, and no torch random number is drawn, so training
    is the same with or without them). ``maybe(frames)`` evaluates every ``every`` frames
    (``every=0``: never) and keeps ``(frames, mean return)`` in ``evaluations``."""

    def __init__(self, env_id: str, policy: Callable, *, seed: int, episodes: int,
                 every: int) -> None:
        self.env_id, self.policy, self.seed = env_id, policy, seed
        self.episodes, self.every = episodes, every
        self.evaluations: list[tuple[int, float]] = []

    def run(self) -> list[float]:
        """The returns of one evaluation."""
        return evaluate(self.env_id, self.policy, seed=self.seed, episodes=self.episodes)

    def maybe(self, frames: int) -> None:
        if self.every and frames % self.every == 0:
            self.evaluations.append((frames, float(np.mean(self.run()))))

    def print_first_at(self, target: float) -> None:
        """``first_eval_at_target=<frames>``: the first evaluation at or above ``target``."""
        crossed = [frames for frames, ret in self.evaluations if ret >= target]
        print(f"first_eval_at_target={crossed[0] if crossed else 'none'} (target {target:g}, "
              f"evaluated every {self.every} steps)")


def deterministic_evaluator(args: argparse.Namespace, actor, env_id: str,
                            device: torch.device) -> Evaluator:
    """An ``Evaluator`` of ``actor``'s deterministic action (the squashed mean, a batch of one in
    eval mode) on ``env_id``, every ``args.eval_every`` frames, ``args.eval_episodes`` episodes
    on start states seeded ``10_000 + 100 * args.seed, ...``."""
    return Evaluator(env_id, deterministic_action(actor, device, batch_of_one=True),
                     seed=10_000 + 100 * args.seed, episodes=args.eval_episodes,
                     every=args.eval_every)


# ---------------------------------------------------------------- plots and report


def show_progress(pbar, episodes, frames: int, **values: str) -> None:
    """Advance ``pbar`` to ``frames`` and show the mean return of the last 10 episodes and
    ``values``."""
    recent = [episode_return for _, episode_return in episodes[-10:]]
    pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a", **values)
    pbar.update(frames - pbar.n)


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


def save_learning_curve(out: Path, episodes, title: str, evaluations=None, *,
                        xlabel: str = "environment steps", ylabel: str = "episode return",
                        window: int = 20) -> None:
    """``out/returns.csv`` (a row ``frames, episode_return`` per finished episode), with
    ``evaluations`` (rows ``frames, mean evaluation return``) ``out/eval_returns.csv``, and
    ``out/curve.png`` (the returns, their running mean over ``window`` episodes and the
    evaluations, titled ``title``)."""
    write_csv(out / "returns.csv", ["frames", "episode_return"], episodes)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    plot_returns(ax, episodes, window)
    if evaluations is not None:
        write_csv(out / "eval_returns.csv", ["frames", "eval_return"], evaluations)
        if evaluations:
            ax.plot(*np.array(evaluations).T, "o-", label="evaluation (deterministic)")
            ax.legend()
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    fig.savefig(out / "curve.png", dpi=100, bbox_inches="tight")


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


def finish(args: argparse.Namespace, start_time: float, episodes, title: str, *,
           env_id: str | None = None, policy: Callable | None = None,
           evaluator: Evaluator | None = None, actor=None, target: float | None = None,
           evaluations=None, plot: bool = True, **curve: Any) -> list[float] | None:
    """A tutorial's last lines: ``save_learning_curve(args.out, episodes, title, evaluations,
    **curve)`` (the ``evaluator``'s evaluations if given); the final policy's evaluation:
    ``evaluator.run()``, or with ``policy`` (deterministic, an observation array in and an
    ``env_id`` action out) ``args.eval_episodes`` episodes on start states seeded
    ``10_000 + 100 * args.seed, ...`` (no training episode had them); with ``plot=False`` only
    ``OUT/returns.csv`` (the tutorial draws its own figure); ``actor`` saved to
    ``args.save_actor`` if that flag is set; ``first_eval_at_target=`` if ``target`` is given;
    then ``report``. Returns the evaluation returns (None without evaluation)."""
    if evaluator is not None:
        evaluations = evaluator.evaluations
    if plot:
        save_learning_curve(args.out, episodes, title, evaluations, **curve)
    else:  # the tutorial draws its own OUT/curve.png
        write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)
    eval_returns = None
    if evaluator is not None:
        eval_returns = evaluator.run()
    elif policy is not None:
        eval_returns = evaluate(env_id, policy, seed=10_000 + 100 * args.seed,
                                episodes=args.eval_episodes)
    if actor is not None and getattr(args, "save_actor", None) is not None:
        torch.save(actor, args.save_actor)
    if target is not None:
        evaluator.print_first_at(target)
    report(start_time, episodes, eval_returns)
    return eval_returns
