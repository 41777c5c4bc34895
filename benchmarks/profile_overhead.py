"""Where the overhead goes: one step of plain torch and of rlloss, split by where the time
is spent (the categories and how to read them: :mod:`benchmarks.profiling`).

    python benchmarks/profile_overhead.py --cases DQNLoss ClipPPOLoss --batch-size 64
    python benchmarks/profile_overhead.py --hand-written  # -> results/profile-hand-written.json

Writes ``benchmarks/results/profile.json``, which ``benchmarks/report.py`` renders into
``benchmarks/results/profile.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the working tree's rlloss

import torch  # noqa: E402

from benchmarks.cases import HAND_WRITTEN, HAND_WRITTEN_METHODS  # noqa: E402
from benchmarks.cases.common import CUSTOM_SUFFIX  # noqa: E402
from benchmarks.harness import LEVELS, MODES  # noqa: E402
from benchmarks.profiling import profile_rows  # noqa: E402
from benchmarks.records import machine_info  # noqa: E402


def steps_of(args: argparse.Namespace, case: str) -> int:
    """``--steps``, a tenth of it for the custom-critic cases of ``--hand-written`` (batch 256,
    ~20x a PPO step)."""
    if args.hand_written and case.endswith(CUSTOM_SUFFIX):
        return max(20, args.steps // 10)
    return args.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=None, help="default: DQNLoss ClipPPOLoss")
    parser.add_argument("--methods", nargs="+", default=["plain", "rlloss"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--levels", nargs="+", default=["forward", "backward"], choices=LEVELS)
    parser.add_argument("--modes", nargs="+", default=["eager"], choices=MODES)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument(
        "--hand-written",
        action="store_true",
        help="the hand-written comparison: its cases (or those of --cases) at their batch "
        "sizes, the rlloss and hand-written methods, backward, eager",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = "profile-hand-written.json" if args.hand_written else "profile.json"
    args.out = args.out or REPO_ROOT / "benchmarks" / "results" / name
    sizes = {case: [args.batch_size] for case in args.cases or ["DQNLoss", "ClipPPOLoss"]}
    if args.hand_written:  # its cases (or those of --cases) at their batch sizes
        sizes = {case: list(HAND_WRITTEN[case]) for case in args.cases or HAND_WRITTEN}
        args.methods, args.levels, args.modes = list(HAND_WRITTEN_METHODS), ["backward"], ["eager"]
    command = "python benchmarks/" + Path(sys.argv[0]).name + " " + " ".join(sys.argv[1:])
    torch.set_num_threads(1)
    rows = [
        row
        for case, batch_sizes in sizes.items()
        for batch_size in batch_sizes
        for mode in args.modes
        for level in args.levels
        for row in profile_rows(case, batch_size, level, mode, args.methods, steps_of(args, case))
    ]
    machine = {**machine_info(), "command": command.strip()}
    method = (
        "self time per step under cProfile, summed by where each function lives (see "
        "benchmarks/profiling.py); wall = best unprofiled block, per step; "
        f"{' and '.join(args.modes)}, 1 CPU thread, {args.steps} steps per block"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "method": method, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
