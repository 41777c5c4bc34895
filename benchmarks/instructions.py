"""Instructions per update step, counted by valgrind's callgrind: a load-independent overhead
measure for shared or noisy machines.

Wall-clock timings on a busy machine drift with whatever else runs; callgrind counts the
instructions a process executes, which do not. For each case and method of
``benchmarks/overhead.py`` (same networks, batch and step; ``--level``, default ``backward``) this
runs the step ``--steps-low`` and ``--steps-high`` times in two processes under callgrind and
reports the difference divided by the extra steps, which cancels interpreter start-up, imports
and set-up. Instructions are not time (memory stalls and vectorisation differ), but in the
overhead-bound small-batch regime, where Python and dispatch dominate, they track it closely.

    python benchmarks/instructions.py --cases ClipPPOLoss DQNLoss --batch-size 64

Each process runs ~50x slower under callgrind (a couple of minutes per process, mostly the
import of torch). Needs ``valgrind`` on the PATH. Writes JSON next to the overhead results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = """
import sys, torch
sys.path.insert(0, {root!r})
sys.argv = ["overhead"]
import benchmarks.overhead as O
torch.set_num_threads(1)
setup = O.CASES[{case!r}]({batch_size}, 0)
method = setup.factories[{method!r}](next(iter(setup.batches.values())))
step = O.level_steps(method, compiled=False)[{level!r}]
for _ in range({steps}):
    step()
"""


def instructions(case: str, method: str, batch_size: int, steps: int, level: str) -> int:
    """Total instructions of a process that runs ``steps`` steps (start-up included)."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "run.py", Path(tmp) / "callgrind.out"
        script.write_text(
            RUNNER.format(
                root=str(HERE.parent),
                case=case,
                method=method,
                batch_size=batch_size,
                steps=steps,
                level=level,
            )
        )
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                str(script),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        return int(re.search(r"^summary: (\d+)", out.read_text(), re.M).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["ClipPPOLoss"])
    parser.add_argument("--methods", nargs="+", default=["plain", "rlloss", "torchrl"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--level", default="backward", choices=["forward", "backward", "update"])
    parser.add_argument("--steps-low", type=int, default=20)
    parser.add_argument("--steps-high", type=int, default=120)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "instructions.json")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    sys.argv = sys.argv[:1]
    from benchmarks.overhead import CASES

    results = {}
    for case in args.cases:
        available = CASES[case](args.batch_size, 0).factories
        per_step = {}
        for method in [m for m in args.methods if m in available]:
            low = instructions(case, method, args.batch_size, args.steps_low, args.level)
            high = instructions(case, method, args.batch_size, args.steps_high, args.level)
            per_step[method] = (high - low) / (args.steps_high - args.steps_low)
            print(
                f"{case} B={args.batch_size} {method}: {per_step[method] / 1e6:.3f} M instr/step",
                flush=True,
            )
        ratios = {f"{m}/plain": per_step[m] / per_step["plain"] for m in per_step if m != "plain"}
        print(
            f"{case} B={args.batch_size} ratios: "
            + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()),
            flush=True,
        )
        results[case] = {"instructions_per_step": per_step, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"batch_size": args.batch_size, "level": args.level, "cases": results}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
