"""Sequence batches for recurrent policies: fixed-length chunks of ``[*B, T]`` trajectories.

A recurrent PPO update (TorchRL's ``LSTMModule`` / ``GRUModule`` in recurrent mode) runs its
networks over whole sequences, backpropagating through time. :func:`chunk_sequences` cuts the
collected trajectories into chunks of ``seq_len`` steps, the unit of a minibatch (rl8's
``seq_len``): each chunk starts from the recurrent state stored at its first step at collection
time (the ``("next", <state>)`` entries the module writes, carried to the following step), so the
update needs no replay of the steps before it; gradients are truncated at chunk starts. The last
chunk of each trajectory is padded and the padding mask (TorchRL's ``("collector", "mask")``,
which the losses read) marks the valid steps.

GAE across chunk boundaries: compute ``advantage`` and ``value_target`` on the unchunked
trajectories first (:class:`rlloss.GAE` on the ``[*B, T]`` rollout), then chunk: the entries
travel with their steps, so ``done`` / ``terminated`` keep their meaning across the cuts and the
targets are those of the whole trajectories. A loss given a chunked batch that already holds
``advantage`` uses it and runs no estimator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

PADDING_MASK_KEY = ("collector", "mask")  # TorchRL's padding mask, which the losses read


def _recurrent_module_types() -> tuple[type, ...]:
    from torchrl.modules import GRUModule, LSTMModule

    return (LSTMModule, GRUModule)


def recurrent_modules(*networks: nn.Module) -> list[nn.Module]:
    """The TorchRL ``LSTMModule`` / ``GRUModule`` instances inside ``networks`` (each once)."""
    found = {}
    for network in networks:
        for module in network.modules():
            if isinstance(module, _recurrent_module_types()):
                found[id(module)] = module
    return list(found.values())


def recurrent_state_keys(*networks: nn.Module) -> list[NestedKey]:
    """The entries holding the recurrent states that the ``LSTMModule`` / ``GRUModule`` inside
    ``networks`` read (``recurrent_state_h`` and ``recurrent_state_c`` by default), each once:
    the ``state_keys`` of :func:`chunk_sequences`."""
    keys = [key for m in recurrent_modules(*networks) for key in m.in_keys[1:-1]]
    return list(dict.fromkeys(keys))


def chunk_sequences(
    batch: TensorDictBase,
    seq_len: int,
    *,
    state_keys: Iterable[NestedKey],
    is_init_key: NestedKey = "is_init",
    mask_key: NestedKey = PADDING_MASK_KEY,
) -> TensorDictBase:
    """``batch`` (``[*B, T]``, time last) cut into chunks of ``seq_len`` steps: ``[N, seq_len]``
    with ``N = prod(B) * ceil(T / seq_len)``, the chunks of each trajectory in time order.

    Every entry (``"next"`` included) is cut the same way, so each chunk's first step holds the
    recurrent state stored there at collection (``state_keys``, one per step as TorchRL's modules
    store them) and its ``is_init`` marks. The last chunk of a trajectory whose length is not a
    multiple of ``seq_len`` is padded with zeros (``False``); ``mask_key`` is ``True`` on the
    valid steps (combined with a mask the batch already holds). Compute GAE before chunking (see
    the module docstring).

    The padding is trailing, as recurrent networks need: the losses give padded steps the
    content of a valid step (NaN-safe masking), which a step in the middle of a sequence would
    feed into the recurrence of the steps after it. A mask the batch already holds must
    likewise mark trailing padding only.

    Args:
        batch: the trajectories, ``[*B, T]``; holds ``is_init_key`` and ``state_keys``.
        seq_len: the chunk length, ``>= 1``.
        state_keys: the entries of the stored recurrent states
            (:func:`recurrent_state_keys` of the networks); checked present.
        is_init_key: the trajectory-start marker the recurrent modules read.
        mask_key: where the padding mask is written.

    Returns:
        The chunks, a new TensorDict of batch size ``[N, seq_len]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torchrl.modules import (
        ...     GRUModule,
        ...     ProbabilisticActor,
        ...     ValueOperator,
        ...     set_recurrent_mode,
        ... )
        >>> from rlloss import GAE, ClipPPOLoss, chunk_sequences, recurrent_state_keys
        >>> gru = GRUModule(
        ...     input_size=3,
        ...     hidden_size=8,
        ...     in_keys=["observation", "h", "is_init"],
        ...     out_keys=["x", ("next", "h")],
        ... )
        >>> actor = ProbabilisticActor(
        ...     TensorDictSequential(
        ...         gru, TensorDictModule(torch.nn.Linear(8, 2), ["x"], ["logits"])
        ...     ),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> rollout = TensorDict(
        ...     {
        ...         "observation": torch.randn(2, 20, 3),
        ...         "action": torch.randint(2, (2, 20)),
        ...         "action_log_prob": torch.full((2, 20), -0.69),
        ...         "h": torch.zeros(2, 20, 1, 8),
        ...         "is_init": torch.zeros(2, 20, 1, dtype=torch.bool).index_fill_(
        ...             1, torch.tensor([0]), True
        ...         ),
        ...         "next": {
        ...             "observation": torch.randn(2, 20, 3),
        ...             "reward": torch.randn(2, 20, 1),
        ...             "done": torch.zeros(2, 20, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(2, 20, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [2, 20],
        ... )  # [B, T], the stored recurrent state "h" at each step
        >>> with torch.no_grad():
        ...     rollout = GAE(gamma=0.99, lmbda=0.95, value_network=critic)(rollout)
        >>> chunks = chunk_sequences(rollout, 8, state_keys=recurrent_state_keys(actor, critic))
        >>> print(
        ...     chunks.shape
        ... )  # [6, 8]: 3 chunks a trajectory, the last padded (("collector", "mask"))
        >>> loss = ClipPPOLoss(actor, critic)
        >>> with set_recurrent_mode(True):
        ...     losses = loss(chunks[:4])
    """
    _check_chunk_arguments(batch, seq_len, [is_init_key, *state_keys])
    time = batch.shape[-1]
    num_chunks = math.ceil(time / seq_len)
    padded_time = num_chunks * seq_len
    rows = batch.reshape(-1, time)
    valid = torch.arange(padded_time, device=rows.device) < time
    valid = valid.expand(rows.shape[0], padded_time)
    existing = rows.get(mask_key, None)
    if existing is not None:
        valid = valid & _padded(existing.reshape(rows.shape), padded_time)
    chunks = rows.apply(lambda x: _padded(x, padded_time), batch_size=[rows.shape[0], padded_time])
    chunks.set(mask_key, valid)
    return chunks.reshape(rows.shape[0] * num_chunks, seq_len)


def _padded(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` (``[N, T, ...]``) padded with zeros to ``[N, length, ...]`` along dim 1."""
    if x.shape[1] == length:
        return x
    padding = x.new_zeros(x.shape[0], length - x.shape[1], *x.shape[2:])
    return torch.cat([x, padding], 1)


def _check_chunk_arguments(batch: TensorDictBase, seq_len: int, keys: list[NestedKey]) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(
            f"chunk_sequences: seq_len must be an integer >= 1 (steps per chunk), got {seq_len!r}."
        )
    if batch.batch_dims < 1:
        raise ValueError(
            "chunk_sequences: the batch needs a time dimension (batch_size [*B, T], time last); "
            f"got batch_size={tuple(batch.batch_size)}."
        )
    present = sorted(str(k) for k in batch.keys(include_nested=True, leaves_only=True))
    for key in keys:
        if batch.get(key, None) is None:
            raise KeyError(
                f"chunk_sequences: the batch has no entry {key!r}. A chunk starts from the "
                "recurrent state stored at its first step and resets where is_init marks a new "
                "trajectory: store both at collection (TorchRL's InitTracker writes is_init; an "
                "LSTMModule / GRUModule writes its states under ('next', ...), carried to the "
                f"following step), or pass the keys you store them under. Entries present: "
                f"{present}."
            )
