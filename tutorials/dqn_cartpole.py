"""Double DQN on CartPole-v1 with rlloss, in a single file.

This tutorial trains a Q-network with rlloss's ``DQNLoss`` (a drop-in replacement for
``torchrl.objectives.DQNLoss``) around a collector you write yourself. The pieces map to the DQN
paper (Mnih et al., Nature 2015, Algorithm 1) and Double DQN (van Hasselt et al., 2015):

1. act epsilon-greedily with respect to Q(s, .), a TorchRL ``QValueActor`` (an MLP), and store
   the transitions (s, a, r, s', terminated) in a replay memory, a TorchRL replay buffer;
2. sample minibatches and minimise L(Q(s, a), y) with the target
   y = r + gamma (1 - terminated) Q_target(s', argmax_a' Q(s', a'))  (double Q-learning);
3. every C gradient steps copy Q's weights into Q_target (TorchRL's ``HardUpdate``).

``--per`` switches on prioritized replay (Schaul et al., 2015) through rlloss's
``PrioritizedSampler`` (``rlloss.data``: a drop-in for TorchRL's, whose sum trees stay on the
buffer's device and need no C++ extension): the loss writes each sample's ``td_error`` into the
batch, the buffer turns it into a priority, and the loss weights samples by the
``priority_weight`` the sampler wrote.

Hyperparameters are rl-baselines3-zoo's tuned CartPole DQN, with two changes that made training
reliable within 50k environment steps: a squared-error loss instead of Huber (which learned
markedly slower here: it caps the gradient of large TD errors, such as those of the terminal
transitions), and a learning rate annealed to 0 (quadratically) so training ends on a stable
policy. After training, the greedy policy (no epsilon) plays 10 evaluation episodes from start
states no training episode had.

Results (50,000 steps, one CPU thread; seeds 0, 1, 2): final_return (greedy evaluation) 500, 500 and 500; the last 10 training
episodes (epsilon 0.04) 500, 500 and 479.5; wall 227, 219 and 217 s. With ``--per`` (same
seeds): final_return 500, 435.4 and 500; last 10 training
episodes 500, 360.9 and 500; wall 830, 814 and 764 s.

Run:
    python tutorials/dqn_cartpole.py --seed 0 --total-frames 50000 --out runs/dqn_cartpole
    python tutorials/dqn_cartpole.py --per --seed 0 --total-frames 50000 --out runs/dqn_per

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes, played with the final epsilon),
``eval_return=`` and last ``final_return=`` (both the mean return of the greedy evaluation).
"""

import torch
from _helpers import (  # tutorials/_helpers.py
    collect_epsilon_greedy,
    discrete_vec,
    evaluation_flags,
    finish,
    greedy_action,
    linear_epsilon,
    replay_memory,
    show_progress,
    start,
    start_collection,
    tutorial_parser,
)
from torch import nn
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import HardUpdate, ValueEstimators

from rlloss import DQNLoss
from rlloss.data import PrioritizedSampler  # TorchRL's, in pure torch on the buffer's device

parser = tutorial_parser(__doc__, "runs/dqn_cartpole", 50_000, "env steps, all envs")
parser.add_argument("--per", action="store_true", help="prioritized experience replay")
evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, dqn.yml, CartPole-v1, except the loss and lr schedule).
NUM_ENVS = 4
NUM_STEPS = 64  # steps per env between training phases: 4 * 64 = 256 env steps ("train_freq")
GRADIENT_STEPS = 128  # gradient steps per training phase
LEARNING_STARTS = 1_000  # env steps of uniformly random actions before training
BUFFER_SIZE = 100_000
BATCH_SIZE = 64
GAMMA = 0.99
LR = 2.3e-3  # annealed to 0 as (1 - progress)^2
# Gradient steps between target copies: once per training phase. (rl-zoo's target_update_interval
# of 10 counts env steps, so there too the target is synced once between training phases.)
TARGET_UPDATE_INTERVAL = 128
EPS_START, EPS_END, EXPLORATION_FRACTION = 1.0, 0.04, 0.16  # eps decays over 16% of training
MAX_GRAD_NORM = 10.0

device, start_time = start(args)  # seeds network init, exploration and replay sampling

# Environment: NUM_ENVS CartPoles stepped together.
envs, obs_dim, num_actions = discrete_vec("CartPole-v1", NUM_ENVS)

# Q(s, .): an MLP writes "action_value"; QValueActor adds the greedy "action" (an index).
q_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[256, 256],
            activation_class=nn.ReLU)
actor = QValueActor(q_net, in_keys=["observation"], action_space="categorical").to(device)

# Double DQN with a squared-error loss; the loss keeps the target copy of the Q-network.
loss_module = DQNLoss(actor, loss_function="l2", double_dqn=True,
                      action_space="categorical").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
# HardUpdate copies on every (interval + 1)-th step(), hence the - 1.
target_updater = HardUpdate(loss_module, value_network_update_interval=TARGET_UPDATE_INTERVAL - 1)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# Replay memory, stored on the training device (a GPU buffer with --device cuda); with --per,
# sampled in proportion to the priorities the loss's "td_error" gives.
if args.per:
    sampler = PrioritizedSampler(BUFFER_SIZE, alpha=0.6, beta=0.4)
    replay_buffer = replay_memory(BUFFER_SIZE, BATCH_SIZE, device, sampler=sampler,
                                  priority_key="td_error")
else:
    replay_buffer = replay_memory(BUFFER_SIZE, BATCH_SIZE, device)


# env i is seeded with seed + i; a progress bar over num_iterations * NUM_ENVS * NUM_STEPS frames
collector, num_iterations, pbar = start_collection(envs, device, args.seed, NUM_STEPS,
                                                   args.total_frames)
episodes = collector.episodes  # (frames, episode_return) for every finished episode
# Uniformly random actions before LEARNING_STARTS, then epsilon decays linearly.
epsilon_at = linear_epsilon(pbar.total, start=EPS_START, end=EPS_END,
                            fraction=EXPLORATION_FRACTION, learning_starts=LEARNING_STARTS)

for iteration in range(num_iterations):
    optimizer.param_groups[0]["lr"] = LR * (1.0 - iteration / num_iterations) ** 2

    # ---- Act epsilon-greedily and store the transitions ----
    # (the greedy action, the actor's argmax, uniformly random with probability epsilon)
    transitions, epsilon = collect_epsilon_greedy(collector, actor, num_actions, NUM_STEPS,
                                                  epsilon_at)
    replay_buffer.extend(transitions)

    # ---- Learn: gradient steps on minibatches sampled from the replay memory ----
    if collector.frames >= LEARNING_STARTS:
        for _ in range(GRADIENT_STEPS):
            batch = replay_buffer.sample()  # with --per, also "priority_weight" and "index"
            loss = loss_module(batch)["loss"]  # also writes batch["td_error"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            target_updater.step()  # copies Q into Q_target every TARGET_UPDATE_INTERVAL steps
            if args.per:  # new priorities from batch["td_error"] (rlloss writes the squared TD
                replay_buffer.update_tensordict_priority(batch)  # error, as TorchRL does)

    show_progress(pbar, episodes, collector.frames, eps=f"{epsilon:.2f}")
pbar.close()
envs.close()

# ---- Save the learning curve, evaluate the greedy policy (argmax_a Q(s, a), no epsilon) on start
# states training never scored, and report ----
finish(args, start_time, episodes, "Double DQN on CartPole-v1", env_id="CartPole-v1",
       policy=greedy_action(actor, device))
