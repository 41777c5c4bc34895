"""Per-update overhead of rlloss losses vs. TorchRL and a hand-written plain-torch baseline.

Every case of :mod:`benchmarks.cases`, at its small and large batch size, eager and compiled,
at three levels (forward; zero_grad + forward + backward; the full update); the methods are
gated for equality, then timed interleaved (the method: :mod:`benchmarks.harness`).

Run from the repository root (the working tree's ``rlloss`` is imported)::

    python benchmarks/overhead.py                      # full run
    python benchmarks/overhead.py --smoke              # seconds; for CI
    python benchmarks/overhead.py --batch-sizes 64 4096 --repeats 50 --out my.json
    python benchmarks/overhead.py --small-only --modes eager --out small.json  # the headline rows
    python benchmarks/overhead.py --hand-written --out benchmarks/results/overhead-hand-written.json
    python benchmarks/overhead.py --cases MAPPOLoss --modes compiled --batch-sizes 64 --merge \
        --out benchmarks/results/overhead-multiagent.json  # added to that file's eager rows
    python benchmarks/overhead.py --ensemble-scaling --critics 2 4 10  # REDQ and TQC, 2 to 10
    python benchmarks/overhead.py --ensemble-scaling --custom-critic    # critics of one's own

``--critics``: the ensemble cases (REDQ, TQC) at each of these numbers of critics; each row
records ``num_critics`` and ``growth``, per method its time over that of the fewest critics.
``--ensemble-scaling`` sets what the ensemble-scaling results were taken with (REDQ 2/4/10 and TQC
2/5/10 critics unless ``--critics`` is given, batch 256, the update level, eager, plain, rlloss
and TorchRL; ``--custom-critic``: their custom-critic cases), written to
``benchmarks/results/ensemble-scaling[-custom-critic].json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # benchmark the working tree, not whatever rlloss may be installed
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import harness, records  # noqa: E402
from benchmarks.cases import BATCH_SIZES, CASES, HAND_WRITTEN, HAND_WRITTEN_METHODS  # noqa: E402
from benchmarks.cases.common import CUSTOM_SUFFIX  # noqa: E402
from benchmarks.cases.ensembles import ENSEMBLES, with_critics  # noqa: E402
from benchmarks.harness import LEVELS, METHODS, MODES, Config  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "overhead.json"
SCALING_CRITICS = {"REDQLoss": (2, 4, 10), "TQCLoss": (2, 5, 10)}  # --ensemble-scaling's default


def batch_sizes_of(case: str, cfg: Config) -> list[int]:
    """``--batch-sizes`` if given, else the case's (small, large) pair, or its small one with
    ``--smoke``."""
    if cfg.batch_sizes:
        return cfg.batch_sizes
    if cfg.hand_written:
        return list(HAND_WRITTEN[case])
    small, large = BATCH_SIZES[case]
    return [small] if cfg.smoke or cfg.small_only else [small, large]


def with_growth(rows: list[dict]) -> list[dict]:
    """Each row with ``growth``: per method, its median time over that of the same loss, batch
    size, mode and level with the fewest critics."""
    for row in rows:
        same = ("case", "batch_size", "mode", "level")
        base = min(
            (r for r in rows if all(r[k] == row[k] for k in same)),
            key=lambda r: r["num_critics"],
        )
        row["growth"] = {
            name: m["time_us"]["median"] / base["methods"][name]["time_us"]["median"]
            for name, m in row["methods"].items()
            if "time_us" in m and "time_us" in base["methods"].get(name, {})
        }
        row["growth_from_critics"] = base["num_critics"]
    return rows


def growth_table(rows: list[dict]) -> list[str]:
    """Per row: its critics, each method's median time (us) and growth over the fewest."""
    methods = list(dict.fromkeys(m for row in rows for m in row["growth"]))
    header = ["loss", "mode", "level", "critics"]
    header += [f"{m} us" for m in methods] + [f"{m} growth" for m in methods]
    body = [
        [row["case"], row["mode"], row["level"], str(row["num_critics"])]
        + [
            f"{row['methods'][m]['time_us']['median']:.0f}" if m in row["growth"] else "-"
            for m in methods
        ]
        + [f"{row['growth'][m]:.2f}x" if m in row["growth"] else "-" for m in methods]
        for row in rows
    ]
    return ["", "Growth with the number of critics:", *records.text_table(header, body, True)]


def parser() -> argparse.ArgumentParser:
    """The command line's options (``parse_args`` applies the presets and checks them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument(
        "--batch-sizes",
        nargs="+",
        default=None,
        help="e.g. '64 4096' or '64,4096' (default: each case's small and large sizes, 64 and 4096 "
        "for PPO, DQN and the multi-agent losses (timesteps of 3 agents), 256 and 4096 for "
        "DDPG, TD3, SAC, CrossQ, IQL and CQL, 64 and 1024 for REDQ and TQC, 256 and 1024 for "
        "MPO; the small one with --smoke)",
    )
    p.add_argument(
        "--small-only", action="store_true", help="each case's small batch size only (the headline)"
    )
    p.add_argument(
        "--hand-written",
        action="store_true",
        help="the comparison with the hand-written steps: their cases (or those of --cases "
        "among them) at their batch sizes (benchmarks.cases.HAND_WRITTEN), eager, backward "
        "level only, rlloss and hand-written methods only",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=METHODS,
        help="the methods to gate and time (default: all; --hand-written: rlloss, rlloss-min, "
        "hand, hand-min)",
    )
    p.add_argument("--levels", nargs="+", default=list(LEVELS), choices=LEVELS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--repeats", type=int, default=30, help="interleaved rounds (samples per method)"
    )
    p.add_argument(
        "--inner", type=int, default=0, help="steps per timed block; 0 = auto (--block-ms)"
    )
    p.add_argument("--warmup", type=int, default=20, help="untimed steps per method before timing")
    p.add_argument("--block-ms", type=float, default=50.0, help="target block length for --inner 0")
    p.add_argument("--rtol", type=float, default=1e-5, help="equality-gate relative tolerance")
    p.add_argument(
        "--compiled-rtol", type=float, default=1e-4, help="gate tolerance of compiled losses"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--require-all", action="store_true", help="a method that cannot be built is a failure"
    )
    p.add_argument(
        "--no-aot-cse",
        action="store_true",
        help="turn off AOTAutograd's common-subexpression elimination (torch 2.13 merges two "
        "randn_like draws of one tensor; rlloss and the plain cases now draw with randn, so "
        "this only reproduces the recorded CQL runs that needed it)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--clock",
        default="wall",
        choices=list(harness.CLOCKS),
        help="what a timed block is measured with: wall (time.perf_counter) or cpu (the "
        "process's CPU time, time.process_time: far less inflated on a machine shared with "
        "other work, where the wall clock counts the time others hold the cores)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of --out this run does not replace (same case, batch size, mode, "
        "level and device); its command is recorded before this run's",
    )
    p.add_argument(
        "--critics", nargs="+", type=int, help="the ensemble cases at these numbers of critics"
    )
    p.add_argument(
        "--ensemble-scaling",
        action="store_true",
        help="REDQ and TQC from few to many critics, as the ensemble-scaling results (see above)",
    )
    p.add_argument(
        "--custom-critic", action="store_true", help="--ensemble-scaling: critics of one's own"
    )
    p.add_argument(
        "--smoke", action="store_true", help="tiny run (seconds) that still checks the gate"
    )
    return p


def parse_args(argv: list[str] | None = None) -> Config:
    """The run's configuration: the options, with the presets of ``--ensemble-scaling``,
    ``--smoke`` and ``--hand-written`` applied."""
    a = parser().parse_args(argv)
    if a.ensemble_scaling:
        suffix = CUSTOM_SUFFIX if a.custom_critic else ""
        chosen = a.cases if a.cases != list(CASES) else list(ENSEMBLES)
        a.cases = [c.removesuffix(CUSTOM_SUFFIX) + suffix for c in chosen]
        a.batch_sizes = a.batch_sizes or ["256"]
        a.levels, a.modes = ["update"], a.modes if a.modes != list(MODES) else ["eager"]
        a.methods = ["plain", "rlloss", "torchrl"]
        if a.out == DEFAULT_OUT:
            a.out = DEFAULT_OUT.with_name(
                f"ensemble-scaling{'-custom-critic' if suffix else ''}.json"
            )
    if a.smoke:
        a.repeats, a.inner, a.warmup = min(a.repeats, 3), a.inner or 2, min(a.warmup, 2)
    if a.hand_written:  # its cases (those of an explicit --cases among them), eager backward
        chosen = a.cases if a.cases != list(CASES) else list(HAND_WRITTEN)
        a.cases = [case for case in chosen if case in HAND_WRITTEN]
        a.levels, a.modes = ["backward"], ["eager"]
        a.methods = list(HAND_WRITTEN_METHODS)
    levels = [level for level in LEVELS if level in a.levels]  # "update" last
    batch_sizes = [int(b) for arg in a.batch_sizes or [] for b in arg.split(",") if b]
    methods = tuple(m for m in METHODS if m in a.methods)
    critics = None  # case -> its numbers of critics
    if a.critics or a.ensemble_scaling:
        default = SCALING_CRITICS if a.ensemble_scaling else {}
        counts = {c: a.critics or default.get(c.removesuffix(CUSTOM_SUFFIX)) for c in a.cases}
        for case in a.cases:
            with_critics(case, 2)  # refuses a case that is not an ensemble
        critics = {c: list(n) for c, n in counts.items()}
    fields = {k: v for k, v in vars(a).items() if k not in ("ensemble_scaling", "custom_critic")}
    return Config(
        **{
            **fields,
            "batch_sizes": batch_sizes,
            "levels": levels,
            "methods": methods,
            "critics": critics,
        }
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.no_aot_cse:
        import torch._functorch.config

        torch._functorch.config.cse = False
    harness.use_device(cfg.device)
    harness.use_clock(cfg.clock)
    harness.single_thread()
    rows = []
    for case in cfg.cases:
        for critics in (cfg.critics or {}).get(case) or [None]:
            build = CASES[case] if critics is None else with_critics(case, critics)
            case_rows = [
                {**row, **({} if critics is None else {"num_critics": critics})}
                for b in batch_sizes_of(case, cfg)
                for row in harness.run_case(case, build(b, cfg.seed), b, cfg)
            ]
            rows.extend(case_rows)
            records.print_table(case, case_rows[0]["description"], case_rows)
    if cfg.critics:
        print("\n".join(growth_table(with_growth(rows))))

    ok = records.write_result(rows, vars(cfg), cfg.out, cfg.merge)
    print(f"\nwrote {cfg.out}" + ("" if ok else "  (some rows FAILED)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
