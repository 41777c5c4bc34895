"""One gradient step as one callable, compiled: sample, loss, backward, optimiser step, priority
write-back, target update.

:func:`compile_update` packages what ``tutorials/compile_and_cudagraphs.py`` writes by hand.
The loss forward, the backward, the optimiser step and the target update run under
``torch.compile`` (dynamo splits them at ``backward()`` and around the optimiser's step: a few
graphs, no recompilation from one batch to the next). With rlloss's samplers
(:class:`rlloss.data.RandomSampler`, :class:`rlloss.data.PrioritizedSampler`) over a plain
``TensorDictReplayBuffer`` of a tensor storage, the draw and the gather of the batch are traced
with the loss (inductor fuses the gathers into the loss's first kernels); any other buffer is
sampled by ``buffer.sample()``, eagerly.
Writing priorities back runs eagerly (``torch.compiler.disable``; rlloss's prioritized sampler
keeps it sync-free).

What the update needs to compile well, and to be captured as a CUDA graph on a GPU:

- **Gradients set to ``None`` before each step**, outside the compiled code (what
  ``optimizer.zero_grad()`` does by default): the backward writes each gradient instead of
  adding it to a zeroed one, and the compiled code holds no zeroing (functionalised, an in-place
  zeroing copies every gradient twice). Under a CUDA graph the gradients are the graph's
  buffers, rewritten by every replay.
- **No host synchronisation** in the loss (rlloss's losses have none) and in the target updater
  (``rlloss.SoftUpdate`` / ``HardUpdate`` have none).
- **On CUDA**: Adam/AdamW with ``capturable=True`` and ``foreach=True`` (the step counter stays on
  the device) and a tensor learning rate (``lr=torch.tensor(3e-4, device="cuda")``) that a
  schedule changes in place (a float learning rate is baked into a CUDA graph).

**CUDA graphs** (``cuda_graph=True``): the first ``warmup`` updates run on a side stream
(compilation, optimiser state, cuDNN/cuBLAS handles), the next is recorded as one CUDA graph
(``torch.cuda.graph``) over a static copy of its batch, and every update after it copies the new
batch into that static batch and replays the graph: one launch for the whole forward, backward,
optimiser step and target update. ``update()`` from a buffer whose sampler is
sync-free on the GPU (:class:`rlloss.data.PrioritizedSampler` over a CUDA storage, no transform)
records the sampling and the priority write-back in the graph too: the whole update is one
replay. With other samplers, sampling and the write-back (read from the static batch, where the
loss wrote its ``td_error``) stay outside the graph, as with ``update(batch)``. Every batch must
have the first one's keys, shapes and dtypes; the returned losses are the graph's output
buffers, overwritten by the next update (``.clone()`` what you keep).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase
from torch import nn

from rlloss._compat import sample_is_a_gather, stored_items, whole_storage

if TYPE_CHECKING:
    from torchrl.data import ReplayBuffer
    from torchrl.objectives.utils import TargetNetUpdater

LOSS_PREFIX = "loss"


def loss_entries(out_keys: Sequence) -> list[str]:
    """The entries a loss module's total is the sum of: ``loss`` and every ``loss_*``."""
    return [k for k in out_keys if isinstance(k, str) and k.split("_")[0] == LOSS_PREFIX]


def clear_gradients(params: Sequence[torch.Tensor]) -> None:
    """``optimizer.zero_grad()`` (gradients set to ``None``) without its profiler record and
    hooks: called before every step, outside the compiled code."""
    for p in params:
        p.grad = None


class Update:
    """One gradient step of ``loss_module`` as one callable, compiled.

    ``update = compile_update(loss, optimizer, target_updater=updater, replay_buffer=rb)``, then
    ``out = update()`` samples a batch from ``rb``, computes the losses, back-propagates their
    sum, steps ``optimizer``, writes the new priorities back to ``rb`` (when its sampler is
    prioritized) and steps ``updater``; ``update(batch)`` takes a batch you sampled yourself.
    It returns the loss module's outputs, detached (read them on the host outside the update).

    Args:
        loss_module: any rlloss (or TorchRL) loss module.
        optimizer: a ``torch.optim.Optimizer`` over the loss module's parameters; every update
            sets their gradients to ``None`` before its backward.
        target_updater: ``rlloss.SoftUpdate`` / ``HardUpdate`` (anything with ``step()``), or
            ``None`` for a loss without target networks.
        replay_buffer: a TorchRL replay buffer to sample from and write priorities back to.
        loss_keys: the entries summed into the total (default: ``loss`` and every ``loss_*``
            entry of ``loss_module.out_keys``).
        compile: ``True`` (``torch.compile`` with its defaults), a dict of ``torch.compile``
            keywords (e.g. ``{"mode": "max-autotune-no-cudagraphs"}``), or ``False`` (eager:
            the same steps, for debugging and comparison).
        cuda_graph: record the step (compiled or not) as a CUDA graph and replay it (module
            docstring); needs the parameters on a CUDA device and a capturable optimiser.
        warmup: with ``cuda_graph``, the updates run before the one recorded (at least 1).

    ``update.step`` is the part that takes a batch (what a CUDA graph would capture). See the
    module docstring for what compiling and CUDA-graph capture need.
    """

    def __init__(
        self,
        loss_module: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        target_updater: TargetNetUpdater | None = None,
        replay_buffer: ReplayBuffer | None = None,
        loss_keys: Sequence[str] | None = None,
        compile: bool | dict = True,
        cuda_graph: bool = False,
        warmup: int = 3,
    ) -> None:
        _check_arguments(loss_module, optimizer, target_updater, replay_buffer, compile)
        if cuda_graph:
            _check_cuda_graph(loss_module, optimizer, warmup)
        self.loss_module, self.optimizer = loss_module, optimizer
        self.target_updater, self.replay_buffer = target_updater, replay_buffer
        self.loss_keys = _checked_loss_keys(loss_module, loss_keys)
        if callable(getattr(target_updater, "prepare", None)):
            target_updater.prepare()  # eager work kept out of the trace (rlloss's updaters)
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        options = compile if isinstance(compile, dict) else {}
        # _run as traced (compiled or not); _step clears the gradients around it
        self._traced_run = torch.compile(self._run, **options) if compile else self._run
        # a buffer whose sample() is a draw and a gather: drawn in the step's own trace
        self.draws_in_step = sample_is_a_gather(replay_buffer)
        self.graph = Captured(self._step, warmup) if cuda_graph else None
        self.sampling_graph = (
            Captured(self._sampled_batch, warmup, lambda: whole_storage(replay_buffer.storage))
            if cuda_graph and samples_on_device(replay_buffer)
            else None
        )

    def _run(self, batch: TensorDictBase | None) -> tuple[TensorDictBase, TensorDictBase]:
        """The step on ``batch`` (``None``: on a batch drawn from the replay buffer in the same
        trace, so that inductor fuses its gathers into the loss's first kernels), and the batch
        it read, where the loss wrote its priorities."""
        if batch is None:
            batch = draw_batch(self.replay_buffer)
        out = self.loss_module(batch)
        total = sum(out[key] for key in self.loss_keys)
        total.backward()
        self.optimizer.step()
        if self.target_updater is not None:
            self.target_updater.step()
        return out.detach(), batch

    def _step(self, batch: TensorDictBase | None) -> tuple[TensorDictBase, TensorDictBase]:
        """Clear the gradients, then :meth:`_run`, compiled (what a CUDA graph records)."""
        clear_gradients(self._params)
        return self._traced_run(batch)

    def step(self, batch: TensorDictBase) -> TensorDictBase:
        """The step on ``batch`` (no sampling, no priority write-back): the loss's outputs."""
        return self._step(batch)[0]

    def _sampled_batch(self) -> TensorDictBase:
        """Sample, step, write the priorities back: the whole update."""
        out, batch = self._step(None if self.draws_in_step else _sample(self.replay_buffer))
        _write_priorities(self.replay_buffer, batch)
        return out

    def __call__(self, batch: TensorDictBase | None = None) -> TensorDictBase:
        if batch is None:
            if self.replay_buffer is None:
                raise TypeError(
                    "update() without a batch samples from the replay buffer, but none was "
                    "given: pass compile_update(..., replay_buffer=rb), or call update(batch)."
                )
            if self.draws_in_step:
                self.replay_buffer.sampler.check_storage(self.replay_buffer.storage)
            if self.sampling_graph is not None:
                return self.sampling_graph()
            if self.graph is None:
                return self._sampled_batch()
            batch = _sample(self.replay_buffer)
        elif not isinstance(batch, TensorDictBase):
            raise TypeError(f"update(batch): batch must be a TensorDict, got {type(batch)}.")
        if self.graph is None:
            out = self.step(batch)
        else:
            out, batch = self.graph(batch)  # the batch the graph read (and wrote td_error to)
        if self.replay_buffer is not None:
            _write_priorities(self.replay_buffer, batch)
        return out


def samples_on_device(replay_buffer) -> bool:
    """Whether sampling from ``replay_buffer`` and writing its priorities can be recorded in the
    update's CUDA graph: a sampler that says so (``capturable``, as
    :class:`rlloss.data.PrioritizedSampler`: no host synchronisation, shapes fixed by the
    capacity) over a storage on a CUDA device, and no transform."""
    sampler = getattr(replay_buffer, "sampler", None)
    storage = getattr(replay_buffer, "storage", None)
    device = getattr(storage, "device", None)
    transform = getattr(replay_buffer, "transform", None)
    return (
        getattr(sampler, "capturable", False)
        and device not in (None, "auto")
        and torch.device(device).type == "cuda"
        and (transform is None or len(transform) == 0)
    )


class Captured:
    """``fn(*batch)`` (a TensorDict or nothing) recorded once as a CUDA graph and replayed.

    The first ``warmup`` calls run on a side stream; the next records ``fn`` on a static copy
    of its batch (recording runs nothing: the replay that follows does the work); later calls
    copy their batch into the static one and replay. Returns ``fn``'s output, buffers that the
    graph owns and rewrites on every replay. ``recording``, when given, returns a context
    manager that the recording runs in (the sampling graph records the replay buffer's storage
    as full: see :func:`rlloss._compat.whole_storage`)."""

    def __init__(self, fn, warmup: int, recording=contextlib.nullcontext) -> None:
        self.fn, self.warmup, self.warmed = fn, warmup, 0
        self.recording = recording
        self.graph = self.static_batch = self.static_out = None
        self.side_stream = torch.cuda.Stream()

    def __call__(self, *batch: TensorDictBase):
        if self.graph is not None:
            if batch:
                self._copy_in(batch[0])
        elif self.warmed < self.warmup:
            self.warmed += 1
            return self._on_side_stream(*batch)
        else:
            self._record(*batch)
        self.graph.replay()
        return self.static_out

    def _copy_in(self, batch: TensorDictBase) -> None:
        try:
            self.static_batch.update_(batch)
        except (KeyError, RuntimeError) as err:
            raise ValueError(
                "compile_update(cuda_graph=True): every batch must have the keys, shapes and "
                f"dtypes of the recorded one ({err})."
            ) from err

    def _on_side_stream(self, *batch: TensorDictBase):
        self.side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side_stream):
            out = self.fn(*batch)
        torch.cuda.current_stream().wait_stream(self.side_stream)
        return out

    def _record(self, *batch: TensorDictBase) -> None:
        self.static_batch = batch[0].clone() if batch else None
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        try:
            with self.recording(), torch.cuda.graph(self.graph):
                self.static_out = self.fn(*([self.static_batch] if batch else []))
        except RuntimeError as err:
            self.graph = None
            raise RuntimeError(
                "compile_update(cuda_graph=True) could not record the update as a CUDA graph: "
                f"{err}. Something in it copies to or synchronises with the host (a CPU tensor, "
                "`.item()`, a sampler or transform that is not sync-free); sample yourself and "
                "call update(batch), or pass cuda_graph=False."
            ) from err


def draw_batch(replay_buffer) -> TensorDictBase:
    """``replay_buffer.sample()`` for a buffer where it is a draw and a gather
    (:func:`rlloss._compat.sample_is_a_gather`), in operations dynamo traces: the same draws for
    a given seed, the same entries, ``index`` and the sampler's info (``priority_weight``) set
    as TorchRL sets them. Call the sampler's ``check_storage`` before, eagerly."""
    index, info = replay_buffer.sampler.draw(replay_buffer.batch_size)
    batch = stored_items(replay_buffer.storage, index)
    for key, value in info.items():
        batch.set(key, value)
    batch.set("index", index)
    return batch


@torch.compiler.disable
def _sample(replay_buffer) -> TensorDictBase:
    return replay_buffer.sample()


@torch.compiler.disable
def _write_priorities(replay_buffer, batch: TensorDictBase) -> None:
    """``replay_buffer.update_tensordict_priority(batch)`` (a no-op without a prioritized
    sampler): the loss wrote the new priorities (its ``td_error``) into ``batch``."""
    update = getattr(replay_buffer, "update_tensordict_priority", None)
    if update is not None:
        update(batch)


def compile_update(
    loss_module: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    target_updater: TargetNetUpdater | None = None,
    replay_buffer: ReplayBuffer | None = None,
    loss_keys: Sequence[str] | None = None,
    compile: bool | dict = True,
    cuda_graph: bool = False,
    warmup: int = 3,
) -> Update:
    """One gradient step as one compiled callable: ``Update`` with the same keywords (see
    :class:`Update` for what each does)."""
    return Update(loss_module, optimizer, target_updater=target_updater,
                  replay_buffer=replay_buffer, loss_keys=loss_keys, compile=compile,
                  cuda_graph=cuda_graph, warmup=warmup)


def _check_arguments(loss_module, optimizer, target_updater, replay_buffer, compile) -> None:
    if not isinstance(loss_module, nn.Module):
        raise TypeError(f"compile_update: loss_module must be an nn.Module, got {loss_module!r}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"compile_update: optimizer must be a torch.optim.Optimizer, got {optimizer!r}."
        )
    if target_updater is not None and not callable(getattr(target_updater, "step", None)):
        raise TypeError(
            "compile_update: target_updater must have a step() method (rlloss.SoftUpdate or "
            f"HardUpdate), got {target_updater!r}."
        )
    if replay_buffer is not None and not callable(getattr(replay_buffer, "sample", None)):
        raise TypeError(
            f"compile_update: replay_buffer must have a sample() method, got {replay_buffer!r}."
        )
    if not isinstance(compile, bool | dict):
        raise TypeError(
            "compile_update: compile must be True, False or a dict of torch.compile keywords, "
            f"got {compile!r}."
        )
    _check_optimizer_parameters(loss_module, optimizer)


def _check_optimizer_parameters(loss_module: nn.Module, optimizer) -> None:
    """The optimizer trains the loss module's own parameters: a loss copies some networks (a Q
    ensemble, a critic shared with the actor), so an optimizer built over the user's modules
    would leave those copies untrained. An optimizer over part of the loss's parameters (one
    optimizer per loss term) is fine; one over other tensors that misses some of the loss's is
    refused."""
    owned = {id(p): name for name, p in loss_module.named_parameters() if p.requires_grad}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if owned and not owned.keys() & held:
        raise ValueError(
            "compile_update: the optimizer holds none of the loss module's parameters; build "
            "it over loss_module.parameters() (after the loss, which may copy the networks)."
        )
    foreign, missing = held - owned.keys(), [owned[i] for i in owned if i not in held]
    if foreign and missing:
        shown = ", ".join(missing[:4]) + (
            f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        )
        raise ValueError(
            f"compile_update: the optimizer holds {len(foreign)} tensors that are not the loss "
            f"module's parameters, and misses the loss's {shown}: the loss trains its own "
            "copies of some networks (a Q ensemble is stacked into the loss), so those would "
            "never be updated. Build the optimizer over loss_module.parameters() (or over "
            "the loss's <name>_params for one term)."
        )


def _check_cuda_graph(loss_module: nn.Module, optimizer, warmup: int) -> None:
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
        raise ValueError(f"compile_update: warmup must be an int >= 1, got {warmup!r}.")
    uncapturable = [
        i for i, group in enumerate(optimizer.param_groups) if group.get("capturable") is False
    ]
    if uncapturable:
        raise ValueError(
            f"compile_update(cuda_graph=True): {type(optimizer).__name__}'s param groups "
            f"{uncapturable} have capturable=False; its step counter would sync with the host "
            f"during the graph: build it with {type(optimizer).__name__}(..., capturable=True, "
            "foreach=True)."
        )
    devices = {p.device.type for p in loss_module.parameters()}
    if devices != {"cuda"} or not torch.cuda.is_available():
        raise ValueError(
            "compile_update(cuda_graph=True) records a CUDA graph: the loss module's parameters "
            f"must all be on a CUDA device (found {sorted(devices)}); move it with "
            "loss.to('cuda') before building the optimizer, or pass cuda_graph=False."
        )


def _checked_loss_keys(loss_module: nn.Module, loss_keys: Sequence[str] | None) -> list[str]:
    out_keys = list(getattr(loss_module, "out_keys", []) or [])
    if loss_keys is None:
        keys = loss_entries(out_keys)
        if not keys:
            raise ValueError(
                f"compile_update: {type(loss_module).__name__}.out_keys ({out_keys}) has no "
                "'loss' or 'loss_*' entry to sum; pass loss_keys=[...]."
            )
        return keys
    keys = [loss_keys] if isinstance(loss_keys, str) else list(loss_keys)
    unknown = [k for k in keys if out_keys and k not in out_keys]
    if not keys or unknown:
        raise ValueError(
            f"compile_update: loss_keys {keys} must name entries of "
            f"{type(loss_module).__name__}'s outputs {out_keys}."
        )
    return keys


__all__ = ["Update", "compile_update"]
