"""PPO on CartPole-v1 with rlloss, in a single file.

This tutorial shows how to train an agent with rlloss's ``ClipPPOLoss`` and ``GAE`` (drop-in
replacements for ``torchrl.objectives``) around a plain gymnasium collector (``VectorCollector``, a
short class below):

1. a gymnasium vector env is stepped by a TorchRL ``ProbabilisticActor``; each rollout is stored
   as a TensorDict of batch size ``[num_envs, num_steps]`` (time is the last batch dim);
2. ``GAE`` computes advantages and value targets for the whole rollout (PPO paper, eq. 11);
3. ``ClipPPOLoss`` gives the clipped surrogate objective (eq. 7) plus the value loss (eq. 9),
   optimised for a few epochs over the same rollout.

Hyperparameters are the rl-baselines3-zoo ones tuned for CartPole. The agent reaches the maximal
return of 500 in about 100k environment steps.

Run:
    python tutorials/ppo_cartpole.py --seed 0 --total-frames 100000 --out runs/ppo_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; the last
printed line is ``final_return=<mean return of the last 10 episodes>``.
"""

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, ClipPPOLoss

parser = helpers.tutorial_parser(__doc__, "runs/ppo_cartpole", 100_000, "env steps, all envs")
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

device, start_time = helpers.start(args)  # seeds network init and action sampling

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



def policy(td: TensorDict) -> torch.Tensor:
    """a ~ pi(.|s), sampled by the actor (which also writes "action_log_prob" into td)."""
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]


collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
episodes = collector.episodes  # (frames, episode_return) for every finished episode
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
pbar = tqdm(total=num_iterations * NUM_ENVS * NUM_STEPS, unit="frames")

for iteration in range(num_iterations):
    # Anneal the learning rate and the clipping range linearly to 0.
    frac = 1.0 - iteration / num_iterations
    optimizer.param_groups[0]["lr"] = LR * frac
    loss_module.clip_epsilon.copy_(CLIP_EPSILON * frac)

    # ---- Collect a rollout with the current policy ----
    # Each step: observation, action, its log-probability and ("next", ...): the true successor
    # state, reward, terminated (no bootstrapping from V(s')) and done (terminated or truncated
    # at the 500-step time limit: the GAE trace stops there, the next step starts a new episode).
    rollout = torch.stack([collector.step(policy, keep=("action_log_prob",))
                           for _ in range(NUM_STEPS)], dim=1)  # [NUM_ENVS, NUM_STEPS], time last

    # ---- Advantages A_t and value targets, computed once with the pre-update critic ----
    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- Optimise the PPO objective for NUM_EPOCHS epochs over the rollout: each epoch in
    # random minibatches of MINIBATCH_SIZE transitions (a fresh permutation every epoch), each an
    # Adam step on the sum of the "loss_*" entries (objective, critic, entropy), the gradient
    # norm clipped to MAX_GRAD_NORM ----
    batch = rollout.reshape(-1)
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(batch.numel(), device=batch.device)
        for idx in order.split(MINIBATCH_SIZE):
            losses = loss_module(batch[idx])
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()

    helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()

# ---- Save the learning curve and report ----
helpers.finish(args, start_time, episodes, "PPO on CartPole-v1")
