"""Conservative Q-learning (CQL) from a fixed Pendulum-v1 dataset with rlloss, offline.

This tutorial trains a policy with rlloss's ``CQLLoss`` (a drop-in replacement for
``torchrl.objectives.CQLLoss``) on the transitions written by ``offline_dataset.py``, never
acting in the environment except to evaluate. The pieces map to Kumar et al., "Conservative
Q-Learning for Offline Reinforcement Learning" (arXiv:2006.04779), CQL(H) on SAC (eq. 4 and
appendix F):

1. ``loss_qvalue``: SAC's regression of both Q_i(s, a) onto r + gamma min_i Q_target,i(s', a'),
   a' ~ pi(.|s') (the "deterministic backup": no entropy bonus in the target);
2. ``loss_cql``: min_q_weight (= the paper's alpha, 5) times, per critic, the log-sum-exp of Q over
   10 uniform actions and 10 + 10 actions of the current policy at s and s' (each importance-
   weighted by the density it was drawn from), minus Q on the dataset's action: Q is pushed
   down where the policy would go and up on the data, so actions outside the dataset are not
   over-estimated;
3. ``loss_actor`` and ``loss_alpha``: SAC's, the entropy temperature tuned towards -|A|;
4. Polyak-average the target critics (TorchRL's ``SoftUpdate``, tau = 0.005).

Hyperparameters are the paper's for the Gym-MuJoCo datasets (alpha = min_q_weight 5 without the
Lagrangian form, policy Adam 1e-4, critic Adam 3e-4, batch 256, 256x256 MLPs); the authors'
behaviour-cloning warm-up of the actor is not used. The dataset (``OfflineDataset``, its
observations standardised), its minibatches and the evaluations are in this file.

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -491.9, -363.9, -587.7 (rlloss); TorchRL's CQLLoss swapped in: -412.1, -357.6, -534.4 (its penalty groups the log-sum-exp differently, README); behaviour cloning -797.6, -812.0, -851.8; dataset mean -839.2. On CUDA (an H100, torch 2.11); figures in benchmarks/results/offline.json.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/cql_offline.py --seed 0 --dataset runs/pendulum_offline/dataset --out runs/cql

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``train_return=`` (mean of the last 10 of those evaluations),
``eval_return=`` and last ``final_return=`` (the final policy's mean over 10 fresh episodes).
"""

import json
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators
from tqdm import tqdm

from rlloss import CQLLoss

# --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes
args = helpers.offline_parser(__doc__, "runs/cql_offline").parse_args()
device, start_time = helpers.start(args)  # seeds network init and minibatch sampling

# Pendulum-v1's action bounds as a TorchRL spec, its observation and action dims (the environment
# only evaluates: the agent learns from the dataset alone).
ENV_ID = "Pendulum-v1"
env = gym.make(ENV_ID)
action_spec = Bounded(low=torch.as_tensor(env.action_space.low),
                      high=torch.as_tensor(env.action_space.high),
                      shape=env.action_space.shape, device=device)
obs_dim, action_dim = env.observation_space.shape[0], action_spec.shape[-1]

BATCH_SIZE, GAMMA, TAU, HIDDEN = 256, 0.99, 0.005, [256, 256]  # the papers' defaults
MIN_Q_WEIGHT, NUM_RANDOM = 5.0, 10


def mlp(in_features: int, out_features: int, cells: list[int]) -> nn.Module:
    """A ReLU MLP with hidden layers of ``cells`` units."""
    return MLP(in_features=in_features, out_features=out_features, num_cells=cells,
               activation_class=nn.ReLU)


def tanh_normal_actor(cells: list[int]) -> ProbabilisticActor:
    """pi(a|s) = tanh-squashed Normal(mu(s), sigma(s)) scaled onto the action bounds. The MLP
    writes (mu, raw sigma); NormalParamExtractor splits them and makes sigma positive (biased
    softplus)."""
    net = nn.Sequential(mlp(obs_dim, 2 * action_dim, cells), NormalParamExtractor())
    bounds = {"low": action_spec.space.low, "high": action_spec.space.high}
    return ProbabilisticActor(TensorDictModule(net, ["observation"], ["loc", "scale"]),
                              in_keys=["loc", "scale"], spec=action_spec,
                              distribution_class=TanhNormal,
                              distribution_kwargs=bounds).to(device)


def q_critic(cells: list[int]) -> ValueOperator:
    """Q(s, a): an MLP on the concatenated observation and action, writing
    ``"state_action_value"``."""
    return ValueOperator(mlp(obs_dim + action_dim, 1, cells),
                         in_keys=["observation", "action"])


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


# pi(a|s): a tanh-squashed Gaussian (as sac_pendulum.py's); Q (CQLLoss keeps two, with targets).
actor = tanh_normal_actor(HIDDEN)
critic = q_critic(HIDDEN)
loss_module = CQLLoss(actor, critic, action_spec=action_spec, min_q_weight=MIN_Q_WEIGHT,
                      num_random=NUM_RANDOM, deterministic_backup=True,
                      loss_function="l2").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_updater = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam([  # the losses' gradients are disjoint: one step for all three
    {"params": actor.parameters(), "lr": 1e-4},
    {"params": loss_module.qvalue_network_params.parameters(), "lr": 3e-4},
    {"params": [loss_module.log_alpha], "lr": 3e-4},
])

# The dataset, held in memory with its observations standardised.
dataset = OfflineDataset(args.dataset, device, BATCH_SIZE)


def policy(observation: np.ndarray) -> np.ndarray:
    """The actor's deterministic action for an environment's observation, standardised as the
    dataset's are (the evaluation policy)."""
    td = TensorDict(observation=dataset.standardise(observation))
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return actor(td)["action"].cpu().numpy()


curve = []  # (gradient steps, mean return of 5 evaluation episodes)
pbar = tqdm(total=args.total_frames, unit="steps")
for step in range(1, args.total_frames + 1):
    batch = dataset.sample()  # BATCH_SIZE transitions drawn uniformly with replacement
    out = loss_module(batch)
    loss = out["loss_actor"] + out["loss_qvalue"] + out["loss_cql"] + out["loss_alpha"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    target_updater.step()

    # ---- Every --eval-every steps and after the last, the policy plays 5 evaluation episodes
    # (start states seeded from 20,000 + 100 seed + step) ----
    if step % args.eval_every == 0 or step == args.total_frames:
        returns = helpers.evaluate(ENV_ID, policy, seed=20_000 + 100 * args.seed + step,
                                   episodes=5)
        curve.append((step, float(np.mean(returns))))
        pbar.set_postfix(eval_return=f"{curve[-1][1]:.1f}")
    pbar.update(1)
pbar.close()

# ---- Save the evaluations' curve (OUT/returns.csv, OUT/curve.png: the evaluation returns
# against gradient steps, running mean over 5), evaluate the final policy on start states the
# dataset never saw, report ----
TITLE = "CQL on a fixed Pendulum-v1 dataset"
helpers.finish(args, start_time, curve, TITLE, env_id=ENV_ID, policy=policy, window=5,
               xlabel="gradient steps", ylabel="evaluation return (5 episodes)")
