"""Behaviour cloning from a fixed Pendulum-v1 dataset with rlloss's ``BCLoss``: the baseline of
the offline tutorials, and imitation of an expert.

A deterministic policy mu(s) (the same network as ``td3bc_offline.py``'s actor) regresses onto
the dataset's actions, min E[(mu(s) - a)^2] (``BCLoss(actor, loss_function="l2")``, a drop-in
for ``torchrl.objectives.BCLoss``), with no reward and no critic. It recovers the behaviour
policy's mean action: on the "medium" dataset the offline RL methods (``iql_offline.py``,
``cql_offline.py``, ``td3bc_offline.py``) are useful where they beat it; on the "expert" one
(``offline_dataset.py --agent-frames 5000``) it imitates the expert.

Results on the "medium" dataset (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -797.6, -812.0, -851.8 (dataset mean -839.2); wall 124-143 s on the CPU (torch 2.11); figures in benchmarks/results/offline.json. These were measured with the same regression written in plain torch, before the script took ``BCLoss`` (the same mean squared error); not rerun since.

Results on the expert dataset (``offline_dataset.py --agent-frames 5000``, seed 0: mean return -149.7; 10,000 gradient steps, ``--total-frames 10000``; seeds 0, 1, 2; final_return over 10 episodes on unseen start states): rlloss -125.1, -109.5, -162.0; TorchRL's ``BCLoss`` swapped in: -125.1, -109.5, -162.0, the same to the digit. As a fraction of the expert, (R - R_random) / (R_expert - R_random) with R_random = -1204 (uniform random actions on the evaluation start states of seeds 0-2, 30 episodes) and R_expert = -149.7: 1.02, 1.04, 0.98 (the deterministic mean action does a little better than the stochastic expert that wrote the data). Wall 155-167 s (rlloss), 157-189 s (TorchRL) each on a loaded 2-core CPU (torch 2.13).

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/bc_offline.py --seed 0 --dataset runs/pendulum_offline/dataset
    python tutorials/offline_dataset.py --agent-frames 5000 --out runs/pendulum_expert  # once
    python tutorials/bc_offline.py --seed 0 --total-frames 10000 --dataset runs/pendulum_expert/dataset

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``train_return=`` (mean of the last 10 of those evaluations),
``eval_return=`` and last ``final_return=`` (the final policy's mean over 10 fresh episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing (dataset, evaluation, results)
import torch

from rlloss import BCLoss

# Parses --seed, --total-frames (gradient steps), --device, --out, --dataset, --eval-every and
# --eval-episodes; seeds torch; Pendulum-v1's action spec and dims (only to evaluate: the agent
# learns from the dataset alone).
run = helpers.OfflineRun(__doc__, "runs/bc_offline")

BATCH_SIZE, HIDDEN = 256, [256, 256]  # the papers' defaults

# mu(s) (td3bc_offline.py's actor), regressed onto the dataset's actions: min E[(mu(s) - a)^2].
actor = helpers.tanh_deterministic_actor(run.obs_dim, run.action_spec, HIDDEN)
loss_module = BCLoss(actor, loss_function="l2")  # reads the batch's "action", the target
optimizer = torch.optim.Adam(loss_module.parameters(), lr=3e-4)

# Minibatches of the dataset (observations standardised); every --eval-every steps the policy's
# deterministic action plays 5 evaluation episodes.
for _step, batch in run.training_steps(actor, BATCH_SIZE):
    loss = loss_module(batch)["loss_bc"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

# ---- Save the evaluations' curve, evaluate the final policy on start states the dataset never
# saw, report ----
run.finish("Behaviour cloning on a fixed Pendulum-v1 dataset")
