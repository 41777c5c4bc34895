"""Instructions per update step, counted by valgrind's callgrind: a load-independent overhead
measure for shared or noisy machines (instructions are not time, but in the overhead-bound
small-batch regime, where Python and dispatch dominate, they track it closely).

    python benchmarks/instructions.py --cases ClipPPOLoss DQNLoss --batch-size 64
    python benchmarks/instructions.py --hand-written  # -> results/instructions-hand-written.json
    python benchmarks/instructions.py --cases MAPPOLoss QMixerLoss --batch-size 64 \
        --methods plain rlloss torchrl --work /tmp/cg \
        --out benchmarks/results/instructions-multiagent.json

Any ``--cases`` and ``--methods`` at one batch size run in one callgrind process
(``benchmarks/callgrind/run.sh``) that dumps its counters around each method's ``--steps`` steps
(after ``--warmup`` steps; none of the start-up, imports or set-up counted); the counts are
merged into ``--out``, keyed ``"<case>, B=<batch>"``, beside the entries it already holds.
``--hand-written``: the same for the cases of the hand-written comparison
(``benchmarks.cases.HAND_WRITTEN``) in two processes (small batches; the custom-critic cases at
fewer steps). Each process runs ~50x slower under callgrind; needs ``valgrind`` on the PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the working tree's rlloss

from benchmarks.cases import CASES, HAND_WRITTEN, HAND_WRITTEN_METHODS  # noqa: E402
from benchmarks.cases.common import CUSTOM_SUFFIX  # noqa: E402
from benchmarks.harness import LEVELS, RATIOS  # noqa: E402
from benchmarks.records import machine_info  # noqa: E402

# steps per method: the custom-critic cases at batch 256 cost ~100x a PPO step under callgrind
HAND_STEPS = {"small": (30, 5), "custom-critic": (3, 2)}  # (steps, warm-up steps)
HERE = Path(__file__).resolve().parent


def dumped_instructions(
    entries: list[tuple[str, int]],
    methods: list[str],
    steps: int,
    warmup: int,
    out: Path,
    level: str = "backward",
) -> subprocess.Popen:
    """Start one process under callgrind (``callgrind/run.sh``) that runs ``steps`` steps at
    ``level`` of each method of each ``(case, batch size)`` of ``entries`` and dumps the counters
    around them."""
    env = {
        **os.environ,
        "ROOT": str(REPO_ROOT),
        "CASES": " ".join(f"{case}:{batch_size}" for case, batch_size in entries),
        "METHODS": " ".join(methods),
        "N": str(steps),
        "WARMUP": str(warmup),
        "LEVEL": level,
        "OMP_NUM_THREADS": "1",
    }
    command = ["bash", str(HERE / "callgrind" / "run.sh"), str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def counted(run, work: Path, steps: int) -> dict[str, dict]:
    """The instructions per step of a finished :func:`dumped_instructions` run in ``work``, and
    their ratios (``harness.RATIOS``), keyed ``"<case>, B=<batch>"``."""
    if run.wait():
        raise RuntimeError(f"callgrind run failed: see {work}/valgrind.log")
    found: dict[tuple[str, int], dict[str, float]] = {}
    for line in (work / "counts.tsv").read_text().split("\n"):
        if line.strip():
            case, batch_size, method, per_step = line.split("\t")
            found.setdefault((case, int(batch_size)), {})[method] = float(per_step)
    results = {}
    for (case, size), counts in found.items():
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


def merge_into(out: Path, entries: dict[str, dict], level: str = "backward") -> None:
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
    result = {"machine": machine, "level": level, "cases": cases}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", nargs="+", default=["ClipPPOLoss"], choices=CASES, metavar="CASE"
    )
    parser.add_argument("--methods", nargs="+", default=["plain", "rlloss", "torchrl"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--level", default="backward", choices=LEVELS)
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
    parser.add_argument("--steps", type=int, default=30, help="counted steps per method")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps before them")
    parser.add_argument("--work", type=Path, default=Path("/tmp/instructions"))
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
    entries = [(case, args.batch_size) for case in args.cases]
    run = dumped_instructions(entries, args.methods, args.steps, args.warmup, args.work, args.level)
    merge_into(args.out, counted(run, args.work, args.steps), args.level)


if __name__ == "__main__":
    main()
