"""How the cost of an ensemble loss grows with its number of critics: REDQLoss and TQCLoss
(``benchmarks.cases.ensembles``) timed at several ``num_qvalue_nets`` for plain torch, rlloss and
TorchRL, each gated for equality first (the method: :mod:`benchmarks.harness`).

Run from the repository root (the working tree's ``rlloss`` is imported)::

    python benchmarks/ensemble_scaling.py                          # REDQ 2/4/10, TQC 2/5/10
    python benchmarks/ensemble_scaling.py --losses REDQLoss --redq-critics 2 10 --smoke
    python benchmarks/ensemble_scaling.py --custom-critic  # critics of one's own nn.Module

Writes ``benchmarks/results/ensemble-scaling.json`` (rows in the overhead harness's format, plus
``num_critics`` and each method's growth over the smallest ensemble) and
``ensemble-scaling.md`` beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # benchmark the working tree's rlloss

from benchmarks import harness  # noqa: E402
from benchmarks.cases.common import CUSTOM_SUFFIX  # noqa: E402
from benchmarks.cases.ensembles import build_ensemble  # noqa: E402
from benchmarks.harness import LEVELS, MODES, Config  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "ensemble-scaling.json"
CUSTOM_OUT = REPO_ROOT / "benchmarks" / "results" / "ensemble-scaling-custom-critic.json"
SHOWN = ("plain", "rlloss", "torchrl")  # plain-min is the same loop as plain here


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--losses", nargs="+", default=["REDQLoss", "TQCLoss"])
    p.add_argument("--redq-critics", nargs="+", type=int, default=[2, 4, 10])
    p.add_argument("--tqc-critics", nargs="+", type=int, default=[2, 5, 10])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--level", default="update", choices=LEVELS)
    p.add_argument("--modes", nargs="+", default=["eager"], choices=MODES)
    p.add_argument("--repeats", type=int, default=20, help="interleaved rounds per method")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per method")
    p.add_argument("--block-ms", type=float, default=50.0, help="target timed block length")
    p.add_argument("--rtol", type=float, default=1e-5, help="equality-gate relative tolerance")
    p.add_argument("--compiled-rtol", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--custom-critic",
        action="store_true",
        help="critics written as a plain nn.Module (not TorchRL's MLP): rlloss cannot stack "
        "them into batched matrix products",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"default: {DEFAULT_OUT.name}, or {CUSTOM_OUT.name} with --custom-critic",
    )
    p.add_argument("--smoke", action="store_true", help="3 rounds of 1 step: checks the gate")
    a = p.parse_args(argv)
    if a.smoke:
        a.repeats, a.warmup = min(a.repeats, 3), min(a.warmup, 1)
    if a.out is None:
        a.out = CUSTOM_OUT if a.custom_critic else DEFAULT_OUT
    cfg = Config(
        cases=a.losses,
        batch_sizes=[a.batch_size],
        levels=[a.level],
        modes=a.modes,
        repeats=a.repeats,
        inner=1 if a.smoke else 0,
        warmup=a.warmup,
        block_ms=a.block_ms,
        rtol=a.rtol,
        compiled_rtol=a.compiled_rtol,
        seed=a.seed,
        require_all=True,
        out=a.out,
        smoke=a.smoke,
    )
    return a, cfg


def with_growth(rows: list[dict]) -> list[dict]:
    """Each row with ``growth``: per method, its median time over the median time of the same
    loss, mode and method with the fewest critics."""
    for row in rows:
        base = min(
            (r for r in rows if r["case"] == row["case"] and r["mode"] == row["mode"]),
            key=lambda r: r["num_critics"],
        )
        row["growth"] = {
            name: m["time_us"]["median"] / base["methods"][name]["time_us"]["median"]
            for name, m in row["methods"].items()
            if "time_us" in m and "time_us" in base["methods"].get(name, {})
        }
        row["growth_from_critics"] = base["num_critics"]
    return rows


def table(rows: list[dict]) -> list[str]:
    """The rows as a Markdown table: times, the paired ratios and each method's growth."""
    header = [
        "loss",
        "mode",
        "critics",
        *(f"{m} (us)" for m in SHOWN),
        "rlloss/plain",
        "torchrl/rlloss",
        *(f"{m} growth" for m in SHOWN),
    ]
    body = []
    for row in rows:
        times = [
            f"{row['methods'][m]['time_us']['median']:.0f}"
            if "time_us" in row["methods"].get(m, {})
            else row["methods"].get(m, {}).get("status", "-")
            for m in SHOWN
        ]
        ratios = [
            f"{r['median']:.2f}x [{r['p25']:.2f}-{r['p75']:.2f}]" if r else "-"
            for r in (row["ratios"].get("rlloss/plain"), row["ratios"].get("torchrl/rlloss"))
        ]
        growth = [f"{row['growth'][m]:.2f}x" if m in row["growth"] else "-" for m in SHOWN]
        body.append([row["case"], row["mode"], str(row["num_critics"]), *times, *ratios, *growth])
    return harness.text_table(header, body, right=True)


def markdown(result: dict) -> str:
    """``ensemble-scaling.md``: the command, the machine, the table."""
    m, rows = result["machine"], result["results"]
    level, batch = rows[0]["level"], rows[0]["batch_size"]
    lines = [
        "# Ensemble scaling: REDQLoss and TQCLoss from few to many critics",
        "",
        "Written by `benchmarks/ensemble_scaling.py`; command:",
        "",
        f"    {m['command']}",
        "",
        f"Machine: {m['cpu_model']}, {m['cpu_count']} CPUs ({m['affinity_cpus']} usable), "
        f"{m['torch_threads']} torch thread; torch {m['torch']}, tensordict {m['tensordict']}, "
        f"torchrl {m['torchrl']}; {m['date']}; git {m['git']}.",
        "",
        f"Per step: `{level}` ({harness.METHOD_TEXT}); batch {batch}. Median microseconds "
        "per step; ratios: median [p25-p75] of the paired per-round ratios; growth: the "
        "median time over the same method's with the fewest critics. "
        + (
            "Every method passed the equality gate (total loss, actor and temperature "
            "gradients) before timing."
            if result["ok"]
            else "Some methods FAILED the equality gate (see the JSON): they were not timed."
        ),
        "",
        *(f"- {row['case']}, {row['num_critics']} critics: {row['description']}" for row in rows),
        "",
        *table(rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, cfg = parse_args(argv)
    harness.single_thread()
    critics = {"REDQLoss": args.redq_critics, "TQCLoss": args.tqc_critics}
    rows = []
    for name in args.losses:
        for n in critics[name]:
            setup = build_ensemble(name, n, args.batch_size, args.seed, args.custom_critic)
            label = name + (CUSTOM_SUFFIX if args.custom_critic else "")
            for row in harness.run_case(label, setup, args.batch_size, cfg):
                rows.append({**row, "num_critics": n})
            print(f"{name} critics={n}: done", file=sys.stderr, flush=True)
    rows = with_growth(rows)
    print("\n".join(table(rows)))
    ok = harness.write_result(rows, vars(args), args.out)
    result = json.loads(args.out.read_text())
    args.out.with_suffix(".md").write_text(markdown(result))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}" + ("" if ok else " (FAILED)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
