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

Results (50,000 steps, the defaults; final_return: the greedy policy's mean return over the 10
evaluation episodes), with rlloss's ``DQNLoss`` and with TorchRL's swapped in (the same loop,
only the import changed: ``python benchmarks/learning.py --tasks dqn_cartpole --libraries
torchrl``, or ``tools/remeasure_tutorials.py --libraries torchrl``), measured with
``tools/remeasure_tutorials.py`` on this repository's 2-core CPU machine (rlloss 4a98e16):

    [figures] rlloss, seeds 0 1 2 3 4, --total-frames 50000: final_return = 500.0 500.0 500.0 500.0 500.0
    [figures] torchrl, seeds 0 1 2 3 4, --total-frames 50000: final_return = 500.0 500.0 500.0 500.0 500.0

These figures depend on the machine, not only on the code: issue 49 measured, on rlloss
e99ba5b (whose DQN forward gives 4a98e16's float32 numbers bit for bit over 500 updates),
500, 373.7, 364.0, 217.5, 500, 500 with rlloss's class and 500, 500, 500, 197.2, 500, 500 with
TorchRL's on seeds 0-5, where this machine gives 500 for every seed 0-4 with both (and 500 for
e99ba5b's own seed 1, and for rlloss's seed 5). Which seeds
succeed moves with float32 rounding (the CPU's kernels, an operation's order), while the two
classes compute the same updates (``tests/test_trajectories.py``: equal within 1e-8 in float64
over 200 Adam steps). Polyak target updates (``SoftUpdate(tau=0.005)`` after every gradient step
instead of the copy every 128) did worse on the two seeds tried (rlloss, seeds 1 and 3: 306.9
and 208.0). Robustness to rounding, partly checked (issue 49): rerun with
``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2`` (on this AVX-512 machine the matrix
products then take AVX2 kernels: other float32 rounding, the same maths; a 4,000-frame run of
seed 0 already parts, final_return 248.4 vs 250.9), rlloss's class reaches 500.0 and 500.0 on
seeds 1 and 2 (those the issue's machine gave 373.7 and 364.0), and TorchRL's class 500.0 on
seed 1 but 311.0 on seed 3 (the issue's machine: 197.2): these settings do not hold 475 on every
seed under a change of rounding, and are still to be made robust. Not yet measured under the
perturbation: seeds 0, 3 and 4 with rlloss's class, 0, 2 and 4 with TorchRL's (a 50,000-step
run took 20 to 22 minutes on the shared machine).
``--per``: measured before issue 49 only (final_return 500, 435.4 and 500 on seeds
0-2), not re-measured.

Run:
    python tutorials/dqn_cartpole.py --seed 0 --total-frames 50000 --out runs/dqn_cartpole
    python tutorials/dqn_cartpole.py --per --seed 0 --total-frames 50000 --out runs/dqn_per

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes, played with the final epsilon),
``eval_return=`` and last ``final_return=`` (both the mean return of the greedy evaluation).
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from torch import nn
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import HardUpdate, ValueEstimators

from rlloss import DQNLoss
from rlloss.data import PrioritizedSampler  # TorchRL's, in pure torch on the buffer's device

parser = helpers.tutorial_parser(__doc__, "runs/dqn_cartpole", 50_000, "env steps, all envs")
parser.add_argument("--per", action="store_true", help="prioritized experience replay")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, dqn.yml, CartPole-v1, except the loss and lr schedule).
# Those of the loop (4 envs, 64 steps of each then 128 gradient steps, 1,000 random steps first,
# a replay memory of 100,000 transitions, minibatches of 64, epsilon from 1 to 0.04 over the
# first 16% of training) are helpers.DQNCartPole's, shared with c51_cartpole.py.
GAMMA = 0.99
LR = 2.3e-3  # annealed to 0 as (1 - progress)^2
# Gradient steps between target copies: once per training phase. (rl-zoo's target_update_interval
# of 10 counts env steps, so there too the target is synced once between training phases.)
TARGET_UPDATE_INTERVAL = 128
MAX_GRAD_NORM = 10.0

# Seeds network init, exploration and replay sampling; makes the 4 CartPoles: run.device,
# run.obs_dim, run.num_actions.
run = helpers.DQNCartPole(args)

# Q(s, .): an MLP writes "action_value"; QValueActor adds the greedy "action" (an index).
q_net = MLP(in_features=run.obs_dim, out_features=run.num_actions, num_cells=[256, 256],
            activation_class=nn.ReLU)
actor = QValueActor(q_net, in_keys=["observation"], action_space="categorical").to(run.device)

# Double DQN with a squared-error loss; the loss keeps the target copy of the Q-network.
loss_module = DQNLoss(actor, loss_function="l2", double_dqn=True,
                      action_space="categorical").to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
# HardUpdate copies on every (interval + 1)-th step(), hence the - 1.
target_updater = HardUpdate(loss_module, value_network_update_interval=TARGET_UPDATE_INTERVAL - 1)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# Replay memory, stored on the training device (a GPU buffer with --device cuda); with --per,
# sampled in proportion to the priorities the loss's "td_error" gives (minibatches then also hold
# "priority_weight" and "index").
if args.per:
    sampler = PrioritizedSampler(run.BUFFER_SIZE, alpha=0.6, beta=0.4)
    replay_buffer = helpers.replay_memory(run.BUFFER_SIZE, run.BATCH_SIZE, run.device,
                                          sampler=sampler, priority_key="td_error")
else:
    replay_buffer = helpers.replay_memory(run.BUFFER_SIZE, run.BATCH_SIZE, run.device)

# ---- The loop: act epsilon-greedily and store the transitions; every 256 env steps (after the
# first 1,000), 128 gradient steps on loss_module(batch)["loss"] (which also writes
# batch["td_error"]), gradients clipped to MAX_GRAD_NORM, each followed by target_updater.step()
# (Q copied into Q_target every TARGET_UPDATE_INTERVAL steps) and, with --per, new priorities
# from batch["td_error"] (rlloss writes the squared TD error, as TorchRL does). Then save the
# learning curve, evaluate the greedy policy (argmax_a Q(s, a), no epsilon) on start states
# training never scored, and report ----
run.train(actor, loss_module, optimizer, target_updater, "Double DQN on CartPole-v1",
          replay_buffer=replay_buffer, max_grad_norm=MAX_GRAD_NORM,
          after_update=replay_buffer.update_tensordict_priority if args.per else None)
