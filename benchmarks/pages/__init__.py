"""BENCHMARKS.md and the full tables it links, rendered from the JSON results.

Inputs, each optional (a missing file is a note in the pages, never an error):

* ``overhead*.json`` -- ``benchmarks/overhead.py``: per case, batch size, mode (eager /
  compiled) and level (forward / backward / update) the time of each method and the paired
  ratios. Each row is checked against the targets (``pages.overhead.OVERHEAD_TARGETS``). A file
  in the older format (rows without ``mode`` / ``level``) is skipped with a note.
* ``profile*.json`` -- ``benchmarks/profile_overhead.py``: per case, mode, level and method,
  the step's time split by where it is spent (torch ops, tensordict, rlloss's Python, dynamo's
  guards...). ``benchmarks/misses.md``, written by hand, explains each missed target from
  them; BENCHMARKS.md ends with it.
* ``compile*.json`` -- ``benchmarks/compile_report.py``: one row per (case, library); whatever
  keys the rows have become the columns of the table.
* ``instructions-hand-written.json`` -- ``benchmarks/instructions.py --hand-written``: the
  instructions per step of the rlloss and hand-written methods, shown beside the timed ratios in
  BENCHMARKS.md's hand-written table.
* ``learning*.json`` -- ``benchmarks/learning.py``: per task and library the per-seed returns,
  whether the target was met, and the learning-curve figures (embedded by relative path).

BENCHMARKS.md holds the headline tables (:mod:`benchmarks.pages.headline`); each page of
``PAGES`` holds the full tables of one kind of file, written into the results dir. Every page
gives each file's date, machine, versions and the command that produced it. Rows measured on a
device other than ``cpu`` get their own sections under "GPU", marked with the device; that
section says so when no GPU figures exist yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchmarks.harness import MODES
from benchmarks.pages.compile import compile_section
from benchmarks.pages.headline import HAND_INSTRUCTIONS, HEADLINE_LEVEL, headline
from benchmarks.pages.learning import learning_section
from benchmarks.pages.markdown import (
    KINDS,
    REPO_ROOT,
    Result,
    devices_of,
    generated_line,
    inputs_section,
    load_results,
    machines_section,
    on_cpu,
    rel,
)
from benchmarks.pages.overhead import format_problem, has_mode, overhead_section
from benchmarks.pages.profile import profile_section

MISSES = REPO_ROOT / "benchmarks" / "misses.md"  # BENCHMARKS.md's last section, by hand


@dataclass(frozen=True)
class Page:
    """One linked page: the full tables of one kind of result file."""

    file: str
    title: str  # its heading, and its link text in BENCHMARKS.md
    kind: str
    section: Callable[[Result, str, Path], list[str]]  # one file's figures on one device
    shows: Callable[[Result], bool] = field(default=lambda result: True)
    explains_misses: bool = False  # links BENCHMARKS.md's section on the missed targets


def overhead_page(mode: str) -> Page:
    """The page of the overhead rows measured in ``mode`` (eager or compiled)."""
    return Page(
        f"overhead-{mode}.md",
        f"Overhead per update, {mode}",
        "overhead",
        partial(overhead_section, mode=mode),
        partial(has_mode, mode=mode),
    )


PAGES = (
    *(overhead_page(mode) for mode in MODES),
    Page("compile.md", "torch.compile: graphs, breaks, recompiles", "compile", compile_section),
    Page(
        "profile.md",
        "Where the overhead goes",
        "profile",
        profile_section,
        explains_misses=True,
    ),
    Page("learning.md", "Learning", "learning", learning_section),
)


def problem_of(result: Result) -> str | None:
    """Why a file cannot be shown, or None."""
    return format_problem(result) if result.kind == "overhead" else result.error


def device_sections(page: Page, results: list[Result], cpu: bool, out: Path) -> list[str]:
    """The sections of a page's files, for their cpu devices or for the others."""
    return [
        line
        for result in results
        for device in (devices_of(result) if result.data is not None else ["cpu"])
        if on_cpu(device) == cpu
        for line in page.section(result, device, out)
    ]


def render_page(page: Page, results: list[Result], results_dir: Path, index: Path) -> str:
    """One page: where its figures come from, then its sections, CPU first, then GPU."""
    out = results_dir / page.file
    used = [r for r in results if r.kind == page.kind and page.shows(r)]
    lines = [
        f"# {page.title}",
        "",
        generated_line(results_dir, len(used)),
        "",
        f"The headline tables: [{index.name}]({rel(index, out)}).",
        "",
    ]
    if page.explains_misses:
        link = f"[{index.name}, Missed targets]({rel(index, out)}#missed-targets-explained)"
        lines += [f"Why each missed target is missed: {link}.", ""]
    if not used:
        return "\n".join([*lines, f"No `{page.kind}*.json` in the results dir.", ""])
    gpu = device_sections(page, used, cpu=False, out=out) or [
        "No GPU figures exist yet: every file here was measured on cpu. Running a benchmark "
        "with `--device cuda` (written to e.g. `overhead-cuda.json`) and then "
        "`python benchmarks/report.py` adds its sections here.",
        "",
    ]
    lines += [
        *inputs_section(used, out, problem_of),
        *machines_section(used),
        "## CPU",
        "",
        *device_sections(page, used, cpu=True, out=out),
        "## GPU",
        "",
        *gpu,
    ]
    return "\n".join(lines).rstrip() + "\n"


def load_instructions(path: Path, notes: list[str]) -> dict | None:
    """The hand-written comparison's instruction counts (``None`` without the file; a note if it
    cannot be read)."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        notes.append(f"{path.name}: could not be read: {err}")
        return None


def load_counts(results_dir: Path, notes: list[str]) -> dict[str, dict]:
    """The entries of every keyed instruction file (``instructions*.json`` written by
    ``benchmarks/instructions.py --dumped`` or ``--hand-written``: ``"<case>, B=<batch>"`` ->
    counts) of the headline level, each with its file's name; the newest entry of a key wins."""
    found = []
    for path in sorted(results_dir.glob("instructions*.json")):
        data = load_instructions(path, notes) or {}
        if "machine" not in data or data.get("level") != HEADLINE_LEVEL:
            continue  # the older files: one batch size per file, no date
        date = data["machine"].get("date", "?")
        found += [
            {"date": date, **entry, "key": key, "file": path.name}
            for key, entry in data["cases"].items()
        ]
    return {e["key"]: e for e in sorted(found, key=lambda e: e.get("date", ""))}


def render_all(results_dir: Path, index: Path) -> tuple[dict[Path, str], list[str]]:
    """BENCHMARKS.md (at ``index``) and every page (in ``results_dir``) by path, and the notes
    worth printing (unreadable or skipped files, missing kinds)."""
    results = load_results(results_dir)
    notes = [f"{r.path.name}: {problem_of(r)}" for r in results if problem_of(r)]
    notes += [
        f"no {kind}*.json in {results_dir}"
        for kind in KINDS
        if not any(r.kind == kind for r in results)
    ]
    files = {results_dir / p.file: render_page(p, results, results_dir, index) for p in PAGES}
    links = [(page.title, rel(results_dir / page.file, index)) for page in PAGES]
    links.append(("missed targets, explained", "#missed-targets-explained"))
    instructions = load_instructions(results_dir / HAND_INSTRUCTIONS, notes)
    counts = load_counts(results_dir, notes)
    generated = generated_line(results_dir, len(results))
    misses = MISSES.read_text() if MISSES.exists() else ""
    files[index] = headline(results, generated, links, instructions, counts) + "\n" + misses
    return files, notes
