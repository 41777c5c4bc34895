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
from rlloss.common import LossModule


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
