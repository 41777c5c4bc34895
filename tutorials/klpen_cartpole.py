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

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, KLPENPPOLoss

parser = helpers.tutorial_parser(__doc__, "runs/klpen_cartpole", 150_000, "env steps, all envs")
args = parser.parse_args()

# Hyperparameters: those of ppo_cartpole.py (rl-baselines3-zoo), with the KL penalty in place of
# the clipping. A rollout holds NUM_ENVS x NUM_STEPS = 8 x 32 = 256 transitions, optimised for
# NUM_EPOCHS passes in minibatches of MINIBATCH_SIZE (the whole rollout); the lr is annealed to 0.
NUM_ENVS, NUM_STEPS, NUM_EPOCHS, MINIBATCH_SIZE = 8, 32, 20, 256
GAMMA, LMBDA, LR = 0.98, 0.8, 1e-3
DTARG, BETA = 0.01, 1.0  # target KL per update and initial penalty coefficient (paper: 0.01, 1)
ENTROPY_COEFF, CRITIC_COEFF, MAX_GRAD_NORM = 0.0, 0.5, 0.5

# Seeds network init and action sampling (all the CPU's threads: this script never set one).
device, start_time = helpers.start(args, one_thread=False)

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


# Policy pi(a|s) = Categorical(logits(s)), which also writes "action_log_prob", and value function
# V(s): separate 64-64 tanh MLPs, the networks of ppo_cartpole.py.
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                 activation_class=nn.Tanh)
actor = ProbabilisticActor(TensorDictModule(policy_net, ["observation"], ["logits"]),
                           in_keys=["logits"],
                           distribution_class=torch.distributions.Categorical,
                           return_log_prob=True).to(device)
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
# L^KLPEN with a fixed beta: beta is updated once per update, below, as in the paper.
loss_module = KLPENPPOLoss(actor_network=actor, critic_network=critic, dtarg=DTARG, beta=BETA,
                           adaptive_beta=False, entropy_coeff=ENTROPY_COEFF,
                           critic_coeff=CRITIC_COEFF, loss_critic_type="l2",
                           normalize_advantage=True).to(device)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)


collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
pbar = tqdm(total=num_iterations * NUM_ENVS * NUM_STEPS, unit="frames")
episodes = collector.episodes  # (frames, episode_return) for every finished episode
penalty_log = []  # (frames, beta used in the update, KL d after the update) for every update


def policy(td: TensorDict) -> torch.Tensor:
    """a ~ pi(.|s), sampled by the actor."""
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]


for iteration in range(num_iterations):
    optimizer.param_groups[0]["lr"] = LR * (1.0 - iteration / num_iterations)

    # ---- Collect a rollout with the current policy; it keeps "logits": pi_old, for KL ----
    rollout = torch.stack([collector.step(policy, keep=("logits", "action_log_prob"))
                           for _ in range(NUM_STEPS)], dim=1)  # [NUM_ENVS, NUM_STEPS], time last

    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- Optimise L^KLPEN for several epochs with a fixed beta ----
    flat = rollout.reshape(-1)
    beta = loss_module.beta.item()
    # ppo_cartpole.py's epochs: random minibatches, an Adam step on the sum of the "loss_*"
    # entries each (the outputs also hold "kl" and "beta": the mean KL and the beta used)
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(flat.numel(), device=flat.device)
        for idx in order.split(MINIBATCH_SIZE):
            losses = loss_module(flat[idx])
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()

    # ---- Adapt beta: d = KL(pi_old || pi_new) over the rollout, after the update ----
    with torch.no_grad():
        kl = loss_module(flat)["kl"]
    loss_module.update_beta(kl)
    penalty_log.append((collector.frames, beta, kl.item()))

    helpers.show_progress(pbar, episodes, collector.frames, beta=f"{beta:.3g}",
                          kl=f"{kl.item():.4f}")
pbar.close()
envs.close()

# ---- Save the learning curve, beta and KL ----
helpers.write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)
helpers.write_csv(args.out / "beta_kl.csv", ["frames", "beta", "kl"], penalty_log)

fig = Figure(figsize=(6, 8))
ax_return, ax_beta, ax_kl = fig.subplots(3, 1, sharex=True)
helpers.plot_returns(ax_return, episodes)
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

helpers.report(start_time, episodes)
