"""What the tutorials share that is not the subject of a tutorial: the one module they import
(as ``import _helpers as helpers``) besides rlloss, TorchRL and the usual libraries. Each tutorial
builds its own losses (and, where they are its subject, its networks); these are the plumbing
around them, and the loops that several tutorials of one family run alike.

Command line and set-up
    ``tutorial_parser``: ``--seed``, ``--total-frames``, ``--device``, ``--out`` (a tutorial adds
    its own flags), ``offline_parser`` (the offline tutorials' flags); ``start``: seeds torch,
    one CPU thread, starts the clock.
Environments and collection
    ``make_vec`` (``discrete_vec``: with the observation dim and the number of actions) and
    ``VectorCollector`` (several gymnasium environments stepped together, transitions as
    TensorDicts with the true successor state), ``start_collection`` (a collector, the number of
    iterations and a progress bar); ``EnvStepper`` (the same for one environment stepped one
    action at a time; ``make_stepper``: with its action spec and dims), ``bounded_spec``,
    ``env_spec``; ``replay_memory`` (a TorchRL replay buffer on the training device).
Behaviour and evaluation policies
    ``act``, ``sample_from``, ``sample_action``, ``gaussian_exploration``, ``epsilon_greedy``
    (with ``linear_epsilon``; ``collect_epsilon_greedy``: the DQN family's acting phase);
    ``most_probable_action``, ``greedy_action``, ``deterministic_action``.
Loops and updates
    ``off_policy_loop``: the Pendulum off-policy tutorials' act / store / update / evaluate loop,
    one environment step a frame, calling the tutorial's own ``update(minibatch)``;
    ``gradient_epochs``: the on-policy tutorials' optimisation of a rollout (PPO's epochs of
    minibatches, A2C's single step), each step on the sum of the loss's ``"loss_*"`` outputs.
Networks
    ``categorical_actor_critic`` (the CartPole policy-gradient tutorials; ``state_value_critic``,
    its V(s)), ``mlp`` (optionally with a normalisation layer before every linear layer,
    CrossQ's placement), ``tanh_normal_actor``, ``tanh_deterministic_actor`` and ``q_critic``
    (the Pendulum off-policy and offline tutorials), ``eval_mode``.
Offline data
    ``OfflineDataset``: the transitions ``offline_dataset.py`` writes, observations standardised,
    sampled in minibatches with periodic evaluations (``training_steps``).
Results
    ``evaluation_flags`` and ``Evaluator`` (periodic and final evaluations;
    ``deterministic_evaluator``), ``show_progress`` (``alpha_postfix``), ``evaluate`` (full
    episodes of a deterministic policy on unseen start states), ``save_learning_curve``
    (``OUT/returns.csv``, ``OUT/eval_returns.csv`` when there are periodic evaluations,
    ``OUT/curve.png``) and ``report``: every tutorial's last lines ``wall_time=...``,
    ``train_return=<mean return of the last 10 finished training episodes>``, for tutorials that
    evaluate their final policy ``eval_return=<mean return of the evaluation episodes>``, and last
    ``final_return=...``: the evaluation mean where there is one, else the training mean.
    ``finish`` does a tutorial's last steps: the learning curve, the final evaluation, the report.
The tutorials of one family
    Each tutorial still builds its networks, its loss and its optimizer and says what its loop
    does; these run what the family's tutorials would otherwise each write again.
    ``SoftActorCriticPendulum`` (with ``soft_actor_critic_parser`` and
    ``soft_actor_critic_update``): the SAC family on Pendulum-v1 (``sac_pendulum.py``,
    ``redq_pendulum.py``, ``tqc_pendulum.py``, ``crossq_pendulum.py``): set-up, the loop's
    settings, the update on the sum of ``loss_qvalue``, ``loss_actor`` and ``loss_alpha``,
    evaluation and report. ``DQNCartPole``: the DQN family on CartPole-v1 (``dqn_cartpole.py``,
    ``c51_cartpole.py``): set-up, the epsilon-greedy loop and its settings, the clipped gradient
    step and target update, evaluation and report. ``OfflineRun``: the offline tutorials
    (``bc_offline.py``, ``cql_offline.py``, ``iql_offline.py``, ``td3bc_offline.py``): flags,
    set-up, the dataset's minibatches with periodic evaluations, the last steps.
    ``mpo_optimisation`` and ``save_dual_diagnostics``: the MPO tutorials' (``mpo_pendulum.py``,
    ``mpo_cartpole.py``) optimiser, update and figure of duals and KLs.
"""

import argparse
import contextlib
import csv
import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhModule, TanhNormal, ValueOperator
from tqdm import tqdm

# ---------------------------------------------------------------- command line and set-up


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


def start(args: argparse.Namespace, one_thread: bool = True) -> tuple[torch.device, float]:
    """Seed torch with ``args.seed`` (network init, exploration, minibatch sampling), use one CPU
    thread unless ``one_thread`` is False (small MLPs: more threads only add synchronisation, and
    thrash), and return the device and the start time."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cpu" and one_thread:
        torch.set_num_threads(1)
    return device, time.perf_counter()


# ---------------------------------------------------------------- environments and collection


def make_vec(env_id: str, num_envs: int, wrappers: tuple = ()) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` with SAME_STEP autoreset: when an episode ends, step()
    returns the first observation of the next one and puts the true last observation in
    ``infos["final_obs"]``. (The gymnasium 1.x default, NEXT_STEP, would instead spend the
    following step() on the reset and ignore its action.) ``wrappers``: gymnasium wrapper
    classes applied to each copy (e.g. a reward of its own)."""
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                        wrappers=list(wrappers))


def discrete_vec(env_id: str, num_envs: int,
                 wrappers: tuple = ()) -> tuple[gym.vector.VectorEnv, int, int]:
    """``make_vec(env_id, num_envs, wrappers)`` for an environment of discrete actions
    (CartPole), with its observation dim and its number of actions."""
    envs = make_vec(env_id, num_envs, wrappers)
    return envs, envs.single_observation_space.shape[0], envs.single_action_space.n


class VectorCollector:
    """Steps ``envs`` with a policy. ``step(policy)`` returns the transitions
    (observation, action, next: observation, reward, terminated, done), each ``[num_envs]``;
    ``episodes`` holds ``(frames, episode_return)`` for every finished episode."""

    def __init__(self, envs: gym.vector.VectorEnv, device: torch.device, seed: int) -> None:
        self.envs, self.device = envs, device
        self.obs, _ = envs.reset(seed=seed)  # env i is seeded with seed + i
        self.running_return = np.zeros(envs.num_envs)
        self.episodes: list[tuple[int, float]] = []
        self.frames = 0

    def reset(self) -> None:
        """Start a new episode in every env; the unfinished ones are dropped (they never enter
        ``episodes``)."""
        self.obs, _ = self.envs.reset()
        self.running_return[:] = 0.0

    def tensor(self, x, dtype=torch.float32) -> torch.Tensor:
        """numpy (from the envs, on CPU) -> torch on the device."""
        return torch.as_tensor(x, dtype=dtype, device=self.device)

    def step(self, policy: Callable[[TensorDict], torch.Tensor], keep: tuple = ()) -> TensorDict:
        """One step of every env with the action ``policy(td)`` returns for ``td["observation"]``;
        the transition keeps the entries ``keep`` that ``policy`` wrote into ``td`` (under
        ``"next"`` too, e.g. a recurrent state)."""
        num_envs = self.envs.num_envs
        td = TensorDict(observation=self.tensor(self.obs), batch_size=[num_envs],
                        device=self.device)
        td["action"] = policy(td)
        self.obs, reward, terminated, truncated, infos = self.envs.step(td["action"].cpu().numpy())
        done = terminated | truncated
        # ("next", "observation") must be the true successor state: for finished envs `obs`
        # already holds the reset observation, the final one is in infos["final_obs"].
        next_obs = self.obs.copy()
        for i in np.flatnonzero(done):
            next_obs[i] = infos["final_obs"][i]
        td["next"] = td.get("next", TensorDict(batch_size=[num_envs])).update(TensorDict(
            observation=self.tensor(next_obs),
            reward=self.tensor(reward).unsqueeze(-1),
            # Only termination stops bootstrapping: an episode truncated at the time limit still
            # has a future, r + gamma * V(s') is the right target.
            terminated=self.tensor(terminated, torch.bool).unsqueeze(-1),
            done=self.tensor(done, torch.bool).unsqueeze(-1),
            batch_size=[num_envs],
        ))
        self.running_return += reward
        self.frames += num_envs
        for i in np.flatnonzero(done):
            self.episodes.append((self.frames, self.running_return[i]))
            self.running_return[i] = 0.0
        return td.select("observation", "action", "next", *keep)


def start_collection(envs: gym.vector.VectorEnv, device: torch.device, seed: int, num_steps: int,
                     total_frames: int) -> tuple[VectorCollector, int, tqdm]:
    """The on-policy and DQN-family loops' start: a ``VectorCollector`` of ``envs`` (env i
    seeded with ``seed + i``), the number of iterations of ``num_steps`` steps of every env that
    fit in ``total_frames`` (at least one), and a progress bar over their frames."""
    collector = VectorCollector(envs, device, seed=seed)
    frames_per_batch = envs.num_envs * num_steps
    num_iterations = max(1, total_frames // frames_per_batch)
    return collector, num_iterations, tqdm(total=num_iterations * frames_per_batch, unit="frames")


class EnvStepper:
    """One gymnasium environment, stepped one action at a time. ``observation()`` is the current
    state as a TensorDict; ``step(action)`` returns the transition (observation, action, next:
    observation, reward, terminated), with the true successor state even when the episode ends
    there (the environment is then reset); ``episodes`` holds ``(frames, episode_return)`` for
    every finished episode."""

    def __init__(self, env_id: str, device: torch.device, seed: int) -> None:
        self.env, self.env_id, self.device = gym.make(env_id), env_id, device
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = 0.0
        self.episodes: list[tuple[int, float]] = []
        self.frames = 0

    def tensor(self, x, dtype=torch.float32) -> torch.Tensor:
        """numpy (from the env, on CPU) -> torch on the device."""
        return torch.as_tensor(x, dtype=dtype, device=self.device)

    def observation_of(self, obs: np.ndarray) -> TensorDict:
        """``obs`` (an observation of this environment) as a TensorDict on the device."""
        return TensorDict(observation=self.tensor(obs), device=self.device)

    def observation(self) -> TensorDict:
        """The current observation as a TensorDict on the device."""
        return self.observation_of(self.obs)

    def step(self, action: torch.Tensor, env_action: torch.Tensor | None = None,
             **entries: torch.Tensor) -> TensorDict:
        """One step with ``action`` (the environment gets ``env_action`` instead where given,
        e.g. the action clipped to the bounds, while the transition keeps ``action``); the
        transition also holds ``entries`` (e.g. a teacher's action for the observation)."""
        td = self.observation()
        td.update(entries)
        td["action"] = action
        env_action = action if env_action is None else env_action
        self.obs, reward, terminated, truncated, _ = self.env.step(env_action.cpu().numpy())
        # ("next", "observation") is the true successor: the reset below only replaces self.obs.
        # Only termination stops bootstrapping (Pendulum's episodes are truncated, never ended).
        td["next"] = TensorDict(observation=self.tensor(self.obs),
                                reward=self.tensor([reward]),
                                terminated=self.tensor([terminated], torch.bool),
                                device=self.device)
        self.frames += 1
        self.episode_return += reward
        if terminated or truncated:
            self.episodes.append((self.frames, self.episode_return))
            self.episode_return = 0.0
            self.obs, _ = self.env.reset()
        return td

    def close(self) -> None:
        self.env.close()


def make_stepper(env_id: str, device: torch.device, seed: int) -> tuple[EnvStepper, Bounded, int, int]:
    """An ``EnvStepper`` of ``env_id`` (reset with ``seed``), its action space as a TorchRL spec
    (``bounded_spec``), the observation and the action dims: the Pendulum tutorials' start."""
    stepper = EnvStepper(env_id, device, seed=seed)
    action_spec = bounded_spec(stepper.env.action_space, device)
    return stepper, action_spec, stepper.env.observation_space.shape[0], action_spec.shape[-1]


def replay_memory(size: int, batch_size: int, device: torch.device, **kwargs) -> TensorDictReplayBuffer:
    """A TorchRL replay buffer of ``size`` transitions stored on ``device`` (a GPU buffer with
    ``--device cuda``), sampling minibatches of ``batch_size`` (uniformly, unless ``kwargs``
    give a ``sampler`` and its ``priority_key``)."""
    return TensorDictReplayBuffer(storage=LazyTensorStorage(size, device=device),
                                  batch_size=batch_size, **kwargs)


def off_policy_loop(total_frames: int, stepper: EnvStepper, action_spec: Bounded,
                    explore: Callable[[TensorDict], torch.Tensor],
                    replay_buffer: TensorDictReplayBuffer, update: Callable[[TensorDict], Any], *,
                    learning_starts: int, updates_per_step: int = 1,
                    evaluator: "Evaluator | None" = None,
                    env_action: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    labels: Callable[[np.ndarray], dict] | None = None,
                    log: Callable[[int, Any], dict] | None = None, log_every: int = 1000) -> None:
    """The Pendulum off-policy tutorials' loop, one environment step a frame for
    ``total_frames`` frames:

    1. act uniformly at random (``action_spec.rand()``) for the first ``learning_starts`` frames,
       then with ``explore(observation td)`` (the behaviour policy); the environment gets
       ``env_action(action)`` where given (e.g. clipped), the transition keeps the action and
       the entries ``labels(observation array)`` where given (e.g. a teacher's action);
    2. store the transition in ``replay_buffer``;
    3. after ``learning_starts``, ``updates_per_step`` times ``losses = update(minibatch)`` (the
       tutorial's gradient step);
    4. ``evaluator.maybe(frame)`` where given; every ``log_every`` frames the progress bar shows
       the mean return of the last 10 episodes and the strings of ``log(frame, last losses)``
       (``losses`` is None before the first update).

    Closes ``stepper`` at the end; the episodes are in ``stepper.episodes``."""
    pbar = tqdm(total=total_frames, unit="frames")
    losses = None
    for frame in range(1, total_frames + 1):
        td = stepper.observation()
        action = action_spec.rand() if frame <= learning_starts else explore(td)
        replay_buffer.add(stepper.step(action, None if env_action is None else env_action(action),
                                       **({} if labels is None else labels(stepper.obs))))
        for _ in range(updates_per_step if frame > learning_starts else 0):
            losses = update(replay_buffer.sample())
        if evaluator is not None:
            evaluator.maybe(frame)
        if frame % log_every == 0:
            show_progress(pbar, stepper.episodes, frame, **({} if log is None else log(frame, losses)))
    pbar.close()
    stepper.close()


def sample_action(actor) -> Callable[[TensorDict], torch.Tensor]:
    """A behaviour policy for ``off_policy_loop``: ``a ~ pi(.|s)`` for one observation (``act``
    with ``ExplorationType.RANDOM``)."""
    return lambda td: act(actor, td, ExplorationType.RANDOM)


def gaussian_exploration(actor, action_spec: Bounded,
                         std: float) -> Callable[[TensorDict], torch.Tensor]:
    """A behaviour policy for ``off_policy_loop`` (TD3's, DDPG's): the deterministic ``actor``'s
    mu(s) plus Gaussian noise of std ``std`` in units of the upper bound, clipped to the
    bounds."""
    max_action = action_spec.space.high

    def explore(td: TensorDict) -> torch.Tensor:
        with torch.no_grad():
            action = actor(td)["action"]
        noise = torch.randn_like(action) * std * max_action
        return (action + noise).clamp(action_spec.space.low, action_spec.space.high)

    return explore


def alpha_postfix(frame: int, losses) -> dict:
    """For ``off_policy_loop``'s ``log``: the SAC temperature ``alpha`` of the last loss outputs
    ("n/a" before the first update)."""
    return {"alpha": f"{float(losses['alpha']):.3f}" if losses is not None else "n/a"}


def deterministic_action(actor, device: torch.device,
                         clip_to: Bounded | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """An evaluation policy for ``evaluate``: ``actor``'s deterministic action (its mean, no
    sampling or noise) for an observation array, clipped to the bounds of ``clip_to`` where
    given."""

    def policy(observation: np.ndarray) -> np.ndarray:
        td = TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32,
                                                    device=device), device=device)
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            action = actor(td)["action"]
        if clip_to is not None:
            action = action.clamp(clip_to.space.low, clip_to.space.high)
        return action.cpu().numpy()

    return policy


def bounded_spec(space: gym.spaces.Box, device: torch.device) -> Bounded:
    """A gymnasium ``Box`` action space as a TorchRL spec on ``device``."""
    return Bounded(low=torch.as_tensor(space.low), high=torch.as_tensor(space.high),
                   shape=space.shape, device=device)


def act(actor, td: TensorDict, exploration_type: ExplorationType) -> torch.Tensor:
    """``actor``'s action for the one observation in ``td`` (given as a batch of one, since
    normalisation layers want a batch dim), in eval mode (normalised by the running statistics,
    which stay as they are): sampled with ``ExplorationType.RANDOM``, the squashed mean with
    ``DETERMINISTIC``."""
    with torch.no_grad(), set_exploration_type(exploration_type), eval_mode(actor):
        return actor(td[None])["action"][0]


def sample_from(actor) -> Callable[[TensorDict], torch.Tensor]:
    """A behaviour policy for ``VectorCollector.step``: ``a ~ pi(.|s)``, sampled by ``actor`` (a
    TorchRL ``ProbabilisticActor``)."""

    def act(td: TensorDict) -> torch.Tensor:
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            return actor(td)["action"]

    return act


def most_probable_action(actor, device: torch.device) -> Callable[[np.ndarray], int]:
    """An evaluation policy for ``evaluate``: ``argmax_a pi(a|s)`` of a categorical ``actor`` that
    writes ``"logits"`` (no sampling)."""

    def act(observation: np.ndarray) -> int:
        td = TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32,
                                                    device=device), device=device)
        with torch.no_grad():
            return int(actor(td)["logits"].argmax(-1))

    return act


def greedy_action(actor, device: torch.device) -> Callable[[np.ndarray], int]:
    """An evaluation policy for ``evaluate``: the greedy ``"action"`` (an index,
    ``argmax_a Q(s, a)``) of a TorchRL Q-value actor, without exploration."""

    def act(observation: np.ndarray) -> int:
        td = TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32,
                                                    device=device), device=device)
        with torch.no_grad():
            return int(actor(td)["action"])

    return act


def epsilon_greedy(actor, num_actions: int, epsilon: float) -> Callable[[TensorDict], torch.Tensor]:
    """A behaviour policy for ``VectorCollector.step``: ``actor``'s greedy ``"action"`` (an
    index), replaced by a uniformly random one with probability ``epsilon``."""

    def act(td: TensorDict) -> torch.Tensor:
        with torch.no_grad():
            greedy = actor(td)["action"]
        explore = torch.rand(greedy.shape, device=greedy.device) < epsilon
        random_action = torch.randint(num_actions, greedy.shape, device=greedy.device)
        return torch.where(explore, random_action, greedy)

    return act


def collect_epsilon_greedy(collector: "VectorCollector", actor, num_actions: int, num_steps: int,
                           epsilon_at: Callable[[int], float]) -> tuple[TensorDict, float]:
    """``num_steps`` steps of every env of ``collector`` with ``epsilon_greedy(actor, num_actions,
    epsilon)``, ``epsilon = epsilon_at(frames so far)`` before each step (the DQN-family
    tutorials' acting phase). Returns the transitions, ``[num_envs * num_steps]`` step after
    step, and the last epsilon."""
    steps = []
    for _ in range(num_steps):
        epsilon = epsilon_at(collector.frames)
        # the greedy action (the actor's argmax), uniformly random with probability epsilon
        steps.append(collector.step(epsilon_greedy(actor, num_actions, epsilon)))
    return torch.cat(steps), epsilon


def linear_epsilon(total_frames: int, *, start: float, end: float, fraction: float,
                   learning_starts: int) -> Callable[[int], float]:
    """rl-zoo's schedule, epsilon as a function of the frames so far: 1 (uniformly random) before
    ``learning_starts``; a linear decay from ``start`` to ``end`` over the first ``fraction`` of
    ``total_frames``, then ``end``."""

    def epsilon_at(frames: int) -> float:
        if frames < learning_starts:
            return 1.0
        return start + min(1.0, frames / (fraction * total_frames)) * (end - start)

    return epsilon_at


# ---------------------------------------------------------------- networks


def categorical_actor_critic(
    obs_dim: int, num_actions: int, device: torch.device, return_log_prob: bool = False
) -> tuple[ProbabilisticActor, ValueOperator]:
    """The CartPole policy-gradient tutorials' networks, separate 64-64 tanh MLPs
    (stable-baselines3's default for A2C and PPO): ``(actor, critic)``. The actor writes
    ``"logits"`` for ``"observation"`` and samples ``"action"`` from ``Categorical(logits)``: the
    policy pi(a|s) (with ``return_log_prob``, it also writes ``"action_log_prob"``, the log
    pi_old(a|s) of PPO's ratio). The critic writes ``"state_value"``: V(s). (``ppo_cartpole.py``
    builds the same two networks in full.)"""
    policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                     activation_class=nn.Tanh)
    actor = ProbabilisticActor(TensorDictModule(policy_net, ["observation"], ["logits"]),
                               in_keys=["logits"],
                               distribution_class=torch.distributions.Categorical,
                               return_log_prob=return_log_prob)
    return actor.to(device), state_value_critic(obs_dim, device)


def state_value_critic(obs_dim: int, device: torch.device) -> ValueOperator:
    """V(s), written to ``"state_value"``: a 64-64 tanh MLP (stable-baselines3's default critic
    for A2C and PPO; ``categorical_actor_critic``'s, ``rpo_pendulum.py``'s)."""
    return ValueOperator(
        MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
        in_keys=["observation"],
    ).to(device)


class ConcatInputs(nn.Sequential):
    """``nn.Sequential`` on its inputs joined along the last dim (a critic reads (s, a))."""

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cat(inputs, -1))


def mlp(in_features: int, out_features: int, cells: list[int],
        norm_layer: Callable[[int], nn.Module] | None = None) -> nn.Module:
    """A ReLU MLP with hidden layers of ``cells`` units; with ``norm_layer`` (a factory of
    normalisation layers, features -> module), one before every linear layer: on the input and
    after each hidden activation (CrossQ's placement, Bhatt et al. Section 4; TorchRL's ``MLP``
    puts its ``norm_class`` between a linear layer and its activation, and not on the input)."""
    if norm_layer is None:
        return MLP(in_features=in_features, out_features=out_features, num_cells=cells,
                   activation_class=nn.ReLU)
    sizes = [in_features, *cells]
    layers = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers += [norm_layer(n_in), nn.Linear(n_in, n_out), nn.ReLU()]
    return ConcatInputs(*layers, norm_layer(sizes[-1]), nn.Linear(sizes[-1], out_features))


def tanh_normal_actor(obs_dim: int, action_spec: Bounded, cells: list[int],
                      norm_layer: Callable[[int], nn.Module] | None = None) -> ProbabilisticActor:
    """pi(a|s) = tanh-squashed Normal(mu(s), sigma(s)) scaled onto the spec's bounds. The MLP
    writes (mu, raw sigma); NormalParamExtractor splits them and makes sigma positive (biased
    softplus)."""
    net = nn.Sequential(mlp(obs_dim, 2 * action_spec.shape[-1], cells, norm_layer),
                        NormalParamExtractor())
    bounds = {"low": action_spec.space.low, "high": action_spec.space.high}
    return ProbabilisticActor(TensorDictModule(net, ["observation"], ["loc", "scale"]),
                              in_keys=["loc", "scale"], spec=action_spec,
                              distribution_class=TanhNormal,
                              distribution_kwargs=bounds).to(action_spec.device)


def tanh_deterministic_actor(obs_dim: int, action_spec: Bounded,
                             cells: list[int]) -> TensorDictSequential:
    """mu(s): an MLP writes an unbounded ``"action_param"``; ``TanhModule`` maps it onto the
    spec's bounds as ``"action"``."""
    return TensorDictSequential(
        TensorDictModule(mlp(obs_dim, action_spec.shape[-1], cells), in_keys=["observation"],
                         out_keys=["action_param"]),
        TanhModule(in_keys=["action_param"], out_keys=["action"], spec=action_spec),
    ).to(action_spec.device)


def q_critic(obs_dim: int, action_dim: int, cells: list[int], num_atoms: int = 1,
             norm_layer: Callable[[int], nn.Module] | None = None) -> ValueOperator:
    """Q(s, a): an MLP on the concatenated observation and action, writing
    ``"state_action_value"`` (``num_atoms`` values: quantiles for TQC)."""
    return ValueOperator(mlp(obs_dim + action_dim, num_atoms, cells, norm_layer),
                         in_keys=["observation", "action"])


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode (normalisation layers read their running statistics and leave
    them alone) inside the block, in its former mode after it."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


# ---------------------------------------------------------------- offline data


class OfflineDataset:
    """The transitions of ``offline_dataset.py`` (a TorchRL ``LazyMemmapStorage`` read back with
    ``loads``), held in memory with their observations standardised by the dataset's mean and std
    (TD3+BC's normalisation, Fujimoto & Gu, arXiv:2106.06860, section 5, used by every offline
    tutorial alike); ``standardise`` does the same to an environment's observation."""

    def __init__(self, path: Path, device: torch.device, batch_size: int) -> None:
        if not (path / "storage").exists():
            raise SystemExit(f"no dataset at {path}: run tutorials/offline_dataset.py first "
                             f"(its --out/dataset), or pass --dataset.")
        size = json.loads((path.parent / "dataset.json").read_text())["transitions"]
        buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(size), batch_size=batch_size)
        buffer.loads(path)
        data = buffer.storage[:].to(device).clone()  # 50k small transitions: held in memory
        self.mean = data["observation"].mean(0)
        self.std = data["observation"].std(0) + 1e-3
        for key in ("observation", ("next", "observation")):
            data[key] = (data[key] - self.mean) / self.std
        self.data, self.device, self.batch_size = data, device, batch_size

    def sample(self) -> TensorDict:
        """A minibatch of ``batch_size`` transitions drawn uniformly with replacement."""
        index = torch.randint(len(self.data), (self.batch_size,), device=self.device)
        return self.data[index]

    def standardise(self, observation: np.ndarray) -> torch.Tensor:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=self.device)
        return (obs - self.mean) / self.std

    def policy(self, actor) -> Callable[[np.ndarray], np.ndarray]:
        """``actor``'s deterministic action for an environment's observation, standardised as
        the dataset is (an evaluation policy for ``evaluate``)."""

        def deterministic_action(observation: np.ndarray) -> np.ndarray:
            td = TensorDict(observation=self.standardise(observation))
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                return actor(td)["action"].cpu().numpy()

        return deterministic_action

    def training_steps(self, args: argparse.Namespace, env_id: str, policy: Callable,
                       curve: list) -> Iterator[tuple[int, TensorDict]]:
        """``(step, minibatch)`` for ``args.total_frames`` gradient steps; after every
        ``args.eval_every``-th step and the last, ``policy`` plays 5 episodes of ``env_id`` and
        ``(step, their mean return)`` is appended to ``curve`` (the offline learning curve)."""
        pbar = tqdm(total=args.total_frames, unit="steps")
        for step in range(1, args.total_frames + 1):
            yield step, self.sample()
            if step % args.eval_every == 0 or step == args.total_frames:
                returns = evaluate(env_id, policy, seed=20_000 + 100 * args.seed + step,
                                   episodes=5)
                curve.append((step, float(np.mean(returns))))
                pbar.set_postfix(eval_return=f"{curve[-1][1]:.1f}")
            pbar.update(1)
        pbar.close()


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


def env_spec(env_id: str, device: torch.device) -> tuple[Bounded, int, int]:
    """``env_id``'s action space as a TorchRL spec on ``device`` (``bounded_spec``), its
    observation and action dims (the offline tutorials never step the environment)."""
    env = gym.make(env_id)
    action_spec = bounded_spec(env.action_space, device)
    return action_spec, env.observation_space.shape[0], action_spec.shape[-1]


# ---------------------------------------------------------------- results


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


def evaluation_flags(parser: argparse.ArgumentParser, every: int | None = None,
                     unit: str = "env steps", save_actor: bool = False) -> None:
    """``--eval-episodes`` (10); with ``every``, ``--eval-every`` too (``every`` ``unit``; 0: only
    the final evaluation) for ``Evaluator``; with ``save_actor``, ``--save-actor PATH`` too.
    Without ``every`` only the final policy is evaluated (``finish``)."""
    if every is None:
        parser.add_argument("--eval-episodes", type=int, default=10,
                            help="episodes of the final deterministic policy, on unseen start "
                                 "states")
    else:
        parser.add_argument("--eval-episodes", type=int, default=10,
                            help="episodes of the deterministic policy, on unseen start states")
        parser.add_argument("--eval-every", type=int, default=every,
                            help=f"{unit} between evaluations of the deterministic policy "
                                 "(OUT/eval_returns.csv; 0: only the final one)")
    if save_actor:
        parser.add_argument("--save-actor", type=Path, default=None,
                            help="also save the trained actor module there "
                                 "(offline_dataset.py uses it)")


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


def deterministic_evaluator(args: argparse.Namespace, actor, stepper: EnvStepper) -> Evaluator:
    """An ``Evaluator`` of ``actor``'s deterministic action (the squashed mean) on the
    environment of ``stepper``, every ``args.eval_every`` frames, ``args.eval_episodes`` episodes
    on start states seeded ``10_000 + 100 * args.seed, ...``."""

    def policy(observation: np.ndarray) -> np.ndarray:
        td = stepper.observation_of(observation)
        return act(actor, td, ExplorationType.DETERMINISTIC).cpu().numpy()

    return Evaluator(stepper.env_id, policy, seed=10_000 + 100 * args.seed,
                     episodes=args.eval_episodes, every=args.eval_every)


def show_progress(pbar, episodes, frames: int, **values: str) -> None:
    """Advance ``pbar`` to ``frames`` and show the mean return of the last 10 episodes and
    ``values``."""
    recent = [episode_return for _, episode_return in episodes[-10:]]
    pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a", **values)
    pbar.update(frames - pbar.n)


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


# ---------------------------------------------------------------- the tutorials of one family


def gradient_epochs(loss_module: nn.Module, optimizer: torch.optim.Optimizer, batch: TensorDict,
                    *, max_grad_norm: float, num_epochs: int = 1, minibatch_size: int | None = None,
                    model: Callable[[TensorDict], TensorDict] | None = None,
                    after_epoch: Callable[[], Any] | None = None) -> TensorDict:
    """The on-policy tutorials' optimisation of a collected ``batch`` (PPO's epochs, A2C's single
    step): ``num_epochs`` passes over ``batch``, each in minibatches of ``minibatch_size`` in a
    random order (a fresh permutation every pass) or, without ``minibatch_size``, the whole batch
    as it is; for every minibatch one ``optimizer`` step on the sum of the ``"loss_*"`` outputs
    of ``model`` (``loss_module`` unless given: e.g. its DistributedDataParallel wrapper, or a
    function running it in recurrent mode), the gradients of ``loss_module``'s parameters
    clipped to norm ``max_grad_norm`` first; ``after_epoch()`` after each pass where given.
    Returns the last loss outputs."""
    model = loss_module if model is None else model
    for _ in range(num_epochs):
        if minibatch_size is None:
            minibatches = iter([batch])
        else:
            order = torch.randperm(batch.numel(), device=batch.device)
            minibatches = (batch[idx] for idx in order.split(minibatch_size))
        for minibatch in minibatches:
            losses = model(minibatch)
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
            optimizer.step()
        if after_epoch is not None:
            after_epoch()
    return losses


def mpo_optimisation(loss_module: nn.Module, actor: nn.Module, critic: nn.Module, target_updater,
                     *, lr: float, dual_lr: float, max_grad_norm: float
                     ) -> tuple[torch.optim.Optimizer, Callable[[TensorDict], TensorDict]]:
    """The MPO tutorials' (``mpo_pendulum.py``, ``mpo_cartpole.py``) optimiser and update: one Adam
    over ``actor``'s and ``critic``'s parameters at ``lr`` (the first parameter group) and the
    loss's dual parameters (temperature, multipliers) at ``dual_lr``; ``update(batch)``, one step
    on the sum of ``loss_actor``, ``loss_qvalue``, ``loss_temperature`` and ``loss_alpha``, the
    networks' gradient norm clipped to ``max_grad_norm``, then Acme's floor on the dual
    parameters (``loss_module.clamp_duals()``) and ``target_updater.step()``; it returns the loss
    outputs (their duals and KLs are the tutorials' diagnostics)."""
    network_parameters = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam([
        {"params": network_parameters, "lr": lr},
        {"params": list(loss_module.dual_parameters()), "lr": dual_lr},
    ])

    def update(batch: TensorDict) -> TensorDict:
        losses = loss_module(batch)
        loss = (losses["loss_actor"] + losses["loss_qvalue"]
                + losses["loss_temperature"] + losses["loss_alpha"])
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(network_parameters, max_grad_norm)
        optimizer.step()
        loss_module.clamp_duals()
        target_updater.step()
        return losses

    return optimizer, update


def save_dual_diagnostics(out: Path, episodes, title: str, names: list[str], diagnostics,
                          duals: tuple[str, ...], kl_bounds: dict[str, float]) -> None:
    """The MPO tutorials' diagnostics: ``OUT/diagnostics.csv`` (``diagnostics``: rows
    ``frames, *names``) and ``OUT/curve.png``, three panels: the episode returns (titled
    ``title``), the ``duals`` and the KLs named in ``kl_bounds``, each with its bound dotted (log
    scales)."""
    write_csv(out / "diagnostics.csv", ["frames", *names], diagnostics)
    fig = Figure(figsize=(15, 4))
    ax_returns, ax_duals, ax_kls = fig.subplots(1, 3)
    plot_returns(ax_returns, episodes)
    ax_returns.set(xlabel="environment steps", ylabel="episode return", title=title)
    if diagnostics:
        rows = np.array(diagnostics)
        columns = dict(zip(names, rows[:, 1:].T, strict=True))
        for name in duals:
            ax_duals.plot(rows[:, 0], columns[name], label=name)
        ax_duals.set(xlabel="environment steps", yscale="log", title="duals")
        ax_duals.legend()
        for name, bound in kl_bounds.items():
            (line,) = ax_kls.plot(rows[:, 0], columns[name], label=name)
            ax_kls.axhline(bound, color=line.get_color(), linestyle=":")
        ax_kls.set(xlabel="environment steps", yscale="log", title="KLs (dotted: their bounds)")
        ax_kls.legend()
    fig.savefig(out / "curve.png", dpi=100, bbox_inches="tight")


def soft_actor_critic_parser(doc: str, default_out: str) -> argparse.ArgumentParser:
    """The SAC-family tutorials' flags: ``tutorial_parser``'s (20,000 env steps),
    ``--eval-every`` (1,000 env steps), ``--eval-episodes`` and ``--save-actor`` (a tutorial adds
    its own: REDQ's ``--utd``)."""
    parser = tutorial_parser(doc, default_out, total_frames=20_000)
    evaluation_flags(parser, every=1_000, save_actor=True)
    return parser


class SoftActorCriticPendulum:
    """What the SAC-family tutorials (``sac_pendulum.py``, ``redq_pendulum.py``,
    ``tqc_pendulum.py``, ``crossq_pendulum.py``) share around their networks, loss and
    optimizer: Pendulum-v1, the loop and the last steps, with the settings of theirs that do not
    touch the loss (rl-baselines3-zoo's Pendulum SAC): ``LEARNING_STARTS`` = 1,000 steps of
    uniformly random actions before learning, a replay buffer of ``BUFFER_SIZE`` = 100,000
    transitions sampled in minibatches of ``BATCH_SIZE`` = 256, and ``EVAL_TARGET`` = -200, the
    evaluation return whose first crossing is reported.

    ``SoftActorCriticPendulum(args)`` (``args`` from ``soft_actor_critic_parser``) seeds torch
    (``start``) and makes the environment (``make_stepper``): ``device``, ``stepper``,
    ``action_spec``, ``obs_dim``, ``action_dim``; ``train`` trains and reports."""

    LEARNING_STARTS = 1_000
    BUFFER_SIZE = 100_000
    BATCH_SIZE = 256
    EVAL_TARGET = -200.0

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device, self.start_time = start(args)
        self.stepper, self.action_spec, self.obs_dim, self.action_dim = make_stepper(
            "Pendulum-v1", self.device, args.seed)

    def train(self, actor, loss_module: nn.Module, optimizer: torch.optim.Optimizer, title: str,
              *, target_updater=None, policy_delay: int = 1, updates_per_step: int = 1) -> None:
        """``off_policy_loop`` for ``--total-frames`` env steps: act uniformly at random for
        ``LEARNING_STARTS`` steps, then with a ~ pi(.|s) (``sample_action(actor)``); store each
        transition in a replay buffer on the training device; after ``LEARNING_STARTS``,
        ``updates_per_step`` gradient steps per env step (``soft_actor_critic_update`` of
        ``loss_module``, ``optimizer``, ``target_updater`` and ``policy_delay``); every
        ``--eval-every`` steps an evaluation of the deterministic policy, the squashed mean
        (``deterministic_evaluator``); the progress bar shows alpha. Then ``finish`` (titled
        ``title``): the learning curve, the final evaluation, ``actor`` saved to
        ``--save-actor``, ``first_eval_at_target=`` and the report."""
        replay_buffer = replay_memory(self.BUFFER_SIZE, self.BATCH_SIZE, self.device)
        evaluator = deterministic_evaluator(self.args, actor, self.stepper)
        update = soft_actor_critic_update(loss_module, optimizer, target_updater, policy_delay)
        off_policy_loop(self.args.total_frames, self.stepper, self.action_spec,
                        sample_action(actor), replay_buffer, update,
                        learning_starts=self.LEARNING_STARTS, updates_per_step=updates_per_step,
                        evaluator=evaluator, log=alpha_postfix)
        finish(self.args, self.start_time, self.stepper.episodes, title, evaluator=evaluator,
               actor=actor, target=self.EVAL_TARGET)


def soft_actor_critic_update(loss_module: nn.Module, optimizer: torch.optim.Optimizer,
                             target_updater=None,
                             policy_delay: int = 1) -> Callable[[TensorDict], TensorDict]:
    """The SAC family's gradient step, an ``update(batch)`` for ``off_policy_loop`` that returns
    the loss outputs: one ``optimizer`` step on ``loss_qvalue``, joined by ``loss_actor`` and
    ``loss_alpha`` on every ``policy_delay``-th call (1: on every call; CrossQ's policy delay:
    3), then ``target_updater.step()`` where given (``SoftUpdate``: Q_target <- tau Q +
    (1 - tau) Q_target; CrossQ has no target networks). Each output only sends gradient to its
    own parameters (the actor loss does not move the critics, the temperature loss only moves
    log(alpha)), so one optimizer on the sum is the same as one optimizer per loss with one
    learning rate; a parameter without gradient (the actor's on a delayed step) is left alone by
    Adam, its moment estimates included."""
    gradient_steps = itertools.count(1)  # counts the calls of update()

    def update(batch: TensorDict) -> TensorDict:
        losses = loss_module(batch)
        loss = losses["loss_qvalue"]
        if next(gradient_steps) % policy_delay == 0:
            loss = loss + losses["loss_actor"] + losses["loss_alpha"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if target_updater is not None:
            target_updater.step()
        return losses

    return update


class DQNCartPole:
    """What the DQN-family tutorials (``dqn_cartpole.py``, ``c51_cartpole.py``) share around their
    networks, loss and optimizer: CartPole-v1, the loop and the last steps, with the settings of
    theirs that do not touch the loss (rl-baselines3-zoo's dqn.yml, CartPole-v1): ``NUM_ENVS`` =
    4 CartPoles stepped together, ``NUM_STEPS`` = 64 steps of each between training phases
    (4 * 64 = 256 env steps, rl-zoo's train_freq), ``GRADIENT_STEPS`` = 128 gradient steps per
    training phase, ``LEARNING_STARTS`` = 1,000 env steps of uniformly random actions before
    training, a replay memory of ``BUFFER_SIZE`` = 100,000 transitions sampled in minibatches of
    ``BATCH_SIZE`` = 64, and epsilon decaying linearly from ``EPS_START`` = 1 to ``EPS_END`` =
    0.04 over the first ``EXPLORATION_FRACTION`` = 16% of training.

    ``DQNCartPole(args)`` seeds torch (``start``) and makes the environments (``discrete_vec``):
    ``device``, ``envs``, ``obs_dim``, ``num_actions``; ``train`` trains and reports."""

    NUM_ENVS = 4
    NUM_STEPS = 64
    GRADIENT_STEPS = 128
    LEARNING_STARTS = 1_000
    BUFFER_SIZE = 100_000
    BATCH_SIZE = 64
    EPS_START, EPS_END, EXPLORATION_FRACTION = 1.0, 0.04, 0.16

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device, self.start_time = start(args)
        self.envs, self.obs_dim, self.num_actions = discrete_vec("CartPole-v1", self.NUM_ENVS)

    def train(self, actor, loss_module: nn.Module, optimizer: torch.optim.Optimizer,
              target_updater, title: str, *, replay_buffer: TensorDictReplayBuffer,
              max_grad_norm: float,
              after_update: Callable[[TensorDict], Any] | None = None) -> None:
        """The loop over ``--total-frames`` env steps, the learning rate annealed from its initial
        value to 0 as (1 - progress)^2. Each iteration: ``NUM_STEPS`` steps of every env,
        epsilon-greedily (``collect_epsilon_greedy``: ``actor``'s greedy action, uniformly
        random with probability epsilon, ``linear_epsilon``), stored in ``replay_buffer``; once
        ``LEARNING_STARTS`` env steps are stored, ``GRADIENT_STEPS`` gradient steps, each on a
        minibatch: ``loss_module(batch)["loss"]``, the gradients clipped to norm
        ``max_grad_norm``, an ``optimizer`` step, ``target_updater.step()`` (the target copy) and
        ``after_update(batch)`` where given (new priorities). Then ``finish`` (titled ``title``):
        the learning curve, the greedy policy's evaluation (``greedy_action``: argmax_a Q(s, a),
        no epsilon) on start states training never scored, the report."""
        base_lr = optimizer.param_groups[0]["lr"]
        # env i is seeded with seed + i; a progress bar over all the iterations' frames
        collector, num_iterations, pbar = start_collection(self.envs, self.device, self.args.seed,
                                                           self.NUM_STEPS, self.args.total_frames)
        epsilon_at = linear_epsilon(pbar.total, start=self.EPS_START, end=self.EPS_END,
                                    fraction=self.EXPLORATION_FRACTION,
                                    learning_starts=self.LEARNING_STARTS)
        for iteration in range(num_iterations):
            optimizer.param_groups[0]["lr"] = base_lr * (1.0 - iteration / num_iterations) ** 2
            transitions, epsilon = collect_epsilon_greedy(collector, actor, self.num_actions,
                                                          self.NUM_STEPS, epsilon_at)
            replay_buffer.extend(transitions)
            if collector.frames >= self.LEARNING_STARTS:
                for _ in range(self.GRADIENT_STEPS):
                    batch = replay_buffer.sample()
                    loss = loss_module(batch)["loss"]
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
                    optimizer.step()
                    target_updater.step()
                    if after_update is not None:
                        after_update(batch)
            show_progress(pbar, collector.episodes, collector.frames, eps=f"{epsilon:.2f}")
        pbar.close()
        self.envs.close()
        finish(self.args, self.start_time, collector.episodes, title, env_id="CartPole-v1",
               policy=greedy_action(actor, self.device))


class OfflineRun:
    """What the offline tutorials (``bc_offline.py``, ``cql_offline.py``, ``iql_offline.py``,
    ``td3bc_offline.py``) share around their networks, losses and update.
    ``OfflineRun(doc, default_out)`` parses ``offline_parser``'s flags (``args``), seeds torch
    (``start``: ``device``) and reads the action spec and dims of ``ENV_ID``, Pendulum-v1
    (``env_spec``: ``action_spec``, ``obs_dim``, ``action_dim``; the environment only evaluates:
    the agent learns from the dataset alone). ``training_steps`` gives the minibatches,
    ``finish`` does the last steps."""

    ENV_ID = "Pendulum-v1"

    def __init__(self, doc: str, default_out: str) -> None:
        self.args = offline_parser(doc, default_out).parse_args()
        self.device, self.start_time = start(self.args)
        self.action_spec, self.obs_dim, self.action_dim = env_spec(self.ENV_ID, self.device)
        self.curve: list[tuple[int, float]] = []  # (gradient steps, mean return of 5 episodes)
        self.policy: Callable | None = None

    def training_steps(self, actor, batch_size: int) -> Iterator[tuple[int, TensorDict]]:
        """Load ``--dataset`` (``OfflineDataset``: observations standardised) and yield
        ``(step, minibatch of batch_size)`` for ``--total-frames`` gradient steps; every
        ``--eval-every`` steps ``actor``'s deterministic action, on observations standardised as
        the dataset's are, plays 5 evaluation episodes (``OfflineDataset.training_steps``)."""
        dataset = OfflineDataset(self.args.dataset, self.device, batch_size)
        self.policy = dataset.policy(actor)
        return dataset.training_steps(self.args, self.ENV_ID, self.policy, self.curve)

    def finish(self, title: str) -> list[float]:
        """``finish`` for the offline tutorials: ``OUT/returns.csv`` and ``OUT/curve.png`` (titled
        ``title``) hold the evaluation returns against gradient steps (running mean over 5), and
        the final policy plays ``--eval-episodes`` episodes on start states the dataset never
        saw; then the report."""
        return finish(self.args, self.start_time, self.curve, title, env_id=self.ENV_ID,
                      policy=self.policy, window=5, xlabel="gradient steps",
                      ylabel="evaluation return (5 episodes)")
