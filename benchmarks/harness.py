"""The overhead harness: one case's methods gated against each other, then timed interleaved.

A case (:mod:`benchmarks.cases`) builds its batches and one factory per method (``plain``,
``rlloss``, ``rlloss-min``, ``torchrl``, ``hand``, ``hand-min``); :func:`run_case` gates every
method against the case's reference (the total loss and every gated gradient, on every batch),
then times each level (``forward``, ``backward``, ``update``) in rotated interleaved rounds and
records the medians and the paired per-round ratios. The method in full: BENCHMARKS.md's
"Method" section (``benchmarks/page.md``).
"""

from __future__ import annotations

import copy
import gc
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
METHODS = ("plain", "rlloss", "rlloss-min", "torchrl", "hand", "hand-min")
# not compiled: the diagnostics-off variants, and the hand-written steps (an eager anchor)
EAGER_ONLY = ("rlloss-min", "hand", "hand-min")
LEVELS = ("forward", "backward", "update")  # "update" last: it changes the weights
MODES = ("eager", "compiled")
RATIOS = (
    ("rlloss", "plain"),
    ("torchrl", "rlloss"),
    ("torchrl", "plain"),
    ("rlloss", "hand"),
    ("rlloss-min", "hand-min"),
    ("rlloss", "hand-min"),  # where rlloss has no diagnostics to switch off
)
METHOD_TEXT = (
    "per step: forward (loss, graph built) | backward (zero_grad(set_to_none) + forward + "
    "backward) | update (backward + Adam step + soft target update); eager or torch.compile'd "
    "loss; 1 CPU thread; interleaved rotated rounds; microseconds per step"
)
DEVICE = torch.device("cpu")  # where the case builders place networks and batches
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # what a block is timed with
CLOCK_TEXT = {"wall": "", "cpu": "; CPU time of the process (time.process_time), not wall time"}
_clock = CLOCKS["wall"]


def use_clock(name: str) -> None:
    """Time the blocks with clock ``name`` (``CLOCKS``) from now on."""
    global _clock
    _clock = CLOCKS[name]


def use_device(name: str) -> None:
    """Place the networks and batches of the cases built from now on on device ``name``."""
    global DEVICE
    DEVICE = torch.device(name)


# --------------------------------------------------------------------------- #
# What a case is
# --------------------------------------------------------------------------- #
class MethodUnavailable(Exception):
    """Raised by a method factory when its implementation cannot be built (not written yet)."""


@dataclass
class Method:
    """One implementation, bound to its own copy of the networks and to one batch."""

    loss: Callable[[], torch.Tensor]  # the forward: the sum of the loss terms
    params: dict[str, torch.Tensor]  # named parameters whose .grad the gate compares
    trainable: tuple[torch.Tensor, ...]  # what the optimizer steps (targets excluded)
    update_targets: Callable[[], None] | None = None  # the target-network update, if any
    # More gradients to gate, by name, read after the backward: those of parameters a library
    # holds stacked (a critic ensemble) and the plain baseline as one module per member.
    gated_grads: Callable[[], dict[str, torch.Tensor]] | None = None
    # sum_i |t_i| over the loss terms (a forward of its own, without gradient): the scale of the
    # total's rounding error in the gate (``None``: the total's own magnitude).
    loss_scale: Callable[[], torch.Tensor] | None = None


@dataclass
class CaseSetup:
    """What a case builder returns: its batches and one method factory per implementation."""

    # Batches by name. The first one is timed; all of them go through the gate.
    batches: dict[str, Any]
    # Method name -> (batch -> Method). Each call must build fresh copies of the networks.
    factories: dict[str, Callable[[Any], Method]]
    description: str = ""
    # The method the others must reproduce (TorchRL where it has the loss).
    reference: str = "torchrl"


# --------------------------------------------------------------------------- #
# The timed steps and the gate
# --------------------------------------------------------------------------- #
def level_steps(method: Method, compiled: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """The three timed levels of one method: ``forward`` (the loss, autograd graph built),
    ``backward`` (zero_grad + forward + backward) and ``update`` (backward + Adam step + target
    update). ``compiled`` wraps the loss in ``torch.compile`` (the same for every method)."""
    loss = torch.compile(method.loss) if compiled else method.loss
    params = method.trainable
    optimizer = torch.optim.Adam(params, lr=1e-6, foreach=True)

    def backward() -> torch.Tensor:
        _zero_grad(params)
        total = loss()
        total.backward()
        return total

    def update() -> torch.Tensor:
        total = backward()
        optimizer.step()
        if method.update_targets is not None:
            method.update_targets()
        return total

    return {"forward": loss, "backward": backward, "update": update}


def _zero_grad(params: tuple[torch.Tensor, ...]) -> None:
    for p in params:
        p.grad = None


def _values(backward: Callable[[], torch.Tensor], method: Method) -> dict[str, torch.Tensor]:
    """The total loss, its scale (``loss_scale``, not compared) and every gated gradient."""
    torch.manual_seed(0)  # methods that draw noise draw the same
    total = backward()
    scale = total.abs() if method.loss_scale is None else method.loss_scale()
    vals = {"loss": total.detach().clone(), "loss_scale": scale.detach().clone()}
    for name, p in method.params.items():
        if p.grad is None:
            raise AssertionError(f"no gradient reached parameter {name}")
        vals[f"grad/{name}"] = p.grad.detach().clone()
    if method.gated_grads is not None:
        for name, grad in method.gated_grads().items():
            vals[f"grad/{name}"] = grad.detach().clone()
    return vals


def _rel_err(a: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """``||a - ref|| / ||scale||`` (``scale`` defaults to ``ref``), in double precision."""
    a, ref = a.double(), ref.double()
    scale = ref if scale is None else scale.double()
    return ((a - ref).norm() / scale.norm().clamp_min(1e-30)).item()


def _compare(vals: dict, ref: dict, rtol: float, batch_name: str, entry: dict) -> None:
    for key, r in ref.items():
        if key == "loss_scale":
            continue
        err = _rel_err(vals[key], r, ref["loss_scale"] if key == "loss" else None)
        if err > entry["max_rel_err"] or math.isnan(err):
            entry["max_rel_err"], entry["worst"] = err, f"{batch_name}:{key}"
        if not err <= rtol:
            entry["ok"] = False


def gate(
    setup: CaseSetup, names: list[str], rtol: float, compiled: bool
) -> tuple[dict[str, dict], dict[str, Method]]:
    """Compare every method with the case's eager reference on every batch: the total loss and
    the gradient of every gated parameter. ``compiled``: the methods' compiled losses are
    compared (with the same eager reference). Returns the per-method report and, for the methods
    that passed, fresh instances on the timed batch (compiled ones already warm)."""
    report: dict[str, dict] = {}
    # Compiled losses draw their noise (RPO, TD3 smoothing, SAC) with inductor's own generator
    # unless told to fall back to eager's; the gate checks the math, so it uses eager's stream.
    with torch._inductor.config.patch(fallback_random=True):
        for batch_name, batch in setup.batches.items():
            reference = setup.factories[setup.reference](batch)
            ref = _values(level_steps(reference, False)["backward"], reference)
            for name in names:
                entry = report.setdefault(name, {"ok": True, "max_rel_err": 0.0, "worst": None})
                if name == setup.reference and not compiled or "unsupported" in entry:
                    continue
                try:
                    method = setup.factories[name](batch)
                    _compare(
                        _values(level_steps(method, compiled)["backward"], method),
                        ref,
                        rtol,
                        batch_name,
                        entry,
                    )
                except Exception as err:  # noqa: BLE001 - any failure of a method fails its gate
                    message = f"{type(err).__name__}: {err}"[:500]
                    if compiled and name == "torchrl" and _is_compile_error(err):
                        # TorchRL's own loss does not compile: a row without it, not a failure
                        entry["unsupported"] = f"does not compile: {message}"
                        continue
                    entry["ok"], entry["error"] = False, message
                    traceback.print_exc()
    if compiled:
        torch._dynamo.reset()  # the timed methods compile afresh, with the default generator
    names = [n for n in names if report[n]["ok"] and "unsupported" not in report[n]]
    timed_batch = next(iter(setup.batches.values()))
    fresh = {name: setup.factories[name](timed_batch) for name in names}
    return report, fresh


def _is_compile_error(err: BaseException) -> bool:
    """Whether ``err`` was raised by torch.compile (dynamo or a backend) rather than the loss."""
    import torch._dynamo.exc as dynamo_exc

    return isinstance(err, (dynamo_exc.BackendCompilerFailed, dynamo_exc.Unsupported))


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #
def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _time_block(step: Callable[[], Any], inner: int, collect: bool = True) -> float:
    if collect:  # a full collection costs ~0.2 s with torchrl imported
        gc.collect()
    gc.disable()
    try:
        _sync()
        t0 = _clock()
        for _ in range(inner):
            step()
        _sync()
        return (_clock() - t0) / inner
    finally:
        gc.enable()


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _summary(xs: list[float], scale: float = 1.0) -> dict[str, float]:
    return {
        "median": _quantile(xs, 0.5) * scale,
        "p25": _quantile(xs, 0.25) * scale,
        "p75": _quantile(xs, 0.75) * scale,
        "min": min(xs) * scale,
        "max": max(xs) * scale,
    }


def time_methods(
    steps: dict[str, Callable[[], Any]],
    repeats: int,
    inner: int,
    warmup: int,
    block_ms: float,
    collect: bool = True,
) -> tuple[dict[str, list[float]], int]:
    """``repeats`` interleaved rounds of every step, rotated one place a round; per step the
    per-step seconds of each round's block, and the block length used. ``collect``: a full
    garbage collection before each block (off for smoke runs, whose times are not read)."""
    names = list(steps)
    if not names:
        return {}, 0
    for name in names:
        for _ in range(warmup):
            steps[name]()
    if inner <= 0:  # calibrate on the slowest method
        slowest = max(_time_block(steps[n], 3, collect) for n in names)
        inner = max(1, round(block_ms / 1e3 / slowest))
    samples: dict[str, list[float]] = {n: [] for n in names}
    # What exists now (networks, batches, torch's and the libraries' own objects) is left out
    # of the collections between blocks: a full collection over it costs ~0.16 s, more than
    # three 50 ms blocks; the garbage the steps make is still collected.
    gc.collect()
    gc.freeze()
    try:
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                samples[name].append(_time_block(steps[name], inner, collect))
    finally:
        gc.unfreeze()
    return samples, inner


# --------------------------------------------------------------------------- #
# One case: gate, then time every level
# --------------------------------------------------------------------------- #
@dataclass
class Config:
    cases: list[str]
    batch_sizes: list[int]
    levels: list[str]
    modes: list[str]
    repeats: int
    inner: int
    warmup: int
    block_ms: float
    rtol: float
    compiled_rtol: float
    seed: int
    require_all: bool
    out: Path
    device: str = "cpu"
    smoke: bool = False
    small_only: bool = False  # each case's small batch size only
    hand_written: bool = False  # the cases and batch sizes of the hand-written comparison
    methods: tuple[str, ...] = METHODS  # the methods to gate and time (the others: not run)
    no_aot_cse: bool = False
    clock: str = "wall"  # "cpu": the process's CPU time (CLOCKS)
    merge: bool = False  # keep the rows of --out that this run does not replace
    critics: dict[str, list[int]] | None = None  # ensemble case -> its numbers of critics


def available_methods(
    setup: CaseSetup, label: str, methods: tuple[str, ...] = METHODS
) -> tuple[list[str], dict[str, dict]]:
    """The ``methods`` of ``setup`` that can be built, and the status of those that cannot."""
    statuses: dict[str, dict] = {}
    available = []
    for name in methods:
        if name not in setup.factories:
            reason = "no such loss in that library"
            if name.startswith("hand"):
                reason = "no hand-written step for this case"
            statuses[name] = {"status": "n/a", "reason": reason}
            continue
        try:
            setup.factories[name](next(iter(setup.batches.values())))
            available.append(name)
        except MethodUnavailable as err:
            statuses[name] = {"status": "skipped", "reason": str(err)}
            print(f"[{label}] {name}: skipped ({err})", file=sys.stderr)
    return available, statuses


def gated_statuses(report: dict[str, dict], statuses: dict[str, dict], label: str) -> dict:
    """``statuses`` completed with the gate's verdict on every gated method."""
    methods_status = dict(statuses)
    for name, rep in report.items():
        if "unsupported" in rep:
            methods_status[name] = {"status": "n/a", "reason": rep["unsupported"]}
            print(f"[{label}] {name}: {rep['unsupported']}", file=sys.stderr)
            continue
        methods_status[name] = {"status": "ok" if rep["ok"] else "FAILED", "gate": rep}
        if not rep["ok"]:
            print(f"[{label}] {name}: gate FAILED {rep}", file=sys.stderr)
    return methods_status


def timed_row(samples: dict[str, list[float]], row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each method's time summary and samples, and the paired ratios."""
    for name, xs in samples.items():
        row["methods"][name]["time_us"] = _summary(xs, 1e6)
        row["methods"][name]["samples_us"] = [x * 1e6 for x in xs]
    for num, den in RATIOS:
        if num in samples and den in samples:
            paired = [a / b for a, b in zip(samples[num], samples[den], strict=True)]
            row["ratios"][f"{num}/{den}"] = _summary(paired)
    return row


def run_case(case: str, setup: CaseSetup, batch_size: int, cfg: Config) -> list[dict]:
    """One row per (mode, level) of ``case`` built at ``batch_size``: every method gated, then
    timed interleaved."""
    available, statuses = available_methods(setup, f"{case} B={batch_size}", cfg.methods)
    rows = []
    for mode in cfg.modes:
        compiled = mode == "compiled"
        names = [n for n in available if not (compiled and n in EAGER_ONLY)]
        if compiled:
            torch._dynamo.reset()  # every method compiles afresh, none hits a cache limit
        t0 = time.perf_counter()
        report, methods = gate(setup, names, cfg.compiled_rtol if compiled else cfg.rtol, compiled)
        gate_s = time.perf_counter() - t0
        methods_status = gated_statuses(report, statuses, f"{case} B={batch_size} {mode}")
        for name in EAGER_ONLY if compiled else ():
            if name in available:
                methods_status[name] = {"status": "n/a", "reason": "eager only"}
        skipped = [n for n, m in methods_status.items() if m["status"] == "skipped"]
        failed = [n for n, m in methods_status.items() if m["status"] == "FAILED"]
        status = "FAILED" if failed or (skipped and cfg.require_all) else "ok"
        steps = {n: level_steps(m, compiled) for n, m in methods.items()}
        for level in cfg.levels:
            samples, inner = time_methods(
                {n: s[level] for n, s in steps.items()},
                cfg.repeats,
                cfg.inner,
                cfg.warmup,
                cfg.block_ms,
                collect=not cfg.smoke,
            )
            row: dict[str, Any] = {
                "case": case,
                "description": setup.description,
                "batch_size": batch_size,
                "mode": mode,
                "level": level,
                "device": str(DEVICE),
                "status": status,
                "inner": inner,
                "clock": cfg.clock,
                "gate_and_compile_s": gate_s,
                "methods": copy.deepcopy(methods_status),
                "ratios": {},
            }
            rows.append(timed_row(samples, row))
    return rows


def single_thread() -> None:
    """One intra-op and one inter-op thread, as every timing here is taken."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set, or parallel work already started
