"""C51 (categorical distributional DQN) on CartPole-v1 with rlloss, in a single file.

This tutorial trains a distributional Q-network with rlloss's ``DistributionalDQNLoss`` (a
drop-in replacement for ``torchrl.objectives.DistributionalDQNLoss``) around a collector you
write yourself. Instead of the mean return Q(s, a), the network predicts, for every action, a
probability distribution over ATOMS fixed returns z_1 < ... < z_K (the "support"); the pieces map
to Bellemare et al., "A Distributional Perspective on Reinforcement Learning" (2017), Algorithm 1:

1. act epsilon-greedily with respect to Q(s, a) = sum_j z_j p_j(s, a), the mean of the predicted
   distribution (TorchRL's ``DistributionalQValueActor`` computes it and the greedy action), and
   store the transitions (s, a, r, s', terminated) in a TorchRL replay buffer;
2. for a sampled transition, take the greedy next action a* (online network: double Q) and the
   target network's distribution p(s', a*); move its atoms to r + gamma (1 - terminated) z_j and
   project them back onto the support (each atom's mass split between its two neighbours);
3. minimise the cross-entropy between that projected target and p(s, a); every C gradient steps
   copy the weights into the target network (TorchRL's ``HardUpdate``).

Hyperparameters are those of ``dqn_cartpole.py`` (rl-baselines3-zoo's tuned CartPole DQN, with
the learning rate annealed to 0); the support spans [0, 100], the discounted return of an
endless episode with gamma = 0.99 being 1 / (1 - gamma) = 100. After training, the greedy policy
(no epsilon) plays 10 evaluation episodes from start states no training episode had.

Results (50,000 steps, one CPU thread each; seeds 0, 1, 2), re-measured on 2026-11-29 with
``tools/tutorial_runs.py --figures`` (the earlier record, 500, 500, 500 and training returns
500.0, 419.7, 469.6, no longer reproduces): final_return (greedy evaluation) 500.0, 500.0 and
437.3; the last 10 training episodes (epsilon 0.04) 500.0, 500.0 and 316.1. With TorchRL's
``DistributionalDQNLoss`` swapped in (the runner's one-import swap) the runs are the same to the
printed digit: final_return 500.0, 500.0, 437.3. Seed 2 is below CartPole's 475 with both
libraries: a run of this budget ends where its last network lands (``dqn_cartpole.py`` shows the
same and keeps the best of its late networks; this tutorial keeps the last one). The per-update
overhead of the two libraries is in the overhead benchmark.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 50000: final_return = 500.0 500.0 437.3
    [figures] rlloss, seeds 0 1 2, --total-frames 50000: train_return = 500.0 500.0 316.1
    [figures] torchrl, seeds 0 1 2, --total-frames 50000: final_return = 500.0 500.0 437.3

Run:
    python tutorials/c51_cartpole.py --seed 0 --total-frames 50000 --out runs/c51_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes, played with the final epsilon),
``eval_return=`` and last ``final_return=`` (both the mean return of the greedy evaluation).
"""

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import MLP, DistributionalQValueActor
from torchrl.objectives import HardUpdate
from tqdm import tqdm

from rlloss import DistributionalDQNLoss

parser = helpers.tutorial_parser(__doc__, "runs/c51_cartpole", 50_000, "env steps, all envs")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters: C51's support, then dqn_cartpole.py's (rl-baselines3-zoo, dqn.yml, CartPole-v1,
# annealed lr; the loop's are below, dqn_cartpole.py's too).
ATOMS, V_MIN, V_MAX = 51, 0.0, 100.0  # the support: C51's 51 atoms over the returns
GAMMA = 0.99
LR = 2.3e-3  # annealed to 0 as (1 - progress)^2
TARGET_UPDATE_INTERVAL = 128  # gradient steps between target copies: once per training phase
MAX_GRAD_NORM = 10.0

# The loop's settings (rl-baselines3-zoo's dqn.yml, CartPole-v1; the same in dqn_cartpole.py and
# c51_cartpole.py): NUM_ENVS CartPoles stepped together, NUM_STEPS steps of each between
# training phases (4 * 64 = 256 env steps, rl-zoo's train_freq), GRADIENT_STEPS gradient steps
# per training phase, LEARNING_STARTS env steps of uniformly random actions before training, a
# replay memory of BUFFER_SIZE transitions sampled in minibatches of BATCH_SIZE, and epsilon
# decaying linearly from EPS_START to EPS_END over the first EXPLORATION_FRACTION of training.
NUM_ENVS = 4
NUM_STEPS = 64
GRADIENT_STEPS = 128
LEARNING_STARTS = 1_000
BUFFER_SIZE = 100_000
BATCH_SIZE = 64
EPS_START, EPS_END, EXPLORATION_FRACTION = 1.0, 0.04, 0.16

device, start_time = helpers.start(args)  # seeds network init, exploration and replay sampling

# Environment: NUM_ENVS CartPoles stepped together. SAME_STEP autoreset: when an episode ends,
# step() returns the first observation of the next one and puts the true last observation in
# infos["final_obs"] (gymnasium's default, NEXT_STEP, would spend the next step() on the reset).
envs = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
obs_dim, num_actions = envs.single_observation_space.shape[0], envs.single_action_space.n


class VectorCollector:
    """Steps ``envs`` with a policy. ``step(policy)`` returns the transitions (observation,
    action, next: observation, reward, terminated, done), each ``[num_envs]``; ``episodes`` holds
    ``(frames, episode_return)`` for every finished episode."""

    def __init__(self, envs: gym.vector.VectorEnv, device: torch.device, seed: int) -> None:
        self.envs, self.device = envs, device
        self.obs, _ = envs.reset(seed=seed)  # env i is seeded with seed + i
        self.running_return = np.zeros(envs.num_envs)
        self.episodes: list[tuple[int, float]] = []
        self.frames = 0

    def tensor(self, x, dtype=torch.float32) -> torch.Tensor:
        """numpy (from the envs, on CPU) -> torch on the device."""
        return torch.as_tensor(x, dtype=dtype, device=self.device)

    def step(self, policy, keep: tuple = ()) -> TensorDict:
        """One step of every env with the action ``policy(td)`` returns for ``td["observation"]``;
        the transition keeps the entries ``keep`` that ``policy`` wrote into ``td``."""
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


# p(s, ., .): an MLP writes ATOMS x num_actions logits; DistributionalQValueActor turns them into
# log-probabilities over the atoms ("action_value") and adds the greedy "action" (an index).
support = torch.linspace(V_MIN, V_MAX, ATOMS)
q_net = MLP(in_features=obs_dim, out_features=(ATOMS, num_actions), num_cells=[256, 256],
            activation_class=nn.ReLU)
actor = DistributionalQValueActor(q_net, in_keys=["observation"], support=support,
                                  action_space="categorical").to(device)

# C51 with double-Q bootstrapping; the loss keeps the target copy of the network.
loss_module = DistributionalDQNLoss(actor, gamma=GAMMA).to(device)
# HardUpdate copies on every (interval + 1)-th step(), hence the - 1.
target_updater = HardUpdate(loss_module, value_network_update_interval=TARGET_UPDATE_INTERVAL - 1)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# Replay memory, stored on the training device, sampled uniformly.
replay_buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE, device=device),
                                       batch_size=BATCH_SIZE)


def epsilon_at(frames: int) -> float:
    """rl-zoo's schedule, epsilon as a function of the frames so far: 1 (uniformly random) before
    LEARNING_STARTS; a linear decay from EPS_START to EPS_END over the first EXPLORATION_FRACTION
    of the frames, then EPS_END."""
    if frames < LEARNING_STARTS:
        return 1.0
    progress = min(1.0, frames / (EXPLORATION_FRACTION * total_frames))
    return EPS_START + progress * (EPS_END - EPS_START)


def epsilon_greedy(epsilon: float):
    """A behaviour policy for ``VectorCollector.step``: the actor's greedy ``"action"`` (an
    index, argmax_a Q(s, a)), replaced by a uniformly random one with probability ``epsilon``."""

    def act(td: TensorDict) -> torch.Tensor:
        with torch.no_grad():
            greedy = actor(td)["action"]
        explore = torch.rand(greedy.shape, device=greedy.device) < epsilon
        random_action = torch.randint(num_actions, greedy.shape, device=greedy.device)
        return torch.where(explore, random_action, greedy)

    return act


# ---- dqn_cartpole.py's loop: act epsilon-greedily and store the transitions; every 256 env
# steps (after the first 1,000), 128 gradient steps on loss_module(batch)["loss"] (the mean
# cross-entropy), gradients clipped to MAX_GRAD_NORM, each followed by target_updater.step().
# The learning rate is annealed from LR to 0 as (1 - progress)^2 ----
collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
episodes = collector.episodes  # (frames, episode_return) for every finished episode
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
total_frames = num_iterations * NUM_ENVS * NUM_STEPS
pbar = tqdm(total=total_frames, unit="frames")
base_lr = optimizer.param_groups[0]["lr"]

for iteration in range(num_iterations):
    optimizer.param_groups[0]["lr"] = base_lr * (1.0 - iteration / num_iterations) ** 2

    # ---- Act: NUM_STEPS steps of every env, epsilon-greedily (epsilon read before each step),
    # and store the transitions ----
    steps = []
    for _ in range(NUM_STEPS):
        epsilon = epsilon_at(collector.frames)
        steps.append(collector.step(epsilon_greedy(epsilon)))
    replay_buffer.extend(torch.cat(steps))

    # ---- Learn: once LEARNING_STARTS env steps are stored, GRADIENT_STEPS gradient steps, each
    # on a fresh minibatch ----
    if collector.frames >= LEARNING_STARTS:
        for _ in range(GRADIENT_STEPS):
            batch = replay_buffer.sample()
            loss = loss_module(batch)["loss"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            target_updater.step()
    helpers.show_progress(pbar, episodes, collector.frames, eps=f"{epsilon:.2f}")
pbar.close()
envs.close()

# ---- Save the learning curve, evaluate the greedy policy (argmax_a Q(s, a), no epsilon) on
# start states training never scored, and report ----
helpers.finish(args, start_time, episodes, "C51 on CartPole-v1", env_id="CartPole-v1",
               policy=helpers.greedy_action(actor, device))
