"""Implicit Q-learning (IQL) from a fixed Pendulum-v1 dataset with rlloss, offline.

This tutorial trains a policy with rlloss's ``IQLLoss`` (a drop-in replacement for
``torchrl.objectives.IQLLoss``) on the transitions written by ``offline_dataset.py``, never
acting in the environment except to evaluate. The pieces map to Kostrikov et al., "Offline
Reinforcement Learning with Implicit Q-Learning" (arXiv:2110.06169), Algorithm 1:

1. ``loss_value``: fit V(s) to an upper expectile (tau = 0.7) of the target critics' minimum
   min_i Q_target,i(s, a) over the dataset's actions (eq. 5): no action outside the dataset is
   ever evaluated, so no value is extrapolated;
2. ``loss_qvalue``: regress both Q_i(s, a) onto r + gamma V(s') (eq. 6);
3. ``loss_actor``: advantage-weighted regression, -exp(beta (Q(s, a) - V(s))) log pi(a|s) on the
   dataset's actions, beta = 3, weights capped at 100 (eq. 7);
4. Polyak-average the target critics (TorchRL's ``SoftUpdate``, tau = 0.005).

Hyperparameters are the paper's for the MuJoCo datasets (expectile 0.7, temperature 3, Adam
3e-4, batch 256, 256x256 MLPs), with a squared-error Q loss. The dataset (``OfflineDataset``, its
observations standardised), its minibatches and the evaluations are in this file.

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -157.1, -157.5, -238.6 (rlloss); TorchRL's IQLLoss swapped in: -157.1, -157.5, -238.6, the same to the digit; behaviour cloning -797.6, -812.0, -851.8; dataset mean -839.2. On CUDA (an H100, torch 2.11); figures in benchmarks/results/offline.json.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/iql_offline.py --seed 0 --dataset runs/pendulum_offline/dataset --out runs/iql

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

from rlloss import IQLLoss

# --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes
args = helpers.offline_parser(__doc__, "runs/iql_offline").parse_args()
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


# pi(a|s): a tanh-squashed Gaussian (as sac_pendulum.py's); Q_1, Q_2 with target copies; V(s).
actor = tanh_normal_actor(HIDDEN)
critics = [q_critic(HIDDEN) for _ in range(2)]
state_value = ValueOperator(mlp(obs_dim, 1, HIDDEN), in_keys=["observation"])
loss_module = IQLLoss(actor, critics, state_value, expectile=0.7, temperature=3.0,
                      loss_function="l2").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_updater = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=3e-4)  # actor, Q_1, Q_2, V

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
    loss = out["loss_actor"] + out["loss_qvalue"] + out["loss_value"]  # disjoint gradients
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
TITLE = "IQL on a fixed Pendulum-v1 dataset"
helpers.finish(args, start_time, curve, TITLE, env_id=ENV_ID, policy=policy, window=5,
               xlabel="gradient steps", ylabel="evaluation return (5 episodes)")
