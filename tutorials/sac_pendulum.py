"""Soft actor-critic (SAC) on Pendulum-v1 with rlloss, in a single file.

This tutorial trains a tanh-Gaussian policy and two Q-networks with rlloss's ``SACLoss`` (a
drop-in replacement for ``torchrl.objectives.SACLoss``) around a collector you write yourself.
The pieces map to "Soft Actor-Critic Algorithms and Applications" (Haarnoja et al.,
arXiv:1812.05905, Algorithm 1):

1. act with a ~ pi(.|s), a TorchRL ``ProbabilisticActor`` over a ``TanhNormal`` (the Gaussian's
   sample squashed by tanh onto the action bounds), and store (s, a, r, s', terminated) in a
   replay buffer (TorchRL's);
2. for every environment step, sample a minibatch and take one gradient step on the sum of
   ``SACLoss``'s three outputs:

   - ``loss_qvalue``: sum_i (Q_i(s, a) - y)^2 with the soft target
     y = r + gamma (1 - terminated) (min_i Q_i,target(s', a') - alpha log pi(a'|s')),
     a' ~ pi(.|s') (eqs. 5-6; two Q-networks and the minimum of their targets, as in TD3);
   - ``loss_actor``: alpha log pi(a~|s) - min_i Q_i(s, a~), a~ reparameterised (eq. 7);
   - ``loss_alpha``: -log(alpha) (log pi(a~|s) + target_entropy), target_entropy = -dim(A)
     (eq. 18, automatic temperature).

   Each output only sends gradient to its own parameters (the actor loss does not move the
   critics, the temperature loss only moves log(alpha)), so one optimizer on the sum is the
   same as three optimizers with one learning rate;
3. move the target Q-networks towards the online ones, Q_target <- tau Q + (1 - tau) Q_target,
   with TorchRL's ``SoftUpdate``.

Pendulum episodes never terminate; they are truncated after 200 steps, and a truncated
transition keeps its bootstrap term (only ``terminated`` enters the target).

Hyperparameters are rl-baselines3-zoo's Pendulum SAC (SB3 defaults with learning rate 1e-3):
256x256 MLPs, batch 256, gamma 0.99, tau 0.005, one gradient step per environment step,
alpha learned from 1.0. Two choices of ours: 1,000 steps of uniformly random actions before
learning (SB3 uses 100; five full episodes of random data steady the first critic updates), and
the squared-error critic loss of the paper (``loss_function="l2"``; TorchRL's default is
smooth L1).

``redq_pendulum.py``, ``tqc_pendulum.py`` and ``crossq_pendulum.py`` run the same loop with
their losses. After training, the policy's squashed mean (no sampling) plays 10 evaluation
episodes from start states no training episode had.

Results (20,000 steps, one CPU thread; seeds 0, 1, 2): final_return (evaluation) -108.5, -106.7
and -160.3 (rl-zoo: about -150); the last 10 training episodes -178.8, -190.5 and -196.2. The
last 10 training episodes of a seed start from the same states whatever the agent (the resets depend on the seed alone), and for these seeds they are harder than average:
the near-optimal hand-written controller of ``compose_losses.py`` (about -150 over random
starts) scores -184, -192 and -222 on them. Re-run with the periodic evaluation
(``tools/tutorial_runs.py``): final_return -112.3, -106.5 and -158.2; the evaluation first at or
above -200 at 4,000, 5,000 and 5,000 steps (seed 2: -208.5 at 4,000, -162.0 at 5,000).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 20000: final_return = -108.0 -107.4 -162.0
    [figures] rlloss, seeds 0 1 2, --total-frames 20000: first_eval_at_target = 4000 4000 5000

These lines were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures`` (seed 0 at
rlloss 116548a, seeds 1 and 2 at 06e7bed); the figures in the prose above are the earlier record.
The final returns are -108.0, -107.4 and -162.0 (were -112.3, -106.5 and -158.2), the evaluation
first at or above -200 at 4,000, 4,000 and 5,000 steps (seed 1 a thousand steps earlier than
before); the last 10 training episodes of seeds 1 and 2, -190.7 and -195.9.

Run:
    python tutorials/sac_pendulum.py --seed 0 --total-frames 20000 --out runs/sac_pendulum

It writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/eval_returns.csv`` (the
mean return of the deterministic policy over the 10 evaluation start states every 1,000 steps,
``--eval-every``; it draws no torch random number, so training is the same with or without it)
and ``OUT/curve.png``; it prints ``first_eval_at_target=`` (the first of those evaluations at or
above -200), ``train_return=`` (mean of the last 10 training episodes, actions sampled from the
policy), ``eval_return=`` and last ``final_return=`` (both the mean return of the evaluation
episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators
from tqdm import tqdm

from rlloss import SACLoss

parser = helpers.tutorial_parser(__doc__, "runs/sac_pendulum", total_frames=20_000)
helpers.evaluation_flags(parser, every=1_000, save_actor=True)  # --eval-every, --eval-episodes,
# --save-actor
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, sac.yml, Pendulum-v1; see the docstring).
GAMMA = 0.99
TAU = 0.005  # target networks: Q_target <- tau Q + (1 - tau) Q_target after each gradient step
LR = 1e-3  # actor, critics and temperature
HIDDEN = [256, 256]

# The loop's settings (rl-baselines3-zoo's Pendulum SAC, shared by the SAC-family tutorials):
# 1,000 steps of uniformly random actions before learning, a replay buffer of 100,000
# transitions sampled in minibatches of 256, and the evaluation return whose first crossing is
# reported.
LEARNING_STARTS = 1_000
BUFFER_SIZE = 100_000
BATCH_SIZE = 256
EVAL_TARGET = -200.0

device, start_time = helpers.start(args)  # seeds network init, exploration and replay sampling

# Pendulum-v1, one environment stepped one action at a time, and its action bounds as a TorchRL
# spec (the actor's; the loss's target entropy -dim(A) = -1 comes from it).
env = gym.make("Pendulum-v1")
action_spec = Bounded(low=torch.as_tensor(env.action_space.low),
                      high=torch.as_tensor(env.action_space.high),
                      shape=env.action_space.shape, device=device)
obs_dim, action_dim = env.observation_space.shape[0], action_spec.shape[-1]


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


# pi(a|s): a tanh-squashed Gaussian; two Q-networks (an ensemble evaluated in one vmap call) with
# target copies; the target entropy -dim(A) = -1 comes from the actor's spec.
actor = tanh_normal_actor(HIDDEN)
critics = [q_critic(HIDDEN) for _ in range(2)]
loss_module = SACLoss(actor, critics, loss_function="l2", alpha_init=1.0).to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
target_updater = SoftUpdate(loss_module, tau=TAU)
# One optimizer for actor, critics and log(alpha): each loss only reaches its own parameters, so
# one optimizer on the sum is the same as three optimizers with one learning rate.
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)


def update(batch: TensorDict) -> TensorDict:
    """One gradient step on loss_qvalue + loss_actor + loss_alpha, then the target networks
    (Q_target <- tau Q + (1 - tau) Q_target); returns the loss outputs."""
    losses = loss_module(batch)
    loss = losses["loss_qvalue"] + losses["loss_actor"] + losses["loss_alpha"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    target_updater.step()
    return losses


# TorchRL's replay buffer, on the training device, sampling minibatches uniformly.
replay_buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE, device=device),
                                       batch_size=BATCH_SIZE)
# Every --eval-every steps the deterministic policy (the squashed mean) plays --eval-episodes
# episodes from start states no training episode had; it draws no torch random number.
evaluator = helpers.deterministic_evaluator(args, actor, "Pendulum-v1", device)


def tensor(x, dtype=torch.float32) -> torch.Tensor:
    """numpy (from the environment, on CPU) -> torch on the device."""
    return torch.as_tensor(x, dtype=dtype, device=device)


obs, _ = env.reset(seed=args.seed)
episode_return = 0.0
episodes = []  # (frames, episode_return) for every finished episode
losses = None  # the last update's loss outputs
pbar = tqdm(total=args.total_frames, unit="frames")
for frame in range(1, args.total_frames + 1):
    # ---- Act: uniformly at random for the first LEARNING_STARTS steps, then a ~ pi(.|s) (the
    # observation as a batch of one) ----
    if frame <= LEARNING_STARTS:
        action = action_spec.rand()
    else:
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            action = actor(TensorDict(observation=tensor(obs), device=device)[None])["action"][0]

    # ---- Step and store the transition. ("next", "observation") is the true successor, and
    # only termination stops bootstrapping (Pendulum's episodes are truncated, never ended) ----
    transition = TensorDict(observation=tensor(obs), device=device)
    transition["action"] = action
    obs, reward, terminated, truncated, _ = env.step(action.cpu().numpy())
    transition["next"] = TensorDict(observation=tensor(obs), reward=tensor([reward]),
                                    terminated=tensor([terminated], torch.bool), device=device)
    replay_buffer.add(transition)
    episode_return += reward
    if terminated or truncated:
        episodes.append((frame, episode_return))
        episode_return = 0.0
        obs, _ = env.reset()

    # ---- Learn: after LEARNING_STARTS, one update per env step on a fresh minibatch ----
    if frame > LEARNING_STARTS:
        losses = update(replay_buffer.sample())

    evaluator.maybe(frame)
    if frame % 1_000 == 0:  # the progress bar shows the temperature alpha
        alpha = f"{float(losses['alpha']):.3f}" if losses is not None else "n/a"
        helpers.show_progress(pbar, episodes, frame, alpha=alpha)
pbar.close()
env.close()

# ---- Save the learning curve, evaluate the final policy on start states training never
# scored, save the actor (--save-actor), print the first evaluation at or above EVAL_TARGET, and
# report ----
helpers.finish(args, start_time, episodes, "SAC on Pendulum-v1", evaluator=evaluator, actor=actor,
               target=EVAL_TARGET)
