"""Compile report: how every loss of ``benchmarks/cases`` fares under ``torch.compile``.

Per case, for the rlloss loss and TorchRL's where the case has one: graphs and graph breaks,
whether ``fullgraph=True`` compiles, recompilations over fresh batches, cold and warm compile
times (what each means: :mod:`benchmarks.compilation`).

Run from the repository root::

    python benchmarks/compile_report.py                    # every case (about 10 min here)
    python benchmarks/compile_report.py --smoke            # 2 cases, 3 fresh batches
    python benchmarks/compile_report.py --cases SACLoss TD3Loss --out my.json
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

from benchmarks import compilation  # noqa: E402
from benchmarks.cases import CASES  # noqa: E402
from benchmarks.harness import machine_info  # noqa: E402

FRESH_BATCHES = 20
SMOKE_CASES = ("DQNLoss", "SACLoss")
SMOKE_FRESH_BATCHES = 3
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "compile.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cases",
        nargs="+",
        choices=list(CASES),
        help=f"default: all ({', '.join(SMOKE_CASES)} with --smoke)",
    )
    p.add_argument(
        "--fresh-batches",
        type=int,
        default=None,
        help=f"batches for the recompile count (default {FRESH_BATCHES}, "
        f"{SMOKE_FRESH_BATCHES} with --smoke)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--smoke", action="store_true", help="2 cases and 3 fresh batches (~2 min)")
    cfg = p.parse_args(argv)
    if cfg.cases is None:
        cfg.cases = list(SMOKE_CASES) if cfg.smoke else list(CASES)
    if cfg.fresh_batches is None:
        cfg.fresh_batches = SMOKE_FRESH_BATCHES if cfg.smoke else FRESH_BATCHES
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    torch.set_num_threads(1)  # as overhead.py; inductor's C++ compiles use their own workers
    init_s, rows = compilation.measure_all(cfg.cases, cfg.seed, cfg.fresh_batches)
    compilation.print_table(rows)
    failing = [f"{r['case']}/{r['library']}" for r in rows if not compilation.meets_contract(r)]
    result = {
        "machine": {**machine_info(), **compilation.compile_settings()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "method": compilation.__doc__.split("\n\n", 1)[1],
        "inductor_init_s": init_s,
        "ok": not failing,
        "results": rows,
    }
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {cfg.out}  (inductor one-time init {init_s:.1f} s)")
    if failing:
        print(f"rlloss rows off the compile contract: {', '.join(failing)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
