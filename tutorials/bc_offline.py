"""Behaviour cloning from a fixed Pendulum-v1 dataset: the baseline of the offline tutorials.

A deterministic policy mu(s) (the same network as ``td3bc_offline.py``'s actor) regresses onto
the dataset's actions, min E[(mu(s) - a)^2], with no reward and no critic. It recovers the
behaviour policy's mean action; the offline RL methods (``iql_offline.py``, ``cql_offline.py``,
``td3bc_offline.py``) are useful where they beat it on the same data. Plain torch: there is no
loss module to take from a library.

Results (20,000 gradient steps on the seed-0 dataset; seeds 0, 1, 2): final_return -797.6, -812.0, -851.8 (dataset mean -839.2); wall 124-143 s on the CPU (H100 machine's CPU/GPU, torch 2.11, 21 runs at once, so walls are inflated); figures in benchmarks/results/offline/.

Run:
    python tutorials/offline_dataset.py --out runs/pendulum_offline   # once
    python tutorials/bc_offline.py --seed 0 --dataset runs/pendulum_offline/dataset

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``train_return=`` (mean of the last 10 of those evaluations),
``eval_return=`` and last ``final_return=`` (the final policy's mean over 10 fresh episodes).
"""

import torch
from _offline import deterministic_actor, parse_args, train

args = parse_args(__doc__.splitlines()[0], "runs/bc_offline")
actor = deterministic_actor(torch.device(args.device))
optimizer = torch.optim.Adam(actor.parameters(), lr=3e-4)


def update(batch, step):
    loss = (actor(batch.select("observation"))["action"] - batch["action"]).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss_bc": loss.detach()}


train(args, "Behaviour cloning", actor, update)
