"""The process ``run.sh`` runs under callgrind: every overhead case's eager step (by default
plain torch and rlloss; ``METHODS`` for others), with the counters dumped around ``N`` steps of
each (after ``WARMUP`` warm-up steps, default 5), so the import of torch and the set-up never
count. A case written ``CASE:B`` runs at batch size ``B`` (else ``BATCH``, else its small one).

    ROOT=<a checkout> CASES="PPOLoss DQNLoss:256" N=40 BATCH=64 benchmarks/callgrind/run.sh OUT

Each dump's instruction total divided by ``N`` is one step's instruction count: a
load-independent measure of per-step overhead on a shared machine (wall time there is too noisy
for differences of a few percent).
"""

import os
import sys

root, control = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)

import torch  # noqa: E402
from marks import mark  # noqa: E402  (beside this script)

from benchmarks.cases import BATCH_SIZES, CASES  # noqa: E402
from benchmarks.harness import level_steps  # noqa: E402

torch.set_num_threads(1)
STEPS, WARMUP = int(os.environ.get("N", 40)), int(os.environ.get("WARMUP", 5))
METHODS = os.environ.get("METHODS", "plain rlloss").split()
LEVEL = os.environ.get("LEVEL", "backward")
SELECTED = os.environ.get("CASES", "").split() or list(CASES)
BATCH = int(os.environ.get("BATCH", 0))


for entry in SELECTED:
    case, _, size = entry.partition(":")
    batch_size = int(size or BATCH or BATCH_SIZES[case][0])
    setup = CASES[case](batch_size, 0)
    batch = next(iter(setup.batches.values()))
    for method in (m for m in METHODS if m in setup.factories):
        step = level_steps(setup.factories[method](batch), compiled=False)[LEVEL]
        for _ in range(WARMUP):
            step()
        mark(control, f"start|{case}|{batch_size}|{method}")
        for _ in range(STEPS):
            step()
        mark(control, f"end|{case}|{batch_size}|{method}")
mark(control, "finished")
