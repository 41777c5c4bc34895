"""Compile report: how every loss of :mod:`benchmarks.cases` fares under ``torch.compile``.

Run from the repository root (the working tree's ``rlloss`` is imported)::

    python benchmarks/compile_report.py                    # every case (about 10 min here)
    python benchmarks/compile_report.py --smoke            # 2 cases, 3 fresh batches
    python benchmarks/compile_report.py --cases SACLoss TD3Loss --out my.json

Per case and library (rlloss, and TorchRL where it has the loss), on one batch of 64: the graphs
and graph breaks ``torch._dynamo.explain`` finds, whether ``fullgraph=True`` compiles and runs,
the recompilations over ``--fresh-batches`` new batches of the same structure, and the cold and
warm first training step (``METHOD``; in full, BENCHMARKS.md's "Method" section). The exit
status is 1 when an rlloss row is off the compile contract (:func:`meets_contract`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the working tree's rlloss

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._dynamo.utils  # noqa: E402
import torch._functorch.config  # noqa: E402
import torch._inductor.config  # noqa: E402
import torch._inductor.utils  # noqa: E402
import torch._logging  # noqa: E402
from torch._inductor.compile_fx import compile_fx  # noqa: E402

from benchmarks.cases import CASES  # noqa: E402
from benchmarks.records import machine_info, text_table  # noqa: E402

METHOD = (  # what each figure means, recorded in the JSON
    "graphs / breaks: torch._dynamo.explain(loss)(); fullgraph: torch.compile(loss, "
    "fullgraph=True) compiles and runs (else the error, and the rest without it); recompiles: "
    "graphs a counting inductor backend receives while the compiled loss runs on fresh batches "
    "(the case built with other seeds, refilled into the TensorDict the loss reads), the "
    "recompile limit raised above their number, dynamo's guard failures as the reasons; cold_s: "
    "the first step (forward + backward) after torch._dynamo.reset() in an empty inductor cache "
    "(torch._inductor.utils.fresh_cache); warm_s: the first step after a reset and "
    "torch._inductor.utils.clear_caches() with that cache directory filled; inductor's one-time "
    "initialisation paid by a tiny function first (inductor_init_s)"
)
FRESH_BATCHES = 20
SMOKE_CASES = ("DQNLoss", "SACLoss")
SMOKE_FRESH_BATCHES = 3
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "compile.json"
LIBRARIES = ("rlloss", "torchrl")
BATCH_SIZE = 64
FRESH_SEED_OFFSET = 1000  # fresh batch i is built with seed + FRESH_SEED_OFFSET + i
REASON_CHARS = 160

# tensordict's notes on its own compiled paths: one line per traced call, not findings
warnings.filterwarnings("ignore", message=r".*lock_\(\) inside a compiled graph.*")
warnings.filterwarnings("ignore", message=r".*inline_inbuilt_nn_modules is deprecated.*")


# --------------------------------------------------------------------------- #
# Fresh batches
# --------------------------------------------------------------------------- #
def fresh_batches(case: str, batch_name: str, count: int, seed: int) -> list[Any]:
    """``count`` new batches with the structure of ``case``'s batch ``batch_name``: the case
    builder run with other seeds (new tensor objects, new values, same keys/shapes/dtypes)."""
    build = CASES[case]
    return [
        build(BATCH_SIZE, seed + FRESH_SEED_OFFSET + i).batches[batch_name] for i in range(count)
    ]


def refill(bound, fresh) -> None:
    """Empty the TensorDict ``bound`` (the one a method's loss reads) and fill it with the
    tensors of ``fresh``: the loss then sees new tensor objects and exactly ``fresh``'s keys."""
    for key in list(bound.keys()):
        del bound[key]
    bound.update(fresh)


# --------------------------------------------------------------------------- #
# Measurements
# --------------------------------------------------------------------------- #
def short_reason(reason) -> str:
    """One line for a graph break: the first line of dynamo's reason and the user source line
    where it broke."""
    text = str(reason.reason).strip().splitlines()[0] if str(reason.reason).strip() else "?"
    where = ""
    if reason.user_stack:
        frame = reason.user_stack[-1]
        where = f" @ {Path(frame.filename).name}:{frame.lineno}"
    return (text[: REASON_CHARS - len(where)] + where).strip()


class _Messages(logging.Handler):
    """A logging handler that keeps the messages it receives."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def short_logged_break(message: str) -> str:
    """One line for a ``graph_breaks`` log message: the break's type (the first unindented line
    after the "Graph Break Reason" line) and where it happened."""
    lines = message.splitlines()
    where = lines[0].rsplit(" at ", 1)[-1] if lines else "?"
    where = f" @ {Path(where.rsplit(':', 1)[0]).name}:{where.rsplit(':', 1)[-1]}"
    kinds = [line for line in lines[2:] if line.strip() and not line[0].isspace()]
    text = kinds[0] if kinds else (lines[1] if len(lines) > 1 else "?")
    return text[: REASON_CHARS - len(where)] + where


def logged_break_reasons(loss: Callable[[], torch.Tensor]) -> list[str]:
    """The graph breaks dynamo logs while tracing ``loss`` (backend "eager": no inductor cost).
    ``explain`` leaves its reasons empty for some breaks (a skipped function, an explicit
    ``torch._dynamo.graph_break()``), which the ``graph_breaks`` log still reports."""
    logger = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    handler, propagate = _Messages(), logger.propagate
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(handler)
    logger.propagate = False  # ours alone: nothing printed
    try:
        torch._dynamo.reset()
        torch.compile(loss, backend="eager")()
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        torch._logging.set_logs()
        torch._dynamo.reset()
    return [short_logged_break(m) for m in handler.messages]


def explain(loss: Callable[[], torch.Tensor]) -> dict[str, Any]:
    """Dynamo's view of the loss: graph count, graph break count and the break reasons."""
    torch._dynamo.reset()
    out = torch._dynamo.explain(loss)()
    reasons = [short_reason(r) for r in out.break_reasons]
    torch._dynamo.reset()
    if out.graph_break_count and not reasons:
        reasons = logged_break_reasons(loss)
    return {
        "graph_count": out.graph_count,
        "graph_break_count": out.graph_break_count,
        "break_reasons": list(dict.fromkeys(reasons)),  # unique, in order
    }


def counting_inductor(calls: list[int]) -> Callable:
    """A torch.compile backend that appends the node count of every graph dynamo hands it to
    ``calls`` and compiles it with inductor."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        calls.append(len(gm.graph.nodes))
        return compile_fx(gm, example_inputs)

    return backend


def error_text(err: BaseException) -> str:
    """The error's class and the first two lines of its message (a backend failure names the
    backend on the first line and the backend's own error on the second)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {' '.join(lines[:2])}"[:300]


def timed_step(loss: Callable[[], torch.Tensor]) -> tuple[float, float]:
    """One training step of ``loss``: (forward seconds, backward seconds)."""
    t0 = time.perf_counter()
    total = loss()
    t1 = time.perf_counter()
    total.backward()
    return t1 - t0, time.perf_counter() - t1


def cache_counters() -> dict[str, int]:
    """Inductor's FX graph cache and AOTAutograd cache hit/miss/bypass counters."""
    counters = torch._dynamo.utils.counters
    return {
        **{k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
        **{k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
    }


def count_recompiles(
    compiled: Callable[[], torch.Tensor], bound, batches: list[Any], calls: list[int]
) -> dict[str, Any]:
    """Run ``compiled`` on every batch of ``batches`` (refilled into ``bound``) and count the
    graphs compiled meanwhile; the guard failures dynamo reports are the reasons."""
    before_calls = len(calls)
    before_reasons = {code: len(r) for code, r in torch._dynamo.utils.guard_failures.items()}
    values = []
    limit = len(batches) + 8
    with torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=limit * 4):
        for batch in batches:
            refill(bound, batch)
            values.append(compiled().detach().item())
    reasons = [
        reason.strip().splitlines()[0][:REASON_CHARS]
        for code, all_reasons in torch._dynamo.utils.guard_failures.items()
        for reason in all_reasons[before_reasons.get(code, 0) :]
    ]
    return {
        "fresh_batches": len(batches),
        "recompiles": len(calls) - before_calls,
        "recompile_reasons": list(dict.fromkeys(reasons)),
        "distinct_fresh_losses": len(set(values)),
    }


def compile_row(
    setup, library: str, batch_name: str, fresh: list[Any], fullgraph: bool, cache_root: str
) -> dict:
    """Cold first step, recompiles over ``fresh`` and warm first step of ``library``'s loss
    compiled with ``fullgraph``, in an empty inductor cache directory made under
    ``cache_root`` (``METHOD``)."""
    bound = setup.batches[batch_name]
    original = bound.copy()  # the same tensors: a clone() could change strides (views of a
    # wider tensor become contiguous), and a stride change is a new graph
    method = setup.factories[library](bound)
    calls: list[int] = []
    row: dict[str, Any] = {"fullgraph": fullgraph}
    with torch._inductor.utils.fresh_cache(dir=cache_root):
        torch._dynamo.reset()
        compiled = torch.compile(method.loss, fullgraph=fullgraph, backend=counting_inductor(calls))
        forward_s, backward_s = timed_step(compiled)
        row.update(cold_s=forward_s + backward_s, cold_forward_s=forward_s)
        row["graphs_compiled"] = len(calls)
        row.update(count_recompiles(compiled, bound, fresh, calls))
        refill(bound, original)
        torch._dynamo.reset()
        torch._inductor.utils.clear_caches()  # in-memory only: the cache directory stays warm
        warm_calls: list[int] = []
        compiled = torch.compile(
            method.loss, fullgraph=fullgraph, backend=counting_inductor(warm_calls)
        )
        before = cache_counters()
        forward_s, backward_s = timed_step(compiled)
        after = cache_counters()
        row.update(warm_s=forward_s + backward_s, warm_forward_s=forward_s)
        row["warm_graphs_compiled"] = len(warm_calls)
        row["warm_cache"] = {
            k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)
        }
    torch._dynamo.reset()
    return row


def libraries_of(case: str, seed: int) -> list[str]:
    """The libraries ``case`` has a loss for, in report order."""
    factories = CASES[case](BATCH_SIZE, seed).factories
    return [library for library in LIBRARIES if library in factories]


def measure(
    case: str, library: str, seed: int, fresh_count: int, cache_root: str
) -> dict[str, Any]:
    """The whole report row of ``library``'s loss in ``case``; inductor caches under
    ``cache_root``."""
    print(f"[{case} / {library}] ...", file=sys.stderr, flush=True)
    setup = CASES[case](BATCH_SIZE, seed)
    batch_name = next(iter(setup.batches))
    row: dict[str, Any] = {
        "case": case,
        "library": library,
        "batch": batch_name,
        "batch_size": BATCH_SIZE,
        "description": setup.description,
    }
    try:
        row.update(explain(setup.factories[library](setup.batches[batch_name].copy()).loss))
    except Exception as err:  # noqa: BLE001 - a loss that cannot be traced is a finding
        row["explain_error"] = error_text(err)
    fresh = fresh_batches(case, batch_name, fresh_count, seed)
    try:
        row.update(compile_row(setup, library, batch_name, fresh, True, cache_root))
        row["fullgraph_ok"] = True
    except Exception as err:  # noqa: BLE001
        row["fullgraph_ok"], row["fullgraph_error"] = False, error_text(err)
        torch._dynamo.reset()
        setup = CASES[case](BATCH_SIZE, seed)  # a clean batch: the failed call wrote
        try:
            row.update(compile_row(setup, library, batch_name, fresh, False, cache_root))
        except Exception as err2:  # noqa: BLE001
            row["compile_error"] = error_text(err2)
            traceback.print_exc()
    return row


def measure_all(cases: list[str], seed: int, fresh_count: int) -> tuple[float, list[dict]]:
    """Inductor's one-time initialisation in seconds, and the row of every library's loss in
    every case of ``cases``, all in one temporary inductor cache root."""
    with tempfile.TemporaryDirectory(prefix="compile_report_") as cache_root:
        init_s = inductor_init_seconds(cache_root)
        rows = [
            measure(case, library, seed, fresh_count, cache_root)
            for case in cases
            for library in libraries_of(case, seed)
        ]
    return init_s, rows


def inductor_init_seconds(cache_root: str) -> float:
    """Compile and run a tiny function once: inductor's one-time initialisation."""
    x = torch.randn(8, requires_grad=True)
    with torch._inductor.utils.fresh_cache(dir=cache_root):
        t0 = time.perf_counter()
        torch.compile(lambda: (x.sin() * 2).sum())().backward()
        elapsed = time.perf_counter() - t0
    torch._dynamo.reset()
    return elapsed


def compile_settings() -> dict[str, Any]:
    """The compiler settings that decide the timings."""
    return {
        "inductor_compile_threads": torch._inductor.config.compile_threads,
        "fx_graph_cache": torch._inductor.config.fx_graph_cache,
        "autograd_cache": torch._functorch.config.enable_autograd_cache,
        "load_average": os.getloadavg(),
    }


def meets_contract(row: dict) -> bool:
    """DESIGN.md's promise for rlloss rows: one graph, ``fullgraph=True`` compiles and runs, no
    recompilation over fresh batches. TorchRL rows are the comparison and always pass."""
    if row["library"] != "rlloss":
        return True
    return (
        row.get("graph_break_count") == 0
        and row.get("fullgraph_ok", False)
        and row.get("recompiles") == 0
        and row.get("distinct_fresh_losses", 0) == row.get("fresh_batches")
    )


# --------------------------------------------------------------------------- #
# Reporting
# --------------------------------------------------------------------------- #
def table_cells(row: dict) -> list[str]:
    """One printed line of the table."""

    def seconds(key: str) -> str:
        return f"{row[key]:.1f}" if key in row else "-"

    recompiles = f"{row['recompiles']}/{row['fresh_batches']}" if "recompiles" in row else "-"
    reasons = row.get("break_reasons") or [row.get("explain_error", "")]
    return [
        row["case"],
        row["library"],
        str(row.get("graph_count", "?")),
        str(row.get("graph_break_count", "?")),
        "yes" if row.get("fullgraph_ok") else "NO",
        recompiles,
        seconds("cold_s"),
        seconds("warm_s"),
        (reasons[0] if reasons else "")[:70],
    ]


def print_table(rows: list[dict]) -> None:
    """The report as a Markdown table, then the full text of every error, break and
    recompilation reason."""
    header = ["case", "library", "graphs", "breaks", "fullgraph", "recompiles", "cold s"]
    header += ["warm s", "first break reason"]
    print("\n".join(text_table(header, [table_cells(row) for row in rows])))
    for row in rows:
        notes = [row.get(k) for k in ("explain_error", "fullgraph_error", "compile_error")]
        notes += row.get("break_reasons", []) + row.get("recompile_reasons", [])
        if row.get("fresh_batches", 0) > 1 and row.get("distinct_fresh_losses", 2) < 2:
            notes.append("fresh batches gave one loss value: the refill did not reach the loss")
        for note in filter(None, notes):
            print(f"  {row['case']} / {row['library']}: {note}")


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
    init_s, rows = measure_all(cfg.cases, cfg.seed, cfg.fresh_batches)
    print_table(rows)
    failing = [f"{r['case']}/{r['library']}" for r in rows if not meets_contract(r)]
    result = {
        "machine": {**machine_info(), **compile_settings()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "method": METHOD,
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
