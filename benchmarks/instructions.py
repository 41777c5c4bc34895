"""Instructions per update step, counted by valgrind's callgrind: a load-independent overhead
measure for shared or noisy machines (the method: :mod:`benchmarks.profiling`).

    python benchmarks/instructions.py --cases ClipPPOLoss DQNLoss --batch-size 64
    python benchmarks/instructions.py --hand-written  # -> results/instructions-hand-written.json
    python benchmarks/instructions.py --dumped --cases MAPPOLoss QMixerLoss --batch-size 64 \
        --methods plain rlloss torchrl --work /tmp/cg --out benchmarks/results/instructions-multiagent.json

Each process runs ~50x slower under callgrind (a couple of minutes per process, mostly the
import of torch). Needs ``valgrind`` on the PATH. Writes JSON next to the overhead results.

``--hand-written``: the cases of the hand-written comparison (``benchmarks.cases.HAND_WRITTEN``)
with every rlloss and hand-written method, in two callgrind processes (the small-batch cases, and
the custom-critic ones at fewer steps), each dumping its counters around each method's steps
(``benchmarks/callgrind/run.sh``): one start-up for all, none of it counted. ``--dumped``: the
same for any ``--cases`` and ``--methods`` at one batch size, merged into ``--out`` beside the
entries it already holds (run it once per batch size).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the working tree's rlloss

from benchmarks.cases import HAND_WRITTEN, HAND_WRITTEN_METHODS  # noqa: E402
from benchmarks.cases.common import CUSTOM_SUFFIX  # noqa: E402
from benchmarks.harness import LEVELS, RATIOS  # noqa: E402
from benchmarks.profiling import (  # noqa: E402
    dumped_instructions,
    instructions_per_step,
    read_dumped_instructions,
)
from benchmarks.records import machine_info  # noqa: E402

# steps per method: the custom-critic cases at batch 256 cost ~100x a PPO step under callgrind
HAND_STEPS = {"small": (30, 5), "custom-critic": (3, 2)}  # (steps, warm-up steps)


def counted(run, work: Path, steps: int) -> dict[str, dict]:
    """The instructions per step of a finished :func:`dumped_instructions` run in ``work``, and
    their ratios (``harness.RATIOS``), keyed ``"<case>, B=<batch>"``."""
    if run.wait():
        raise RuntimeError(f"callgrind run failed: see {work}/valgrind.log")
    results = {}
    for (case, size), counts in read_dumped_instructions(work).items():
        ratios = {
            f"{num}/{den}": counts[num] / counts[den]
            for num, den in RATIOS
            if num in counts and den in counts
        }
        results[f"{case}, B={size}"] = {
            "case": case,
            "batch_size": size,
            "steps": steps,
            "instructions_per_step": counts,
            "ratios": ratios,
        }
    return results


def hand_written_counts(work: Path, selected: list[str]) -> dict[str, dict]:
    """Instructions per step of the cases of the hand-written comparison in the ``selected``
    groups (of ``HAND_STEPS``), their rlloss and hand-written methods, and their ratios
    (``harness.RATIOS``), keyed ``"<case>, B=<batch>"``."""
    groups = {name: [] for name in selected}
    for case, sizes in HAND_WRITTEN.items():
        group = "custom-critic" if case.endswith(CUSTOM_SUFFIX) else "small"
        if group in groups:
            groups[group] += [(case, size) for size in sizes]
    runs = {
        name: dumped_instructions(
            entries, list(HAND_WRITTEN_METHODS), *HAND_STEPS[name], work / name
        )
        for name, entries in groups.items()
    }
    results = {}
    for name, run in runs.items():
        results.update(counted(run, work / name, HAND_STEPS[name][0]))
    return results


def merge_into(out: Path, entries: dict[str, dict]) -> None:
    """Write ``entries`` into the keyed file ``out`` (``"<case>, B=<batch>"`` -> counts, each
    with its date and commit), keeping the entries of ``out`` they do not replace and the
    commands that made them."""
    machine = machine_info()
    previous = json.loads(out.read_text()) if out.exists() else {"cases": {}}
    cases = previous["cases"]
    if "machine" in previous:  # the commands behind the entries kept, then this one
        machine["command"] = f"{previous['machine']['command']} && {machine['command']}"
    for key, entry in entries.items():
        cases[key] = {**entry, "date": machine["date"], "git": machine["git"]}
    result = {"machine": machine, "level": "backward", "cases": cases}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


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
        "--hand-written", action="store_true", help="the hand-written comparison (see above)"
    )
    parser.add_argument(
        "--groups",
        nargs="+",
        default=list(HAND_STEPS),
        choices=list(HAND_STEPS),
        help="--hand-written: the groups of cases to count (the others' entries in --out kept)",
    )
    parser.add_argument(
        "--dumped",
        action="store_true",
        help="--cases and --methods at --batch-size in one callgrind process, counters dumped "
        "around --steps steps of each after --warmup (callgrind/run.sh; backward level), merged "
        "into --out keyed '<case>, B=<batch>'",
    )
    parser.add_argument("--steps", type=int, default=30, help="--dumped: steps per method")
    parser.add_argument("--warmup", type=int, default=5, help="--dumped: warm-up steps")
    parser.add_argument("--work", type=Path, default=Path("/tmp/instructions-hand-written"))
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results/instructions.json, or instructions-hand-written.json",
    )
    args = parser.parse_args()
    name = "instructions-hand-written.json" if args.hand_written else "instructions.json"
    args.out = args.out or REPO_ROOT / "benchmarks" / "results" / name
    if args.hand_written:
        merge_into(args.out, hand_written_counts(args.work, args.groups))
        return
    if args.dumped:
        entries = [(case, args.batch_size) for case in args.cases]
        run = dumped_instructions(entries, args.methods, args.steps, args.warmup, args.work)
        merge_into(args.out, counted(run, args.work, args.steps))
        return
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
