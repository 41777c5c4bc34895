"""Truncated quantile critics (TQC) on Pendulum-v1 with rlloss, on SAC's training loop.

This tutorial trains SAC's tanh-Gaussian policy with distributional critics through rlloss's
``TQCLoss`` (a drop-in replacement for ``torchrl.objectives.TQCLoss``). The pieces map to
"Controlling Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile
Critics" (Kuznetsov et al., arXiv:2005.04269, Algorithm 1):

1. N = 5 critics, each an MLP writing M = 25 atoms theta_n^m(s, a) (the quantiles at levels
   tau_m = (2m - 1) / (2M) of Z_n(s, a)); the agent acts with a ~ pi(.|s) and stores
   (s, a, r, s', terminated) in a replay buffer, as SAC does;
2. for every environment step, one gradient step on the sum of ``TQCLoss``'s three outputs:

   - ``loss_qvalue``: the target critics' N M = 125 atoms at (s', a'), a' ~ pi(.|s'), are
     pooled and sorted and the d N = 2 x 5 = 10 largest dropped (d = 2 per net,
     ``top_quantiles_to_drop_per_net``; eq. 10: the truncation that controls overestimation);
     each kept atom gives y_k = r + gamma (1 - terminated) (z_(k) - alpha log pi(a'|s'))
     (eq. 11), and each critic is trained by the quantile Huber loss (kappa = 1) of its 25
     atoms against all 115 y_k (eq. 12), summed over the critics;
   - ``loss_actor``: alpha log pi(a~|s) - 1/(N M) sum_n sum_m theta_n^m(s, a~), the mean of
     every (untruncated) atom (eq. 13);
   - ``loss_alpha``: SAC's automatic temperature, target entropy -dim(A);
3. Q_target <- tau Q + (1 - tau) Q_target with TorchRL's ``SoftUpdate``.

The paper's hyperparameters are N = 5, M = 25, d = 2 on most MuJoCo tasks (d from 0 to 5 by
task), 256-unit layers (3 for the critics, 2 for the actor), batch 256, learning rate 3e-4,
one update per step. We keep N, M and d and take everything else from ``sac_pendulum.py`` (the
rl-zoo Pendulum SAC settings: 2x256 MLPs, learning rate 1e-3, gamma 0.99, tau 0.005, alpha
learned from 1.0, 1,000 random steps first), so that the two differ only by the loss. The
training loop is ``sac_pendulum.py``'s.

Results (20,000 steps, ``tools/tutorial_runs.py``, one CPU thread): final_return (evaluation)
-108.9, -108.9 and -157.7 on seeds 0, 1, 2 (seed 2's evaluation start states are the hard ones:
SAC -160.3, REDQ -158.8 on them); the evaluation first at or above -200 at 4,000 steps on all
three seeds (-180.2, -126.9, -169.4; -640.6, -656.8, -837.0 at 3,000), as SAC's first crossings
(4,000 and 5,000) and REDQ's (4,000); the last 10 training episodes -177.8, -189.9, -194.1.
TorchRL's ``TQCLoss`` swapped in, seeds 0, 1, 2: final_return
-109.9, -105.3, -159.0, first at or above -200 at 4,000 steps on all three (-128.0, -126.7,
-169.6), the last 10 training episodes -179.2, -188.4, -201.7.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 20000: final_return = -111.3 -104.5 -154.0
    [figures] rlloss, seeds 0 1 2, --total-frames 20000: first_eval_at_target = 4000 4000 4000
    [figures] rlloss, seeds 0 1 2, --total-frames 20000: train_return = -194.0 -189.1 -191.6
    [figures] torchrl, seeds 0 1 2, --total-frames 20000: final_return = -108.7 -104.8 -157.4
    [figures] torchrl, seeds 0 1 2, --total-frames 20000: first_eval_at_target = 4000 4000 4000
    [figures] torchrl, seeds 0 1 2, --total-frames 20000: train_return = -189.5 -188.4 -193.6

rlloss's three seeds were re-measured on 2026-11-29 with ``tools/tutorial_runs.py --figures``
(seeds 0 and 1 at rlloss 06e7bed, seed 2 at a996393): final_return -111.3, -104.5 and -154.0
(the earlier record above: -108.9, -108.9, -157.7), the evaluation first at or above -200 at
4,000 steps on all three as before (seed 2: -169.8), the last 10 training episodes -194.0,
-189.1 and -191.6. TorchRL's seed 0 was re-measured the same day (a996393): final_return
-108.7 (earlier -109.9), first at or above -200 at 4,000 steps as before, the last 10 training
episodes -189.5 (earlier -179.2). TorchRL's seeds 1 and 2 were re-measured on 2026-11-29
as well (d4563f3, whose code is a996393's): final_return -104.8 and -157.4 (earlier -105.3,
-159.0), first at or above -200 at 4,000 steps on both as before (-126.7, -169.4), the last 10
training episodes -188.4 and -193.6 (earlier -188.4, -201.7). An rlloss run takes about 25
minutes of one core here; TorchRL's took 41-44 minutes while sharing the machine's two cores.

Run:
    python tutorials/tqc_pendulum.py --seed 0 --total-frames 20000 --out runs/tqc_pendulum

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

from rlloss import TQCLoss

parser = helpers.tutorial_parser(__doc__, "runs/tqc_pendulum", total_frames=20_000)
helpers.evaluation_flags(parser, every=1_000, save_actor=True)  # --eval-every, --eval-episodes,
# --save-actor
args = parser.parse_args()

# Hyperparameters: sac_pendulum.py's and TQC's.
GAMMA, TAU, LR, HIDDEN = 0.99, 0.005, 1e-3, [256, 256]
NUM_CRITICS = 5  # N
NUM_QUANTILES = 25  # M, atoms per critic
DROP_PER_NET = 2  # d: the pooled target drops its d N largest atoms

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


def q_critic(cells: list[int], num_atoms: int = 1) -> ValueOperator:
    """Q(s, a): an MLP on the concatenated observation and action, writing
    ``"state_action_value"`` (``num_atoms`` values: TQC's quantiles)."""
    return ValueOperator(mlp(obs_dim + action_dim, num_atoms, cells),
                         in_keys=["observation", "action"])


# pi(a|s): SAC's tanh-squashed Gaussian; N quantile critics (one vmap call) with target copies;
# the target entropy -dim(A) = -1 comes from the actor's spec.
actor = tanh_normal_actor(HIDDEN)
critics = [q_critic(HIDDEN, num_atoms=NUM_QUANTILES) for _ in range(NUM_CRITICS)]
loss_module = TQCLoss(actor, critics, num_qvalue_nets=NUM_CRITICS,
                      top_quantiles_to_drop_per_net=DROP_PER_NET, alpha_init=1.0).to(device)
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
helpers.finish(args, start_time, episodes, "TQC on Pendulum-v1", evaluator=evaluator, actor=actor,
               target=EVAL_TARGET)
