"""TD3+BC from a fixed Pendulum-v1 dataset with rlloss, offline.

This tutorial trains a deterministic policy with rlloss's ``TD3BCLoss`` (a drop-in replacement
for ``torchrl.objectives.TD3BCLoss``) on the transitions written by ``offline_dataset.py``, never
acting in the environment except to evaluate. The pieces map to Fujimoto & Gu, "A Minimalist
Approach to Offline Reinforcement Learning" (arXiv:2106.06860), eq. 3 on top of TD3:

1. ``loss_qvalue``: TD3's clipped double-Q regression onto r + gamma min_i Q_target,i(s',
   mu_target(s') + clipped noise), every step;
2. ``loss_actor``, every 2nd step: -lambda Q_1(s, mu(s)) + (mu(s) - a)^2 with
   lambda = alpha / mean |Q_1(s, mu(s))|, alpha = 2.5: the policy improves on Q while staying
   near the dataset's actions (the behaviour-cloning term);
3. Polyak-average the target actor and critics after each actor step (``SoftUpdate``).

Hyperparameters are the paper's (alpha 2.5, policy noise 0.2 and clip 0.5 in units of the
action bound, policy delay 2, Adam 3e-4, batch 256, 256x256 MLPs; observations standardised
with the dataset's statistics, ``_helpers.OfflineDataset``, for every method).

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -808.1, -787.8, -822.7 (rlloss); TorchRL's TD3BCLoss swapped in: -805.7, -789.1, -822.9; behaviour cloning -797.6, -812.0, -851.8; dataset mean -839.2: above the dataset on 3 of 3 seeds and above BC on 2 of 3 (seeds 1, 2), by a small margin -- on this narrow dataset the BC term keeps TD3+BC close to the behaviour policy. Wall 373-389 s (rlloss), 434-449 s (TorchRL), on CUDA (an H100, torch 2.11); figures in benchmarks/results/offline.json.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/td3bc_offline.py --seed 0 --dataset runs/pendulum_offline/dataset

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``train_return=`` (mean of the last 10 of those evaluations),
``eval_return=`` and last ``final_return=`` (the final policy's mean over 10 fresh episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing (dataset, evaluation, results)
import torch
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import TD3BCLoss

# Parses --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes; seeds torch; Pendulum-v1's action spec and dims (only to evaluate).
run = helpers.OfflineRun(__doc__, "runs/td3bc_offline")

BATCH_SIZE, GAMMA, TAU, HIDDEN = 256, 0.99, 0.005, [256, 256]  # the papers' defaults
POLICY_DELAY = 2
MAX_ACTION = 2.0

# mu(s) (td3_pendulum.py's actor) with a target copy; two critics with target copies.
actor = helpers.tanh_deterministic_actor(run.obs_dim, run.action_spec, HIDDEN)
critics = [helpers.q_critic(run.obs_dim, run.action_dim, HIDDEN) for _ in range(2)]
loss_module = TD3BCLoss(actor, critics, action_spec=run.action_spec,
                        policy_noise=0.2 * MAX_ACTION, noise_clip=0.5 * MAX_ACTION, alpha=2.5,
                        loss_function="l2").to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_updater = SoftUpdate(loss_module, tau=TAU)
actor_optimizer = torch.optim.Adam(loss_module.actor_network.parameters(), lr=3e-4)
critic_optimizer = torch.optim.Adam(loss_module.qvalue_network_params.parameters(), lr=3e-4)

# Minibatches of the dataset (observations standardised); every --eval-every steps the policy's
# deterministic action plays 5 evaluation episodes.
for step, batch in run.training_steps(actor, BATCH_SIZE):
    loss_qvalue, _ = loss_module.qvalue_loss(batch)
    critic_optimizer.zero_grad()
    loss_qvalue.backward()
    critic_optimizer.step()
    if step % POLICY_DELAY == 0:  # the actor and the targets every POLICY_DELAY steps
        loss_actor, _ = loss_module.actor_loss(batch)
        actor_optimizer.zero_grad()
        loss_actor.backward()
        actor_optimizer.step()
        target_updater.step()

# ---- Save the evaluations' curve, evaluate the final policy on start states the dataset never
# saw, report ----
run.finish("TD3+BC on a fixed Pendulum-v1 dataset")
