"""Robust Policy Optimization (RPO) on Pendulum-v1 with rlloss, in a single file.

RPO (Rahman & Xue, arXiv:2212.07536) is clipped PPO with one change in the update: the mean of
the Gaussian policy is perturbed with fresh uniform noise, ``mu(s) + z, z ~ U(-alpha, alpha)``,
before the new log-probability ``log pi(a|s)`` of the ratio is computed. Rollouts are sampled
from the unperturbed policy; the perturbation keeps the policy's entropy from collapsing.
``--rpo-alpha 0`` is plain clipped PPO.

Two helpers from rlloss make PPO work on Pendulum's dense, large negative rewards:

- ``RewardNormalizer``: inside the collector, each reward is divided, step by step, by the
  running std of the discounted return (PPO's reward scaling, Engstrom et al.,
  arXiv:2005.12729); the episode returns reported are those of the raw rewards;
- ``KLAdaptiveLR``: after every epoch the learning rate is divided by 1.5 if the KL between the
  rollout policy and the current one is above 2 * ``kl_threshold``, multiplied by 1.5 if below
  ``kl_threshold`` / 2 (skrl's scheduler; see ``policy_kl`` for which KL).

The policy is CleanRL's (rpo_continuous_action.py): a Normal with a state-independent log-std.
Actions are clipped to the bounds when stepping the env, and the *unclipped* action is stored
for its log-probability. Hyperparameters follow skrl's and rl-baselines3-zoo's Pendulum PPO.

Run (and compare alpha = 0.5 with plain PPO):
    python tutorials/rpo_pendulum.py --seed 0 --out runs/rpo_pendulum
    python tutorials/rpo_pendulum.py --seed 0 --rpo-alpha 0 --out runs/ppo_pendulum
    python tutorials/rpo_pendulum.py --compare runs/rpo_pendulum runs/ppo_pendulum --out runs

A training run writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/lr.csv`` and
``OUT/curve.png``; the last printed line is ``final_return=<mean return of the last 10
episodes>``. ``--compare DIR...`` draws the curves of finished runs into ``OUT/comparison.png``.
"""

import argparse
import time
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from tensordict.nn import AddStateIndependentNormalScale, TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, KLAdaptiveLR, RewardNormalizer, RPOLoss
from rlloss.functional import kl_k3

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--total-frames", type=int, default=300_000, help="env steps, all envs")
parser.add_argument("--device", default="cpu")
parser.add_argument("--out", type=Path, default=Path("runs/rpo_pendulum"))
parser.add_argument("--rpo-alpha", type=float, default=0.5, help="0: plain clipped PPO")
parser.add_argument("--compare", type=Path, nargs="+", metavar="DIR",
                    help="plot the returns.csv of these runs into OUT/comparison.png and exit")
args = parser.parse_args()


def running_mean_curve(ax, episodes, label, window=20, **kwargs):
    """Plot the running mean of (frames, episode_return) rows."""
    x, y = np.array(episodes, dtype=float).reshape(-1, 2).T
    window = max(1, min(window, len(y)))
    ax.plot(x[window - 1:], np.convolve(y, np.ones(window) / window, "valid"), label=label,
            **kwargs)


if args.compare:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for run in args.compare:
        episodes = np.loadtxt(run / "returns.csv", delimiter=",", skiprows=1, ndmin=2)
        running_mean_curve(ax, episodes, label=run.name)
    ax.set(xlabel="environment steps", ylabel="episode return (running mean of 20)",
           title="RPO vs PPO on Pendulum-v1")
    ax.legend()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "comparison.png", dpi=100, bbox_inches="tight")
    raise SystemExit(0)

# Hyperparameters (skrl / rl-baselines3-zoo Pendulum PPO; reward scaling instead of gSDE).
NUM_ENVS = 4
NUM_STEPS = 512  # steps per env per rollout: a rollout holds 4 * 512 = 2048 transitions
NUM_EPOCHS = 10
MINIBATCH_SIZE = 128
GAMMA, LMBDA = 0.9, 0.95
LR, KL_THRESHOLD = 1e-3, 0.008  # initial learning rate, adapted to the KL by KLAdaptiveLR
CLIP_EPSILON = 0.2
ENTROPY_COEFF, CRITIC_COEFF = 0.0, 0.5
MAX_GRAD_NORM = 0.5

torch.manual_seed(args.seed)  # seeds network init, action sampling and the RPO noise
device = torch.device(args.device)
start_time = time.perf_counter()

# Environment, with SAME_STEP autoreset (see ppo_cartpole.py). Pendulum episodes are truncated
# after 200 steps and never terminate.
envs = gym.make_vec(
    "Pendulum-v1",
    num_envs=NUM_ENVS,
    vectorization_mode="sync",
    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
)
obs_dim = envs.single_observation_space.shape[0]
action_dim = envs.single_action_space.shape[0]
action_low, action_high = envs.single_action_space.low, envs.single_action_space.high

# Policy pi(a|s) = Normal(mu(s), sigma), sigma a learned state-independent parameter. RPOLoss
# perturbs the "loc" entry that this module writes.
actor = ProbabilisticActor(
    TensorDictModule(
        nn.Sequential(
            MLP(in_features=obs_dim, out_features=action_dim, num_cells=[64, 64],
                activation_class=nn.Tanh),
            AddStateIndependentNormalScale(action_dim),  # returns (loc, exp(log_std))
        ),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    ),
    in_keys=["loc", "scale"],
    distribution_class=IndependentNormal,
    return_log_prob=True,
).to(device)
# V(s), written to "state_value": a 64-64 tanh MLP.
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
loss_module = RPOLoss(actor_network=actor, critic_network=critic, rpo_alpha=args.rpo_alpha,
                      clip_epsilon=CLIP_EPSILON, entropy_coeff=ENTROPY_COEFF,
                      critic_coeff=CRITIC_COEFF, loss_critic_type="l2",
                      normalize_advantage=True).to(device)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)
scheduler = KLAdaptiveLR(optimizer, kl_threshold=KL_THRESHOLD)
reward_normalizer = RewardNormalizer(num_envs=NUM_ENVS, gamma=GAMMA).to(device)


def to_tensor(x, dtype=torch.float32):
    """numpy (from the env, on CPU) -> torch on the training device."""
    return torch.as_tensor(x, dtype=dtype, device=device)


@torch.no_grad()
def policy_kl(batch):
    """k3 estimate of KL(pi_old || pi) over the rollout, pi the current *unperturbed* policy.

    Not the loss's ``kl_k3`` output: RPOLoss computes it with the perturbed mean mu(s) + z, so it
    also measures the noise (about alpha^2 / (6 sigma^2) per action dimension, above the KL target
    from the first minibatch on), and KLAdaptiveLR would keep cutting the learning rate.
    """
    log_prob = actor.get_dist(batch.copy()).log_prob(batch["action"])  # copy: keep stored loc
    return kl_k3(log_prob - batch["action_log_prob"]).mean()


frames_per_batch = NUM_ENVS * NUM_STEPS
num_iterations = max(1, args.total_frames // frames_per_batch)
obs, _ = envs.reset(seed=args.seed)  # env i is seeded with seed + i
running_return = np.zeros(NUM_ENVS)
episodes = []  # (frames, episode_return) for every finished episode, raw rewards
lr_log = []  # (frames, learning rate after the update) for every update
frames = 0
pbar = tqdm(total=num_iterations * frames_per_batch, unit="frames")

for _ in range(num_iterations):
    # ---- Collect a rollout with the current (unperturbed) policy ----
    steps = []
    for _ in range(NUM_STEPS):
        td = TensorDict(observation=to_tensor(obs), batch_size=[NUM_ENVS], device=device)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            actor(td)  # writes "loc", "scale", "action" (unclipped) and "action_log_prob"
        action = np.clip(td["action"].cpu().numpy(), action_low, action_high)
        obs, reward, terminated, truncated, infos = envs.step(action)
        done = terminated | truncated
        next_obs = obs.copy()  # the true successor state of finished envs is in final_obs
        for i in np.flatnonzero(done):
            next_obs[i] = infos["final_obs"][i]
        done_tensor = to_tensor(done, torch.bool)
        td["next"] = TensorDict(
            observation=to_tensor(next_obs),
            # r_t / std(discounted return), the statistics updated with this step.
            reward=reward_normalizer(to_tensor(reward), done_tensor).unsqueeze(-1),
            terminated=to_tensor(terminated, torch.bool).unsqueeze(-1),
            done=done_tensor.unsqueeze(-1),
            batch_size=[NUM_ENVS],
        )
        steps.append(td)

        running_return += reward
        for i in np.flatnonzero(done):
            episodes.append((frames + NUM_ENVS, running_return[i]))
            running_return[i] = 0.0
        frames += NUM_ENVS
    rollout = torch.stack(steps, dim=1)  # batch size [NUM_ENVS, NUM_STEPS], time last

    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- Optimise the RPO objective; adapt the learning rate to each epoch's KL ----
    # Random minibatches, an Adam step on the sum of the "loss_*" entries each (fresh noise z on
    # mu(s) in every call of the loss); after each epoch the scheduler reads the epoch's KL.
    flat = rollout.reshape(-1)
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(flat.numel(), device=flat.device)  # a fresh permutation
        for idx in order.split(MINIBATCH_SIZE):
            losses = loss_module(flat[idx])
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()
        scheduler.step(policy_kl(flat))
    lr_log.append((frames, optimizer.param_groups[0]["lr"]))

    recent = [ret for _, ret in episodes[-10:]]
    pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a",
                     lr=f"{lr_log[-1][1]:.2g}")
    pbar.update(frames_per_batch)
pbar.close()
envs.close()

# ---- Save the learning curve and the learning rate ----
helpers.write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)
helpers.write_csv(args.out / "lr.csv", ["frames", "lr"], lr_log)

fig = Figure(figsize=(6, 6))
ax_return, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
helpers.plot_returns(ax_return, episodes)
ax_return.set(ylabel="episode return",
              title=f"RPO (alpha={args.rpo_alpha}) on Pendulum-v1")
ax_lr.semilogy(*np.array(lr_log).T)
ax_lr.set(xlabel="environment steps", ylabel="learning rate (KLAdaptiveLR)")
fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")

helpers.report(start_time, episodes)
