"""A small collector for the tutorials that step several gymnasium environments at once: one
policy call per step of all of them, transitions as TensorDicts with the true successor state,
and the returns of finished episodes."""

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type


def make_vec(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` with SAME_STEP autoreset: when an episode ends, step()
    returns the first observation of the next one and puts the true last observation in
    ``infos["final_obs"]``."""
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


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


def sample_from(actor) -> Callable[[TensorDict], torch.Tensor]:
    """A behaviour policy for ``VectorCollector.step``: ``a ~ pi(.|s)``, sampled by ``actor`` (a
    TorchRL ``ProbabilisticActor``)."""

    def act(td: TensorDict) -> torch.Tensor:
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            return actor(td)["action"]

    return act


def most_probable_action(actor, device: torch.device) -> Callable[[np.ndarray], int]:
    """An evaluation policy for ``_results.evaluate``: ``argmax_a pi(a|s)`` of a categorical
    ``actor`` that writes ``"logits"`` (no sampling)."""

    def act(observation: np.ndarray) -> int:
        td = TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32,
                                                    device=device), device=device)
        with torch.no_grad():
            return int(actor(td)["logits"].argmax(-1))

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


def linear_epsilon(frames: int, total_frames: int, *, start: float, end: float, fraction: float,
                   learning_starts: int) -> float:
    """rl-zoo's schedule: 1 (uniformly random) before ``learning_starts``; a linear decay from
    ``start`` to ``end`` over the first ``fraction`` of the frames, then ``end``."""
    if frames < learning_starts:
        return 1.0
    return start + min(1.0, frames / (fraction * total_frames)) * (end - start)
