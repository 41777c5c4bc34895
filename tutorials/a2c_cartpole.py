"""A2C (advantage actor-critic) on CartPole-v1 with rlloss, in a single file.

This tutorial trains an agent with rlloss's ``A2CLoss`` and ``GAE`` (drop-in replacements for
``torchrl.objectives``) around a collector you write yourself. The pieces map to Mnih et al.,
"Asynchronous Methods for Deep Reinforcement Learning" (arXiv:1602.01783), Algorithm S3 (A3C),
run synchronously: NUM_ENVS actors step in lockstep and share one update (A2C).

1. every env takes t_max = NUM_STEPS steps with a ~ pi(a|s);
2. the return of every step is the n-step return R = r_t + gamma r_{t+1} + ... +
   gamma^k V(s_{t+k+1}), bootstrapped from V at the end of the rollout (0 where the episode
   terminated); the advantage is A = R - V(s_t). That is ``GAE`` with lambda = 1;
3. one gradient step on ``A2CLoss``: the policy gradient -log pi(a_t|s_t) A (``loss_objective``)
   plus CRITIC_COEFF (R - V(s_t))^2 (``loss_critic``); the entropy bonus is off on CartPole.

Hyperparameters are rl-baselines3-zoo's for CartPole-v1 (a2c.yml: 8 envs, ent_coef 0, 500k
steps) over stable-baselines3's A2C defaults (n_steps 5, gamma 0.99, gae_lambda 1, lr 7e-4,
RMSprop with alpha 0.99 and eps 1e-5, vf_coef 0.5, max_grad_norm 0.5, no advantage
normalisation, separate 64-64 tanh networks for the policy and the value; stable-baselines3's
orthogonal initialisation is not copied, the networks keep PyTorch's default). After training, the
most probable action (no sampling) plays 10 evaluation episodes from start states no training
episode had, as the zoo's benchmark evaluates deterministically.

Results (500,000 steps, one CPU thread, ``tools/tutorial_runs.py --tasks a2c_cartpole``, seeds
0, 1, 2): final_return (deterministic evaluation)
500, 500 and 500; the last 10 training episodes 500.0, 500.0 and 500.0 (the mean training
return passes 475 between 100k and 200k steps). With TorchRL's ``A2CLoss`` and ``GAE`` swapped
in: final_return 500, 500 and 500; training 500.0, 500.0 and 500.0. On seed 0 the two libraries give the same first 936
episodes, then float rounding makes the runs drift apart.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 500000: final_return = 500 500 500
    [figures] rlloss, seeds 0 1 2, --total-frames 500000: train_return = 500.0 500.0 500.0
    [figures] torchrl, seeds 0 1 2, --total-frames 500000: final_return = 500 500 500
    [figures] torchrl, seeds 0 1 2, --total-frames 500000: train_return = 500.0 500.0 500.0

These lines were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures`` (rlloss
a996393): every figure holds, with both libraries.

Run:
    python tutorials/a2c_cartpole.py --seed 0 --total-frames 500000 --out runs/a2c_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes), ``eval_return=`` and last
``final_return=`` (both the mean return of the deterministic evaluation).
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

from rlloss import GAE, A2CLoss

parser = helpers.tutorial_parser(__doc__, "runs/a2c_cartpole", 500_000, "env steps, all envs")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, a2c.yml, CartPole-v1, over stable-baselines3's defaults).
NUM_ENVS = 8
NUM_STEPS = 5  # t_max: steps per env per update, a rollout holds 8 * 5 = 40 transitions
GAMMA, LMBDA = 0.99, 1.0  # lambda = 1: n-step returns bootstrapped at the end of the rollout
LR = 7e-4
RMSPROP_ALPHA, RMSPROP_EPS = 0.99, 1e-5
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
# Categorical(logits). Value function V(s), written to "state_value". Separate 64-64 tanh MLPs
# (stable-baselines3's default for A2C).
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                 activation_class=nn.Tanh)
actor = ProbabilisticActor(TensorDictModule(policy_net, ["observation"], ["logits"]),
                           in_keys=["logits"],
                           distribution_class=torch.distributions.Categorical).to(device)
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
# The policy gradient and the critic's squared error (R - V(s))^2.
loss_module = A2CLoss(actor_network=actor, critic_network=critic, entropy_coeff=ENTROPY_COEFF,
                      critic_coeff=CRITIC_COEFF, loss_critic_type="l2").to(device)
optimizer = torch.optim.RMSprop(loss_module.parameters(), lr=LR, alpha=RMSPROP_ALPHA,
                                eps=RMSPROP_EPS)


def policy(td: TensorDict) -> torch.Tensor:
    """a ~ pi(.|s), sampled by the actor."""
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]


collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
episodes = collector.episodes  # (frames, episode_return) for every finished episode
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
pbar = tqdm(total=num_iterations * NUM_ENVS * NUM_STEPS, unit="frames")

for iteration in range(num_iterations):
    # ---- Collect t_max steps of every env with the current policy ----
    rollout = torch.stack([collector.step(policy) for _ in range(NUM_STEPS)], dim=1)

    # ---- n-step returns R and advantages A = R - V(s_t), with the pre-update critic ----
    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target" (= R)

    # ---- One gradient step on policy gradient + critic regression: an RMSprop step on the sum
    # of the "loss_*" entries (objective and critic), the gradient norm clipped ----
    losses = loss_module(rollout)
    loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
    optimizer.step()

    if iteration % 50 == 0 or iteration + 1 == num_iterations:
        helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()

# ---- Save the learning curve, evaluate the final policy without sampling (argmax_a pi(a|s)) on
# start states training never scored, and report ----
helpers.finish(args, start_time, episodes, "A2C on CartPole-v1", env_id="CartPole-v1",
               policy=helpers.most_probable_action(actor, device))
