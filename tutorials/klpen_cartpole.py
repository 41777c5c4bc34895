"""PPO with an adaptive KL penalty (KLPEN) on CartPole-v1 with rlloss, in a single file.

The PPO paper (Schulman et al., arXiv:1707.06347) proposes two surrogates. ``ppo_cartpole.py``
uses the clipped one; this tutorial uses the other, section 4:

    L^KLPEN = E_t[ r_t A_t - beta KL(pi_old(.|s_t) || pi(.|s_t)) ],

with beta adapted to a target KL ``dtarg`` after each policy update: ``d < dtarg / 1.5 -> beta /=
2``, ``d > 1.5 dtarg -> beta *= 2``. ``KLPENPPOLoss`` computes KL(pi_old || pi) analytically from
the logits that the collecting policy stored in the rollout, so the rollout must keep "logits".

beta adaptation: by default (``adaptive_beta=True``, TorchRL's behaviour) ``KLPENPPOLoss`` adapts
beta after every forward pass. This script follows the paper instead: ``adaptive_beta=False``, and
one ``loss_module.update_beta(d)`` per update, ``d`` the KL between the policy before and after it.

Everything else (collector, GAE, hyperparameters) is as in ``ppo_cartpole.py``. Besides
``OUT/returns.csv`` and ``OUT/curve.png`` (return, beta and KL panels), the script writes
``OUT/beta_kl.csv`` (one row per update). The last printed line is ``final_return=<mean return
of the last 10 episodes>``.

Run:
    python tutorials/klpen_cartpole.py --seed 0 --total-frames 150000 --out runs/klpen_cartpole
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

from rlloss import GAE, KLPENPPOLoss

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--total-frames", type=int, default=150_000, help="env steps, all envs")
parser.add_argument("--device", default="cpu")
parser.add_argument("--out", type=Path, default=Path("runs/klpen_cartpole"))
args = parser.parse_args()

# Hyperparameters: those of ppo_cartpole.py (rl-baselines3-zoo), with the KL penalty in place of
# the clipping.
NUM_ENVS = 8
NUM_STEPS = 32  # steps per env per rollout: a rollout holds 8 * 32 = 256 transitions
NUM_EPOCHS = 20  # optimisation passes over each rollout
MINIBATCH_SIZE = 256  # the whole rollout
GAMMA, LMBDA = 0.98, 0.8
LR = 1e-3  # linearly annealed to 0
DTARG, BETA = 0.01, 1.0  # target KL per update and initial penalty coefficient (paper: 0.01, 1)
ENTROPY_COEFF, CRITIC_COEFF = 0.0, 0.5
MAX_GRAD_NORM = 0.5

torch.manual_seed(args.seed)  # seeds network init and action sampling
device = torch.device(args.device)
start_time = time.perf_counter()

# Environment, with SAME_STEP autoreset (see ppo_cartpole.py).
envs = gym.make_vec(
    "CartPole-v1",
    num_envs=NUM_ENVS,
    vectorization_mode="sync",
    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
)
obs_dim = envs.single_observation_space.shape[0]
num_actions = envs.single_action_space.n

# Policy pi(a|s) = Categorical(logits(s)) and value function V(s).
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                 activation_class=nn.Tanh)
actor = ProbabilisticActor(
    TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
    in_keys=["logits"],
    distribution_class=torch.distributions.Categorical,
    return_log_prob=True,
).to(device)
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
loss_module = KLPENPPOLoss(
    actor_network=actor,
    critic_network=critic,
    dtarg=DTARG,
    beta=BETA,
    adaptive_beta=False,  # beta is updated once per update, below, as in the paper
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
penalty_log = []  # (frames, beta used in the update, KL d after the update) for every update
frames = 0
pbar = tqdm(total=num_iterations * frames_per_batch, unit="frames")

for iteration in range(num_iterations):
    optimizer.param_groups[0]["lr"] = LR * (1.0 - iteration / num_iterations)

    # ---- Collect a rollout with the current policy ----
    steps = []
    for _ in range(NUM_STEPS):
        td = TensorDict(observation=to_tensor(obs), batch_size=[NUM_ENVS], device=device)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            actor(td)  # writes "logits", "action" and "action_log_prob"
        obs, reward, terminated, truncated, infos = envs.step(td["action"].cpu().numpy())
        done = terminated | truncated
        next_obs = obs.copy()  # the true successor state of finished envs is in final_obs
        for i in np.flatnonzero(done):
            next_obs[i] = infos["final_obs"][i]
        td["next"] = TensorDict(
            observation=to_tensor(next_obs),
            reward=to_tensor(reward).unsqueeze(-1),
            terminated=to_tensor(terminated, torch.bool).unsqueeze(-1),
            done=to_tensor(done, torch.bool).unsqueeze(-1),
            batch_size=[NUM_ENVS],
        )
        steps.append(td)  # keeps "logits": pi_old, for KL(pi_old || pi)

        running_return += reward
        for i in np.flatnonzero(done):
            episodes.append((frames + NUM_ENVS, running_return[i]))
            running_return[i] = 0.0
        frames += NUM_ENVS
    rollout = torch.stack(steps, dim=1)  # batch size [NUM_ENVS, NUM_STEPS], time last

    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- Optimise L^KLPEN for several epochs with a fixed beta ----
    flat = rollout.reshape(-1)
    beta = loss_module.beta.item()
    for _ in range(NUM_EPOCHS):
        for idx in torch.randperm(frames_per_batch, device=device).split(MINIBATCH_SIZE):
            losses = loss_module(flat[idx])  # losses["kl"], losses["beta"]: mean KL, beta used
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()

    # ---- Adapt beta: d = KL(pi_old || pi_new) over the rollout, after the update ----
    with torch.no_grad():
        kl = loss_module(flat)["kl"]
    loss_module.update_beta(kl)
    penalty_log.append((frames, beta, kl.item()))

    recent = [ret for _, ret in episodes[-10:]]
    pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a",
                     beta=f"{beta:.3g}", kl=f"{kl.item():.4f}")
    pbar.update(frames_per_batch)
pbar.close()
envs.close()

# ---- Save the learning curve, beta and KL ----
write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)
write_csv(args.out / "beta_kl.csv", ["frames", "beta", "kl"], penalty_log)

fig = Figure(figsize=(6, 8))
ax_return, ax_beta, ax_kl = fig.subplots(3, 1, sharex=True)
plot_returns(ax_return, episodes)
ax_return.set(ylabel="episode return", title="PPO (adaptive KL penalty) on CartPole-v1")
x, beta_values, kl_values = np.array(penalty_log).T
ax_beta.semilogy(x, beta_values)
ax_beta.set(ylabel="beta")
ax_kl.semilogy(x, kl_values, label="KL(pi_old || pi_new)")
ax_kl.axhline(DTARG, color="k", linestyle="--", label="dtarg")
ax_kl.axhspan(DTARG / 1.5, DTARG * 1.5, color="k", alpha=0.1, label="beta unchanged")
ax_kl.set(xlabel="environment steps", ylabel="KL per update")
ax_kl.legend()
fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")

report(start_time, episodes)
