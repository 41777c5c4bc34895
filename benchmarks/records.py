"""What the overhead harness prints and writes: its text tables, every result file's ``machine``
block, and the JSON result of a run of ``overhead.py`` (rows merged with an earlier file's)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import CLOCK_TEXT, METHOD_TEXT, METHODS, REPO_ROOT


# --------------------------------------------------------------------------- #
# Printing and the machine block
# --------------------------------------------------------------------------- #
def text_table(header: list[str], body: list[list[str]], right: bool = False) -> list[str]:
    """A Markdown table padded to its columns' widths, cells right-aligned with ``right``."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if right else c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return [line(header), rule, *(line(cells) for cells in body)]


def _fmt_time(row: dict, name: str) -> str:
    m = row["methods"].get(name, {})
    if m.get("status") in ("FAILED", "n/a"):
        return m["status"]
    if "time_us" not in m:
        return "skipped"
    t = m["time_us"]
    return f"{t['median']:.1f} [{t['p25']:.1f}-{t['p75']:.1f}]"


def _fmt_ratio(row: dict, key: str) -> str:
    r = row["ratios"].get(key)
    return "-" if r is None else f"{r['median']:.2f}x [{r['p25']:.2f}-{r['p75']:.2f}]"


def print_table(case: str, description: str, rows: list[dict]) -> None:
    """One case's rows as a text table: every method's time and the two headline ratios."""
    header = [
        "mode",
        "level",
        "batch",
        *(f"{m} (us)" for m in METHODS),
        "rlloss/plain",
        "torchrl/rlloss",
        "rlloss/hand",
        "rlloss-min/hand-min",
    ]
    body = [
        [
            row["mode"],
            row["level"],
            str(row["batch_size"]) + ("" if row["status"] == "ok" else " FAILED"),
            *(_fmt_time(row, m) for m in METHODS),
            _fmt_ratio(row, "rlloss/plain"),
            _fmt_ratio(row, "torchrl/rlloss"),
            _fmt_ratio(row, "rlloss/hand"),
            _fmt_ratio(row, "rlloss-min/hand-min"),
        ]
        for row in rows
    ]
    print(f"\n{case}: {description}")
    print("median per step [p25-p75]; ratios: median [IQR] of paired per-round ratios")
    print("\n".join(text_table(header, body, right=True)))


def _git_state() -> dict[str, Any] | None:
    """The commit of the working tree and whether it has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": rev, "dirty": bool(dirty)}


def machine_info() -> dict[str, Any]:
    """Date, command, CPU, library versions and git state: every result file's ``machine``."""
    cpu_model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tensordict": version("tensordict"),
        "torchrl": version("torchrl"),
        "git": _git_state(),
    }


def _row_key(row: dict) -> tuple:
    """What a row measured: case, batch size, mode, level, device and number of critics."""
    return tuple(
        row.get(k) for k in ("case", "batch_size", "mode", "level", "device", "num_critics")
    )


def write_result(rows: list[dict], config: dict, out: Path, merge: bool = False) -> bool:
    """Write ``rows`` with the machine block, ``config`` and the method to ``out`` (JSON); whether
    every row is ok. ``merge``: keep the rows already in ``out`` that ``rows`` do not replace
    (same case, batch size, mode, level, device and number of critics), and its command before
    this one's."""
    machine = machine_info()
    if merge and out.exists():
        previous = json.loads(out.read_text())
        new = {_row_key(r) for r in rows}
        rows = [r for r in previous["results"] if _row_key(r) not in new] + rows
        machine["command"] = f"{previous['machine']['command']} && {machine['command']}"
    ok = all(r["status"] == "ok" for r in rows)
    result = {
        "machine": machine,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in config.items()},
        "method": METHOD_TEXT + CLOCK_TEXT[config.get("clock", "wall")],
        "ok": ok,
        "results": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return ok
