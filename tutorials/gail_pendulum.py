"""Generative adversarial imitation (GAIL) on Pendulum-v1 with rlloss: a discriminator and PPO.

GAIL (Ho & Ermon, arXiv:1606.03476, Algorithm 1) learns a policy from an expert's state-action
pairs alone, never reading the environment's reward:

1. collect a rollout with the current policy pi;
2. ``GAILLoss`` (a drop-in for ``torchrl.objectives.GAILLoss``): a few steps of the
   discriminator D(s, a), the probability that a pair is the expert's, on the binary
   cross-entropy -log D(s_E, a_E) - log(1 - D(s, a)) between expert pairs (from the expert
   dataset of ``offline_dataset.py --agent-frames 5000``) and the rollout's pairs; no gradient
   penalty by default (Ho & Ermon's discriminator has none; ``--gp-lambda`` adds WGAN-GP's);
3. the rollout's rewards become ``rlloss.functional.gail_reward(D(s, a), form="logit")`` =
   log D - log(1 - D) (``--reward-form``; the form of Kostrikov's widely used PyTorch GAIL and of
   AIRL), scaled by the running std of their discounted return (``RewardNormalizer``);
4. ``ClipPPOLoss`` with ``GAE`` on those rewards: clipped PPO epochs, the learning rate adapted
   to the KL by ``KLAdaptiveLR`` (``rpo_pendulum.py``'s PPO with ``--rpo-alpha 0``).

The environment's own reward is only read to report the episode returns (``OUT/returns.csv``)
and the final deterministic policy's evaluation. The discriminator scores observations
standardised by the expert dataset's statistics and actions clipped to the bounds, as the
expert's are.

Why the gradient penalty was dropped (diagnosis on seed 1, 100,000 steps, rlloss; final_return of
the deterministic policy, 10 episodes): the first version (WGAN-GP's penalty, weight 10, reward
-log(1 - D)) reached the expert on seed 0 only, and on seed 1 ended at -1215.2 here. WGAN-GP's
penalty (||grad D|| - 1)^2 is taken at points between expert and policy pairs, and it is meant
for an unbounded critic; here (as in TorchRL's ``GAILLoss``) D is a probability. A random-action
policy's pairs lie a median 4.7 standardised units from the expert's, so a D in [0, 1] cannot
keep a unit slope along those segments and also separate them: at weight 10 the penalty keeps D
undecided: with 40 or 80 D steps a rollout (instead of 8) it still gave 0.81-0.88 on expert pairs
and 0.35-0.38 on the policy's, a reward too flat to lead PPO to the swing-up (training returns
-1459 to -1485, below a random policy's -1204). Seed 1, 100,000 steps: penalty 10, -log(1 - D):
-1215.2; penalty 10, logit: -1445.9 (-1531.1 with unstandardised observations for D); penalty 10
with 40 or 80 D steps (logit or -log(1 - D)): training returns -1459 to -1485 at 35,000-37,000
steps (stopped there); penalty 1, logit: -984.6; penalty 1, -log(1 - D): -564.7; no penalty,
logit: -111.7 (D 0.51 / 0.52 at the end: the policy's pairs pass for the expert's); no penalty,
-log(1 - D): -108.3. So the penalty is the cause and the reward form is not (both forms learn
without it); the default keeps the logit form, which the 200,000-step runs below used.

Results (200,000 environment steps, the default; the expert dataset of seed 0, mean return
-149.7; final_return over 10 episodes of the deterministic policy on unseen start states): rlloss
-202.2, -112.4, -238.1 on seeds 0, 1, 2 (``train_return``: -174.8, -190.1, -210.9); TorchRL's
``GAILLoss``, ``ClipPPOLoss`` and ``GAE`` swapped in: -549.8, -112.5, -236.4 (``train_return``:
-302.5, -185.0, -206.9). As a fraction of the expert, (R - R_random) / (R_expert - R_random) with
R_random = -1204 (uniform random actions on the evaluation start states, 30 episodes): 0.95,
1.04, 0.92 (rlloss) and 0.62, 1.04, 0.92 (TorchRL), so at least 0.9 of the expert on 5 of the 6
runs (the first version, with the penalty: 1.04, 0.17, 0.24 and 1.02, 0.07, 0.08). TorchRL's seed
0 had reached the expert's level during training (running mean -175 at 188,000 steps) and fell
back in its last updates (-302.5 at the end): GAIL's adversarial reward keeps moving, and the
script keeps the last policy, not the best. The libraries' runs play the same first rollout and
drift apart after the first update (episode returns of the first rollout identical, of the third
already different), which training amplifies (one CPU thread, torch 2.13); figures in
benchmarks/results/offline.json ("imitation", with the seed-1 diagnosis and the first version's
figures).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them (``<offline_dataset ...>``: the output directory of that run,
made first):

    [figures] rlloss, seeds 0 1 2, --total-frames 200000 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset: final_return = -136.6 -116.6 -365.7
    [figures] rlloss, seeds 0 1 2, --total-frames 200000 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset: train_return = -173.3 -165.8 -286.7
    [figures] torchrl, seeds 0 1 2, --total-frames 200000 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset: final_return = -125.8 -110.7 -259.3
    [figures] torchrl, seeds 0 1 2, --total-frames 200000 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset: train_return = -174.3 -174.2 -209.0

These lines were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures`` (rlloss
a996393), on an expert dataset made again by the same command (its policy now scores -150.7,
the earlier one -149.7: ``offline_dataset.py``'s own re-measure); the results above are the
earlier record. As a fraction of the expert (-150.7 now): 1.01, 1.03, 0.80 with rlloss and 1.02,
1.04, 0.90 with TorchRL's classes, so at least 0.9 of the expert on 4 of the 6 runs (earlier 5
of 6; TorchRL's seed 2 at 0.897). rlloss's seed 2 (-365.7, training -286.7) is this record's
weakest run; TorchRL's seed 0, the weakest earlier (-549.8), reaches -125.8. The two libraries
still play the same first rollout (8 identical episodes on seed 0) and drift apart from there,
as described above: GAIL's outcome per seed moves with rounding, in both libraries.

Run:
    python tutorials/offline_dataset.py --agent-frames 5000 --out runs/pendulum_expert  # once
    python tutorials/gail_pendulum.py --seed 0 --dataset runs/pendulum_expert/dataset

It writes ``OUT/returns.csv`` (one row per training episode, the environment's return) and
``OUT/curve.png``, and prints ``train_return=``, ``eval_return=`` and last ``final_return=`` (the
final deterministic policy's mean over ``--eval-episodes`` fresh episodes).
"""

import json
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import AddStateIndependentNormalScale, TensorDictModule
from torch import nn
from torchrl.data import Bounded, LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, ClipPPOLoss, GAILLoss
from rlloss.functional import gail_reward, kl_k3
from rlloss.training import KLAdaptiveLR, RewardNormalizer  # PPO's helpers (kept by the swap)

ENV_ID = "Pendulum-v1"
parser = helpers.tutorial_parser(__doc__, "runs/gail_pendulum", total_frames=200_000)
parser.add_argument("--dataset", type=Path, default=Path("runs/pendulum_expert/dataset"),
                    help="the expert's transitions, written by offline_dataset.py")
parser.add_argument("--reward-form", default="logit", choices=("positive", "negative", "logit"),
                    help="gail_reward's form of D(s, a)")
parser.add_argument("--disc-input", default="expert", choices=("expert", "raw"),
                    help="the discriminator's observations: standardised by the expert's "
                         "statistics, or as the environment gives them")
parser.add_argument("--gp-lambda", type=float, default=0.0,
                    help="weight of the gradient penalty (0: none)")
parser.add_argument("--disc-steps", type=int, default=8, help="discriminator steps a rollout")
helpers.evaluation_flags(parser)
args = parser.parse_args()
device, start_time = helpers.start(args)

# PPO: rpo_pendulum.py's (skrl / rl-baselines3-zoo Pendulum). GAIL: D updated by
# DISC_STEPS minibatches of DISC_BATCH policy and as many expert pairs after every rollout.
NUM_ENVS, NUM_STEPS, NUM_EPOCHS, MINIBATCH_SIZE = 4, 512, 10, 128
GAMMA, LMBDA, LR, KL_THRESHOLD, CLIP_EPSILON, MAX_GRAD_NORM = 0.9, 0.95, 1e-3, 0.008, 0.2, 0.5
DISC_STEPS, DISC_BATCH, DISC_LR, GP_LAMBDA = args.disc_steps, 256, 3e-4, args.gp_lambda


class OfflineDataset:
    """The transitions of ``offline_dataset.py`` (a TorchRL ``LazyMemmapStorage`` read back with
    ``loads``), held in memory with their observations standardised by the dataset's mean and std
    (TD3+BC's normalisation, Fujimoto & Gu, arXiv:2106.06860, section 5); ``standardise`` does
    the same to an environment's observation."""

    def __init__(self, path: Path, device: torch.device, batch_size: int) -> None:
        if not (path / "storage").exists():
            raise SystemExit(f"no dataset at {path}: run tutorials/offline_dataset.py first "
                             f"(its --out/dataset), or pass --dataset.")
        size = json.loads((path.parent / "dataset.json").read_text())["transitions"]
        buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(size), batch_size=batch_size)
        buffer.loads(path)
        data = buffer.storage[:].to(device).clone()  # 50k small transitions: held in memory
        self.mean = data["observation"].mean(0)
        self.std = data["observation"].std(0) + 1e-3
        for key in ("observation", ("next", "observation")):
            data[key] = (data[key] - self.mean) / self.std
        self.data, self.device, self.batch_size = data, device, batch_size

    def sample(self) -> TensorDict:
        """A minibatch of ``batch_size`` transitions drawn uniformly with replacement."""
        index = torch.randint(len(self.data), (self.batch_size,), device=self.device)
        return self.data[index]

    def standardise(self, observation) -> torch.Tensor:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=self.device)
        return (obs - self.mean) / self.std


# The expert's pairs, observations standardised by their own mean and std.
expert = OfflineDataset(args.dataset, device, DISC_BATCH)
# Pendulum-v1's action bounds as a TorchRL spec, its observation and action dims.
env = gym.make(ENV_ID)
action_spec = Bounded(low=torch.as_tensor(env.action_space.low),
                      high=torch.as_tensor(env.action_space.high),
                      shape=env.action_space.shape, device=device)
obs_dim, action_dim = env.observation_space.shape[0], action_spec.shape[-1]

# pi(a|s) = Normal(mu(s), sigma), sigma state-independent (rpo_pendulum.py's); V(s).
actor = ProbabilisticActor(
    TensorDictModule(
        nn.Sequential(MLP(in_features=obs_dim, out_features=action_dim, num_cells=[64, 64],
                          activation_class=nn.Tanh),
                      AddStateIndependentNormalScale(action_dim)),
        in_keys=["observation"], out_keys=["loc", "scale"]),
    in_keys=["loc", "scale"], distribution_class=IndependentNormal, return_log_prob=True,
).to(device)
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)
advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
ppo = ClipPPOLoss(actor, critic, clip_epsilon=CLIP_EPSILON, entropy_coeff=0.0, critic_coeff=0.5,
                  loss_critic_type="l2", normalize_advantage=True).to(device)
optimizer = torch.optim.Adam(ppo.parameters(), lr=LR)
scheduler = KLAdaptiveLR(optimizer, kl_threshold=KL_THRESHOLD)
reward_normalizer = RewardNormalizer(num_envs=NUM_ENVS, gamma=GAMMA).to(device)

# D(s, a) in (0, 1): a 64-64 tanh MLP on the concatenated pair and a sigmoid, under the expert's
# keys ("observation", "action"); GAILLoss reads the policy's at "collector_*".


class ConcatInputs(nn.Sequential):
    """``nn.Sequential`` on its inputs joined along the last dim (D reads (s, a))."""

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cat(inputs, -1))


discriminator = TensorDictModule(
    ConcatInputs(MLP(in_features=obs_dim + action_dim, out_features=1,
                     num_cells=[64, 64], activation_class=nn.Tanh), nn.Sigmoid()),
    in_keys=["observation", "action"], out_keys=["d_logits"],
).to(device)
gail = GAILLoss(discriminator, use_grad_penalty=GP_LAMBDA > 0, gp_lambda=GP_LAMBDA)
disc_optimizer = torch.optim.Adam(gail.parameters(), lr=DISC_LR)


def policy_pairs(rollout: TensorDict) -> TensorDict:
    """The rollout's pairs as the discriminator sees the expert's."""
    low, high = action_spec.space.low, action_spec.space.high
    observation = rollout["observation"]
    if args.disc_input == "expert":
        observation = expert.standardise(observation)
    return TensorDict(observation=observation,
                      action=rollout["action"].clamp(low, high), batch_size=rollout.shape)


def expert_pairs() -> TensorDict:
    """A batch of expert pairs, observations as the discriminator reads them."""
    batch = expert.sample().select("observation", "action")
    if args.disc_input == "raw":
        batch["observation"] = batch["observation"] * expert.std + expert.mean
    return batch


def update_discriminator(pairs: TensorDict) -> None:
    """DISC_STEPS Adam steps of GAILLoss on random policy pairs against expert pairs."""
    for _ in range(DISC_STEPS):
        policy = pairs[torch.randint(pairs.numel(), (DISC_BATCH,), device=device)]
        batch = expert_pairs()
        batch["collector_observation"] = policy["observation"]
        batch["collector_action"] = policy["action"]
        disc_optimizer.zero_grad()
        gail(batch)["loss"].backward()
        disc_optimizer.step()


@torch.no_grad()
def policy_kl(batch: TensorDict) -> torch.Tensor:
    """k3 estimate of KL(pi_old || pi) over the rollout (KLAdaptiveLR's signal)."""
    log_prob = actor.get_dist(batch.copy()).log_prob(batch["action"])
    return kl_k3(log_prob - batch["action_log_prob"]).mean()


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


def sample_action(td: TensorDict) -> torch.Tensor:
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]  # also writes "loc", "scale", "action_log_prob"


# NUM_ENVS Pendulums stepped together. SAME_STEP autoreset: when an episode ends, step() returns
# the first observation of the next one and puts the true last observation in infos["final_obs"].
envs = gym.make_vec(ENV_ID, num_envs=NUM_ENVS, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
collector = VectorCollector(envs, device, seed=args.seed)  # env i is seeded with seed + i
num_iterations = max(1, args.total_frames // (NUM_ENVS * NUM_STEPS))
pbar = tqdm(total=num_iterations * NUM_ENVS * NUM_STEPS, unit="frames")
for _ in range(num_iterations):
    rollout = torch.stack([collector.step(sample_action, keep=("loc", "scale", "action_log_prob"))
                           for _ in range(NUM_STEPS)], dim=1)  # [NUM_ENVS, NUM_STEPS]
    pairs = policy_pairs(rollout)
    update_discriminator(pairs.reshape(-1))
    with torch.no_grad():  # GAIL's reward replaces the environment's, then PPO's scaling
        reward = gail_reward(discriminator(pairs)["d_logits"], form=args.reward_form)
        rollout["next", "reward"] = reward_normalizer(reward, rollout["next", "done"])
        advantage_module(rollout)
    flat = rollout.reshape(-1)
    # PPO epochs: random minibatches (a fresh permutation every epoch), each an Adam step on the
    # sum of the "loss_*" entries; after each epoch KLAdaptiveLR adapts the learning rate to the
    # KL of the policy from the one that collected the rollout.
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(flat.numel(), device=flat.device)
        for idx in order.split(MINIBATCH_SIZE):
            losses = ppo(flat[idx])
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(ppo.parameters(), MAX_GRAD_NORM)
            optimizer.step()
        scheduler.step(policy_kl(flat))
    with torch.no_grad():  # D's mean on the rollout's pairs and on expert pairs
        d_policy = discriminator(pairs)["d_logits"].mean().item()
        d_expert = discriminator(expert_pairs())["d_logits"].mean().item()
    helpers.show_progress(pbar, collector.episodes, collector.frames,
                          d_policy=f"{d_policy:.2f}", d_expert=f"{d_expert:.2f}")
pbar.close()
envs.close()


def deterministic_policy(observation: np.ndarray) -> np.ndarray:
    td = TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32, device=device))
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return actor(td)["action"].clamp(-2.0, 2.0).cpu().numpy()


# ---- Save the learning curve (the environment's returns), evaluate the final policy ----
helpers.finish(args, start_time, collector.episodes, "GAIL (PPO learner) on Pendulum-v1",
               env_id=ENV_ID, policy=deterministic_policy)
