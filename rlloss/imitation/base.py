"""``SupervisedLoss``: what the losses that fit a network to the batch's own entries share
(behaviour cloning, diffusion and chunked policies, GAIL's discriminator, Decision
Transformers, Random Network Distillation's predictor; no TD target, no value estimator): the
trained networks exposed as TorchRL exposes them (``<name>_params``), and the reduction of an
elementwise loss over the batch's valid elements (TorchRL's ``loss_mask_key`` masks and a
loss's own padding mask)."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import check_network
from rlloss.common import LossModule, fill_padding


class SupervisedLoss(LossModule):
    """Base of the imitation, sequence-model and exploration losses.

    Subclasses register their trained networks with :meth:`_register_networks` (each then has
    a ``<name>_params`` TensorDict of views, as TorchRL's ``actor_network_params``) and reduce
    with :meth:`_reduce_valid`.
    """

    def __init__(self, reduction: str | None = None) -> None:
        super().__init__()
        self.reduction = self._check_reduction(reduction)
        self._networks: tuple[str, ...] = ()

    def _register_networks(self, plain: bool = False, **networks) -> None:
        """Hold each network as the attribute of its name (checked: a TensorDict module, or
        with ``plain`` any ``nn.Module`` called on tensors)."""
        owner = type(self).__name__
        for name, network in networks.items():
            if not plain:
                check_network(owner, name, network)
            elif not isinstance(network, nn.Module):
                raise TypeError(
                    f"{owner}: {name} must be a torch.nn.Module called on the observation "
                    f"tensor, got {type(network).__name__}."
                )
            setattr(self, name, network)
        self._networks += tuple(networks)

    def __getattr__(self, name: str):
        if name.endswith("_params") and name[: -len("_params")] in self.__dict__.get(
            "_networks", ()
        ):
            return TensorDict.from_module(getattr(self, name[: -len("_params")]))
        return super().__getattr__(name)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        """No value estimator: nothing to forward."""

    def _without_padding(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``tensordict``, or when its ``loss_mask_key`` masks mark padding a copy whose padded
        elements hold a valid element's content (:func:`rlloss.common.fill_padding`): the
        reduction leaves padding out of the value, this out of the gradient (a NaN input of a
        padded element would reach the weights' gradient through the network's products)."""
        mask = self._loss_mask(tensordict)
        if mask is None:
            return tensordict
        return fill_padding(tensordict, mask.squeeze(-1), self._mask_paths())

    def _valid_mean(self, values: torch.Tensor, batch: TensorDictBase) -> torch.Tensor:
        """A diagnostic's mean over the batch's valid elements (its ``loss_mask_key`` masks)."""
        mask = self._loss_mask(batch)
        mask = None if mask is None else _expand(mask, values, "loss_mask_key mask")
        return rlf.reduce(values, "mean", mask)

    def _reduce_formula(self, formula, batch: TensorDictBase, *args) -> torch.Tensor:
        """``formula(*args, reduction)`` (an elementwise formula of ``rlloss.functional`` that
        takes the reduction last) reduced over the batch's valid elements: by the formula's own
        reduction (one operation, one autograd node, as ``F.mse_loss``'s default) when no
        ``loss_mask_key`` entry masks the loss, else elementwise then :meth:`_reduce_valid`."""
        if self.reduction == "none" or self._loss_mask(batch) is not None:
            return self._reduce_valid(formula(*args, "none"), batch)
        return formula(*args, self.reduction)

    def _reduce_valid(
        self,
        loss: torch.Tensor,
        batch: TensorDictBase,
        valid: torch.Tensor | None = None,
        mask_name: str = "mask",
    ) -> torch.Tensor:
        """``loss`` reduced over the valid elements: those of the batch's ``loss_mask_key``
        masks (``[*B]``) and, when given, of ``valid`` (the loss's own mask, ``True`` where an
        element counts, broadcast over the loss's trailing dims).

        With ``reduction="none"``: the loss with invalid elements set to 0, except that with
        ``valid`` given the valid elements come out flat (``loss[valid]``, TorchRL's
        convention; a data-dependent shape, so a host sync).
        """
        mask = self._loss_mask(batch)
        if mask is not None:
            mask = _expand(mask, loss, "loss_mask_key mask")
        if valid is not None:
            valid = _expand(valid, loss, mask_name)
            mask = valid if mask is None else mask & valid
            if self.reduction == "none":
                return torch.where(mask, loss, 0.0)[mask]
        return rlf.reduce(loss, self.reduction, mask)


def check_target(owner: str, key, target: torch.Tensor, prediction: torch.Tensor) -> None:
    """The demonstrated entry ``key`` fits the network's ``prediction``: the same shape, and no
    float64 target for a float32 network (the loss would be computed in float64 silently). A
    shape and dtype comparison: no host sync."""
    if target.shape != prediction.shape:
        raise ValueError(
            f"{owner}: the demonstrated {key!r} has shape {tuple(target.shape)}, but the actor "
            f"predicts shape {tuple(prediction.shape)}: store demonstrations of the actor's "
            f"action size ({prediction.shape[-1] if prediction.ndim else 1}), or point the "
            "loss at the entry holding them (loss.set_keys(...))."
        )
    if target.dtype == torch.float64 and prediction.dtype != torch.float64:  # silent promotion
        raise TypeError(
            f"{owner}: the demonstrated {key!r} has dtype {target.dtype}, but the actor "
            f"predicts {prediction.dtype}: cast the batch (batch.to({prediction.dtype})) or "
            f"the loss and its networks (loss.to({target.dtype}))."
        )


def zero_padded(values: torch.Tensor, pad: torch.Tensor, finite_only: bool = False):
    """``values`` (``[*B, T, D]``) with the elements ``pad`` marks (``[*B, T]``, ``True`` on
    padding, broadcast over the trailing dims) set to 0, or with ``finite_only`` only those of
    them that are NaN or inf (a chunk a policy also reads keeps its finite padding, as in
    TorchRL). No host sync."""
    if pad.shape != values.shape[: pad.ndim]:
        return values  # the loss's shape check explains the mismatch
    while pad.ndim < values.ndim:
        pad = pad.unsqueeze(-1)
    if finite_only:
        pad = pad & ~torch.isfinite(values)
    return torch.where(pad, torch.zeros((), dtype=values.dtype, device=values.device), values)


def _expand(mask: torch.Tensor, loss: torch.Tensor, name: str) -> torch.Tensor:
    """``mask`` broadcast over ``loss``'s trailing dims (its trailing singleton dims dropped
    first); a ``ValueError`` naming both shapes when it does not fit."""
    shape = mask.shape
    if shape == loss.shape:
        return mask
    while mask.ndim > loss.ndim and mask.shape[-1] == 1:
        mask = mask.squeeze(-1)
    mask = mask.reshape(*mask.shape, *(1,) * (loss.ndim - mask.ndim))
    if mask.ndim != loss.ndim or any(
        m not in (1, n) for m, n in zip(mask.shape, loss.shape, strict=True)
    ):
        raise ValueError(
            f"the {name} has shape {tuple(shape)}, which does not fit the elementwise loss of "
            f"shape {tuple(loss.shape)}: its dims must be the loss's leading dims (e.g. [*B] or "
            "[*B, T] for a loss over [*B, T, D])."
        )
    return mask.expand_as(loss)
