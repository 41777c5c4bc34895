"""TRL 1.16's own preference-loss code, run on tensors, as the reference of the parity tests.

TRL's trainer modules import ``accelerate`` and ``datasets`` at the top, which the test
environment need not have; the loss code itself needs only ``torch``. So the functions are
taken from the installed TRL's source files by name (``ast``), compiled in a namespace with
``torch``, ``F``, ``math`` and stand-ins for TRL's distributed helpers (one process: identity
gathers), and called with a stand-in trainer (``self``) that carries the hyperparameters and
a stand-in model that returns what TRL's fused LM head returns (per-token log-probs of the
labels, 0 where a label is -100). Nothing of TRL's arithmetic is rewritten here.

Skips the importing test module when TRL 1.16 is not installed (``pip install
rlloss[llm-test]``).
"""

from __future__ import annotations

import ast
import contextlib
import math
import pathlib
import types
import warnings
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F

TRL_VERSION = "1.16.0"


def trl_root() -> pathlib.Path:
    """The installed TRL's package directory; skip the calling test module without TRL 1.16
    (the functions are read by name from 1.16's files)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version != TRL_VERSION:
        pytest.skip(
            f"TRL {TRL_VERSION} is not installed (found {version}): pip install --no-deps "
            f"trl=={TRL_VERSION} (the llm-test extra) to run the TRL parity tests.",
            allow_module_level=True,
        )
    import importlib.util

    return pathlib.Path(importlib.util.find_spec("trl").origin).parent


def _function_source(path: pathlib.Path, qualname: str) -> str:
    """The source of ``qualname`` (``"Class.method"`` or ``"function"``) in ``path``."""
    tree = ast.parse(path.read_text())
    scope, *rest = qualname.split(".")
    for node in tree.body:
        if getattr(node, "name", None) != scope:
            continue
        if not rest:
            return ast.unparse(node)
        for item in node.body:
            if getattr(item, "name", None) == rest[0]:
                item.decorator_list = []  # a @staticmethod: a plain function here
                return ast.unparse(item)
    raise LookupError(f"{qualname} not found in {path}: TRL's layout changed")


def load(relative_path: str, qualname: str, namespace: dict):
    """TRL's function ``qualname`` from ``trl/<relative_path>``, compiled in ``namespace``."""
    source = _function_source(trl_root() / relative_path, qualname)
    exec(compile(source, f"trl/{relative_path}:{qualname}", "exec"), namespace)  # noqa: S102
    return namespace[qualname.split(".")[-1]]


def namespace() -> dict:
    """What TRL's loss code refers to: torch, its functional API, math, and one-process
    stand-ins for the peft / gradient-checkpointing helpers it calls."""
    return {
        "torch": torch,
        "F": F,
        "math": math,
        "warnings": warnings,
        "is_peft_model": lambda model: False,
        "disable_gradient_checkpointing": lambda *args, **kwargs: contextlib.nullcontext(),
        "is_triton_available": lambda: False,
    }


class OneProcess:
    """TRL's ``self.accelerator`` on one process: gathers are the identity."""

    device = torch.device("cpu")

    @staticmethod
    def gather_for_metrics(tensor):
        return tensor

    gather = gather_for_metrics


class FusedHeadModel:
    """A stand-in for TRL's model call ``model(input_ids=..., labels=..., fused_lm_head=True)``:
    the logits of ``input_ids`` come from ``logits_of`` (position ``j`` predicting token
    ``j + 1``, as a causal LM's), and the per-token log-probs of ``labels[:, 1:]`` are TRL's
    ``selective_log_softmax``, 0 where the label is -100."""

    def __init__(self, logits_of, training: bool = True):
        ns = namespace()
        self.selective_log_softmax = load("trainer/utils.py", "selective_log_softmax", ns)
        self.logits_of = logits_of
        self.training = training

    def __call__(self, input_ids, labels, **kwargs):
        logits = self.logits_of(input_ids)[:, :-1]
        targets = labels[:, 1:]
        picked = self.selective_log_softmax(logits, targets.clamp_min(0))
        log_probs = torch.where(targets != -100, picked, 0.0)
        zeros = torch.zeros_like(log_probs)
        return types.SimpleNamespace(
            log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool()
        )


def trainer(**hyperparameters) -> types.SimpleNamespace:
    """A stand-in TRL trainer: one process, training mode, no aux loss, no weighting."""
    base = dict(
        accelerator=OneProcess(),
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
    )
    return types.SimpleNamespace(**base, **hyperparameters)


def dpo_loss(model: FusedHeadModel, inputs: dict, loss_type: str, beta: float, eps: float):
    """``DPOTrainer._compute_loss`` of TRL 1.16 on ``inputs`` (``input_ids`` ``[2B, T]``, the
    chosen rows first; ``attention_mask``, ``completion_mask``, ``ref_chosen_logps``,
    ``ref_rejected_logps``)."""
    compute = load("trainer/dpo_trainer.py", "DPOTrainer._compute_loss", namespace())
    self = trainer(
        model=model,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=eps,
        use_weighting=False,
    )
    return compute(self, model, inputs, False)


def kto_loss(model: FusedHeadModel, inputs: dict, beta: float, weights: tuple[float, float]):
    """``KTOTrainer._compute_loss`` of TRL 1.16 (``loss_type="kto"``, the KL estimate on the
    ``KL_*`` rows, the reference log-probs precomputed)."""
    ns = namespace()
    compute = load("trainer/kto_trainer.py", "KTOTrainer._compute_loss", ns)
    kl_logps = load("trainer/kto_trainer.py", "KTOTrainer._compute_kl_logps", ns)
    self = trainer(
        model=model,
        calculate_KL=True,
        precompute_ref_logps=True,
        loss_type="kto",
        beta=beta,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
    )
    self._compute_kl_logps = types.MethodType(kl_logps, self)
    return compute(self, model, inputs, False)


def simpo_loss(logits: torch.Tensor, labels: torch.Tensor, beta, gamma, eps):
    """``CPOTrainer(loss_type="simpo")``'s loss of TRL 1.16 (``cpo_alpha=0``: SimPO alone):
    ``get_batch_logps(..., average_log_prob=True)`` then ``cpo_loss``, averaged over the
    pairs; ``logits`` ``[2B, T, V]`` and ``labels`` ``[2B, T]``, the chosen rows first."""
    ns = namespace()
    ns["selective_log_softmax"] = load("trainer/utils.py", "selective_log_softmax", ns)
    batch_logps = load("experimental/cpo/cpo_trainer.py", "CPOTrainer.get_batch_logps", ns)
    cpo_loss = load("experimental/cpo/cpo_trainer.py", "CPOTrainer.cpo_loss", ns)
    logps = batch_logps(logits, labels, average_log_prob=True)
    chosen, rejected = logps.chunk(2)
    self = trainer(alpha=0.0, loss_type="simpo", simpo_gamma=gamma, beta=beta)
    self.label_smoothing = eps
    losses, _, _ = cpo_loss(self, chosen, rejected)
    return losses.mean()
