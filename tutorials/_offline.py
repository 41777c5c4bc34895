"""What the offline-RL tutorials share (``iql_offline.py``, ``cql_offline.py``,
``td3bc_offline.py``, ``bc_offline.py``): their arguments, the dataset written by
``offline_dataset.py``, the Pendulum-v1 networks, and the training loop, which only samples the
dataset (the environment is used to evaluate, never to collect).

Observations are standardised with the dataset's mean and std (TD3+BC's normalisation,
Fujimoto & Gu, arXiv:2106.06860, section 5), for every method alike; the policies evaluated on
the environment standardise with the same statistics.
"""

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from _results import evaluate, plot_returns, report, write_csv
from matplotlib.figure import Figure
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhModule, TanhNormal, ValueOperator
from tqdm import tqdm

ENV_ID, OBS_DIM, ACTION_DIM, MAX_ACTION = "Pendulum-v1", 3, 1, 2.0
BATCH_SIZE, GAMMA, TAU, HIDDEN = 256, 0.99, 0.005, [256, 256]  # the papers' defaults


def parse_args(description: str, default_out: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-frames", type=int, default=20_000,
                        help="gradient steps (an offline learner collects no frames)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dataset", type=Path, default=Path("runs/pendulum_offline/dataset"),
                        help="written by offline_dataset.py")
    parser.add_argument("--out", type=Path, default=Path(default_out))
    parser.add_argument("--eval-every", type=int, default=1_000, help="gradient steps")
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="episodes of the final deterministic policy, on unseen start states")
    args = parser.parse_args()
    torch.manual_seed(args.seed)  # network init and minibatch sampling
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(1)  # small MLPs: more threads only add synchronisation
    return args


class Dataset:
    """The transitions of ``offline_dataset.py`` in a TorchRL replay buffer (its
    ``LazyMemmapStorage`` read back with ``loads``), observations standardised in place."""

    def __init__(self, path: Path, device: torch.device) -> None:
        if not (path / "storage").exists():
            raise SystemExit(f"no dataset at {path}: run tutorials/offline_dataset.py first "
                             f"(its --out/dataset), or pass --dataset.")
        size = json.loads((path.parent / "dataset.json").read_text())["transitions"]
        buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(size), batch_size=BATCH_SIZE)
        buffer.loads(path)
        data = buffer.storage[:].to(device).clone()  # 50k small transitions: held in memory
        self.mean = data["observation"].mean(0)
        self.std = data["observation"].std(0) + 1e-3
        for key in ("observation", ("next", "observation")):
            data[key] = (data[key] - self.mean) / self.std
        self.data, self.device = data, device

    def sample(self) -> TensorDict:
        index = torch.randint(len(self.data), (BATCH_SIZE,), device=self.device)
        return self.data[index]

    def standardise(self, observation: np.ndarray) -> torch.Tensor:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=self.device)
        return (obs - self.mean) / self.std


def action_spec(device) -> Bounded:
    return Bounded(-MAX_ACTION, MAX_ACTION, shape=(ACTION_DIM,), device=device)


def stochastic_actor(device) -> ProbabilisticActor:
    """pi(a|s): a tanh-squashed Normal scaled onto the action bounds (as ``sac_pendulum.py``)."""
    spec = action_spec(device)
    net = nn.Sequential(MLP(in_features=OBS_DIM, out_features=2 * ACTION_DIM, num_cells=HIDDEN,
                            activation_class=nn.ReLU), NormalParamExtractor())
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
    ).to(device)


def deterministic_actor(device) -> TensorDictSequential:
    """mu(s): an MLP followed by a tanh onto the action bounds (as ``td3_pendulum.py``)."""
    return TensorDictSequential(
        TensorDictModule(MLP(in_features=OBS_DIM, out_features=ACTION_DIM, num_cells=HIDDEN,
                             activation_class=nn.ReLU),
                         in_keys=["observation"], out_keys=["action_param"]),
        TanhModule(in_keys=["action_param"], out_keys=["action"], spec=action_spec(device)),
    ).to(device)


def critic(device) -> ValueOperator:
    """Q(s, a) on the concatenated observation and action, writing "state_action_value"."""
    return ValueOperator(MLP(in_features=OBS_DIM + ACTION_DIM, out_features=1, num_cells=HIDDEN,
                             activation_class=nn.ReLU),
                         in_keys=["observation", "action"]).to(device)


def state_value(device) -> ValueOperator:
    """V(s), writing "state_value"."""
    return ValueOperator(MLP(in_features=OBS_DIM, out_features=1, num_cells=HIDDEN,
                             activation_class=nn.ReLU), in_keys=["observation"]).to(device)


def train(args, title: str, actor: nn.Module, update: Callable[[TensorDict, int], dict]) -> None:
    """``args.total_frames`` calls of ``update(batch, step)`` on dataset minibatches; every
    ``args.eval_every`` steps the policy's deterministic action plays 5 episodes (the learning
    curve: ``OUT/returns.csv`` with columns frames = gradient steps, episode_return); at the end
    ``args.eval_episodes`` evaluation episodes from start states the dataset never saw."""
    start_time = time.perf_counter()
    device = torch.device(args.device)
    dataset = Dataset(args.dataset, device)

    def policy(observation):
        td = TensorDict(observation=dataset.standardise(observation))
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            return actor(td)["action"].cpu().numpy()

    curve = []  # (gradient steps, mean return of 5 evaluation episodes)
    pbar = tqdm(total=args.total_frames, unit="steps")
    for step in range(1, args.total_frames + 1):
        out = update(dataset.sample(), step)
        if step % args.eval_every == 0 or step == args.total_frames:
            returns = evaluate(ENV_ID, policy, seed=20_000 + 100 * args.seed + step, episodes=5)
            curve.append((step, float(np.mean(returns))))
            pbar.set_postfix(eval_return=f"{curve[-1][1]:.1f}",
                             **{k: f"{float(v):.3g}" for k, v in out.items() if k.startswith("loss")})
        pbar.update(1)
    pbar.close()

    write_csv(args.out / "returns.csv", ["frames", "episode_return"], curve)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    plot_returns(ax, curve, window=5)
    ax.set(xlabel="gradient steps", ylabel="evaluation return (5 episodes)",
           title=f"{title} on a fixed Pendulum-v1 dataset")
    fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")
    eval_returns = evaluate(ENV_ID, policy, seed=10_000 + 100 * args.seed,
                            episodes=args.eval_episodes)
    report(start_time, curve, eval_returns)
