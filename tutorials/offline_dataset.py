"""A fixed offline dataset for the offline-RL tutorials: Pendulum-v1 transitions of a partially
trained SAC agent, written in TorchRL's storage format.

1. train ``sac_pendulum.py`` for ``--agent-frames`` environment steps (default 3,000: the agent
   rarely swings the pendulum up yet; fully trained it scores about -150)
   and keep its actor;
2. play ``--total-frames`` steps (default 50,000: 250 episodes) with that actor's stochastic
   policy, a ~ pi(.|s), in 10 environments with seeded resets, storing (s, a, r, s', terminated, done): a "medium"
   dataset in the sense of D4RL (Fu et al., arXiv:2004.07219);
3. write them with TorchRL's ``LazyMemmapStorage`` (``replay_buffer.dumps(OUT / "dataset")``,
   read back with ``replay_buffer.loads``), and ``OUT/returns.csv`` and ``OUT/curve.png`` of the
   dataset's episodes.

``iql_offline.py``, ``cql_offline.py``, ``td3bc_offline.py`` and the behaviour-cloning baseline
``bc_offline.py`` learn from that dataset alone (``--dataset OUT/dataset``); to be useful they
must beat the dataset's mean return, printed last as ``final_return=``.

The same script with ``--agent-frames 5000`` writes the *expert* dataset of the imitation
tutorials (``bc_offline.py`` imitating it, ``gail_pendulum.py``): SAC after
5,000 steps is a trained agent (about -150), and its stochastic policy plays the 250 episodes.

With several ``--agent-frames`` the dataset mixes qualities: each behaviour policy plays an equal
share of ``--total-frames`` in turn (whole episodes, in the same 10 environments), ``0`` standing
for uniform random actions; ``dataset.json`` gives each one's mean return under ``"policies"``.
``--agent-frames 0 3000 5000 --total-frames 60000`` is the random + medium + expert dataset that
``dt_offline.py`` conditions on.

Results (seed 0, the dataset the offline tutorials use): 50,000 transitions, 250 episodes, mean
return -839.2 +- 110.1 (behaviour policy: SAC after 3,000 steps; 2,500 steps gave -1092, 3,500
gave -197, so 3,000 is the "medium" one); re-measured on 2026-11-29 (rlloss 6901cc9): -838.8 +-
113.9.
Expert (seed 0, ``--agent-frames 5000``): 50,000 transitions, 250 episodes, mean return
-149.7 +- 84.5 (torch 2.13); re-measured on 2026-11-29 (rlloss 116548a and 06e7bed, the same
figure twice): -150.7 +- 85.4.
Mixed (seed 0, ``--agent-frames 0 3000 5000 --total-frames 60000``): 60,000 transitions, 300
episodes, 100 of each policy: random -1221.8, medium -837.3, expert -144.1 (all: -734.4 +-
483.4); re-measured on 2026-11-29 (rlloss 06e7bed): random -1221.8, medium -860.9, expert -145.4
(all: -742.7 +- 485.9), the SAC agents behind it having moved with float32 rounding.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0, --agent-frames 3000 --total-frames 50000: final_return = -838.8
    [figures] rlloss, seeds 0, --agent-frames 5000 --total-frames 50000: final_return = -150.7
    [figures] rlloss, seeds 0, --agent-frames 0 3000 5000 --total-frames 60000: final_return = -742.7

Run:
    python tutorials/offline_dataset.py --seed 0 --out runs/pendulum_offline
    python tutorials/offline_dataset.py --seed 0 --agent-frames 5000 --out runs/pendulum_expert
    python tutorials/offline_dataset.py --seed 0 --agent-frames 0 3000 5000 --total-frames 60000 \
        --out runs/pendulum_mixed
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from tqdm import tqdm

ENV_ID = "Pendulum-v1"

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--total-frames", type=int, default=50_000, help="transitions to store")
parser.add_argument("--agent-frames", type=int, nargs="+", default=[3_000],
                    help="environment steps of SAC training for the behaviour policy; several "
                         "values: a mixed dataset, each policy playing an equal share in turn "
                         "(0: uniform random actions, no training)")
parser.add_argument("--device", default="cpu")
parser.add_argument("--out", type=Path, default=Path("runs/pendulum_offline"))
args = parser.parse_args()

torch.manual_seed(args.seed)
torch.set_num_threads(1)
start_time = time.perf_counter()
args.out.mkdir(parents=True, exist_ok=True)

NUM_ENVS, EPISODE_LEN = 10, 200  # environments stepped together; Pendulum's episode length
share = args.total_frames // NUM_ENVS // len(args.agent_frames)  # steps of each env per policy
if len(args.agent_frames) > 1 and share % EPISODE_LEN:
    parser.error(f"--total-frames {args.total_frames} gives each of the {len(args.agent_frames)} "
                 f"behaviour policies {share} steps of each of the {NUM_ENVS} environments, not a "
                 f"multiple of the {EPISODE_LEN}-step episode: pass a multiple of "
                 f"{NUM_ENVS * EPISODE_LEN * len(args.agent_frames)}")


# ---- 1. The behaviour policies: sac_pendulum.py stopped early (0 frames: uniform actions) ----
def behaviour_policy(frames: int):
    """The stochastic policy, a ~ pi(.|s), of SAC after ``frames`` steps; uniform if 0."""
    if frames == 0:
        space = collector.envs.single_action_space
        low, high = (torch.as_tensor(x, device=args.device) for x in (space.low, space.high))
        return lambda td: low + (high - low) * torch.rand(td.shape + low.shape, device=td.device)
    agent_dir = args.out / ("agent" if len(args.agent_frames) == 1 else f"agent_{frames}")
    subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sac_pendulum.py")), "--seed",
         str(args.seed), "--total-frames", str(frames), "--out", str(agent_dir),
         "--save-actor", str(agent_dir / "actor.pt"), "--device", args.device],
        check=True, stdout=subprocess.DEVNULL,
    )
    actor = torch.load(agent_dir / "actor.pt", weights_only=False)  # pickled by sac_pendulum.py

    def sample_action(td):
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            return actor(td)["action"]

    return sample_action


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


# ---- 2. Play each policy in turn in NUM_ENVS environments and store the transitions ----
# NUM_ENVS Pendulums stepped together. SAME_STEP autoreset: when an episode ends, step() returns
# the first observation of the next one and puts the true last observation in infos["final_obs"].
envs = gym.make_vec(ENV_ID, num_envs=NUM_ENVS, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
collector = VectorCollector(envs, torch.device(args.device),
                            seed=args.seed + 1_000)  # resets no training episode had
steps, per_policy = [], []
for frames in args.agent_frames:
    sample_action, first = behaviour_policy(frames), len(collector.episodes)
    steps += [collector.step(sample_action) for _ in tqdm(range(share))]
    returns = [ret for _, ret in collector.episodes[first:]]
    per_policy.append({"agent_frames": frames, "episodes": len(returns),
                       "mean_return": float(np.mean(returns)) if returns else float("nan")})
envs.close()
episodes = collector.episodes
replay_buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(len(steps) * NUM_ENVS))
replay_buffer.extend(torch.cat(steps).cpu())

# ---- 3. Write the dataset (TorchRL's format) and what it holds ----
replay_buffer.dumps(args.out / "dataset")
returns = [ret for _, ret in episodes]
summary = {"transitions": len(replay_buffer), "episodes": len(returns),
           "agent_frames": args.agent_frames, "seed": args.seed,
           "mean_return": float(np.mean(returns)) if returns else float("nan"),
           "std_return": float(np.std(returns)) if returns else float("nan"),
           "policies": per_policy}
(args.out / "dataset.json").write_text(json.dumps(summary, indent=2))
helpers.write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)
fig = Figure(figsize=(6, 4))
ax = fig.add_subplot()
helpers.plot_returns(ax, episodes)
ax.set(xlabel="dataset step", ylabel="episode return",
       title=f"Offline dataset: SAC after {'/'.join(map(str, args.agent_frames))} steps, "
             f"Pendulum-v1")
fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")
print(f"dataset={args.out / 'dataset'} transitions={len(replay_buffer)} episodes={len(returns)}")
print(f"dataset_return_std={summary['std_return']:.1f}")
for policy in per_policy:
    print(f"policy_return[{policy['agent_frames']}]={policy['mean_return']:.1f}")
print(f"wall_time={time.perf_counter() - start_time:.1f}s")
print(f"final_return={summary['mean_return']:.1f}")  # the dataset's mean episode return
