"""PPO on CartPole-v1 with rlloss, in a single file.

This tutorial shows how to train an agent with rlloss's ``ClipPPOLoss`` and ``GAE`` (drop-in
replacements for ``torchrl.objectives``) around a collector you write yourself:

1. a gymnasium vector env is stepped by a TorchRL ``ProbabilisticActor``; each rollout is stored
   as a TensorDict of batch size ``[num_envs, num_steps]`` (time is the last batch dim);
2. ``GAE`` computes advantages and value targets for the whole rollout (PPO paper, eq. 11);
3. ``ClipPPOLoss`` gives the clipped surrogate objective (eq. 7) plus the value loss (eq. 9),
   optimised for a few epochs over the same rollout.

Hyperparameters are the rl-baselines3-zoo ones tuned for CartPole. The agent reaches the maximal
return of 500 in about 100k environment steps, a minute or two on a laptop CPU.

Run:
    python tutorials/ppo_cartpole.py --seed 0 --total-frames 100000 --out runs/ppo_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; the last
printed line is ``final_return=<mean return of the last 10 episodes>``.
"""

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from _helpers import plot_returns, report, write_csv  # tutorials/_helpers.py
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, ClipPPOLoss

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--total-frames", type=int, default=100_000, help="env steps, all envs")
parser.add_argument("--device", default="cpu")
parser.add_argument("--out", type=Path, default=Path("runs/ppo_cartpole"))
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, ppo.yml, CartPole-v1).
NUM_ENVS = 8
NUM_STEPS = 32  # steps per env per rollout: a rollout holds 8 * 32 = 256 transitions
NUM_EPOCHS = 20  # optimisation passes over each rollout
MINIBATCH_SIZE = 256  # the whole rollout
GAMMA, LMBDA = 0.98, 0.8
LR = 1e-3  # linearly annealed to 0
CLIP_EPSILON = 0.2  # linearly annealed to 0
ENTROPY_COEFF, CRITIC_COEFF = 0.0, 0.5
MAX_GRAD_NORM = 0.5

torch.manual_seed(args.seed)  # seeds network init and action sampling
device = torch.device(args.device)
if device.type == "cpu":
    torch.set_num_threads(1)  # tiny MLPs: more threads only add synchronisation (and thrash)
start_time = time.perf_counter()

# Environment. SAME_STEP autoreset: when an episode ends, step() returns the first observation of
# the next episode and puts the true last observation in infos["final_obs"]. (The gymnasium 1.x
# default, NEXT_STEP, would instead spend the following step() on the reset and ignore its action.)
envs = gym.make_vec(
    "CartPole-v1",
    num_envs=NUM_ENVS,
    vectorization_mode="sync",
    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
)
obs_dim = envs.single_observation_space.shape[0]
num_actions = envs.single_action_space.n

# Policy pi(a|s): an MLP writes "logits"; ProbabilisticActor samples "action" from
# Categorical(logits) and records its log-probability (the "old" log-prob of the PPO ratio).
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                 activation_class=nn.Tanh)
actor = ProbabilisticActor(
    TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
    in_keys=["logits"],
    distribution_class=torch.distributions.Categorical,
    return_log_prob=True,
).to(device)
# Value function V(s), written to "state_value".
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
loss_module = ClipPPOLoss(
    actor_network=actor,
    critic_network=critic,
    clip_epsilon=CLIP_EPSILON,
    entropy_coeff=ENTROPY_COEFF,
    critic_coeff=CRITIC_COEFF,
    loss_critic_type="l2",
    normalize_advantage=True,
).to(device)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)


def to_tensor(x, dtype=torch.float32):
    """numpy (from the env, on CPU) -> torch on the training device."""
    return torch.as_tensor(x, dtype=dtype, device=device)


frames_per_batch = NUM_ENVS * NUM_STEPS
num_iterations = max(1, args.total_frames // frames_per_batch)
obs, _ = envs.reset(seed=args.seed)  # env i is seeded with seed + i
running_return = np.zeros(NUM_ENVS)
episodes = []  # (frames, episode_return) for every finished episode
frames = 0
pbar = tqdm(total=num_iterations * frames_per_batch, unit="frames")

for iteration in range(num_iterations):
    # Anneal the learning rate and the clipping range linearly to 0.
    frac = 1.0 - iteration / num_iterations
    optimizer.param_groups[0]["lr"] = LR * frac
    loss_module.clip_epsilon.copy_(CLIP_EPSILON * frac)

    # ---- Collect a rollout with the current policy ----
    steps = []
    for _ in range(NUM_STEPS):
        td = TensorDict(observation=to_tensor(obs), batch_size=[NUM_ENVS], device=device)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            actor(td)  # writes "logits", "action" and "action_log_prob"
        obs, reward, terminated, truncated, infos = envs.step(td["action"].cpu().numpy())
        done = terminated | truncated

        # ("next", "observation") must be the true successor state: for finished envs `obs`
        # already holds the reset observation, the final one is in infos["final_obs"].
        next_obs = obs.copy()
        for i in np.flatnonzero(done):
            next_obs[i] = infos["final_obs"][i]
        td["next"] = TensorDict(
            observation=to_tensor(next_obs),
            reward=to_tensor(reward).unsqueeze(-1),
            # terminated: no bootstrapping from V(s'). done (terminated or truncated at the
            # 500-step time limit): the GAE trace stops here, as the next step starts a new episode.
            terminated=to_tensor(terminated, torch.bool).unsqueeze(-1),
            done=to_tensor(done, torch.bool).unsqueeze(-1),
            batch_size=[NUM_ENVS],
        )
        steps.append(td.exclude("logits"))

        running_return += reward
        for i in np.flatnonzero(done):
            episodes.append((frames + NUM_ENVS, running_return[i]))
            running_return[i] = 0.0
        frames += NUM_ENVS
    rollout = torch.stack(steps, dim=1)  # batch size [NUM_ENVS, NUM_STEPS], time last

    # ---- Advantages A_t and value targets, computed once with the pre-update critic ----
    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- Optimise the PPO objective for several epochs over the rollout ----
    flat = rollout.reshape(-1)
    for _ in range(NUM_EPOCHS):
        for idx in torch.randperm(frames_per_batch, device=device).split(MINIBATCH_SIZE):
            losses = loss_module(flat[idx])
            # Total loss: sum of the "loss_*" entries (objective, critic, entropy).
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()

    recent = [ret for _, ret in episodes[-10:]]
    pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a")
    pbar.update(frames_per_batch)
pbar.close()
envs.close()

# ---- Save the learning curve ----
write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)

fig = Figure(figsize=(6, 4))
ax = fig.add_subplot()
plot_returns(ax, episodes)
ax.set(xlabel="environment steps", ylabel="episode return", title="PPO on CartPole-v1")
fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")

report(start_time, episodes)
