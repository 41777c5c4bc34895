"""CI gate: TorchRL's own loss tests, rlloss's classes swapped in, held at a floor per class.

Runs the selected test classes of TorchRL's verbatim 0.14.0 test files (read from
``../shared/torchrl-tests/test/`` beside the repository, never copied into it) in one pytest
process with ``swap_plugin`` (``RLLOSS_SWAP=1``), attributes each test to the swapped classes it
constructs (the plugin's ``classes`` record) and compares, per class, the tests that pass with
the floor checked in at ``floors.json``. A class below its floor fails the gate and its failing
test ids are printed; a class above its floor passes, with a note that the floor can be raised.

    python tools/torchrl_tests/gate.py                    # the gate (exit 1 below a floor)
    python tools/torchrl_tests/gate.py --update-floors    # raise floors to today's counts
    python tools/torchrl_tests/gate.py --reference        # re-measure TorchRL's own classes

``--update-floors`` only raises a floor (a floor is where the class was at its best); a class new
to the selection gets its count. ``--reference`` runs TorchRL's classes (``RLLOSS_SWAP=0``) and
records their counts in the ``torchrl`` column (no gate). Exit status: 0 every class at or above
its floor, 1 a class below, 2 the tests cannot be run (missing tree, collection error, timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_TESTS = REPO.parent / "shared" / "torchrl-tests"
FLOORS = HERE / "floors.json"
INI = HERE / "gate_pytest.ini"

_O = "test/objectives"
# family -> the test classes / functions that build one of the swapped classes. Fixed order:
# the selection (and so each test's random state) is the same on every run.
SELECTION = {
    "ppo": [
        f"{_O}/test_ppo.py::TestPPO",
        f"{_O}/test_ppo.py::TestA2C",
        f"{_O}/test_ppo.py::TestReinforce",
        f"{_O}/test_ppo.py::test_ppo_ess_preserves_feature_shape_for_singleton_batch",
    ],
    "dqn": [f"{_O}/test_dqn.py::TestDQN", f"{_O}/test_dqn.py::TestQMixer"],
    "ddpg": [
        f"{_O}/test_ddpg.py::TestDDPG",
        f"{_O}/test_ddpg.py::TestTD3",
        f"{_O}/test_ddpg.py::TestTD3BC",
    ],
    "sac": [
        f"{_O}/test_sac.py::TestSAC",
        f"{_O}/test_sac.py::TestDiscreteSAC",
        f"{_O}/test_sac.py::TestREDQ",
        f"{_O}/test_sac.py::TestCrossQ",
    ],
    "iql": [f"{_O}/test_iql.py::TestIQL", f"{_O}/test_iql.py::TestDiscreteIQL"],
    "cql": [f"{_O}/test_cql.py::TestCQL", f"{_O}/test_cql.py::TestDiscreteCQL"],
    "tqc": [f"{_O}/test_tqc.py::TestTQC"],
    "values": [f"{_O}/test_values.py::TestValues", f"{_O}/test_values.py::TestAdv"],
    # the whole file: its own losses subclass the swapped LossModule
    "loss_module": [f"{_O}/test_loss_module.py"],
    "dreamer": [f"{_O}/test_dreamer.py::TestDreamer", f"{_O}/test_dreamer.py::TestWorldModelLoss"],
    "dreamer_v3": [f"{_O}/test_dreamer_v3.py::TestDreamerV3"],
    "controllers": [f"{_O}/test_controllers.py::TestExponentialQuadraticCost"],
    "bc": [f"{_O}/test_bc.py::TestBCLoss"],
    "diffusion_bc": [f"{_O}/test_diffusion_bc.py::TestDiffusionBCLoss"],
    "act": [f"{_O}/test_act.py::TestACTLoss"],
    "dt": [
        f"{_O}/test_dt.py::TestDT",
        f"{_O}/test_dt.py::TestOnlineDT",
        f"{_O}/test_dt.py::TestGAIL",
    ],
    "rnd": ["test/test_rnd.py::TestRNDLoss"],
    "mappo": [
        f"{_O}/test_mappo.py::TestMultiAgentGAE",
        f"{_O}/test_mappo.py::TestMAPPOLoss",
        f"{_O}/test_mappo.py::TestIPPOLoss",
    ],
    "vla": [f"{_O}/test_vla.py::TestChunkedBC", f"{_O}/test_vla.py::TestTokenPPO"],
    "llm": ["test/llm/test_llm_objectives.py"],
}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tests",
        type=Path,
        default=Path(os.environ.get("RLLOSS_TORCHRL_TESTS", DEFAULT_TESTS)),
        help="the folder holding TorchRL's test/ (default: ../shared/torchrl-tests beside the "
        "repository, or $RLLOSS_TORCHRL_TESTS)",
    )
    parser.add_argument(
        "--families",
        nargs="+",
        choices=sorted(SELECTION),
        default=None,
        help="run only these families (a partial run never updates floors)",
    )
    parser.add_argument(
        "--update-floors",
        action="store_true",
        help="raise each class's floor to its count today (never lowers one)",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="run TorchRL's own classes and record their counts in floors.json (with "
        "--families: only print them)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds before the pytest run is stopped (the gate then fails)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="keep the per-test JSON lines here (default: a temporary file)",
    )
    parser.add_argument(
        "--from-results",
        type=Path,
        default=None,
        help="judge (or record) the per-test JSON lines of an earlier run (--results) instead "
        "of running the tests",
    )
    return parser.parse_args(argv)


def fail(message):
    """Stop with exit status 2: the gate could not run (distinct from a class below its floor)."""
    print(f"gate: {message}", file=sys.stderr)
    sys.exit(2)


def check_tests_tree(tests):
    """The tree must be there: CI always has it, so a missing one is an error, never a skip."""
    missing = [
        p
        for p in ("test/conftest.py", "test/objectives", "test/llm", "test/test_rnd.py")
        if not (tests / p).exists()
    ]
    if missing:
        fail(
            f"TorchRL's test files are missing: {tests} lacks {', '.join(missing)}.\n"
            "CI reads them from ../shared/torchrl-tests/ beside the repository (TorchRL 0.14.0's "
            "verbatim test/ tree); give another copy with --tests DIR or $RLLOSS_TORCHRL_TESTS."
        )


def child_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_pytest(tests, node_ids, swap, results, timeout):
    """One pytest process over ``node_ids``: (exit status or None on timeout, wall seconds, CPU
    seconds, output)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
        RLLOSS_SWAP="1" if swap else "0",
        RLLOSS_RESULTS=str(results),
        # the tree is read-only; no network: the tests that download a tokenizer fail at once
        PYTHONDONTWRITEBYTECODE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(INI),
        "--rootdir",
        str(tests),
        "-p",
        "swap_plugin",
        "-p",
        "offline_tokenizers",  # TorchRL's LLM tests' two hub tokenizers, built in memory
        "-p",
        "no:cacheprovider",
        "-q",
        "--no-header",
        "-o",
        "console_output_style=classic",
        "--tb=no",
        *node_ids,
    ]
    start, cpu = time.monotonic(), child_cpu_seconds()
    try:
        proc = subprocess.run(
            cmd,
            cwd=tests,
            env=env,
            timeout=timeout,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except subprocess.TimeoutExpired as timed_out:
        output = timed_out.output or ""
        output = output.decode() if isinstance(output, bytes) else output
        return None, time.monotonic() - start, child_cpu_seconds() - cpu, output
    return proc.returncode, time.monotonic() - start, child_cpu_seconds() - cpu, proc.stdout


def read_results(results):
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    return {rec["nodeid"]: rec for rec in records}


# The value estimators count only in their own test files, in the tests that build no other
# swapped class: a loss builds its estimator itself, and which one differs (TorchRL's off-policy
# losses, its deprecated ones included, a TD0Estimator each; rlloss's none), so the tests of a
# loss would count for an estimator in one setting and not in the other.
ESTIMATORS = {"GAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace", "MultiAgentGAE"}
ESTIMATOR_FILES = ("test_values.py", "test_mappo.py", "test_loss_module.py")


def attributed(nodeid, classes):
    """The classes a test counts for (see :data:`ESTIMATORS`)."""
    classes = set(classes)
    own_file = nodeid.split("::")[0].endswith(ESTIMATOR_FILES)
    return classes if own_file and classes <= ESTIMATORS else classes - ESTIMATORS


def per_class(records):
    """class name -> (passed test ids, not-passed test ids), over the tests that build it."""
    passed, other = defaultdict(list), defaultdict(list)
    for nodeid, rec in sorted(records.items()):
        for name in attributed(nodeid, rec.get("classes", [])):
            (passed if rec["outcome"] == "passed" else other)[name].append(nodeid)
    return passed, other


def load_floors():
    return json.loads(FLOORS.read_text()) if FLOORS.exists() else {"classes": {}}


def write_floors(floors):
    floors["classes"] = dict(sorted(floors["classes"].items()))
    FLOORS.write_text(json.dumps(floors, indent=1) + "\n")


def versions():
    import tensordict
    import torch
    import torchrl

    return f"torch {torch.__version__}, tensordict {tensordict.__version__}, torchrl {torchrl.__version__}"


def _cell(value) -> str:
    return "-" if value is None else str(value)


def report(floors, passed, other):
    """Print per-class counts; return the names of the classes below their floor."""
    below = []
    names = sorted(set(floors["classes"]) | set(passed) | set(other))
    header = f"{'class':<26}{'ours':>8}{'TorchRL':>9}{'floor':>7}"
    print(f"\n{header}  (of the tests that build the class, those that pass)")
    for name in names:
        entry = floors["classes"].get(name, {})
        ours, floor, ref = len(passed[name]), entry.get("floor"), entry.get("torchrl")
        note = ""
        if floor is None:
            note = "no floor yet (--update-floors)"
        elif ours < floor:
            note = f"BELOW FLOOR by {floor - ours}"
            below.append(name)
        elif ours > floor:
            note = f"above floor by {ours - floor}: raise it (--update-floors)"
        print(f"{name:<26}{ours:>8}{_cell(ref):>9}{_cell(floor):>7}  {note}")
    for name in below:
        floor = floors["classes"][name]["floor"]
        print(
            f"\n{name}: {len(passed[name])} pass (floor {floor}); not passing ({len(other[name])}):"
        )
        for nodeid in other[name]:
            print(f"  {nodeid}")
    return below


def record_column(floors, column, passed, other, summary):
    """Write ``column`` of floors.json: ``torchrl`` as measured, ``floor`` raised only."""
    for name in sorted(set(passed) | set(other) | set(floors["classes"])):
        entry = floors["classes"].setdefault(name, {})
        best = entry.get(column, 0) if column == "floor" else 0
        entry[column] = max(best, len(passed[name]))
    floors.setdefault("meta", {})[column] = summary
    write_floors(floors)
    print(f"gate: wrote the {column} column of {FLOORS.relative_to(REPO)}")


def run_selection(args, tests, families):
    """Run the families' tests; the per-test records and a one-line summary of the run."""
    node_ids = [node for family in families for node in SELECTION[family]]
    swap = not args.reference
    with tempfile.TemporaryDirectory() as tmp:
        results = args.results or Path(tmp) / "results.jsonl"
        results.unlink(missing_ok=True)
        setting = "rlloss's classes" if swap else "TorchRL's own classes"
        print(f"gate: TorchRL's tests from {tests}, {setting}, families: {' '.join(families)}")
        status, seconds, cpu, output = run_pytest(tests, node_ids, swap, results, args.timeout)
        records = read_results(results) if results.exists() else {}
    print(output.rstrip().splitlines()[-1] if output.strip() else "")
    summary = f"{len(records)} tests in {seconds:.0f} s wall, {cpu:.0f} s CPU"
    print(f"gate: {summary} (pytest exit status {status})")
    broken = [r for r in records.values() if r["outcome"] == "collection_error"]
    if status is None or status not in (0, 1) or broken:
        print(output[-6000:])
        for rec in broken:
            print(f"collection error: {rec['nodeid']}: {rec['message']}")
        reason = "timed out" if status is None else f"exit status {status}"
        fail(f"the TorchRL test run did not complete ({reason}); no verdict.")
    return records, summary


def main(argv=None):
    args = parse_args(argv)
    tests = args.tests.resolve()
    check_tests_tree(tests)
    if args.families and args.update_floors:
        fail("floors are measured over the whole selection (drop --families).")
    if args.from_results:
        records = read_results(args.from_results)
        summary = f"{len(records)} tests (from {args.from_results.name})"
        print(f"gate: {summary}")
    else:
        records, summary = run_selection(args, tests, args.families or list(SELECTION))
    passed, other = per_class(records)
    floors = load_floors()
    if args.update_floors or (args.reference and not args.families):
        column = "torchrl" if args.reference else "floor"
        day = time.strftime("%Y-%m-%d", time.gmtime())
        record_column(floors, column, passed, other, f"{day}, {versions()}, {summary}")
    below = report(floors, passed, other)
    if args.reference:
        return 0
    if below:
        print(f"\ngate: FAILED: {len(below)} classes below their floor: {' '.join(below)}")
        return 1
    print("\ngate: every class at or above its floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
