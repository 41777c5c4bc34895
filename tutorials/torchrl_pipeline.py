"""rlloss in an existing TorchRL pipeline: PPO on CartPole-v1, one import line changed.

Everything here is TorchRL: ``GymEnv`` environments batched in a ``SerialEnv`` with
``StepCounter`` and ``RewardSum`` transforms, a ``Collector`` (``SyncDataCollector`` before
TorchRL 0.14), TorchRL's ``GAE``, and a ``ReplayBuffer`` (``LazyTensorStorage`` +
``SamplerWithoutReplacement``) serving the minibatches.
Only the loss comes from rlloss; ``rlloss.ClipPPOLoss`` takes the same keywords, reads the same
keys ("advantage", "value_target", "action_log_prob"...) and writes the same ``loss_*`` entries as
``torchrl.objectives.ClipPPOLoss``, so the switch is the import line marked "was:" below.

The algorithm (PPO paper, arXiv:1707.06347): collect a batch with the current policy, compute
GAE advantages (eq. 11) once, then optimise the clipped surrogate (eq. 7) plus the value loss
for several epochs over minibatches of that batch. Hyperparameters are the rl-baselines3-zoo ones
for CartPole, as in ``ppo_cartpole.py``, which shows the same algorithm with a hand-written
gymnasium collector and rlloss's own GAE.

Run:
    python tutorials/torchrl_pipeline.py --seed 0 --total-frames 100000 --out runs/torchrl_ppo

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; the last
printed line is ``final_return=<mean return of the last 10 episodes>``.
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector  # SyncDataCollector in TorchRL < 0.14
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs import Compose, GymEnv, RewardSum, SerialEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives.value import GAE
from tqdm import tqdm

from rlloss import ClipPPOLoss  # was: from torchrl.objectives import ClipPPOLoss

parser = helpers.tutorial_parser(__doc__, "runs/torchrl_ppo", 100_000, "env steps, all envs")
args = parser.parse_args()

# Hyperparameters: ppo_cartpole.py's (rl-baselines3-zoo, ppo.yml, CartPole-v1). A batch holds
# NUM_ENVS x NUM_STEPS = 8 x 32 = 256 transitions, optimised for NUM_EPOCHS passes in minibatches
# of MINIBATCH_SIZE (the whole batch); the lr and the clipping range are annealed linearly to 0.
NUM_ENVS, NUM_STEPS, NUM_EPOCHS, MINIBATCH_SIZE = 8, 32, 20, 256
GAMMA, LMBDA, LR, CLIP_EPSILON = 0.98, 0.8, 1e-3, 0.2
ENTROPY_COEFF, CRITIC_COEFF, MAX_GRAD_NORM = 0.0, 0.5, 0.5

device, start_time = helpers.start(args, one_thread=False)  # seeds network init and action sampling


def make_env():
    """One CartPole with a step counter and the running episode return ("episode_reward")."""
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), RewardSum()))


env = SerialEnv(NUM_ENVS, make_env)  # batch size [8]; ParallelEnv would run one process per env
env.set_seed(args.seed)
obs_dim = env.observation_spec["observation"].shape[-1]
num_actions = env.action_spec.shape[-1]  # GymEnv encodes discrete actions as one-hot vectors

# Policy pi(a|s) = OneHotCategorical(logits(s)) and value function V(s).
actor = ProbabilisticActor(
    TensorDictModule(
        MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
            activation_class=nn.Tanh),
        in_keys=["observation"],
        out_keys=["logits"],
    ),
    in_keys=["logits"],
    spec=env.action_spec,
    distribution_class=OneHotCategorical,
    return_log_prob=True,  # writes "action_log_prob", the log pi_old(a|s) of the ratio
).to(device)
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

frames_per_batch = NUM_ENVS * NUM_STEPS
total_frames = max(frames_per_batch, args.total_frames // frames_per_batch * frames_per_batch)
num_iterations = total_frames // frames_per_batch
collector = Collector(  # samples from the actor (exploration type RANDOM by default)
    env, actor, frames_per_batch=frames_per_batch, total_frames=total_frames, device=device
)
replay_buffer = ReplayBuffer(
    storage=LazyTensorStorage(frames_per_batch, device=device),
    sampler=SamplerWithoutReplacement(),
    batch_size=MINIBATCH_SIZE,
)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=False)
loss_module = ClipPPOLoss(actor_network=actor, critic_network=critic, clip_epsilon=CLIP_EPSILON,
                          entropy_coeff=ENTROPY_COEFF, critic_coeff=CRITIC_COEFF,
                          loss_critic_type="l2", normalize_advantage=True)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

episodes = []  # (frames, episode_return) for every finished episode
frames = 0
pbar = tqdm(total=total_frames, unit="frames")

for iteration, data in enumerate(collector):  # data: batch size [NUM_ENVS, NUM_STEPS]
    frac = 1.0 - iteration / num_iterations
    optimizer.param_groups[0]["lr"] = LR * frac
    loss_module.clip_epsilon.copy_(CLIP_EPSILON * frac)

    # Episode returns: RewardSum's running sum, read at the steps where an episode ended.
    done = data["next", "done"].squeeze(-1)
    step_frames = frames + NUM_ENVS * (1 + torch.arange(data.shape[-1]))  # frames at each step
    for t, ret in zip(step_frames.expand_as(done)[done].tolist(),
                      data["next", "episode_reward"][done].squeeze(-1).tolist(), strict=True):
        episodes.append((t, ret))
    frames += data.numel()

    # Advantages A_t and value targets, once per batch, with TorchRL's GAE.
    with torch.no_grad():
        advantage_module(data)  # writes "advantage" and "value_target"
    replay_buffer.extend(data.reshape(-1))  # replaces the previous batch (capacity = one batch)

    # Several epochs of minibatch updates; SamplerWithoutReplacement visits each sample once
    # per epoch.
    for _ in range(NUM_EPOCHS):
        for _ in range(frames_per_batch // MINIBATCH_SIZE):
            losses = loss_module(replay_buffer.sample())
            loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()

    helpers.show_progress(pbar, episodes, frames)
pbar.close()
collector.shutdown()

# ---- Save the learning curve and report ----
helpers.finish(args, start_time, episodes, "PPO on CartPole-v1 (TorchRL pipeline, rlloss loss)")
