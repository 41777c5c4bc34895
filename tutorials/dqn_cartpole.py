"""Double DQN on CartPole-v1 with rlloss, in a single file.

This tutorial trains a Q-network with rlloss's ``DQNLoss`` (a drop-in replacement for
``torchrl.objectives.DQNLoss``) around a collector you write yourself. The pieces map to the DQN
paper (Mnih et al., Nature 2015, Algorithm 1) and Double DQN (van Hasselt et al., 2015):

1. act epsilon-greedily with respect to Q(s, .), a TorchRL ``QValueActor`` (an MLP), and store
   the transitions (s, a, r, s', terminated) in a replay memory, a TorchRL replay buffer;
2. sample minibatches and minimise L(Q(s, a), y) with the target
   y = r + gamma (1 - terminated) Q_target(s', argmax_a' Q(s', a'))  (double Q-learning);
3. every C gradient steps copy Q's weights into Q_target (TorchRL's ``HardUpdate``).

``--per`` switches on prioritized replay (Schaul et al., 2015) through rlloss's
``PrioritizedSampler`` (``rlloss.data``: a drop-in for TorchRL's, whose sum trees stay on the
buffer's device and need no C++ extension): the loss writes each sample's ``td_error`` into the
batch, the buffer turns it into a priority, and the loss weights samples by the
``priority_weight`` the sampler wrote.

Hyperparameters are rl-baselines3-zoo's tuned CartPole DQN, with three changes that make the
result hold on every seed: a squared-error loss instead of Huber (which learned markedly slower
here: it caps the gradient of large TD errors, such as those of the terminal transitions), a
learning rate annealed to 0 (quadratically), and 100,000 environment steps with checkpoint
selection. DQN on CartPole does not end reliably on its best policy: a network that balances for
500 steps can lose it again thousands of steps later, even as the learning rate nears 0. So over
the second half of training, every 10 training phases (2,560 env steps) and after the last, the
greedy policy (no epsilon) plays 5 episodes from start states of its own, and the network with
the best mean (the latest among equals) is the result; that network then plays the 10
evaluation episodes, from start states neither training nor selection had. The last network's
own evaluation is printed too (``last_network_return=``).

Results (100,000 steps, the defaults; final_return: the selected network's mean return over the
10 evaluation episodes), with rlloss's ``DQNLoss`` and with TorchRL's swapped in (the same loop,
only the import changed: ``tools/tutorial_runs.py --figures --tutorials dqn_cartpole``), on this
repository's 2-core CPU machine:

    [figures] rlloss, seeds 0 1 2 3 4, --total-frames 100000: final_return = 500.0 500.0 500.0 500.0 500.0
    [figures] torchrl, seeds 0 1 2 3 4, --total-frames 100000: final_return = 500.0 500.0 500.0 500.0 500.0

The last network alone (``last_network_return``, the same 10 episodes): rlloss 500.0, 500.0,
500.0, 93.9, 414.3; TorchRL 500.0, 500.0, 126.3, 500.0, 500.0 (where the last network fell
short, the selected one is from 81,920 or 87,040 steps). Robustness to rounding: rerun with
``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2`` (on this AVX-512 machine the matrix
products then take AVX2 kernels: other float32 rounding, the same maths; a 4,000-frame run of seed
0 already parts), final_return on seeds 0-4: rlloss 500.0, 500.0, 464.3, 500.0, 500.0; TorchRL
500.0 on all five (last networks: rlloss 182.0, 500.0, 391.7, 167.4, 500.0; TorchRL 492.7, 500.0,
500.0, 500.0, 500.0). So 9 of 10 perturbed runs reach 475; on rlloss's seed 2 the selected network
scored 500 on its 5 selection episodes and 464.3 on the 10 evaluation ones (more selection episodes
is the next setting to try).

Why these settings (issue 49): with 50,000 steps and no selection (the settings before), the
final network reached 500 on seeds 0-4 with both classes on this machine, but the issue's
machine measured 500, 373.7, 364.0, 217.5, 500, 500 (rlloss) and 500, 500, 500, 197.2, 500, 500
(TorchRL) on seeds 0-5, and the AVX2 kernels here gave 311.0 (TorchRL, seed 3): which seeds
succeed moved with float32 rounding, while the two classes compute the same updates
(``tests/test_trajectories.py``: equal within 1e-8 in float64 over 200 Adam steps). Tried and
dropped: a learning rate of 1e-3 (seed 1: 206.3), 100,000 steps without selection (AVX2, seed
0: 182.0 after reaching 500 at 40,000 steps), selection at 50,000 steps (AVX2, TorchRL's seed
3: 298.1, no network of the second half above 336.8), Polyak target updates
(``SoftUpdate(tau=0.005)``; seeds 1 and 3: 306.9 and 208.0).
``--per``: measured before issue 49 only (50,000 steps, no selection: final_return 500, 435.4
and 500 on seeds 0-2), not re-measured.

Run:
    python tutorials/dqn_cartpole.py --seed 0 --out runs/dqn_cartpole
    python tutorials/dqn_cartpole.py --per --seed 0 --out runs/dqn_per

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``last_network_return=`` (the last network's greedy evaluation), ``selected_at=`` (the env steps
of the selected network) and ``selected_score=`` (its selection mean), ``train_return=`` (mean of
the last 10 training episodes, played with the final epsilon), ``eval_return=`` and last
``final_return=`` (both the mean return of the selected network's greedy evaluation).
"""

import copy

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import HardUpdate, ValueEstimators
from tqdm import tqdm

from rlloss import DQNLoss
from rlloss.data import PrioritizedSampler  # TorchRL's, in pure torch on the buffer's device

parser = helpers.tutorial_parser(__doc__, "runs/dqn_cartpole", 100_000, "env steps, all envs")
parser.add_argument("--per", action="store_true", help="prioritized experience replay")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, dqn.yml, CartPole-v1, except the loss, the lr schedule, the
# budget and the checkpoint selection).
# Those of the loop (4 envs, 64 steps of each then 128 gradient steps, 1,000 random steps first,
# a replay memory of 100,000 transitions, minibatches of 64, epsilon from 1 to 0.04 over the
# first 16% of training) are below, shared with c51_cartpole.py.
GAMMA = 0.99
LR = 2.3e-3  # annealed to 0 as (1 - progress)^2
# Gradient steps between target copies: once per training phase. (rl-zoo's target_update_interval
# of 10 counts env steps, so there too the target is synced once between training phases.)
TARGET_UPDATE_INTERVAL = 128
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
# Checkpoint selection (what makes the result hold on every seed: see the docstring): over the
# second half of training, every SELECT_EVERY training phases and after the last, the greedy
# policy plays SELECT_EPISODES episodes from start states of its own (neither training's nor the
# final evaluation's); the network with the best mean (the latest among equals) is the result.
SELECT_EVERY = 10
SELECT_FROM = 0.5
SELECT_EPISODES = 5

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


# Q(s, .): an MLP writes "action_value"; QValueActor adds the greedy "action" (an index).
q_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[256, 256],
            activation_class=nn.ReLU)
actor = QValueActor(q_net, in_keys=["observation"], action_space="categorical").to(device)

# Double DQN with a squared-error loss; the loss keeps the target copy of the Q-network.
loss_module = DQNLoss(actor, loss_function="l2", double_dqn=True,
                      action_space="categorical").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
# HardUpdate copies on every (interval + 1)-th step(), hence the - 1.
target_updater = HardUpdate(loss_module, value_network_update_interval=TARGET_UPDATE_INTERVAL - 1)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# Replay memory, stored on the training device (a GPU buffer with --device cuda); with --per,
# sampled in proportion to the priorities the loss's "td_error" gives (minibatches then also hold
# "priority_weight" and "index").
if args.per:
    sampler = PrioritizedSampler(BUFFER_SIZE, alpha=0.6, beta=0.4)
    replay_buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE, device=device),
                                           batch_size=BATCH_SIZE, sampler=sampler,
                                           priority_key="td_error")
else:
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


# ---- The loop: act epsilon-greedily and store the transitions; every 256 env steps (after the
# first 1,000), 128 gradient steps on loss_module(batch)["loss"] (which also writes
# batch["td_error"]), gradients clipped to MAX_GRAD_NORM, each followed by target_updater.step()
# (Q copied into Q_target every TARGET_UPDATE_INTERVAL steps) and, with --per, new priorities
# from batch["td_error"] (rlloss writes the squared TD error, as TorchRL does). The learning
# rate is annealed from LR to 0 as (1 - progress)^2 ----
collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
episodes = collector.episodes  # (frames, episode_return) for every finished episode
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
total_frames = num_iterations * NUM_ENVS * NUM_STEPS
pbar = tqdm(total=total_frames, unit="frames")
base_lr = optimizer.param_groups[0]["lr"]
greedy_policy = helpers.greedy_action(actor, device)  # argmax_a Q(s, a), no epsilon
best_score, best_state, best_frames = -float("inf"), None, 0

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
            if args.per:
                replay_buffer.update_tensordict_priority(batch)

    # ---- Select: in the second half, every SELECT_EVERY phases and after the last one, score
    # the greedy policy on SELECT_EPISODES start states seeded 20_000 + 100 * seed, ... (no
    # torch random number is drawn: training goes on exactly as without it); keep the best ----
    last = iteration == num_iterations - 1
    if last or (iteration >= SELECT_FROM * num_iterations and (iteration + 1) % SELECT_EVERY == 0):
        score = np.mean(helpers.evaluate("CartPole-v1", greedy_policy,
                                         seed=20_000 + 100 * args.seed, episodes=SELECT_EPISODES))
        if score >= best_score:
            best_score, best_state = score, copy.deepcopy(actor.state_dict())
            best_frames = collector.frames

    helpers.show_progress(pbar, episodes, collector.frames, eps=f"{epsilon:.2f}")
pbar.close()
envs.close()

# ---- The last network's own evaluation (printed for comparison), then the selected network ----
last_returns = helpers.evaluate("CartPole-v1", greedy_policy, seed=10_000 + 100 * args.seed,
                                episodes=args.eval_episodes)
print(f"last_network_return={np.mean(last_returns):.1f}")
print(f"selected_at={best_frames} selected_score={best_score:.1f}")
actor.load_state_dict(best_state)

# ---- Save the learning curve, evaluate the selected network's greedy policy on start states
# neither training nor selection scored, and report ----
helpers.finish(args, start_time, episodes, "Double DQN on CartPole-v1", env_id="CartPole-v1",
               policy=greedy_policy)
