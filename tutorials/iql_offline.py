"""Implicit Q-learning (IQL) from a fixed Pendulum-v1 dataset with rlloss, offline.

This tutorial trains a policy with rlloss's ``IQLLoss`` (a drop-in replacement for
``torchrl.objectives.IQLLoss``) on the transitions written by ``offline_dataset.py``, never
acting in the environment except to evaluate. The pieces map to Kostrikov et al., "Offline
Reinforcement Learning with Implicit Q-Learning" (arXiv:2110.06169), Algorithm 1:

1. ``loss_value``: fit V(s) to an upper expectile (tau = 0.7) of the target critics' minimum
   min_i Q_target,i(s, a) over the dataset's actions (eq. 5): no action outside the dataset is
   ever evaluated, so no value is extrapolated;
2. ``loss_qvalue``: regress both Q_i(s, a) onto r + gamma V(s') (eq. 6);
3. ``loss_actor``: advantage-weighted regression, -exp(beta (Q(s, a) - V(s))) log pi(a|s) on the
   dataset's actions, beta = 3, weights capped at 100 (eq. 7);
4. Polyak-average the target critics (TorchRL's ``SoftUpdate``, tau = 0.005).

Hyperparameters are the paper's for the MuJoCo datasets (expectile 0.7, temperature 3, Adam
3e-4, batch 256, 256x256 MLPs), with a squared-error Q loss. The dataset, its minibatches and the
evaluations come from ``_helpers.py``.

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -157.1, -157.5, -238.6 (rlloss); TorchRL's IQLLoss swapped in: -157.1, -157.5, -238.6, the same to the digit; behaviour cloning -797.6, -812.0, -851.8; dataset mean -839.2. Wall 741-744 s (rlloss), 783-797 s (TorchRL), on CUDA (an H100, torch 2.11); figures in benchmarks/results/offline.json.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/iql_offline.py --seed 0 --dataset runs/pendulum_offline/dataset --out runs/iql

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``train_return=`` (mean of the last 10 of those evaluations),
``eval_return=`` and last ``final_return=`` (the final policy's mean over 10 fresh episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing (dataset, evaluation, results)
import torch
from torchrl.modules import ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import IQLLoss

# Parses --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes; seeds torch; Pendulum-v1's action spec and dims (only to evaluate).
run = helpers.OfflineRun(__doc__, "runs/iql_offline")

BATCH_SIZE, GAMMA, TAU, HIDDEN = 256, 0.99, 0.005, [256, 256]  # the papers' defaults

# pi(a|s): a tanh-squashed Gaussian (as sac_pendulum.py's); Q_1, Q_2 with target copies; V(s).
actor = helpers.tanh_normal_actor(run.obs_dim, run.action_spec, HIDDEN)
critics = [helpers.q_critic(run.obs_dim, run.action_dim, HIDDEN) for _ in range(2)]
state_value = ValueOperator(helpers.mlp(run.obs_dim, 1, HIDDEN), in_keys=["observation"])
loss_module = IQLLoss(actor, critics, state_value, expectile=0.7, temperature=3.0,
                      loss_function="l2").to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_updater = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=3e-4)  # actor, Q_1, Q_2, V

# Minibatches of the dataset (observations standardised); every --eval-every steps the policy's
# deterministic action plays 5 evaluation episodes.
for _step, batch in run.training_steps(actor, BATCH_SIZE):
    out = loss_module(batch)
    loss = out["loss_actor"] + out["loss_qvalue"] + out["loss_value"]  # disjoint gradients
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    target_updater.step()

# ---- Save the evaluations' curve, evaluate the final policy on start states the dataset never
# saw, report ----
run.finish("IQL on a fixed Pendulum-v1 dataset")
