"""What the world-model losses share: running the world model on a copy of the batch with the
real labels moved aside, per-step reductions, reconstruction errors, logits under a legacy key.
"""

from __future__ import annotations

import warnings

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import check_in_range, next_key
from rlloss._networks import CALL_ERRORS, explained_module_error
from rlloss.common import LossModule


class WorldModelLossBase(LossModule):
    """A loss that calls ``world_model`` on a batch of real transitions.

    The ground-truth entries ``("next", <name>)`` (``reward``, ``done``...) are moved to
    ``("next", true_<name>)`` in a shallow copy of the batch before the world model runs, so the
    model writes its predictions under the original keys; the caller's batch is not modified.
    Weights (``lambda_*``, ``*_weight``) are checked (>= 0) and kept as attributes.
    """

    def __init__(self, world_model: nn.Module, *, global_average: bool = False, **weights) -> None:
        super().__init__()
        if not callable(world_model):
            raise TypeError(
                f"{type(self).__name__}: world_model must be a module called on a TensorDict, "
                f"got {type(world_model).__name__}."
            )
        for name, value in weights.items():
            check_in_range(name, value, 0.0)
        self.world_model = world_model
        self.global_average = global_average
        self.__dict__.update(weights)
        self.__dict__["_weight_names"] = tuple(weights)

    def __setattr__(self, name: str, value) -> None:
        if name in self.__dict__.get("_weight_names", ()):
            check_in_range(name, value, 0.0)  # a weight assigned later (a schedule) too
        super().__setattr__(name, value)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(getattr(self.world_model, "in_keys", []))

    def _run_world_model(
        self, tensordict: TensorDictBase, labels: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> TensorDictBase:
        """The world model's output on a copy of ``tensordict`` whose ``("next", label)`` entries
        (``labels``: required, ``optional``: moved when present) are under ``true_<label>``."""
        batch = tensordict.copy()
        for name in labels + optional:
            value = self._read(tensordict, name, nested=True)
            if value is None and name in optional:
                continue
            if value is None:
                self._get(tensordict, name, nested=True)  # the missing-key error
            batch.set(next_key(getattr(self.tensor_keys, f"true_{name}")), value)
            del batch[next_key(getattr(self.tensor_keys, name))]
        try:
            output = self.world_model(batch)
        except (*CALL_ERRORS, KeyError) as error:
            raise world_model_error(type(self).__name__, self.world_model, batch, error) from error
        return batch if output is None else output

    def _per_step(self, error: torch.Tensor, batch_size: torch.Size) -> torch.Tensor:
        """``error`` summed over its event dims (``[*batch_size]``), or as is with
        ``global_average`` (its mean is then over every element)."""
        if self.global_average:
            return error
        return error.reshape(*batch_size, -1).sum(-1)

    def _heads(self) -> tuple[list, list]:
        """The observation keys and their reconstruction keys, as lists."""
        targets, predictions = self.tensor_keys.pixels, self.tensor_keys.reco_pixels
        as_list = lambda key: list(key) if isinstance(key, list) else [key]  # noqa: E731
        return as_list(targets), as_list(predictions)

    def _get_next(self, output: TensorDictBase, key: NestedKey, name: str) -> torch.Tensor:
        """``output[("next", key)]``; a clear ``KeyError`` naming ``tensor_keys.<name>``."""
        value = output.get(next_key(key), None)
        if value is None:
            raise KeyError(
                f"{type(self).__name__}: the world model's output has no {next_key(key)!r} "
                f"(tensor_keys.{name}); keys present: {list(output.keys(True))}."
            )
        return value


def reconstruction_error(
    target: torch.Tensor, prediction: torch.Tensor, kind: str, symlog: bool
) -> torch.Tensor:
    """``|symlog(x) - symlog(x_hat)|^p`` elementwise (``p = 2`` for ``"l2"``, 1 for ``"l1"``);
    without ``symlog``, integer images are scaled to [0, 1] (DreamerV3's decoder targets)."""
    if symlog:
        target, prediction = rlf.symlog(target), rlf.symlog(prediction)
    else:
        if not target.is_floating_point():
            target = target.float() / 255.0
        prediction = prediction.float()
    error = target - prediction
    return error.square() if kind == "l2" else error.abs()


def imagined_lambda_target(loss, fake_data: TensorDictBase, actor_loss: str) -> torch.Tensor:
    """The ``lambda_target`` of the imagined trajectories a value loss regresses on; a clear
    ``KeyError`` naming the actor loss that writes it when the batch has none."""
    target = fake_data.get("lambda_target", None)
    if target is None:
        raise KeyError(
            f"{type(loss).__name__}: the batch has no 'lambda_target' (keys present: "
            f"{list(fake_data.keys(True))}); pass the imagined trajectories the actor loss "
            f"returns ({actor_loss} writes lambda_target)."
        )
    return target


def legacy_logits(loss, outputs, name: str, fallback: str, nested: bool = False) -> torch.Tensor:
    """The logits under ``tensor_keys.<name>``, else (TorchRL's deprecated layout) under
    ``tensor_keys.<fallback>`` with TorchRL's ``DeprecationWarning``."""
    key = next_key(getattr(loss.tensor_keys, name), nested)
    logits = outputs.get(key, None)
    if logits is not None:
        return logits
    legacy = next_key(getattr(loss.tensor_keys, fallback), nested)
    logits = outputs.get(legacy, None)
    if logits is None:
        raise KeyError(
            f"{type(loss).__name__}: no logits under {key!r} (tensor_keys.{name}) nor "
            f"{legacy!r}; keys present: {list(outputs.keys(True))}."
        )
    kind = "reward" if name.startswith("reward") else "value"
    warnings.warn(
        f"Storing DreamerV3 categorical {kind} logits under the decoded {kind} key "
        f"{_compat.unravel_key(legacy)!r} is deprecated and will be removed in v0.16. Write "
        f"logits to the configured {name} key instead.",
        DeprecationWarning,
        stacklevel=4,
    )
    return logits


def world_model_error(owner: str, model: nn.Module, batch: TensorDictBase, error) -> Exception:
    """What a failed call of the world model raises: a missing input named (a ``KeyError``), a
    floating entry of another dtype than the model's parameters (a ``TypeError``), otherwise a
    ``ValueError`` listing the entries the model reads with their shapes and dtypes."""
    if isinstance(error, KeyError):
        return explained_module_error(error, model, batch)
    in_keys = list(getattr(model, "in_keys", []))
    entries = {key: batch.get(key, None) for key in in_keys}
    entries = {key: value for key, value in entries.items() if isinstance(value, torch.Tensor)}
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    for key, value in entries.items():
        if parameter is not None and value.is_floating_point() and value.dtype != parameter.dtype:
            return TypeError(
                f"{owner}: the batch's {key!r} has dtype {value.dtype}, but the world model's "
                f"parameters are {parameter.dtype}: cast the batch (batch.to({parameter.dtype})) "
                f"or the loss (loss.to({value.dtype}))."
            )
    shapes = {key: tuple(value.shape) for key, value in entries.items()}
    return ValueError(
        f"{owner}: the world model {type(model).__name__} failed on the batch's entries "
        f"{shapes}: check each entry's size against the model's layers (e.g. the action size). "
        f"The model raised: {error}"
    )
