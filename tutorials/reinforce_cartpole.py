"""REINFORCE with a learned baseline on CartPole-v1 with rlloss, in a single file.

This tutorial trains an agent with rlloss's ``ReinforceLoss`` and ``TD1Estimator`` (drop-in
replacements for ``torchrl.objectives``) around a collector you write yourself. The pieces map
to the episodic REINFORCE of Williams, "Simple statistical gradient-following algorithms for
connectionist reinforcement learning" (Machine Learning 8, 1992), with a learned reinforcement
baseline b(s) = V(s) as in Sutton & Barto, "Reinforcement Learning: An Introduction" (2nd ed.,
section 13.4, "REINFORCE with Baseline"):

1. play whole episodes with a ~ pi(a|s): NUM_ENVS envs step until each has finished at least
   one episode; the batch keeps each env's steps up to its last episode end, and the envs are
   reset, dropping the episodes still unfinished. Every episode in a batch is played from its
   start to its end by the policy being updated;
2. the Monte-Carlo return of every step, G_t = r_t + gamma r_{t+1} + ... to the end of its
   episode (``TD1Estimator``: the lambda = 1 return), and the advantage A_t = G_t - V(s_t);
3. one gradient step on ``ReinforceLoss``: -log pi(a_t|s_t) A_t (``loss_actor``) plus the
   baseline's regression (G_t - V(s_t))^2 (``loss_value``).

Two choices beyond the paper: an episode cut at CartPole's 500-step time limit did not
terminate, so its last return is bootstrapped, r + gamma V(s'), as everywhere in these
tutorials (all other returns are pure Monte-Carlo ones); and the advantages are normalised over
the batch, which keeps the step size steady while the returns grow from about 20 to 100. Sutton
& Barto's gamma^t factor on the update is left out, as in most implementations. The networks
(separate 64-64 tanh MLPs) and gamma = 0.99 are those of ``a2c_cartpole.py``. Adam's lr, 1e-3,
is annealed linearly to 0 over the budget, as in ``ppo_cartpole.py``: at a constant lr the
returns still dip late in training (see the results). After training, the most probable action
(no sampling) plays 10 evaluation episodes from start states no training episode had.

Budget: 500,000 environment steps, the A2C budget of rl-baselines3-zoo (there is no published
REINFORCE result to match), so that the two tutorials compare at equal cost. REINFORCE needs
them: it makes one update per batch of whole episodes (about 8 x 500 = 4,000 steps once the
pole stays up), the steps of the dropped unfinished episodes count too (a fifth of them), and
even at 500k the training return (sampled actions) has not reached the target: its mean over
the last 50k steps is 388, 460 and 417 on seeds 0, 1, 2 (57 to 65 over the first 50k, 346 to
404 around 250k); only the deterministic policy scores 500. No smaller budget was tried.

Results (500,000 steps, one CPU thread, ``tools/tutorial_runs.py --tasks reinforce_cartpole``,
seeds 0, 1, 2): final_return (deterministic
evaluation) 500, 500 and 500; the last 10 training episodes (sampled actions) 430.1, 455.1 and
457.8. With TorchRL's ``ReinforceLoss`` and ``TD1Estimator`` swapped in: final_return 500, 500
and 500; training 406.0, 481.4 and 441.0. On seed 0 the two libraries give the same first 902 episodes. A first version with a
constant lr of 1e-3 ended at final_return 500, 472.6 and 500 (rlloss), seed 1 after training
returns of about 480.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 500000: final_return = 496.9 500 500
    [figures] rlloss, seeds 0 1 2, --total-frames 500000: train_return = 455.2 433.6 416.7
    [figures] torchrl, seeds 0 1 2, --total-frames 500000: final_return = 500 500 500
    [figures] torchrl, seeds 0 1 2, --total-frames 500000: train_return = 440.1 449.7 478.3

These lines were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures`` (rlloss
a996393); the results above are the earlier record. Every deterministic evaluation still
scores 500 but rlloss's seed 0 (496.9, the mean of 10 episodes: at least one ended early). The
training returns moved by up to 41 in both directions, with either library. The two libraries
now give the same first 1,070, 871 and 843 episodes on seeds 0, 1, 2 (of about 1,700), then
part by float rounding (``ReinforceLoss``'s trajectory test against TorchRL's holds to 1e-8 in float64).

Run:
    python tutorials/reinforce_cartpole.py --seed 0 --total-frames 500000 --out runs/reinforce

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

from rlloss import ReinforceLoss, TD1Estimator

parser = helpers.tutorial_parser(__doc__, "runs/reinforce_cartpole", 500_000, "env steps")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters.
NUM_ENVS = 8  # a batch holds at least one whole episode of each
GAMMA = 0.99
LR = 1e-3  # linearly annealed to 0

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

    def reset(self) -> None:
        """Start a new episode in every env; the unfinished ones are dropped (they never enter
        ``episodes``)."""
        self.obs, _ = self.envs.reset()
        self.running_return[:] = 0.0

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


# Policy pi(a|s) (writes "logits", samples "action") and the baseline V(s) ("state_value"):
# separate 64-64 tanh MLPs (stable-baselines3's default for A2C and PPO).
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                 activation_class=nn.Tanh)
actor = ProbabilisticActor(TensorDictModule(policy_net, ["observation"], ["logits"]),
                           in_keys=["logits"],
                           distribution_class=torch.distributions.Categorical).to(device)
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

return_module = TD1Estimator(gamma=GAMMA, value_network=critic)
loss_module = ReinforceLoss(actor_network=actor, critic_network=critic,
                            loss_critic_type="l2").to(device)  # the squared error (G - V(s))^2
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
episodes = collector.episodes  # (frames, episode_return) for every finished episode


def policy(td: TensorDict) -> torch.Tensor:
    """a ~ pi(.|s), sampled by the actor."""
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]


pbar = tqdm(total=args.total_frames, unit="frames")

while collector.frames < args.total_frames:
    optimizer.param_groups[0]["lr"] = LR * (1.0 - collector.frames / args.total_frames)

    # ---- Play until every env has finished an episode, all with the current policy ----
    steps, finished = [], torch.zeros(NUM_ENVS, dtype=torch.bool, device=device)
    while not finished.all():
        steps.append(collector.step(policy))
        finished |= steps[-1]["next", "done"].squeeze(-1)
    rollout = torch.stack(steps, dim=1)  # batch size [NUM_ENVS, steps]
    # Keep the whole episodes: each env's steps up to its last episode end.
    done = rollout["next", "done"].squeeze(-1)
    batch = rollout[done.flip(1).cumsum(1).flip(1) > 0]  # [steps kept], env after env
    collector.reset()  # drop the unfinished episodes: the next batch starts new ones

    # ---- Monte-Carlo returns G_t and advantages A = G_t - V(s_t) ----
    with torch.no_grad():
        return_module(batch)  # writes "advantage" and "value_target" (= G)
    advantage = batch["advantage"]
    batch["advantage"] = (advantage - advantage.mean()) / (advantage.std() + 1e-8)

    # ---- One gradient step on the policy gradient and the baseline's regression ----
    losses = loss_module(batch)
    loss = losses["loss_actor"] + losses["loss_value"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()

# ---- Save the learning curve, evaluate the final policy without sampling (argmax_a pi(a|s)) on
# start states training never scored, and report ----
helpers.finish(args, start_time, episodes, "REINFORCE on CartPole-v1", env_id="CartPole-v1",
               policy=helpers.most_probable_action(actor, device))
