"""Write ``BENCHMARKS.md`` from the JSON results in ``benchmarks/results/`` and the missed
targets' explanations in ``benchmarks/misses.md`` (what it shows: :mod:`benchmarks.pages`).

One command, run from anywhere::

    python benchmarks/report.py                                  # -> BENCHMARKS.md
    python benchmarks/report.py --results-dir /tmp/res --out /tmp/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.pages import render  # noqa: E402

DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
DEFAULT_OUT = REPO_ROOT / "BENCHMARKS.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    text, notes = render(args.results_dir.resolve())
    args.out.write_text(text)
    print(f"wrote {args.out}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
