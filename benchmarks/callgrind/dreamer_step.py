"""The process ``run.sh`` runs under callgrind for the DreamerV3 update
(``benchmarks/dreamer_v3_update.py``): each method's eager update, with the counters dumped
around ``N`` updates (after ``WARMUP``, default 1), so the import of torch, the set-up and the
first calls never count.

    STEP=benchmarks/callgrind/dreamer_step.py ROOT=. METHODS="rlloss torchrl plain" N=1 \
        DREAMER="16 64 15" benchmarks/callgrind/run.sh OUT

``DREAMER``: batch, time steps and imagination horizon. The counts land in ``OUT/counts.tsv``
under the case ``DreamerV3Loss`` at the batch ``B x T``.
"""

import os
import sys

root, control = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)

import torch  # noqa: E402
from marks import mark  # noqa: E402  (beside this script)

from benchmarks.dreamer_v3_update import make_updates, networks, sequences  # noqa: E402

torch.set_num_threads(1)
STEPS, WARMUP = int(os.environ.get("N", 1)), int(os.environ.get("WARMUP", 1))
METHODS = os.environ.get("METHODS", "rlloss torchrl plain").split()
BATCH, TIME, HORIZON = (int(x) for x in os.environ.get("DREAMER", "16 64 15").split())


torch.manual_seed(0)
updates = make_updates(METHODS, networks(), HORIZON, sequences(BATCH, TIME), compiled=False)
for method, update in updates.items():
    for step in range(WARMUP):
        torch.manual_seed(step)
        update()
    mark(control, f"start|DreamerV3Loss|{BATCH}x{TIME}|{method}")
    for step in range(STEPS):
        torch.manual_seed(WARMUP + step)
        update()
    mark(control, f"end|DreamerV3Loss|{BATCH}x{TIME}|{method}")
mark(control, "finished")
