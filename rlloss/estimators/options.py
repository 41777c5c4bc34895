"""The estimators' value-call options, checked as TorchRL 0.14.1 checks them: chunking
(``value_chunk_size`` / ``num_chunks`` / ``value_chunk_dim``) and the shifted call (``shifted``,
``shifted_budget``), and the split of a batch into chunks."""

from __future__ import annotations

from tensordict import TensorDictBase


def _count(owner: str, name: str, value, minimum: int = 1):
    """``value`` if it is ``None`` or an integer ``>= minimum``; else TorchRL's error, naming
    ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an integer or None, got {type(value)}.")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}.")
    return value


def chunking(owner: str, value_chunk_size, num_chunks, num_chunk, value_chunk_dim) -> tuple:
    """``(value_chunk_size, num_chunks, value_chunk_dim)`` checked: positive integers, the two
    ways of chunking exclusive, ``num_chunk`` an alias of ``num_chunks`` (equal when both are
    given), ``value_chunk_dim`` an integer (its range is checked against each batch)."""
    value_chunk_size = _count(owner, "value_chunk_size", value_chunk_size)
    num_chunks = _count(owner, "num_chunks", num_chunks)
    num_chunk = _count(owner, "num_chunk", num_chunk)
    if num_chunks is not None and num_chunk is not None and num_chunks != num_chunk:
        raise ValueError(
            f"{owner}: num_chunks and num_chunk cannot both be set to different values "
            f"(got {num_chunks} and {num_chunk}); num_chunk is an alias, pass one."
        )
    num_chunks = num_chunk if num_chunks is None else num_chunks
    if value_chunk_size is not None and num_chunks is not None:
        raise ValueError(
            f"{owner}: value_chunk_size and num_chunks cannot both be set (got "
            f"{value_chunk_size} and {num_chunks}); pass value_chunk_size for a chunk size or "
            "num_chunks for a number of chunks."
        )
    if isinstance(value_chunk_dim, bool) or not isinstance(value_chunk_dim, int):
        raise TypeError(
            f"{owner}: value_chunk_dim must be an integer, got {type(value_chunk_dim)}."
        )
    return value_chunk_size, num_chunks, value_chunk_dim


def shifted_options(owner: str, shifted, shifted_budget) -> tuple[bool, int]:
    """``(shifted, shifted_budget)`` checked: a boolean, and an integer ``>= 1``."""
    if shifted is not True and shifted is not False:
        raise ValueError(f"{owner}: shifted must be a boolean, got {shifted!r}.")
    if isinstance(shifted_budget, bool) or not isinstance(shifted_budget, int):
        raise TypeError(f"{owner}: shifted_budget must be an integer, got {shifted_budget!r}.")
    if shifted_budget < 1:
        raise ValueError(f"{owner}: shifted_budget must be >= 1, got {shifted_budget}.")
    return shifted, shifted_budget


def chunk_dim(owner: str, value_chunk_dim: int, batch_dims: int) -> int:
    """``value_chunk_dim`` as a non-negative dim of a batch of ``batch_dims`` dims; out of range:
    an error naming it, the batch's dims and the valid range."""
    if not -batch_dims <= value_chunk_dim < batch_dims:
        raise ValueError(
            f"{owner}: value_chunk_dim={value_chunk_dim} is out of bounds for a batch of "
            f"{batch_dims} dims; pass a value_chunk_dim in [{-batch_dims}, {batch_dims})."
        )
    return value_chunk_dim % batch_dims


def split(
    owner: str, tensordict: TensorDictBase, size, chunks, dim: int
) -> tuple[TensorDictBase, ...]:
    """``tensordict`` cut along ``dim`` into ``chunks`` chunks (sizes differing by at most one,
    as ``torch.tensor_split``) or chunks of ``size`` (one chunk without either, or for an
    empty dim)."""
    dim = chunk_dim(owner, dim, tensordict.batch_dims)
    length = tensordict.shape[dim]
    if length == 0 or (chunks is None and size is None):
        return (tensordict,)
    if chunks is not None:
        base, extra = divmod(length, chunks)
        sizes = [base + 1] * extra + [base] * (chunks - extra)
        return tuple(tensordict.split([n for n in sizes if n], dim))
    return tuple(tensordict.split(size, dim))
