"""Behaviour cloning from a fixed Pendulum-v1 dataset with rlloss's ``BCLoss``: the baseline of
the offline tutorials, and imitation of an expert.

A deterministic policy mu(s) (the same network as ``td3bc_offline.py``'s actor) regresses onto
the dataset's actions, min E[(mu(s) - a)^2] (``BCLoss(actor, loss_function="l2")``, a drop-in
for ``torchrl.objectives.BCLoss``), with no reward and no critic. It recovers the behaviour
policy's mean action: on the "medium" dataset the offline RL methods (``iql_offline.py``,
``cql_offline.py``, ``td3bc_offline.py``) are useful where they beat it; on the "expert" one
(``offline_dataset.py --agent-frames 5000``) it imitates the expert.

Results on the "medium" dataset (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -797.6, -812.0, -851.8 (dataset mean -839.2) on the CPU (torch 2.11); figures in benchmarks/results/offline.json. These were measured with the same regression written in plain torch, before the script took ``BCLoss`` (the same mean squared error); not rerun since.

Results on the expert dataset (``offline_dataset.py --agent-frames 5000``, seed 0: mean return -149.7; 10,000 gradient steps, ``--total-frames 10000``; seeds 0, 1, 2; final_return over 10 episodes on unseen start states): rlloss -125.1, -109.5, -162.0; TorchRL's ``BCLoss`` swapped in: -125.1, -109.5, -162.0, the same to the digit. As a fraction of the expert, (R - R_random) / (R_expert - R_random) with R_random = -1204 (uniform random actions on the evaluation start states of seeds 0-2, 30 episodes) and R_expert = -149.7: 1.02, 1.04, 0.98 (the deterministic mean action does a little better than the stochastic expert that wrote the data). On the CPU (torch 2.13).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them (``<offline_dataset ...>``: the output directory of that run,
made first):

    [figures] rlloss, seeds 0 1 2, --total-frames 10000 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset: final_return = -124.8 -109.5 -162.7
    [figures] torchrl, seeds 0 1 2, --total-frames 10000 --dataset <offline_dataset --seed 0 --agent-frames 5000>/dataset: final_return = -124.8 -109.5 -162.7

These lines were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures`` (seed 0 at
rlloss 116548a, seeds 1 and 2 at 06e7bed): the prerequisite expert dataset's mean return is now
-150.7 (the earlier record: -149.7), and the final returns -124.8, -109.5 and -162.7 with both
libraries, the same to the digit (the earlier record above: -125.1, -109.5, -162.0).

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/bc_offline.py --seed 0 --dataset runs/pendulum_offline/dataset
    python tutorials/offline_dataset.py --agent-frames 5000 --out runs/pendulum_expert  # once
    python tutorials/bc_offline.py --seed 0 --total-frames 10000 --dataset runs/pendulum_expert/dataset

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
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, TanhModule
from tqdm import tqdm

from rlloss import BCLoss

# --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes
args = helpers.offline_parser(__doc__, "runs/bc_offline").parse_args()
device, start_time = helpers.start(args)  # seeds network init and minibatch sampling

# Pendulum-v1's action bounds as a TorchRL spec, its observation and action dims (the environment
# only evaluates: the agent learns from the dataset alone).
ENV_ID = "Pendulum-v1"
env = gym.make(ENV_ID)
action_spec = Bounded(low=torch.as_tensor(env.action_space.low),
                      high=torch.as_tensor(env.action_space.high),
                      shape=env.action_space.shape, device=device)
obs_dim, action_dim = env.observation_space.shape[0], action_spec.shape[-1]

BATCH_SIZE, HIDDEN = 256, [256, 256]  # the papers' defaults


def mlp(in_features: int, out_features: int, cells: list[int]) -> nn.Module:
    """A ReLU MLP with hidden layers of ``cells`` units."""
    return MLP(in_features=in_features, out_features=out_features, num_cells=cells,
               activation_class=nn.ReLU)


def tanh_deterministic_actor(cells: list[int]) -> TensorDictSequential:
    """mu(s): an MLP writes an unbounded ``"action_param"``; ``TanhModule`` maps it onto the
    action bounds as ``"action"``."""
    return TensorDictSequential(
        TensorDictModule(mlp(obs_dim, action_dim, cells), in_keys=["observation"],
                         out_keys=["action_param"]),
        TanhModule(in_keys=["action_param"], out_keys=["action"], spec=action_spec),
    ).to(device)


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


# mu(s) (td3bc_offline.py's actor), regressed onto the dataset's actions: min E[(mu(s) - a)^2].
actor = tanh_deterministic_actor(HIDDEN)
loss_module = BCLoss(actor, loss_function="l2")  # reads the batch's "action", the target
optimizer = torch.optim.Adam(loss_module.parameters(), lr=3e-4)

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
    loss = loss_module(batch)["loss_bc"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

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
TITLE = "Behaviour cloning on a fixed Pendulum-v1 dataset"
helpers.finish(args, start_time, curve, TITLE, env_id=ENV_ID, policy=policy, window=5,
               xlabel="gradient steps", ylabel="evaluation return (5 episodes)")
