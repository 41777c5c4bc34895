"""C51 (categorical distributional DQN) on CartPole-v1 with rlloss, in a single file.

This tutorial trains a distributional Q-network with rlloss's ``DistributionalDQNLoss`` (a
drop-in replacement for ``torchrl.objectives.DistributionalDQNLoss``) around a collector you
write yourself. Instead of the mean return Q(s, a), the network predicts, for every action, a
probability distribution over ATOMS fixed returns z_1 < ... < z_K (the "support"); the pieces map
to Bellemare et al., "A Distributional Perspective on Reinforcement Learning" (2017), Algorithm 1:

1. act epsilon-greedily with respect to Q(s, a) = sum_j z_j p_j(s, a), the mean of the predicted
   distribution (TorchRL's ``DistributionalQValueActor`` computes it and the greedy action), and
   store the transitions (s, a, r, s', terminated) in a TorchRL replay buffer;
2. for a sampled transition, take the greedy next action a* (online network: double Q) and the
   target network's distribution p(s', a*); move its atoms to r + gamma (1 - terminated) z_j and
   project them back onto the support (each atom's mass split between its two neighbours);
3. minimise the cross-entropy between that projected target and p(s, a); every C gradient steps
   copy the weights into the target network (TorchRL's ``HardUpdate``).

Hyperparameters are those of ``dqn_cartpole.py`` (rl-baselines3-zoo's tuned CartPole DQN, with
the learning rate annealed to 0); the support spans [0, 100], the discounted return of an
endless episode with gamma = 0.99 being 1 / (1 - gamma) = 100. After training, the greedy policy
(no epsilon) plays 10 evaluation episodes from start states no training episode had.

Results (50,000 steps, one CPU thread each; seeds 0, 1, 2): final_return (greedy
evaluation) 500, 500 and 500; the last 10 training episodes (epsilon 0.04) 500.0, 419.7 and
469.6; wall 508, 521 and 522 s. The learning benchmark (``benchmarks/learning.py --tasks
c51_cartpole``) ran this script with rlloss and with TorchRL's
``DistributionalDQNLoss`` swapped in: final_return 500, 500, 500 for both; wall 917, 907, 465 s
(rlloss) and 572, 442, 375 s (TorchRL); the walls are not a comparison of the two libraries
(the per-update overhead is in the overhead benchmark).

Run:
    python tutorials/c51_cartpole.py --seed 0 --total-frames 50000 --out runs/c51_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes, played with the final epsilon),
``eval_return=`` and last ``final_return=`` (both the mean return of the greedy evaluation).
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from torch import nn
from torchrl.modules import MLP, DistributionalQValueActor
from torchrl.objectives import HardUpdate

from rlloss import DistributionalDQNLoss

parser = helpers.tutorial_parser(__doc__, "runs/c51_cartpole", 50_000, "env steps, all envs")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters: C51's support, then dqn_cartpole.py's (rl-baselines3-zoo, dqn.yml, CartPole-v1,
# annealed lr; the loop's are helpers.DQNCartPole's).
ATOMS, V_MIN, V_MAX = 51, 0.0, 100.0  # the support: C51's 51 atoms over the returns
GAMMA = 0.99
LR = 2.3e-3  # annealed to 0 as (1 - progress)^2
TARGET_UPDATE_INTERVAL = 128  # gradient steps between target copies: once per training phase
MAX_GRAD_NORM = 10.0

# Seeds network init, exploration and replay sampling; makes the 4 CartPoles: run.device,
# run.obs_dim, run.num_actions.
run = helpers.DQNCartPole(args)

# p(s, ., .): an MLP writes ATOMS x num_actions logits; DistributionalQValueActor turns them into
# log-probabilities over the atoms ("action_value") and adds the greedy "action" (an index).
support = torch.linspace(V_MIN, V_MAX, ATOMS)
q_net = MLP(in_features=run.obs_dim, out_features=(ATOMS, run.num_actions), num_cells=[256, 256],
            activation_class=nn.ReLU)
actor = DistributionalQValueActor(q_net, in_keys=["observation"], support=support,
                                  action_space="categorical").to(run.device)

# C51 with double-Q bootstrapping; the loss keeps the target copy of the network.
loss_module = DistributionalDQNLoss(actor, gamma=GAMMA).to(run.device)
# HardUpdate copies on every (interval + 1)-th step(), hence the - 1.
target_updater = HardUpdate(loss_module, value_network_update_interval=TARGET_UPDATE_INTERVAL - 1)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

replay_buffer = helpers.replay_memory(run.BUFFER_SIZE, run.BATCH_SIZE, run.device)

# ---- dqn_cartpole.py's loop: act epsilon-greedily and store the transitions; every 256 env
# steps (after the first 1,000), 128 gradient steps on loss_module(batch)["loss"] (the mean
# cross-entropy), gradients clipped to MAX_GRAD_NORM, each followed by target_updater.step().
# Then save the learning curve, evaluate the greedy policy (argmax_a Q(s, a), no epsilon) on start
# states training never scored, and report ----
run.train(actor, loss_module, optimizer, target_updater, "C51 on CartPole-v1",
          replay_buffer=replay_buffer, max_grad_norm=MAX_GRAD_NORM)
