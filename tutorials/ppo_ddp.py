"""PPO on CartPole-v1 with data-parallel training over several processes (torch.distributed).

The algorithm and hyperparameters are those of ``ppo_cartpole.py``; the global batch is split
over the processes ("ranks"): with 2 ranks each steps 4 of the 8 environments, so every update
still sees 8 x 32 = 256 transitions and the same number of updates fits the frame budget.

What is synchronised, and how:

- the gradients: the loss module is wrapped in ``DistributedDataParallel``, which averages them
  over the ranks during ``backward()``. Wrap the *loss module* (it holds the actor and the
  critic, and in other losses the target networks and duals), keep the wrapper in a variable
  until ``backward()`` is over, and sum the ``loss_*`` entries of the TensorDict it returns;
- the advantage normalisation: ``normalize_advantage_global=True`` standardises each rank's
  advantages with the mean and std of every rank's (two all-reduces), as one process would over
  the whole batch;
- KLPEN's beta, ``KLAdaptiveLR``, ``KLEarlyStopping``, ``RewardNormalizer`` and
  ``ValueNormalizer`` (not used here) reduce their statistics over the ranks by themselves as
  soon as a process group is initialised.

Each rank starts with the same seed (the same initial networks; DDP also copies rank 0's), seeds
its environments ``seed + 4 * rank + i`` (the seeds one process would give its 8 environments)
and samples actions from its own stream. Rank 0 gathers the episodes, writes the outputs and
prints the report.

Run (2 processes on this machine, gloo on CPU):
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 tutorials/ppo_ddp.py --seed 0

With ``--baseline`` rank 0 first runs ``ppo_cartpole.py`` with the same seed and budget, alone,
and prints its wall time and return beside this run's. Started without torchrun, the script
trains in one process (no process group). On GPUs (``--device cuda``) each rank uses the GPU
``LOCAL_RANK`` and NCCL; on several machines, see the README ("Data-parallel training").

It writes ``OUT/returns.csv`` (one row per finished episode, frames counted over every rank) and
``OUT/curve.png``; the last printed line is ``final_return=<mean return of the last 10
episodes>``.

Results (100k frames, 2 ranks with ``--baseline``, one seed at a time, on a 2-core CPU; the
frame where the mean of the last 10 episodes first reached 475 in brackets):

| seed | 2 ranks: final return | ``ppo_cartpole.py``: final return |
|---|---|---|
| 0 | 500.0 (31.5k) | 500.0 (33.7k) |
| 1 | 500.0 (26.0k) | 500.0 (57.2k) |
| 2 | 500.0 (19.8k) | 500.0 (28.0k) |

Two ranks learn as one process does, and take longer on a 2-core CPU (``--baseline`` prints the
two wall times): the networks are tiny, and the all-reduces (the gradients, the advantage
statistics) about double an update's cost, while the 7,800 updates of a run dominate it; the two
processes also share the machine's two cores. Data
parallelism pays where each rank has its own cores or GPU and the environments or networks are
costly.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from rlloss import GAE, ClipPPOLoss

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--total-frames", type=int, default=100_000, help="env steps, all ranks")
parser.add_argument("--device", default="cpu", help="cpu, or cuda: the GPU LOCAL_RANK per rank")
parser.add_argument("--out", type=Path, default=Path("runs/ppo_ddp"))
parser.add_argument(
    "--baseline",
    action="store_true",
    help="rank 0 first runs ppo_cartpole.py alone, for the wall-time comparison",
)
args = parser.parse_args()

# Hyperparameters: ppo_cartpole.py's (rl-baselines3-zoo, ppo.yml, CartPole-v1), global batch. A
# global rollout holds NUM_ENVS x NUM_STEPS = 8 x 32 = 256 transitions (the envs split over the
# ranks), optimised for NUM_EPOCHS passes, one minibatch each (the whole rollout); the lr and the
# clipping range are annealed linearly to 0.
NUM_ENVS, NUM_STEPS, NUM_EPOCHS = 8, 32, 20
GAMMA, LMBDA, LR, CLIP_EPSILON = 0.98, 0.8, 1e-3, 0.2
ENTROPY_COEFF, CRITIC_COEFF, MAX_GRAD_NORM = 0.0, 0.5, 0.5

# ---- The process group: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous ----
distributed = "RANK" in os.environ
rank = int(os.environ.get("RANK", 0))
world_size = int(os.environ.get("WORLD_SIZE", 1))
device = torch.device(args.device)
if device.type == "cuda":
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
else:
    torch.set_num_threads(1)  # tiny MLPs: more threads only add synchronisation (and thrash)
if NUM_ENVS % world_size:
    raise SystemExit(f"{NUM_ENVS} environments do not split over {world_size} ranks evenly")
envs_per_rank = NUM_ENVS // world_size


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


def categorical_actor_critic() -> tuple[ProbabilisticActor, ValueOperator]:
    """ppo_cartpole.py's networks, separate 64-64 tanh MLPs: the policy pi(a|s) (writes "logits",
    samples "action" from Categorical(logits)) and V(s) (writes "state_value")."""
    policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                     activation_class=nn.Tanh)
    actor = ProbabilisticActor(TensorDictModule(policy_net, ["observation"], ["logits"]),
                               in_keys=["logits"],
                               distribution_class=torch.distributions.Categorical).to(device)
    critic = ValueOperator(
        MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
        in_keys=["observation"],
    ).to(device)
    return actor, critic


baseline = None
if args.baseline and rank == 0:  # before this run's clock starts; the other ranks wait for it
    command = [
        sys.executable,
        str(Path(__file__).with_name("ppo_cartpole.py")),
        "--seed",
        str(args.seed),
        "--total-frames",
        str(args.total_frames),
        "--device",
        args.device,
        "--out",
        str(args.out / "single_process"),
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    baseline = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
if distributed:
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

torch.manual_seed(args.seed)  # the same initial networks on every rank
start_time = time.perf_counter()
# This rank's CartPoles, SAME_STEP autoreset (ppo_cartpole.py's) and ppo_cartpole.py's networks.
envs = gym.make_vec("CartPole-v1", num_envs=envs_per_rank, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
obs_dim, num_actions = envs.single_observation_space.shape[0], envs.single_action_space.n
actor, critic = categorical_actor_critic()
advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
# ppo_cartpole.py's loss, the advantages normalised by the mean and std of the global batch.
loss_module = ClipPPOLoss(actor_network=actor, critic_network=critic, clip_epsilon=CLIP_EPSILON,
                          entropy_coeff=ENTROPY_COEFF, critic_coeff=CRITIC_COEFF,
                          loss_critic_type="l2", normalize_advantage=True,
                          normalize_advantage_global=True).to(device)
# DDP averages the gradients over the ranks in backward(); without a group, the loss itself.
model = (
    DistributedDataParallel(loss_module, device_ids=[device] if device.type == "cuda" else None)
    if distributed
    else loss_module
)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

torch.manual_seed(args.seed + rank)  # each rank samples its own actions
# env i of this rank is seeded seed + envs_per_rank * rank + i: one process's seeds for all 8
collector = VectorCollector(envs, device, seed=args.seed + envs_per_rank * rank)


def policy(td: TensorDict) -> torch.Tensor:
    """a ~ pi(.|s), sampled by the actor."""
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        return actor(td)["action"]


frames_per_batch = NUM_ENVS * NUM_STEPS  # global
num_iterations = max(1, args.total_frames // frames_per_batch)
pbar = tqdm(total=num_iterations * frames_per_batch, unit="frames", disable=rank != 0)

for iteration in range(num_iterations):
    # Anneal the learning rate and the clipping range linearly to 0 (the same on every rank).
    frac = 1.0 - iteration / num_iterations
    optimizer.param_groups[0]["lr"] = LR * frac
    loss_module.clip_epsilon.copy_(CLIP_EPSILON * frac)

    # ---- Collect this rank's part of the rollout: [envs_per_rank, NUM_STEPS] ----
    rollout = torch.stack([collector.step(policy) for _ in range(NUM_STEPS)], dim=1)
    with torch.no_grad():
        # log pi_old(a|s): the policy did not change during the collection
        rollout["action_log_prob"] = actor.get_dist(rollout).log_prob(rollout["action"])
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- 20 epochs over the rollout; DDP averages the gradients of the ranks' halves ----
    # One minibatch per epoch: the whole rollout, in any order. Each epoch an Adam step on the
    # sum of the "loss_*" entries of the DDP model, the averaged gradients' norm clipped first.
    batch = rollout.reshape(-1)
    for _ in range(NUM_EPOCHS):
        losses = model(batch)
        loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
        optimizer.step()
    pbar.update(frames_per_batch)
pbar.close()
envs.close()

# ---- Rank 0 gathers every rank's episodes, frames counted over all ranks ----
episodes = [(frames * world_size, ret) for frames, ret in collector.episodes]
if distributed:
    gathered = [None] * world_size
    dist.all_gather_object(gathered, episodes)
    episodes = sorted(episode for part in gathered for episode in part)
    dist.destroy_process_group()
if rank == 0:
    helpers.save_learning_curve(args.out, episodes, f"PPO on CartPole-v1, {world_size} process(es)")
    if baseline is not None:
        print(f"single_process_wall_time={baseline['wall_time']}")
        print(f"single_process_final_return={baseline['final_return']}")
    print(f"processes={world_size}")
    helpers.report(start_time, episodes)
