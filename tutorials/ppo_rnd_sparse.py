"""PPO + RND on a sparse MountainCar-v0: an exploration bonus for a reward PPO seldom finds.

The car must reach the flag on the right hill, which it can do only by rocking back and forth
to build up momentum; an episode ends there or at 200 steps. This tutorial's sparse variant
(``SparseReward``) pays +1 for reaching the flag and 0 at every other step, so an episode's return
says whether it reached the flag. A random policy practically never does: every reward of plain
PPO's rollouts is 0 and its advantages carry nothing but the critic's own errors. Random Network
Distillation (Burda et al., "Exploration by Random Network Distillation", arXiv:1810.12894) adds
an intrinsic reward: the error of a trained predictor ``f_hat`` regressing the features of a
frozen random network ``f`` on the next state, large where the agent has seldom been. With it the
agent pushes into ever higher (position, velocity) states, reaches the flag, and then the
extrinsic reward takes over.

The loop (``--rnd``, the default; ``--no-rnd`` drops the bonus and gives plain PPO's curve):

1. 16 gymnasium envs are stepped by a TorchRL ``ProbabilisticActor`` for 128 steps: a
   ``[16, 128]`` rollout (time last);
2. RND: TorchRL's ``RunningMeanStd`` is updated with the rollout's next observations (the RND
   networks read them standardised and clipped to [-5, 5], the paper's ``obs_rms``); the bonus of
   each transition is the per-sample ``loss_predictor`` of an ``RNDLoss`` with
   ``reduction="none", update_fraction=1.0`` (rlloss's ``RNDLoss.intrinsic_reward(rollout)`` gives
   the same numbers; the per-sample loss is used so that TorchRL's class, which has no
   ``intrinsic_reward``, runs the same script); it is divided by the running std of its
   discounted returns (``rlloss.training.RewardNormalizer``, the paper's sec. 2.4), as the
   extrinsic reward is by its own normaliser, and the two are added (coefficients
   ``EXT_COEFF``, ``INT_COEFF``, the paper's 2 and 1);
3. ``GAE`` and ``ClipPPOLoss`` (4 epochs of 8 minibatches, no entropy bonus) on the combined
   reward; then the predictor is trained by ``RNDLoss`` (``update_fraction=0.25``, the paper's)
   on the same rollout, with its own Adam.

Simplifications against the paper: one critic on the summed reward, with the intrinsic stream
episodic like the extrinsic one (the paper keeps two value heads and a non-episodic intrinsic
return); the actor and critic read the observation scaled to [-1, 1] by the observation space's
bounds. The returns reported are the environment's sparse ones (extrinsic only).

Results (seeds 0, 1, 2, 300k env steps, 146 rollouts; final = mean return of the last 10
training episodes, i.e. the share of them that reached the flag; then the step of the first
episode that reached it and the share of the last 100 episodes that did; the TorchRL rows are
this script with ``from rlloss import`` swapped to TorchRL's ``GAE``, ``ClipPPOLoss`` and
``RNDLoss`` by ``tools/tutorial_runs.py``; one CPU thread):

    PPO + RND, rlloss   seed 0: 0.3 (79k, 0.38)  seed 1: 1.0 (83k, 1.00)  seed 2: 0.8 (89k, 0.75)
    PPO + RND, TorchRL  seed 0: 0.1 (79k, 0.08)  seed 1: 1.0 (76k, 1.00)  seed 2: 1.0 (89k, 0.96)
    PPO alone, rlloss   seed 0: 0.0 (never, 0.00)  seed 1: 1.0 (66k, 0.98)  seed 2: 0.3 (93k, 0.30)
    PPO alone, TorchRL  seed 0: 0.0 (never, 0.00)  seed 1: 0.9 (66k, 0.92)  seed 2: 0.0 (93k, 0.00)

PPO + RND reached the flag on every seed with both libraries (first at 76k-89k steps) and, over
the last 100 episodes, on 71 % (rlloss) and 68 % (TorchRL) of episodes on average; PPO alone
never reached it on seed 0, and on 43 % and 31 %: its critic, initialised near 0 and wrong
where it has seldom been trained, gives the advantages some directed exploration of their own,
and on seed 1 that found the flag first. So RND's gain here is real but not the clean
"PPO finds nothing" contrast: two of the three seeds of PPO alone found the flag within this
budget. Two harder variants were tried for a clean contrast (rlloss, 300k steps, one run
each, the code otherwise this script's): a 150-step time limit (MountainCar-v0's is 200), which
a random bang-bang policy of the scaled state meets less often (9.7 % of 20,000 random linear
ones reach the flag from some start state, 14.2 % at 200 steps, in a numpy model of the
dynamics): PPO alone still reached the flag on seed 1 (first near 100k steps, 1 to 5 of the
last 10 episodes from 210k on; stopped at 237k); and a cost of 0.001 for every step the engine
pushes (MountainCarContinuous's energy charge): both PPO alone (seed 1) and PPO + RND (seed 0)
settled on never pushing from 22k and 26k steps on and never reached the flag, the
normalised push cost outweighing RND's normalised bonus. Neither variant was kept. The two
libraries' runs (same seeds) part ways during training, not in kind. Figure of both curves,
every seed, both libraries:
``docs/figures/ppo_rnd_sparse.png`` (``tools/tutorial_runs.py --rnd-runs DIR --out FIGURE``).

Deep Sea (``--task deepsea --size N``), for the clean contrast: bsuite's hard-exploration chain
(Osband et al., "Behaviour Suite for Reinforcement Learning", ICLR 2020; ``DeepSea`` below). An
N x N grid entered at its top-left cell; each step descends a row and moves a column right or
left; which action means "right" is drawn per cell from the seed; "right" costs 0.01 / N, and
only the episode that goes right at all N steps is paid (+1, return 0.99). The observation is
the cell, one-hot. Two changes for this task only: the extrinsic reward is not normalised (its
running std, from the tiny move costs alone until the first success, would blow them up to
the size of RND's bonus: the MountainCar push-cost failure above), and an entropy bonus of
0.01 (without it, on seed 0 of N = 20, the policy fell back from the rewarded path at 230k
steps onto a fixed 16-right path and stayed there). With N = 20 and 400k steps (19,968
episodes), a uniformly random policy reaches the reward with probability 2^-20 per episode,
1.9 % within the budget (10.8 % over six such runs). Smaller N were tried first (rlloss,
PPO + RND, seed 0, no entropy bonus, 200k steps): N = 14 found the reward at 15k steps, held
it on up to 95 % of episodes and lost it twice (1 % of the last 100); N = 16 found it at 86k
(97 % of the last 100); but there a uniform policy finds it within 400k steps with
probability 82 % and 32 %, so PPO alone could too.

Results (N = 20, 400k env steps, seeds 0, 1, 2; the same columns as above, then the mean number of
"right" actions per episode over the last 100 episodes):

    PPO + RND, rlloss  seed 0: 0.59 (179k, 0.62, 18.7)  seed 1: 0.89 (193k, 0.99, 20.0)
                       seed 2: -0.01 (179k, 0.00, 13.0)
    PPO + RND, TorchRL seed 0: 0.09 (182k, 0.31, 15.6)  seed 1: 0.69 (193k, 0.52, 18.3)
                       seed 2: 0.39 (167k, 0.39, 18.5)
    PPO alone, rlloss  seed 0: -0.00 (never, 0.00, 1.9)  seed 1: -0.00 (never, 0.00, 8.0)
                       seed 2: -0.00 (never, 0.00, 0.3)
    PPO alone, TorchRL seed 0: -0.00 (never, 0.00, 0.8)  seed 1: -0.00 (never, 0.00, 8.0)
                       seed 2: -0.00 (never, 0.00, 2.4)

PPO + RND found the reward on every seed with both libraries (first at 167k-193k steps) and at
its peak held it on 94-96 % of 500 consecutive episodes in every run, but not steadily: the
share of the last 100 episodes is 0.00 to 0.99 (rlloss seed 2 had held 86 % around 333k and
then left the path, as RND's bonus keeps pulling elsewhere). PPO alone never reached it in any
run (0 of 19,968 episodes each): the move cost taught it to go left, 0.3 to 8 "rights" per
episode at the end. The two libraries' runs part ways only during training. Figure:
``docs/figures/ppo_rnd_deepsea.png`` (``tools/tutorial_runs.py --rnd-title "Deep Sea 20"``).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --rnd --total-frames 300000: final_return = 0.4 1.0 1.0
    [figures] torchrl, seeds 0 1 2, --rnd --total-frames 300000: final_return = 0.3 1.0 1.0
    [figures] rlloss, seeds 0 1 2, --no-rnd --total-frames 300000: final_return = 0.0 0.9 0.0
    [figures] torchrl, seeds 0 1 2, --no-rnd --total-frames 300000: final_return = 0.0 1.0 0.1
    [figures] rlloss, seeds 0 1 2, --task deepsea --size 20 --rnd --total-frames 400000: final_return = 0.9 -0.0 1.0
    [figures] torchrl, seeds 0 1 2, --task deepsea --size 20 --rnd --total-frames 400000: final_return = 1.0 0.9 1.0
    [figures] rlloss, seeds 0 1 2, --task deepsea --size 20 --no-rnd --total-frames 400000: final_return = -0.0 -0.0 -0.0
    [figures] torchrl, seeds 0 1 2, --task deepsea --size 20 --no-rnd --total-frames 400000: final_return = -0.0 -0.0 -0.0

These lines were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures`` (rlloss
a996393; the script prints one decimal); the two tables above are the earlier record, and the
two figures were redrawn from the new runs. The same columns now:

    MountainCar, 300k   PPO + RND, rlloss   0.4 (79k, 0.37)  1.0 (83k, 0.99)  1.0 (83k, 0.98)
                        PPO + RND, TorchRL  0.3 (79k, 0.34)  1.0 (76k, 0.99)  1.0 (83k, 0.98)
                        PPO alone, rlloss   0.0 (never, 0.00)  0.9 (66k, 0.96)  0.0 (93k, 0.05)
                        PPO alone, TorchRL  0.0 (never, 0.00)  1.0 (66k, 0.97)  0.1 (93k, 0.32)
    Deep Sea 20, 400k   PPO + RND, rlloss   0.89 (148k, 0.84, 19.4)  -0.01 (167k, 0.00, 12.1)
                                            0.99 (140k, 0.87, 19.0)
                        PPO + RND, TorchRL  0.99 (116k, 0.98, 19.9)  0.89 (193k, 0.85, 19.1)
                                            0.99 (185k, 0.94, 19.8)
                        PPO alone, both     -0.00 on every seed (never; 0.1 to 8.0 "rights")

The conclusions hold: on MountainCar PPO + RND reaches the flag on every seed with both
libraries and PPO alone never on seed 0; on Deep Sea PPO + RND finds the reward on every seed
(first at 116k-193k steps; at its best it held it on 94-98 % of 500 consecutive episodes in
every run) and PPO alone in none of its 19,968 episodes. Which seed ends off the path moved:
now rlloss's seed 1 (it had held 97 % of 500 episodes), earlier rlloss's seed 2.

Run:
    python tutorials/ppo_rnd_sparse.py --seed 0 --out runs/ppo_rnd
    python tutorials/ppo_rnd_sparse.py --seed 0 --no-rnd --out runs/ppo_plain
    python tutorials/ppo_rnd_sparse.py --task deepsea --size 20 --total-frames 400000 --seed 0

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png`` (the returns,
and with ``--rnd`` the mean intrinsic bonus per rollout); the last printed line is
``final_return=<mean return of the last 10 episodes>``.
"""

import argparse

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs.transforms.rnd import RunningMeanStd
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, ClipPPOLoss, RNDLoss
from rlloss.training import RewardNormalizer

parser = helpers.tutorial_parser(__doc__, "runs/ppo_rnd_sparse", 300_000, "env steps, all envs")
parser.add_argument("--rnd", action=argparse.BooleanOptionalAction, default=True,
                    help="add RND's intrinsic reward (--no-rnd: plain PPO)")
parser.add_argument("--task", choices=("mountaincar", "deepsea"), default="mountaincar",
                    help="sparse MountainCar-v0 (default) or an N x N Deep Sea (--size)")
parser.add_argument("--size", type=int, default=20, help="Deep Sea's N (rows = columns = steps)")
args = parser.parse_args()

# Hyperparameters.
NUM_ENVS = 16
NUM_STEPS = 128  # a rollout holds 16 * 128 = 2048 transitions
NUM_EPOCHS, MINIBATCH_SIZE = 4, 256
GAMMA, LMBDA = 0.99, 0.95
LR, RND_LR = 3e-4, 1e-3
CLIP_EPSILON = 0.2
ENTROPY_COEFF, CRITIC_COEFF = 0.0, 0.5  # no entropy bonus (rl-baselines3-zoo, MountainCar-v0)
if args.task == "deepsea":  # without one, the policy collapsed onto a path and stayed there
    ENTROPY_COEFF = 0.01
MAX_GRAD_NORM = 0.5
EXT_COEFF, INT_COEFF = 2.0, 1.0  # the paper's weights of the two (normalised) rewards
RND_FEATURES = 64


class SparseReward(gym.Wrapper):
    """MountainCar's reward made sparse: 1 on reaching the flag (termination), else 0."""

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(terminated), terminated, truncated, info


class DeepSea(gym.Env):
    """bsuite's Deep Sea (Osband et al., "Behaviour Suite for Reinforcement Learning", 2020):
    an N x N grid entered at the top-left cell; every step descends one row and moves one
    column right or left (clipped at the edges), so an episode lasts N steps. Which of the two
    actions means "right" is drawn per cell, once, from ``mapping_seed`` (the same in every
    copy). "Right" costs 0.01 / N; taking it in the last column of the last row pays +1, so
    only the episode that goes right at every step (return 0.99) is rewarded, and a uniformly
    random policy finds it with probability 2^-N per episode. Observation: the one-hot N x N
    grid of the current cell (all zeros after the last row, as bsuite's)."""

    def __init__(self, size: int, mapping_seed: int) -> None:
        self.size = size
        self.right = np.random.default_rng(mapping_seed).integers(0, 2, (size, size))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size * size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def observe(self) -> np.ndarray:
        obs = np.zeros(self.size * self.size, np.float32)
        if self.row < self.size:
            obs[self.row * self.size + self.column] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.row = self.column = 0
        return self.observe(), {}

    def step(self, action):
        right = int(action) == self.right[self.row, self.column]
        reward = float(right and self.column == self.size - 1) - (0.01 / self.size) * right
        self.column = min(self.column + 1, self.size - 1) if right else max(self.column - 1, 0)
        self.row += 1
        return self.observe(), reward, self.row == self.size, False, {}


TASK_NAME = f"Deep Sea {args.size}" if args.task == "deepsea" else "sparse MountainCar-v0"
device, start_time = helpers.start(args)  # seeds network init and action sampling
# NUM_ENVS copies stepped together. SAME_STEP autoreset: when an episode ends, step() returns the
# first observation of the next one and puts the true last observation in infos["final_obs"].
if args.task == "deepsea":
    gym.register("DeepSea-v0", entry_point=DeepSea,
                 kwargs={"size": args.size, "mapping_seed": args.seed})
    env_id, wrappers = "DeepSea-v0", []
else:
    env_id, wrappers = "MountainCar-v0", [SparseReward]
envs = gym.make_vec(env_id, num_envs=NUM_ENVS, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                    wrappers=wrappers)
obs_dim, num_actions = envs.single_observation_space.shape[0], envs.single_action_space.n
space = envs.single_observation_space


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


class ScaleToUnit(nn.Module):
    """Observations mapped from the space's [low, high] box to [-1, 1] (velocity is +-0.07)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return 2.0 * (obs - self.low) / (self.high - self.low) - 1.0


def mlp(out_features: int, cells: list[int], activation=nn.Tanh) -> nn.Module:
    return MLP(in_features=obs_dim, out_features=out_features, num_cells=cells,
               activation_class=activation)


# Policy pi(a|s) and value V(s): 64-64 tanh MLPs on the scaled observation.
actor = ProbabilisticActor(
    TensorDictModule(nn.Sequential(ScaleToUnit(), mlp(num_actions, [64, 64])),
                     in_keys=["observation"], out_keys=["logits"]),
    in_keys=["logits"], distribution_class=torch.distributions.Categorical, return_log_prob=True,
).to(device)
critic = ValueOperator(nn.Sequential(ScaleToUnit(), mlp(1, [64, 64])),
                       in_keys=["observation"]).to(device)
advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
loss_module = ClipPPOLoss(actor_network=actor, critic_network=critic, clip_epsilon=CLIP_EPSILON,
                          entropy_coeff=ENTROPY_COEFF, critic_coeff=CRITIC_COEFF,
                          loss_critic_type="l2", normalize_advantage=True).to(device)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)
ext_normalizer = RewardNormalizer(num_envs=NUM_ENVS, gamma=GAMMA).to(device)

# RND: a frozen random target f and a deeper trained predictor f_hat, state -> 64 features.
obs_rms = RunningMeanStd(shape=(obs_dim,)).to(device)
target = mlp(RND_FEATURES, [64], nn.LeakyReLU).to(device)
predictor = mlp(RND_FEATURES, [64, 64], nn.LeakyReLU).to(device)
rnd_loss = RNDLoss(predictor, target, obs_rms=obs_rms, update_fraction=0.25).to(device)
# The same networks, unreduced and on every sample: the bonus 1/K ||f_hat(s') - f(s')||^2.
rnd_bonus = RNDLoss(predictor, target, obs_rms=obs_rms, reduction="none", update_fraction=1.0)
rnd_optimizer = torch.optim.Adam(predictor.parameters(), lr=RND_LR)
int_normalizer = RewardNormalizer(num_envs=NUM_ENVS, gamma=GAMMA).to(device)

collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
pbar = tqdm(total=num_iterations * NUM_ENVS * NUM_STEPS, unit="frames")
episodes = collector.episodes  # (frames, episode_return) for every finished episode


def policy(td: TensorDict) -> torch.Tensor:
    """a ~ pi(.|s), sampled by the actor."""
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]


bonuses = []  # (frames, mean raw intrinsic reward of the rollout)


def gradient_epochs(module: nn.Module, optimizer: torch.optim.Optimizer, batch: TensorDict,
                    max_grad_norm: float) -> None:
    """NUM_EPOCHS passes over ``batch`` in random minibatches of MINIBATCH_SIZE (a fresh
    permutation every pass), each an ``optimizer`` step on the sum of ``module``'s "loss_*"
    outputs, the gradient norm clipped to ``max_grad_norm``."""
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(batch.numel(), device=batch.device)
        for idx in order.split(MINIBATCH_SIZE):
            losses = module(batch[idx])
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
            optimizer.step()


for _ in range(num_iterations):
    rollout = torch.stack([collector.step(policy, keep=("action_log_prob",))
                           for _ in range(NUM_STEPS)], dim=1)  # [NUM_ENVS, NUM_STEPS]
    done = rollout["next", "done"]
    reward = rollout["next", "reward"]  # Deep Sea's is left unscaled, see the docstring
    reward = EXT_COEFF * (ext_normalizer(reward, done) if args.task == "mountaincar" else reward)
    if args.rnd:
        obs_rms.update(rollout["next", "observation"])
        with torch.no_grad():
            bonus = rnd_bonus(rollout)["loss_predictor"].unsqueeze(-1)  # [NUM_ENVS, NUM_STEPS, 1]
        bonuses.append((collector.frames, bonus.mean().item()))
        reward = reward + INT_COEFF * int_normalizer(bonus, done)
    rollout["next", "reward"] = reward

    with torch.no_grad():
        advantage_module(rollout)  # "advantage" and "value_target" on the combined reward
    flat = rollout.reshape(-1)
    gradient_epochs(loss_module, optimizer, flat, MAX_GRAD_NORM)
    if args.rnd:  # the predictor regresses the target on a quarter of each minibatch
        gradient_epochs(rnd_loss, rnd_optimizer, flat, max_grad_norm=10.0)
    helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()


def save_figure() -> None:
    """OUT/curve.png: the episode returns, and the intrinsic bonus beside them with --rnd."""
    fig = Figure(figsize=(10 if args.rnd else 6, 4))
    ax = fig.add_subplot(1, 2 if args.rnd else 1, 1)
    helpers.plot_returns(ax, episodes)
    ax.set(xlabel="environment steps", ylabel="episode return (1: reached the flag)",
           title=f"PPO{' + RND' if args.rnd else ''} on {TASK_NAME}")
    if args.rnd and bonuses:
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.plot(*np.array(bonuses).T)
        ax2.set(xlabel="environment steps", ylabel="mean intrinsic reward (raw)", yscale="log",
                title="RND bonus per rollout")
    for axis in fig.axes:
        axis.xaxis.set_major_formatter(EngFormatter())  # 100k, not 100000
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")


save_figure()
helpers.finish(args, start_time, episodes, "", plot=False)
