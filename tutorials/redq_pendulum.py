"""Randomized ensembled double Q-learning (REDQ) on Pendulum-v1 with rlloss, on SAC's loop.

This tutorial trains SAC's tanh-Gaussian policy with an ensemble of critics through rlloss's
``REDQLoss`` (a drop-in replacement for ``torchrl.objectives.REDQLoss``). The pieces map to
"Randomized Ensembled Double Q-Learning: Learning Fast Without a Model" (Chen et al.,
arXiv:2101.05982, Algorithm 1):

1. an ensemble of N = 10 Q-networks (2x128 MLPs) with target copies; the agent acts with
   a ~ pi(.|s) and stores (s, a, r, s', terminated) in a replay buffer, as SAC does;
2. for every environment step, G gradient steps (the update-to-data ratio, UTD), each on the
   sum of ``REDQLoss``'s three outputs on a fresh minibatch:

   - ``loss_qvalue``: a subset J of M = 2 of the N target critics is drawn at random (line 7),
     y = r + gamma (1 - terminated) (min_{j in J} Q_j,target(s', a') - alpha log pi(a'|s')),
     a' ~ pi(.|s') (line 8), and every Q_i is regressed on y (line 9; squared error here);
   - ``loss_actor``: alpha log pi(a~|s) - 1/N sum_i Q_i(s, a~), the ensemble mean (line 13);
   - ``loss_alpha``: SAC's automatic temperature, target entropy -dim(A), over the
     log-probabilities of a~ and a'; TorchRL's REDQ clamps alpha into [min_alpha, max_alpha]
     (default [0.1, 10]); we lower min_alpha to 1e-3 because Pendulum's SAC settles near
     alpha = 0.05 and a floor of 0.1 keeps the policy noisier than it needs to be;

3. Q_target <- tau Q + (1 - tau) Q_target after every gradient step (line 10), with TorchRL's
   ``SoftUpdate``.

The paper uses G = 20 (and N = 10, M = 2, 256-unit critics) with one actor step per
environment step; here every gradient step moves the actor too (the losses come from one
``forward``, TorchRL's interface). On one CPU thread a REDQ update with ten 2x256 critics
costs about three times SAC's, with ten 2x128 critics about one and a half times, and the
paper's G = 20 multiplies that by 20. To keep a run near SAC's cost we use 2x128 critics and
G = 1 by default; ``--utd G`` sets G (G = 2 doubles the time; a GPU, ``--device cuda``, runs the ensemble in
one vmap call and has room for the paper's G = 20). Everything else is ``sac_pendulum.py``'s
(the rl-zoo Pendulum SAC settings: 2x256 MLPs, batch 256, learning rate 1e-3, gamma 0.99,
tau 0.005, alpha learned from 1.0, 1,000 random steps first), so that the two differ only by
the loss, the critics' width and the UTD. The training loop is ``sac_pendulum.py``'s
with G gradient steps per environment step.

Results (20,000 steps, one CPU thread; seeds 0, 1, 2), re-measured on 2026-11-29 with
``tools/tutorial_runs.py --figures``: final_return (evaluation) -109.1, -105.9 and -160.6, the
evaluation first at or above -200 at 4,000 steps on all three seeds; the last 10 training
episodes of seed 0 -178.7. (The earlier record: -111.7, -106.4, -158.8 and -182.9, the same
crossing steps; float32 rounding moved since.) TorchRL's ``REDQLoss`` swapped in
(``tools/tutorial_runs.py``), re-measured the same day: -109.1, -106.0 and -161.1 (the earlier
record: -108.6, -106.2, -159.5), first at or above -200 at 4,000 steps on all three seeds.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 20000: final_return = -109.1 -105.9 -160.6
    [figures] rlloss, seeds 0 1 2, --total-frames 20000: first_eval_at_target = 4000 4000 4000
    [figures] rlloss, seeds 0, --total-frames 20000: train_return = -178.7
    [figures] torchrl, seeds 0 1 2, --total-frames 20000: final_return = -109.1 -106.0 -161.1
    [figures] torchrl, seeds 0 1 2, --total-frames 20000: first_eval_at_target = 4000 4000 4000

Run:
    python tutorials/redq_pendulum.py --seed 0 --total-frames 20000 --out runs/redq_pendulum

It writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/eval_returns.csv`` (the mean
return of the deterministic policy over 10 unseen start states every 1,000 steps) and
``OUT/curve.png``; it prints ``first_eval_at_target=`` (the first of those evaluations at or
above -200), ``train_return=``, ``eval_return=`` and last ``final_return=`` (the mean return of
the final deterministic policy's evaluation episodes).
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

from rlloss import REDQLoss

parser = helpers.tutorial_parser(__doc__, "runs/redq_pendulum", total_frames=20_000)
helpers.evaluation_flags(parser, every=1_000, save_actor=True)  # --eval-every, --eval-episodes,
# --save-actor
parser.add_argument("--utd", type=int, default=1,
                    help="G, gradient steps per environment step (update-to-data ratio)")
args = parser.parse_args()

# Hyperparameters: sac_pendulum.py's and REDQ's.
GAMMA, TAU, LR = 0.99, 0.005, 1e-3
HIDDEN = [256, 256]  # the actor's
NUM_CRITICS = 10  # N
SUBSET = 2  # M, target critics in each target's minimum
CRITIC_CELLS = [128, 128]  # each critic's hidden layers (see the docstring)
MIN_ALPHA = 1e-3  # TorchRL's REDQ floor is 0.1

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


# pi(a|s): SAC's tanh-squashed Gaussian; N critics (one vmap call) with target copies; the target
# entropy -dim(A) = -1 comes from the actor's spec.
actor = tanh_normal_actor(HIDDEN)
critics = [q_critic(CRITIC_CELLS) for _ in range(NUM_CRITICS)]
loss_module = REDQLoss(actor, critics, num_qvalue_nets=NUM_CRITICS, sub_sample_len=SUBSET,
                       loss_function="l2", alpha_init=1.0, min_alpha=MIN_ALPHA).to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
target_updater = SoftUpdate(loss_module, tau=TAU)
# One optimizer for actor, critics and log(alpha): each loss only reaches its own parameters.
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

    # ---- Learn: after LEARNING_STARTS, G = --utd updates per env step, each on a fresh minibatch ----
    if frame > LEARNING_STARTS:
        for _ in range(args.utd):
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
helpers.finish(args, start_time, episodes, "REDQ on Pendulum-v1", evaluator=evaluator, actor=actor,
               target=EVAL_TARGET)
