"""What a failed call of a user's network raises: the missing input, the dtype or the input size
that does not match the network's, named with the key, the expected and the actual value and the
fix (:func:`explained`)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn

from rlloss._checks import MissingKeyError

CALL_ERRORS = (
    RuntimeError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
)  # None input: AttributeError


def explained(error: Exception, network, in_keys: list, inputs: list, batch) -> Exception:
    """The error to raise when calling ``network`` on ``inputs`` (the entries ``in_keys`` of
    ``batch``, ``None`` where absent) raised ``error``: a missing input, a dtype or an input
    size that does not match the network's, named with the key, the expected and the actual
    value and the fix; otherwise ``error``'s type with the inputs' shapes added. An error
    already explained by an inner call is returned as it is."""
    if getattr(error, "rlloss_explained", False):
        return error
    network = getattr(network, "template", network)  # an Ensemble: its members' architecture
    name = f"the network {type(network).__name__} (in_keys {list(in_keys)})"
    missing = [key for key, value in zip(in_keys, inputs, strict=True) if value is None]
    given = {k: v for k, v in zip(in_keys, inputs, strict=True) if isinstance(v, torch.Tensor)}
    if missing:
        present = sorted(str(k) for k in _keys(batch))
        new = MissingKeyError(
            f"{name} cannot be called: the TensorDict it reads has no entry {missing[0]!r} (for "
            "a next-state value, the batch's ('next', ...) entry). Entries present there: "
            f"{present}. Store it in the batch, or rename the network's in_keys (or the batch "
            "entry) so they agree."
        )
    else:
        new = _dtype_error(name, network, given) or _size_error(name, network, given, error)
    new.rlloss_explained = True
    return new


def missing_output_error(owner: str, network: str, name: str, key, written) -> MissingKeyError:
    """The ``KeyError`` raised when a network's outputs lack the entry ``tensor_keys.<name>`` the
    loss reads from them: the network, the key, what it writes and the ``set_keys`` call."""
    written = [k for k in written if k != key]
    suggested = repr(written[0]) if len(written) == 1 else "<the key it writes>"
    return MissingKeyError(
        f"{owner}: the {network} wrote no entry {key!r} (tensor_keys.{name}); it writes "
        f"{written}. If that is its {name}, remap it with loss.set_keys({name}={suggested})."
    )


def _keys(batch) -> list:
    if isinstance(batch, TensorDictBase):
        return list(batch.keys(include_nested=True, leaves_only=True))
    return [key for key, value in batch.items() if value is not None]


def _dtype_error(name: str, network, given: dict) -> Exception | None:
    if not isinstance(network, nn.Module):
        return None
    tensors = [*network.parameters(), *network.buffers()]  # a target copy holds buffers only
    parameter = next((t for t in tensors if t.is_floating_point()), None)
    if parameter is None:
        return None
    for key, value in given.items():
        if value.is_floating_point() and value.dtype != parameter.dtype:
            return TypeError(
                f"{name}: the entry {key!r} has dtype {value.dtype}, but the network's "
                f"parameters are {parameter.dtype}. Cast the batch (batch.to({parameter.dtype})) "
                f"or the loss and its networks (loss.to({value.dtype}))."
            )
    return None


def _size_error(name: str, network, given: dict, error: Exception) -> Exception:
    shapes = {key: tuple(value.shape) for key, value in given.items()}
    first = _first_linear(network)
    features = sum(value.shape[-1] for value in given.values() if value.ndim)
    if first is not None and features != first.in_features:
        return ValueError(
            f"{name}: its first layer takes {first.in_features} input features, but the batch's "
            f"entries {shapes} give {features} (their last dims). Check the entry sizes against "
            f"the network's (e.g. the action size of the batch). The call raised: {error}"
        )
    message = f"{name} failed on the batch's entries of shapes {shapes}: {error}"
    try:
        return type(error)(message)
    except Exception:  # an exception type with another signature
        return RuntimeError(message)


def _first_linear(network) -> nn.Linear | None:
    if not isinstance(network, nn.Module):
        return None
    for module in network.modules():
        if isinstance(module, nn.Linear) and not isinstance(module, nn.LazyLinear):
            return module
    return None


def check_action_dtype(distribution, action: torch.Tensor, key, owner: str):
    """A ``TypeError`` when a floating ``action`` has another dtype than the distribution's
    parameters (``log_prob`` would promote silently: a float64 loss from float32 networks)."""
    dtype, base = None, distribution
    while dtype is None and base is not None:  # through Independent / transformed wrappers
        tensors = [v for v in vars(base).values() if isinstance(v, torch.Tensor)]
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
        base = getattr(base, "base_dist", None)
    dtype = dtype or action.dtype
    if dtype != action.dtype:
        raise TypeError(
            f"{owner}: the batch's action {key!r} has dtype {action.dtype}, but the policy's "
            f"distribution ({type(distribution).__name__}) is {dtype}: cast the batch "
            f"(batch.to({dtype})) or the loss and its networks (loss.to({action.dtype}))."
        )
