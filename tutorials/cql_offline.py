"""Conservative Q-learning (CQL) from a fixed Pendulum-v1 dataset with rlloss, offline.

This tutorial trains a policy with rlloss's ``CQLLoss`` (a drop-in replacement for
``torchrl.objectives.CQLLoss``) on the transitions written by ``offline_dataset.py``, never
acting in the environment except to evaluate. The pieces map to Kumar et al., "Conservative
Q-Learning for Offline Reinforcement Learning" (arXiv:2006.04779), CQL(H) on SAC (eq. 4 and
appendix F):

1. ``loss_qvalue``: SAC's regression of both Q_i(s, a) onto r + gamma min_i Q_target,i(s', a'),
   a' ~ pi(.|s') (the "deterministic backup": no entropy bonus in the target);
2. ``loss_cql``: min_q_weight (= the paper's alpha, 5) times, per critic, the log-sum-exp of Q over
   10 uniform actions and 10 + 10 actions of the current policy at s and s' (each importance-
   weighted by the density it was drawn from), minus Q on the dataset's action: Q is pushed
   down where the policy would go and up on the data, so actions outside the dataset are not
   over-estimated;
3. ``loss_actor`` and ``loss_alpha``: SAC's, the entropy temperature tuned towards -|A|;
4. Polyak-average the target critics (TorchRL's ``SoftUpdate``, tau = 0.005).

Hyperparameters are the paper's for the Gym-MuJoCo datasets (alpha = min_q_weight 5 without the
Lagrangian form, policy Adam 1e-4, critic Adam 3e-4, batch 256, 256x256 MLPs); the authors'
behaviour-cloning warm-up of the actor is not used. The dataset, its minibatches and
the evaluations come from ``_helpers.py``.

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -491.9, -363.9, -587.7 (rlloss); TorchRL's CQLLoss swapped in: -412.1, -357.6, -534.4 (its penalty groups the log-sum-exp differently, README); behaviour cloning -797.6, -812.0, -851.8; dataset mean -839.2. Wall 781-789 s (rlloss), 1189-1199 s (TorchRL), on CUDA (an H100, torch 2.11); figures in benchmarks/results/offline.json.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/cql_offline.py --seed 0 --dataset runs/pendulum_offline/dataset --out runs/cql

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``train_return=`` (mean of the last 10 of those evaluations),
``eval_return=`` and last ``final_return=`` (the final policy's mean over 10 fresh episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing (dataset, evaluation, results)
import torch
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import CQLLoss

# Parses --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes; seeds torch; Pendulum-v1's action spec and dims (only to evaluate).
run = helpers.OfflineRun(__doc__, "runs/cql_offline")

BATCH_SIZE, GAMMA, TAU, HIDDEN = 256, 0.99, 0.005, [256, 256]  # the papers' defaults
MIN_Q_WEIGHT, NUM_RANDOM = 5.0, 10

# pi(a|s): a tanh-squashed Gaussian (as sac_pendulum.py's); Q (CQLLoss keeps two, with targets).
actor = helpers.tanh_normal_actor(run.obs_dim, run.action_spec, HIDDEN)
critic = helpers.q_critic(run.obs_dim, run.action_dim, HIDDEN)
loss_module = CQLLoss(actor, critic, action_spec=run.action_spec, min_q_weight=MIN_Q_WEIGHT,
                      num_random=NUM_RANDOM, deterministic_backup=True,
                      loss_function="l2").to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_updater = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam([  # the losses' gradients are disjoint: one step for all three
    {"params": actor.parameters(), "lr": 1e-4},
    {"params": loss_module.qvalue_network_params.parameters(), "lr": 3e-4},
    {"params": [loss_module.log_alpha], "lr": 3e-4},
])

# Minibatches of the dataset (observations standardised); every --eval-every steps the policy's
# deterministic action plays 5 evaluation episodes.
for _step, batch in run.training_steps(actor, BATCH_SIZE):
    out = loss_module(batch)
    loss = out["loss_actor"] + out["loss_qvalue"] + out["loss_cql"] + out["loss_alpha"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    target_updater.step()

# ---- Save the evaluations' curve, evaluate the final policy on start states the dataset never
# saw, report ----
run.finish("CQL on a fixed Pendulum-v1 dataset")
