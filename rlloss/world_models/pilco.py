"""``ExponentialQuadraticCost``: PILCO's expected saturating cost of a Gaussian state.

Deisenroth and Rasmussen, "PILCO: A Model-Based and Data-Efficient Approach to Policy Search"
(ICML 2011), eq. 24-25. A smooth, bounded stand-in for a 0-1 cost around a target, whose
expectation under a Gaussian state ``N(m, S)`` has a closed form and analytic gradients in ``m``
and ``S`` (:func:`rlloss.functional.expected_saturating_cost`).
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from rlloss import functional as rlf
from rlloss._data_checks import checks_enabled
from rlloss.common import LossModule, accepts_tensor_arguments


class ExponentialQuadraticCost(LossModule):
    r"""PILCO's saturating cost, its expectation under a Gaussian state, reduced over the batch.

    $$
    \mathcal{L}_{\text{cost}} = \mathbb{E}_{x \sim N(m, S)}
    \Big[1 - \exp\Big(-\frac{1}{2} (x - t)^\top W (x - t)\Big)\Big]
    $$

    TorchRL's ``ExponentialQuadraticCost`` with the same keywords, keys and output: the state's
    mean ``m`` (``[*B, D]``) and covariance ``S`` (``[*B, D, D]``) are read under
    ``tensor_keys.loc`` and ``tensor_keys.scale`` (``("observation", "mean")`` and
    ``("observation", "var")``), the cost written under ``tensor_keys.loss_cost``.

    Reference: Deisenroth and Rasmussen, "PILCO: A Model-Based and Data-Efficient Approach
    to Policy Search" (ICML 2011), eq. 24-25.

    Args:
        target: the target state ``t``, ``[D]`` (default: the origin).
        weights: the symmetric positive semi-definite weight matrix ``W``, ``[D, D]`` (default:
            the identity).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (a ``[*B]`` cost, the output
            TensorDict of batch size ``[*B]``).

    Differences from TorchRL: a bad ``reduction`` or a target / weight matrix of the wrong shape
    is refused by the constructor (TorchRL raises on the first forward, or inside ``linalg``);
    weights that are not symmetric positive semi-definite (``-I``: a cost that falls away from
    the target) are refused at construction and on assignment (``cost.weights = W``), checked
    on the host then (TorchRL returns a number). The state covariance is data: with
    :func:`rlloss.set_checks` on, one that is not symmetric positive semi-definite is refused
    too (a host sync, so off by default).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rlloss import ExponentialQuadraticCost
        >>> cost = ExponentialQuadraticCost(target=torch.zeros(4), reduction="none")
        >>> m, S = (
        ...     torch.randn(8, 4),
        ...     torch.eye(4).expand(8, 4, 4) * 0.1,
        ... )  # Gaussian states: mean, covariance
        >>> td = TensorDict({("observation", "mean"): m, ("observation", "var"): S}, [8])
        >>> print(cost(td)["loss_cost"])  # [8], each in [0, 1]: the expected saturating cost
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read and written by ExponentialQuadraticCost."""

        loc: NestedKey = ("observation", "mean")  # the state mean, [*B, D]
        scale: NestedKey = ("observation", "var")  # the state covariance, [*B, D, D]
        loss_cost: NestedKey = "loss_cost"  # written: the expected cost, [*B] ([] once reduced)

    def __init__(
        self,
        target: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        self.reduction = self._check_reduction(reduction)
        _check_target_and_weights(target, weights)
        self.register_buffer("target", target)
        self.register_buffer("weights", weights)

    def __setattr__(self, name: str, value) -> None:
        if name in ("target", "weights") and "_buffers" in self.__dict__:
            target = value if name == "target" else self._buffers.get("target")
            weights = value if name == "weights" else self._buffers.get("weights")
            _check_target_and_weights(target, weights)  # as at construction
        super().__setattr__(name, value)

    @property
    def in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.loc, self.tensor_keys.scale]

    @property
    def out_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.loss_cost]

    def _target_and_weights(self, mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target ``[D]`` and weights ``[D, D]``, the defaults in ``mean``'s dtype/device."""
        size = mean.shape[-1]
        target = self.target if self.target is not None else mean.new_zeros(size)
        weights = self.weights
        if weights is None:
            weights = torch.eye(size, dtype=mean.dtype, device=mean.device)
        if target.shape[-1] != size or weights.shape != (size, size):
            raise ValueError(
                f"ExponentialQuadraticCost: the state has {size} dimensions but the target has "
                f"shape {tuple(target.shape)} and the weights {tuple(weights.shape)}; build the "
                f"cost with a target [{size}] and weights [{size}, {size}]."
            )
        return target, weights

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The expected cost, reduced; a TensorDict with ``tensor_keys.loss_cost``."""
        mean, covariance = self._get(tensordict, "loc"), self._get(tensordict, "scale")
        if checks_enabled():
            check_positive_semidefinite(
                f"ExponentialQuadraticCost: the state covariance {self.tensor_keys.scale!r}",
                covariance,
                "Store a covariance of the form L @ L.T (variances >= 0).",
            )
        target, weights = self._target_and_weights(mean)
        try:
            cost = rlf.expected_saturating_cost(mean, covariance, target, weights)
        except torch.linalg.LinAlgError as error:  # I + S W not positive definite
            raise ValueError(
                f"ExponentialQuadraticCost: the state covariance {self.tensor_keys.scale!r} "
                "must be symmetric positive semi-definite (I + S W could not be factorised; "
                f"linalg raised: {error}). rlloss.set_checks(True) checks every covariance."
            ) from error
        loss = rlf.reduce(cost, self.reduction)
        batch_size = cost.shape if self.reduction == "none" else torch.Size([])
        return TensorDict({self.tensor_keys.loss_cost: loss}, batch_size=batch_size)


def _check_target_and_weights(target, weights) -> None:
    if target is not None and (not isinstance(target, torch.Tensor) or target.ndim != 1):
        raise ValueError(
            "ExponentialQuadraticCost: target must be a 1-D tensor [D] (the target state), got "
            f"{getattr(target, 'shape', target)!r}."
        )
    if weights is not None:
        square = isinstance(weights, torch.Tensor) and weights.ndim == 2
        if not square or weights.shape[0] != weights.shape[1]:
            raise ValueError(
                "ExponentialQuadraticCost: weights must be a square matrix [D, D] (the "
                f"precision of the cost), got {getattr(weights, 'shape', weights)!r}."
            )
    if weights is not None:
        check_positive_semidefinite(
            "ExponentialQuadraticCost: weights",
            weights,
            "Pass W = A @ A.T or a non-negative diagonal, e.g. torch.eye(D).",
        )
    if target is not None and weights is not None and weights.shape[0] != target.shape[0]:
        raise ValueError(
            f"ExponentialQuadraticCost: target has {target.shape[0]} dimensions but weights "
            f"are {tuple(weights.shape)}; they must describe the same state size."
        )


def check_positive_semidefinite(name: str, matrix: torch.Tensor, fix: str) -> None:
    """Refuse a matrix (or a batch of them) that is not symmetric positive semi-definite,
    within a rounding tolerance relative to its largest entry; reads it on the host (at
    construction, or with :func:`rlloss.set_checks` on)."""
    matrix = matrix.detach().double()
    scale = float(matrix.abs().amax()) if matrix.numel() else 0.0
    tolerance = 1e-6 * max(scale, 1e-12)
    if not torch.isfinite(matrix).all():
        raise ValueError(f"{name} must be finite, got a matrix holding nan or inf.")
    if not torch.allclose(matrix, matrix.mT, rtol=0.0, atol=tolerance):
        raise ValueError(
            f"{name} must be a symmetric positive semi-definite matrix; it is not symmetric "
            "(pass (W + W.T) / 2)."
        )
    smallest = float(torch.linalg.eigvalsh(matrix).amin())
    if smallest < -tolerance:
        raise ValueError(
            f"{name} must be a symmetric positive semi-definite matrix; its smallest eigenvalue "
            f"is {smallest:.4g}. {fix}"
        )
