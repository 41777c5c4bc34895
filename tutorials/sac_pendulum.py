"""Soft actor-critic (SAC) on Pendulum-v1 with rlloss, in a single file.

This tutorial trains a tanh-Gaussian policy and two Q-networks with rlloss's ``SACLoss`` (a
drop-in replacement for ``torchrl.objectives.SACLoss``) around a collector you write yourself.
The pieces map to "Soft Actor-Critic Algorithms and Applications" (Haarnoja et al.,
arXiv:1812.05905, Algorithm 1):

1. act with a ~ pi(.|s), a TorchRL ``ProbabilisticActor`` over a ``TanhNormal`` (the Gaussian's
   sample squashed by tanh onto the action bounds), and store (s, a, r, s', terminated) in a
   replay buffer (TorchRL's);
2. for every environment step, sample a minibatch and take one gradient step on the sum of
   ``SACLoss``'s three outputs:

   - ``loss_qvalue``: sum_i (Q_i(s, a) - y)^2 with the soft target
     y = r + gamma (1 - terminated) (min_i Q_i,target(s', a') - alpha log pi(a'|s')),
     a' ~ pi(.|s') (eqs. 5-6; two Q-networks and the minimum of their targets, as in TD3);
   - ``loss_actor``: alpha log pi(a~|s) - min_i Q_i(s, a~), a~ reparameterised (eq. 7);
   - ``loss_alpha``: -log(alpha) (log pi(a~|s) + target_entropy), target_entropy = -dim(A)
     (eq. 18, automatic temperature).

   Each output only sends gradient to its own parameters (the actor loss does not move the
   critics, the temperature loss only moves log(alpha)), so one optimizer on the sum is the
   same as three optimizers with one learning rate;
3. move the target Q-networks towards the online ones, Q_target <- tau Q + (1 - tau) Q_target,
   with TorchRL's ``SoftUpdate``.

Pendulum episodes never terminate; they are truncated after 200 steps, and a truncated
transition keeps its bootstrap term (only ``terminated`` enters the target).

Hyperparameters are rl-baselines3-zoo's Pendulum SAC (SB3 defaults with learning rate 1e-3):
256x256 MLPs, batch 256, gamma 0.99, tau 0.005, one gradient step per environment step,
alpha learned from 1.0. Two choices of ours: 1,000 steps of uniformly random actions before
learning (SB3 uses 100; five full episodes of random data steady the first critic updates), and
the squared-error critic loss of the paper (``loss_function="l2"``; TorchRL's default is
smooth L1).

After training, the policy's squashed mean (no sampling) plays 10 evaluation episodes from start
states no training episode had.

Results (20,000 steps, one CPU thread on a 2-core machine shared with three other training
runs, so the wall times are inflated; seeds 0, 1, 2): final_return (evaluation) -108.5, -106.7
and -160.3 (rl-zoo: about -150); the last 10 training episodes -178.8, -190.5 and -196.2; 1,213,
824 and 689 s. The last 10 training episodes of a seed start from the same states whatever the
agent (the resets depend on the seed alone), and for these seeds they are harder than average:
the near-optimal hand-written controller of ``compose_losses.py`` (about -150 over random
starts) scores -184, -192 and -222 on them.

Run:
    python tutorials/sac_pendulum.py --seed 0 --total-frames 20000 --out runs/sac_pendulum

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes, actions sampled from the policy),
``eval_return=`` and last ``final_return=`` (both the mean return of the evaluation episodes).
"""

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from _results import evaluate, plot_returns, report, write_csv  # tutorials/_results.py
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators
from tqdm import tqdm

from rlloss import SACLoss

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--total-frames", type=int, default=20_000, help="env steps")
parser.add_argument("--device", default="cpu")
parser.add_argument("--out", type=Path, default=Path("runs/sac_pendulum"))
parser.add_argument("--eval-episodes", type=int, default=10,
                    help="episodes of the final deterministic policy, on unseen start states")
parser.add_argument("--save-actor", type=Path, default=None,
                    help="also save the trained actor module there (offline_dataset.py uses it)")
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, sac.yml, Pendulum-v1; see the docstring for our changes).
LEARNING_STARTS = 1_000  # env steps of uniformly random actions before training
BUFFER_SIZE = 100_000
BATCH_SIZE = 256
GAMMA = 0.99
TAU = 0.005  # target networks: Q_target <- tau Q + (1 - tau) Q_target after each gradient step
LR = 1e-3  # actor, critics and temperature

torch.manual_seed(args.seed)  # seeds network init, exploration and replay sampling
device = torch.device(args.device)
if device.type == "cpu":
    torch.set_num_threads(1)  # small MLPs: more threads only add synchronisation (and thrash)
start_time = time.perf_counter()

env = gym.make("Pendulum-v1")
obs_dim = env.observation_space.shape[0]
action_dim = env.action_space.shape[0]
action_spec = Bounded(
    low=torch.as_tensor(env.action_space.low),
    high=torch.as_tensor(env.action_space.high),
    shape=env.action_space.shape,
    device=device,
)

# pi(a|s) = tanh-squashed Normal(mu(s), sigma(s)) scaled onto [low, high]. The MLP writes
# (mu, raw sigma); NormalParamExtractor splits them and makes sigma positive (biased softplus).
actor = ProbabilisticActor(
    TensorDictModule(
        nn.Sequential(
            MLP(in_features=obs_dim, out_features=2 * action_dim, num_cells=[256, 256],
                activation_class=nn.ReLU),
            NormalParamExtractor(),
        ),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    ),
    in_keys=["loc", "scale"],
    spec=action_spec,
    distribution_class=TanhNormal,
    distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
).to(device)


def make_critic():
    """Q(s, a): an MLP on the concatenated observation and action, writing
    "state_action_value"."""
    return ValueOperator(
        MLP(in_features=obs_dim + action_dim, out_features=1, num_cells=[256, 256],
            activation_class=nn.ReLU),
        in_keys=["observation", "action"],
    )


# Two Q-networks (an ensemble evaluated in one vmap call) with target copies; the target
# entropy -dim(A) = -1 comes from the actor's spec.
loss_module = SACLoss(
    actor, [make_critic(), make_critic()], loss_function="l2", alpha_init=1.0
).to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
target_updater = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)  # actor, Q_1, Q_2, log(alpha)

# Replay memory, stored on the training device (a GPU buffer with --device cuda).
replay_buffer = TensorDictReplayBuffer(
    storage=LazyTensorStorage(BUFFER_SIZE, device=device), batch_size=BATCH_SIZE
)


def to_tensor(x, dtype=torch.float32):
    """numpy (from the env, on CPU) -> torch on the training device."""
    return torch.as_tensor(x, dtype=dtype, device=device)


obs, _ = env.reset(seed=args.seed)
episode_return = 0.0
episodes = []  # (frames, episode_return) for every finished episode
losses = None  # the last SACLoss outputs, for the progress bar
pbar = tqdm(total=args.total_frames, unit="frames")

for frame in range(1, args.total_frames + 1):
    # ---- Act: uniformly random before LEARNING_STARTS, then a ~ pi(.|s) ----
    td = TensorDict(observation=to_tensor(obs), device=device)
    if frame <= LEARNING_STARTS:
        td["action"] = action_spec.rand()
    else:
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            actor(td)  # writes "loc", "scale" and a sampled "action" in [low, high]
    obs, reward, terminated, truncated, _ = env.step(td["action"].cpu().numpy())
    # ("next", "observation") is the true successor: env.reset() below only replaces `obs`.
    td["next"] = TensorDict(
        observation=to_tensor(obs),
        reward=to_tensor([reward]),
        terminated=to_tensor([terminated], torch.bool),  # never true on Pendulum
        device=device,
    )
    replay_buffer.add(td.select("observation", "action", "next"))

    episode_return += reward
    if terminated or truncated:
        episodes.append((frame, episode_return))
        episode_return = 0.0
        obs, _ = env.reset()

    # ---- Learn: one gradient step on the sum of the three SAC losses ----
    if frame > LEARNING_STARTS:
        batch = replay_buffer.sample()
        losses = loss_module(batch)
        loss = losses["loss_qvalue"] + losses["loss_actor"] + losses["loss_alpha"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        target_updater.step()

    if frame % 1000 == 0:
        recent = [ret for _, ret in episodes[-10:]]
        pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a",
                         alpha=f"{losses['alpha']:.3f}" if losses is not None else "n/a")
    pbar.update(1)
pbar.close()
env.close()

# ---- Save the learning curve ----
write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)

fig = Figure(figsize=(6, 4))
ax = fig.add_subplot()
plot_returns(ax, episodes)
ax.set(xlabel="environment steps", ylabel="episode return", title="SAC on Pendulum-v1")
fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")


def deterministic_action(observation):
    """The squashed mean tanh(mu(s)) scaled onto the bounds, without sampling."""
    td = TensorDict(observation=to_tensor(observation), device=device)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return actor(td)["action"].cpu().numpy()


# ---- Evaluate the final policy without exploration, on start states training never scored ----
eval_returns = evaluate("Pendulum-v1", deterministic_action, seed=10_000 + 100 * args.seed,
                        episodes=args.eval_episodes)
if args.save_actor is not None:
    torch.save(actor, args.save_actor)
report(start_time, episodes, eval_returns)
