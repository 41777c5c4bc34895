"""Instructions per update step, counted by valgrind's callgrind: a load-independent overhead
measure for shared or noisy machines (the method: :mod:`benchmarks.profiling`).

    python benchmarks/instructions.py --cases ClipPPOLoss DQNLoss --batch-size 64

Each process runs ~50x slower under callgrind (a couple of minutes per process, mostly the
import of torch). Needs ``valgrind`` on the PATH. Writes JSON next to the overhead results.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the working tree's rlloss

from benchmarks.harness import LEVELS  # noqa: E402
from benchmarks.profiling import instructions_per_step  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["ClipPPOLoss"])
    parser.add_argument("--methods", nargs="+", default=["plain", "rlloss", "torchrl"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--level", default="backward", choices=LEVELS)
    parser.add_argument("--steps-low", type=int, default=20)
    parser.add_argument("--steps-high", type=int, default=120)
    parser.add_argument(
        "--critics", type=int, default=None, help="ensemble cases (REDQ, TQC): critics to use"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "instructions.json"
    )
    args = parser.parse_args()
    results = {
        case: instructions_per_step(
            case,
            args.methods,
            args.batch_size,
            args.level,
            args.steps_low,
            args.steps_high,
            args.critics,
        )
        for case in args.cases
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "batch_size": args.batch_size,
                "level": args.level,
                "critics": args.critics,
                "cases": results,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
