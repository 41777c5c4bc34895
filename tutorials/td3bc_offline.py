"""TD3+BC from a fixed Pendulum-v1 dataset with rlloss, offline.

This tutorial trains a deterministic policy with rlloss's ``TD3BCLoss`` (a drop-in replacement
for ``torchrl.objectives.TD3BCLoss``) on the transitions written by ``offline_dataset.py``, never
acting in the environment except to evaluate. The pieces map to Fujimoto & Gu, "A Minimalist
Approach to Offline Reinforcement Learning" (arXiv:2106.06860), eq. 3 on top of TD3:

1. ``loss_qvalue``: TD3's clipped double-Q regression onto r + gamma min_i Q_target,i(s',
   mu_target(s') + clipped noise), every step;
2. ``loss_actor``, every 2nd step: -lambda Q_1(s, mu(s)) + (mu(s) - a)^2 with
   lambda = alpha / mean |Q_1(s, mu(s))|, alpha = 2.5: the policy improves on Q while staying
   near the dataset's actions (the behaviour-cloning term);
3. Polyak-average the target actor and critics after each actor step (``SoftUpdate``).

Hyperparameters are the paper's (alpha 2.5, policy noise 0.2 and clip 0.5 in units of the
action bound, policy delay 2, Adam 3e-4, batch 256, 256x256 MLPs; observations standardised
with the dataset's statistics, ``OfflineDataset``, as in every offline tutorial).

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -808.1, -787.8, -822.7 (rlloss); TorchRL's TD3BCLoss swapped in: -805.7, -789.1, -822.9; behaviour cloning -797.6, -812.0, -851.8; dataset mean -839.2: above the dataset on 3 of 3 seeds and above BC on 2 of 3 (seeds 1, 2), by a small margin -- on this narrow dataset the BC term keeps TD3+BC close to the behaviour policy. On CUDA (an H100, torch 2.11); figures in benchmarks/results/offline.json.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/td3bc_offline.py --seed 0 --dataset runs/pendulum_offline/dataset

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
from torchrl.modules import MLP, TanhModule, ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators
from tqdm import tqdm

from rlloss import TD3BCLoss

# --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes
args = helpers.offline_parser(__doc__, "runs/td3bc_offline").parse_args()
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
POLICY_DELAY = 2
MAX_ACTION = 2.0


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


def q_critic(cells: list[int]) -> ValueOperator:
    """Q(s, a): an MLP on the concatenated observation and action, writing
    ``"state_action_value"``."""
    return ValueOperator(mlp(obs_dim + action_dim, 1, cells), in_keys=["observation", "action"])


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


# mu(s) (td3_pendulum.py's actor) with a target copy; two critics with target copies.
actor = tanh_deterministic_actor(HIDDEN)
critics = [q_critic(HIDDEN) for _ in range(2)]
loss_module = TD3BCLoss(actor, critics, action_spec=action_spec,
                        policy_noise=0.2 * MAX_ACTION, noise_clip=0.5 * MAX_ACTION, alpha=2.5,
                        loss_function="l2").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_updater = SoftUpdate(loss_module, tau=TAU)
actor_optimizer = torch.optim.Adam(loss_module.actor_network.parameters(), lr=3e-4)
critic_optimizer = torch.optim.Adam(loss_module.qvalue_network_params.parameters(), lr=3e-4)

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
    loss_qvalue, _ = loss_module.qvalue_loss(batch)
    critic_optimizer.zero_grad()
    loss_qvalue.backward()
    critic_optimizer.step()
    if step % POLICY_DELAY == 0:  # the actor and the targets every POLICY_DELAY steps
        loss_actor, _ = loss_module.actor_loss(batch)
        actor_optimizer.zero_grad()
        loss_actor.backward()
        actor_optimizer.step()
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
TITLE = "TD3+BC on a fixed Pendulum-v1 dataset"
helpers.finish(args, start_time, curve, TITLE, env_id=ENV_ID, policy=policy, window=5,
               xlabel="gradient steps", ylabel="evaluation return (5 episodes)")
