"""The training loop the SAC-family Pendulum tutorials share (``sac_pendulum.py``,
``redq_pendulum.py``, ``tqc_pendulum.py``, ``crossq_pendulum.py``): command line, tanh-Gaussian
actor, Q-network ensemble, replay buffer, collector, periodic greedy evaluation and the
end-of-run report.

The loss class is not imported here: each tutorial imports it (``from rlloss import ...``, the
line the learning benchmark swaps for TorchRL's) and hands ``train`` a function building the
loss module from the actor and a critic factory. Every loss of the family returns
``loss_qvalue``, ``loss_actor`` and ``loss_alpha``, and each sends gradient only to its own
parameters (critics, actor, log(alpha)), so one Adam optimizer on their sum is three optimizers
with one learning rate. The family's variations are arguments of ``train``: target networks or
none (CrossQ), a normalisation layer in the networks (CrossQ's batch renormalisation), a
policy delay, Adam's betas, the critics' width and the update-to-data ratio.
"""

import argparse
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from _results import evaluate, plot_returns, report, write_csv  # tutorials/_results.py
from matplotlib.figure import Figure  # the object-oriented API renders with Agg, no GUI needed
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators
from tqdm import tqdm

# Hyperparameters (rl-baselines3-zoo, sac.yml, Pendulum-v1; see sac_pendulum.py's docstring).
LEARNING_STARTS = 1_000  # env steps of uniformly random actions before training
BUFFER_SIZE = 100_000
BATCH_SIZE = 256
GAMMA = 0.99
TAU = 0.005  # target networks: Q_target <- tau Q + (1 - tau) Q_target after each gradient step
LR = 1e-3  # actor, critics and temperature
ADAM_BETAS = (0.9, 0.999)  # PyTorch's defaults (CrossQ: (0.5, 0.999))
EVAL_TARGET = -200.0  # the first evaluation at or above it is reported (issue 14)


def parse_args(doc: str, default_out: str, utd: int | None = None) -> argparse.Namespace:
    """The tutorials' command line; ``--utd`` (gradient steps per env step, default ``utd``)
    where ``utd`` is given."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-frames", type=int, default=20_000, help="env steps")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path(default_out))
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="episodes of the deterministic policy, on unseen start states")
    parser.add_argument("--eval-every", type=int, default=1_000,
                        help="env steps between evaluations of the deterministic policy "
                             "(OUT/eval_returns.csv; 0: only the final one)")
    parser.add_argument("--save-actor", type=Path, default=None,
                        help="also save the trained actor module there "
                             "(offline_dataset.py uses it)")
    if utd is not None:
        parser.add_argument("--utd", type=int, default=utd,
                            help="gradient steps per environment step (update-to-data ratio)")
    return parser.parse_args()


class ConcatInputs(nn.Sequential):
    """``nn.Sequential`` on its inputs joined along the last dim (a critic reads (s, a))."""

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cat(inputs, -1))


def mlp(in_features: int, out_features: int, cells: list[int],
        norm_layer: Callable[[int], nn.Module] | None = None) -> nn.Module:
    """A ReLU MLP with hidden layers of ``cells`` units; with ``norm_layer`` (a factory of
    normalisation layers, features -> module), one before every linear layer: on the input and
    after each hidden activation (CrossQ's placement, Bhatt et al. Section 4; TorchRL's ``MLP``
    puts its ``norm_class`` between a linear layer and its activation, and not on the input)."""
    if norm_layer is None:
        return MLP(in_features=in_features, out_features=out_features, num_cells=cells,
                   activation_class=nn.ReLU)
    sizes = [in_features, *cells]
    layers = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers += [norm_layer(n_in), nn.Linear(n_in, n_out), nn.ReLU()]
    return ConcatInputs(*layers, norm_layer(sizes[-1]), nn.Linear(sizes[-1], out_features))


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode (normalisation layers read their running statistics and leave
    them alone) inside the block, in its former mode after it."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def train(args: argparse.Namespace, make_loss: Callable, *, title: str, num_atoms: int = 1,
          updates_per_step: int = 1, critic_cells: int = 256,
          target_networks: bool = True, norm_layer: Callable[[int], nn.Module] | None = None,
          policy_delay: int = 1, adam_betas: tuple[float, float] = ADAM_BETAS) -> None:
    """Train ``make_loss(actor, make_critic)``'s agent on Pendulum-v1 for ``args.total_frames``
    env steps, ``updates_per_step`` gradient steps per env step after ``LEARNING_STARTS``; the
    critics (two hidden layers of ``critic_cells``) write ``num_atoms`` values (quantiles for
    TQC). ``target_networks``: the loss keeps target copies, moved by TorchRL's ``SoftUpdate``
    after every gradient step (False for CrossQ: there is nothing to update). ``norm_layer``:
    see ``mlp`` (actor and critics). ``policy_delay``: the actor and temperature losses join
    the critic loss on every ``policy_delay``-th gradient step only. ``adam_betas``: Adam's.
    Writes ``OUT/returns.csv``, ``OUT/eval_returns.csv``, ``OUT/curve.png`` and prints the
    report."""
    torch.manual_seed(args.seed)  # seeds network init, exploration and replay sampling
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # small MLPs: more threads only add synchronisation (and thrash)
    start_time = time.perf_counter()

    env = gym.make("Pendulum-v1")
    obs_dim = env.observation_space.shape[0]
    action_dim = env.action_space.shape[0]
    action_spec = Bounded(
        low=torch.as_tensor(env.action_space.low),
        high=torch.as_tensor(env.action_space.high),
        shape=env.action_space.shape,
        device=device,
    )

    # pi(a|s) = tanh-squashed Normal(mu(s), sigma(s)) scaled onto [low, high]. The MLP writes
    # (mu, raw sigma); NormalParamExtractor splits them and makes sigma positive (biased softplus).
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(mlp(obs_dim, 2 * action_dim, [256, 256], norm_layer),
                          NormalParamExtractor()),
            in_keys=["observation"],
            out_keys=["loc", "scale"],
        ),
        in_keys=["loc", "scale"],
        spec=action_spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
    ).to(device)

    def make_critic():
        """Q(s, a): an MLP on the concatenated observation and action, writing
        "state_action_value" (``num_atoms`` values)."""
        return ValueOperator(
            mlp(obs_dim + action_dim, num_atoms, [critic_cells, critic_cells], norm_layer),
            in_keys=["observation", "action"],
        )

    loss_module = make_loss(actor, make_critic).to(device)
    loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
    target_updater = SoftUpdate(loss_module, tau=TAU) if target_networks else None
    # actor, critics, log(alpha); a parameter without gradient (the actor's on a delayed step)
    # is left alone, its moment estimates included
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR, betas=adam_betas)

    # Replay memory, stored on the training device (a GPU buffer with --device cuda).
    replay_buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(BUFFER_SIZE, device=device), batch_size=BATCH_SIZE
    )

    def to_tensor(x, dtype=torch.float32):
        """numpy (from the env, on CPU) -> torch on the training device."""
        return torch.as_tensor(x, dtype=dtype, device=device)

    def policy_action(observation, exploration_type):
        """The actor's action at one observation (as a batch of one: normalisation layers want a
        batch dim), in eval mode: normalised by the running statistics, which stay as they are."""
        td = TensorDict(observation=to_tensor(observation)[None], batch_size=[1], device=device)
        with torch.no_grad(), set_exploration_type(exploration_type), eval_mode(actor):
            return actor(td)["action"][0]

    def deterministic_action(observation):
        """The squashed mean tanh(mu(s)) scaled onto the bounds, without sampling."""
        return policy_action(observation, ExplorationType.DETERMINISTIC).cpu().numpy()

    def evaluate_policy():
        """Mean return of the deterministic policy on start states training never scored (the
        same ones at every evaluation; no torch random number is drawn)."""
        return evaluate("Pendulum-v1", deterministic_action, seed=10_000 + 100 * args.seed,
                        episodes=args.eval_episodes)

    obs, _ = env.reset(seed=args.seed)
    episode_return = 0.0
    episodes = []  # (frames, episode_return) for every finished episode
    evaluations = []  # (frames, mean evaluation return) every args.eval_every steps
    losses = None  # the last loss outputs, for the progress bar
    gradient_steps = 0
    pbar = tqdm(total=args.total_frames, unit="frames")

    for frame in range(1, args.total_frames + 1):
        # ---- Act: uniformly random before LEARNING_STARTS, then a ~ pi(.|s) ----
        if frame <= LEARNING_STARTS:
            action = action_spec.rand()
        else:
            action = policy_action(obs, ExplorationType.RANDOM)  # sampled, in [low, high]
        td = TensorDict(observation=to_tensor(obs), action=action, device=device)
        obs, reward, terminated, truncated, _ = env.step(action.cpu().numpy())
        # ("next", "observation") is the true successor: env.reset() below only replaces `obs`.
        td["next"] = TensorDict(
            observation=to_tensor(obs),
            reward=to_tensor([reward]),
            terminated=to_tensor([terminated], torch.bool),  # never true on Pendulum
            device=device,
        )
        replay_buffer.add(td)

        episode_return += reward
        if terminated or truncated:
            episodes.append((frame, episode_return))
            episode_return = 0.0
            obs, _ = env.reset()

        # ---- Learn: updates_per_step gradient steps on the sum of the three losses ----
        if frame > LEARNING_STARTS:
            for _ in range(updates_per_step):
                gradient_steps += 1
                batch = replay_buffer.sample()
                losses = loss_module(batch)
                loss = losses["loss_qvalue"]
                if gradient_steps % policy_delay == 0:
                    loss = loss + losses["loss_actor"] + losses["loss_alpha"]
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if target_updater is not None:
                    target_updater.step()

        if args.eval_every and frame % args.eval_every == 0:
            evaluations.append((frame, float(np.mean(evaluate_policy()))))
        if frame % 1000 == 0:
            recent = [ret for _, ret in episodes[-10:]]
            pbar.set_postfix(mean_return=f"{np.mean(recent):.1f}" if recent else "n/a",
                             alpha=f"{losses['alpha']:.3f}" if losses is not None else "n/a",
                             eval=f"{evaluations[-1][1]:.1f}" if evaluations else "n/a")
        pbar.update(1)
    pbar.close()
    env.close()

    # ---- Save the learning curve ----
    write_csv(args.out / "returns.csv", ["frames", "episode_return"], episodes)
    write_csv(args.out / "eval_returns.csv", ["frames", "eval_return"], evaluations)

    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    plot_returns(ax, episodes)
    if evaluations:
        ax.plot(*np.array(evaluations).T, "o-", label="evaluation (deterministic)")
        ax.legend()
    ax.set(xlabel="environment steps", ylabel="episode return", title=f"{title} on Pendulum-v1")
    fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")

    # ---- Evaluate the final policy without exploration, on start states training never scored ----
    eval_returns = evaluate_policy()
    if args.save_actor is not None:
        torch.save(actor, args.save_actor)
    crossed = [frames for frames, ret in evaluations if ret >= EVAL_TARGET]
    print(f"first_eval_at_target={crossed[0] if crossed else 'none'} (target {EVAL_TARGET:g}, "
          f"evaluated every {args.eval_every} steps)")
    report(start_time, episodes, eval_returns)
