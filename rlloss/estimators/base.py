"""The value estimators' shared base: ``ValueEstimator``.

TensorDict modules over :mod:`rlloss.functional.returns` with TorchRL's constructor keywords.
Each reads a ``[*B, T]`` batch (time the last batch dim unless ``time_dim`` says otherwise),
calls ``value_network`` on the batch and on ``batch["next"]`` when one is given (writing
``state_value`` and ``("next", "state_value")`` as TorchRL does), and writes ``advantage`` and
``value_target``. ``("next", "terminated")`` stops bootstrapping and ``("next", "done")`` cuts
traces; a batch without ``terminated`` is read with ``done`` in its place, as TorchRL does, with a
warning (truncated steps are then not bootstrapped). The value network's calls shared by every
estimator (values already in the batch, recurrent inputs at ``s'``, the value read back, other
weights swapped in) are in :mod:`rlloss.estimators.value_calls`.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, set_skip_existing
from tensordict.utils import NestedKey
from torch import nn
from torchrl.objectives.utils import hold_out_net

import rlloss.estimators.options as _options
import rlloss.estimators.shifted as _shifted
import rlloss.estimators.value_calls as _calls
from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import (
    Coefficient,
    CoefficientOwner,
    MissingKeyError,
    check_in_range,
    missing_key_message,
    next_key,
    remap_keys,
    warn_terminated_from_done,
)
from rlloss._dispatch import accepts_tensor_arguments
from rlloss._keywords import torchrl_keywords
from rlloss._networks import NetworkCall
from rlloss.estimators.shifted import SHIFTED_VALID_KEY
from rlloss.estimators.value_norm import ValueNormalizer, check_value_normalizer
from rlloss.functional.returns import shifted_flags
from rlloss.training.sequences import recurrent_modules

DEFAULT_GAMMA = 0.99  # TorchRL's default discount, for every loss and estimator
PADDING_MASK_KEY = ("collector", "mask")  # TorchRL's padding mask: padded steps update no moments
DEFAULT_LMBDA = 0.95  # TorchRL's default lambda of TD(lambda) and GAE


# TorchRL's ``*_key`` keywords, removed for set_keys (see rlloss._keywords)
_REMOVED_KEYS = ("advantage_key", "value_target_key", "value_key")


class ValueEstimator(CoefficientOwner, TensorDictModuleBase):
    """Base of the value estimators: key handling, value-network calls, writing the outputs.

    Subclasses implement :meth:`estimate` (tensors in, ``(advantage, value_target)`` out).

    Keywords (TorchRL 0.14.1's ``ValueEstimatorBase``'s, and ``gamma``): ``shifted=True``
    computes ``V(s)`` and ``V(s')`` in one value-network call (:mod:`rlloss.estimators.shifted`;
    ``shifted_budget`` extra slots for truncated steps' next inputs; the kept steps written to
    ``shifted_valid``); ``skip_existing`` (``None``: tensordict's ``skip_existing()``) keeps
    values already in the batch; ``value_chunk_size`` / ``num_chunks`` (alias ``num_chunk``)
    call the network on chunks along ``value_chunk_dim``; ``differentiable=False`` computes the
    outputs without a graph; ``time_dim`` (default: the dim named ``"time"``, else the last);
    ``group_key``: ids to standardise within. ``advantage_key`` / ``value_target_key`` /
    ``value_key`` raise TorchRL's error (use :meth:`set_keys`); ``device``, ``vectorized`` and
    ``deactivate_vmap`` are kept as attributes and change no number (see "Differences from
    TorchRL").

    ``value_normalizer`` (an :class:`rlloss.ValueNormalizer`, not a TorchRL keyword): the value
    network outputs normalised values; the estimator de-normalises what it computes with it
    (values read from the batch are taken as they are, in return units), writes those values,
    and, in training mode, merges the value targets it computes into the normaliser's moments.
    """

    gamma = Coefficient(low=0.0, high=1.0)  # checked on assignment as at construction

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read and written by the estimator (``reward``, ``done``, ``terminated`` are read
        under ``"next"``)."""

        advantage: NestedKey = "advantage"  # written: the advantage, [*B, T, 1]
        value_target: NestedKey = "value_target"  # written: the critic's target, [*B, T, 1]
        value: NestedKey = "state_value"  # read (or written by value_network): V(s), [*B, T, 1]
        reward: NestedKey = "reward"  # read under "next", [*B, T, 1]
        done: NestedKey = "done"  # read under "next": cuts traces, [*B, T, 1]
        terminated: NestedKey = "terminated"  # under "next": stops bootstrapping, [*B, T, 1]
        steps_to_next_obs: NestedKey = "steps_to_next_obs"  # optional: n of gamma**n, [*B, T, 1]
        sample_log_prob: NestedKey = "action_log_prob"  # TorchRL's name (V-trace reads it), [*B, T]

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        value_network: nn.Module | None = None,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        device: torch.device | None = None,
        deactivate_vmap: bool = False,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
        time_dim: int | None = None,
        average_rewards: bool = False,
        vectorized: bool | None = True,
        value_normalizer: ValueNormalizer | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_in_range("gamma", gamma, 0.0, 1.0)
        check_value_normalizer(owner, value_normalizer)
        removed = {"advantage_key": advantage_key, "value_target_key": value_target_key}
        removed["value_key"] = value_key
        torchrl_keywords(self, removed, accepted=(), translated=_REMOVED_KEYS)
        self.value_chunk_size, self.num_chunks, self.value_chunk_dim = _options.chunking(
            owner, value_chunk_size, num_chunks, num_chunk, value_chunk_dim
        )
        self.shifted, self.shifted_budget = _options.shifted_options(owner, shifted, shifted_budget)
        self.gamma = float(gamma)
        self.value_network = value_network
        self._value_call = None if value_network is None else NetworkCall(value_network)
        self._recurrent_modules = [] if value_network is None else recurrent_modules(value_network)
        self.differentiable = differentiable
        self.time_dim = time_dim
        self.average_rewards = average_rewards
        self.group_key = group_key  # the standardisations are per group of its ids
        self.skip_existing = skip_existing  # None: tensordict.nn's skip_existing() at each call
        # TorchRL's implementation switches (vmap over the two value calls, the vectorised
        # recursion) and the device of its buffers: the numbers are the same either way, and
        # rlloss's estimators hold no tensors to place (gamma, lmbda are floats)
        self.vectorized, self.deactivate_vmap, self._device = vectorized, deactivate_vmap, device
        self.tensor_keys = self._AcceptedKeys()
        self.out_keys = [self.tensor_keys.advantage, self.tensor_keys.value_target]
        self.value_normalizer = value_normalizer

    @classmethod
    def for_loss(cls, loss_module: nn.Module, **hyperparams) -> ValueEstimator:
        """An estimator for ``loss_module`` (TorchRL's registry hook): ``value_network`` from the
        keywords, else the loss's ``critic_network``, else its ``value_network``."""
        if "value_network" not in hyperparams:
            network = getattr(loss_module, "critic_network", None)
            hyperparams["value_network"] = (
                getattr(loss_module, "value_network", None) if network is None else network
            )
        return cls(**hyperparams)

    @property
    def in_keys(self) -> list[NestedKey]:
        """The entries read: the value network's inputs (or the values) now and under
        ``"next"``, and reward, done, terminated under ``"next"``."""
        inputs = (
            list(self.value_network.in_keys)
            if self.value_network is not None
            else [self.tensor_keys.value]
        )
        flags = [self.tensor_keys.reward, self.tensor_keys.done, self.tensor_keys.terminated]
        keys = [*inputs, *(next_key(k) for k in [*inputs, *flags]), *self._policy_keys()]
        groups = [] if self.group_key is None else [self.group_key]
        return list(dict.fromkeys([*keys, *groups]))

    def _policy_keys(self) -> list[NestedKey]:
        return []

    def set_keys(self, **kwargs) -> None:
        """Remap keys, as :meth:`rlloss.LossModule.set_keys`."""
        remap_keys(type(self).__name__, self.tensor_keys, self._AcceptedKeys, **kwargs)
        self.out_keys = [self.tensor_keys.advantage, self.tensor_keys.value_target]

    def _padding_mask(self, tensordict: TensorDictBase) -> None:
        """Estimators read every step (padding included): the data checks scan them all."""
        return None

    def _read(self, tensordict: TensorDictBase, name: str, nested: bool = False) -> torch.Tensor:
        full_key = next_key(getattr(self.tensor_keys, name), nested)
        value = tensordict.get(full_key, None)
        if value is None:
            raise MissingKeyError(
                missing_key_message(type(self).__name__, name, full_key, tensordict)
            )
        return value

    def _values(
        self, tensordict: TensorDictBase, params=None, target_params=None, time_dim: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``V(s)``, ``V(s')`` and the kept steps (``None`` unless shifted): read from the batch,
        or written there by ``value_network`` (with ``params`` / ``target_params`` in place of
        its weights when given, TorchRL's functional call; detached, as TorchRL's).

        A differentiable estimator lets gradients reach the inputs of ``V(s)`` but never the
        value network's weights (they are held out of the graph, as in TorchRL), nor ``V(s')``.
        ``skip_existing`` (``None``: ``tensordict.nn.skip_existing()``): values already in the
        batch, now and under ``"next"``, are used without calling the network.
        """
        key = self.tensor_keys.value
        if self._value_call is not None and _calls.uses_existing_values(
            tensordict, key, self.skip_existing
        ):
            params = target_params = None
            call = False
        else:
            call = self._value_call is not None
        if self.shifted and self._value_call is not None:
            return self._shifted_values(tensordict, params, target_params, time_dim, call)
        if params is not None or target_params is not None:
            params = None if params is None else params.detach()
            target_params = params if target_params is None else target_params
            with _calls.weights(self.value_network, params):
                tensordict.set(key, self._chunked_value(tensordict))
            next_tensordict = tensordict.get("next")
            next_inputs = _calls.next_inputs(tensordict, self._recurrent_modules)
            with _calls.weights(self.value_network, target_params):
                next_value = self._chunked_value(next_inputs)
                next_tensordict.set(key, next_value.detach())
        elif call:
            held_out = self.differentiable and torch.is_grad_enabled()
            with hold_out_net(self.value_network) if held_out else contextlib.nullcontext():
                tensordict.set(key, self._chunked_value(tensordict))
                next_tensordict = tensordict.get("next")
                next_inputs = _calls.next_inputs(tensordict, self._recurrent_modules)
                next_value = self._chunked_value(next_inputs)
                next_tensordict.set(key, next_value.detach() if held_out else next_value)
        value = self._read(tensordict, "value")
        return value, self._read(tensordict, "value", nested=True), None

    def _shifted_values(self, tensordict, params, target_params, time_dim: int, call: bool):
        """TorchRL's ``shifted=True``: ``V(s)`` and ``V(s')`` of every kept step from one
        value-network call over the steps' inputs with the next inputs of truncations inserted
        (:mod:`rlloss.estimators.shifted`); ``shifted_valid`` marks the kept steps."""
        owner, key = type(self).__name__, self.tensor_keys.value
        done, terminated = self._read(tensordict, "done", nested=True), self._terminated(tensordict)
        root_slot, valid, insert = _shifted.layout(
            tensordict, done, terminated, self.shifted_budget, time_dim
        )
        if not call:  # skip_existing: the values in the batch
            value = self._read(tensordict, "value")
            return value, self._read(tensordict, "value", nested=True), valid
        if target_params is not None and target_params is not params:
            raise ValueError(
                f"{owner}(shifted=True) computes V(s) and V(s') in one call, with one set of "
                "weights: pass params alone (or target_params=params), or use shifted=False."
            )
        keys = list(dict.fromkeys(self._value_call.in_keys))
        inputs = _shifted.sequence_inputs(
            tensordict, keys, root_slot, insert, self.shifted_budget, time_dim
        )
        held_out = params is None and self.differentiable and torch.is_grad_enabled()
        params = None if params is None else params.detach()
        hold = hold_out_net(self.value_network) if held_out else contextlib.nullcontext()
        with hold, _calls.weights(self.value_network, params):
            values = self._chunked_value(inputs)
        value = _shifted.gather_steps(values, root_slot, time_dim)
        next_value = _shifted.gather_steps(values, root_slot + 1, time_dim)
        if held_out or params is not None:
            next_value = next_value.detach()
        tensordict.set(key, value)
        tensordict.get("next").set(key, next_value)
        return value, next_value, valid

    def _groups(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        """The group ids under ``group_key`` (``None`` without one); a missing entry raises a
        ``KeyError`` naming it."""
        if self.group_key is None:
            return None
        groups = tensordict.get(self.group_key, None)
        if groups is None:
            owner = type(self).__name__
            message = missing_key_message(owner, "group_key", self.group_key, tensordict)
            raise MissingKeyError(f"{message} (group_key: the ids to standardise within)")
        return groups

    def _standardized_rewards(self, reward: torch.Tensor, tensordict: TensorDictBase):
        """TorchRL's ``average_rewards``: the rewards standardised over the batch, or within the
        groups of ``group_key``."""
        groups = self._groups(tensordict)
        if groups is not None:
            return rlf.group_standardize(reward, groups, eps=1e-5)
        return (reward - reward.mean()) / reward.std().clamp_min(1e-5)

    def _estimate_inputs(self, tensordict: TensorDictBase, value: torch.Tensor, valid) -> dict:
        """Inputs of :meth:`estimate` besides the returns' (V-trace's importance ratios, GAE's
        group ids and kept steps)."""
        return {}

    def _terminated(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``("next", "terminated")``; without it, ``done`` (TorchRL's fallback: truncations are
        then taken as terminations), with a warning once per estimator."""
        key = next_key(self.tensor_keys.terminated)
        terminated = tensordict.get(key, None)
        if terminated is not None:
            return terminated
        done = tensordict.get(next_key(self.tensor_keys.done), None)
        if done is None:  # neither flag: the error names the one that matters
            message = missing_key_message(type(self).__name__, "terminated", key, tensordict)
            raise MissingKeyError(message)
        if not self._warned_terminated:
            self._warned_terminated = True
            warn_terminated_from_done(
                type(self).__name__, self.tensor_keys.terminated, self.tensor_keys.done
            )
        return done

    _warned_terminated = False

    def _split_value_net_input(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, ...]:
        """The batch cut along ``value_chunk_dim`` into ``num_chunks`` chunks or chunks of
        ``value_chunk_size`` (one chunk without either, or for an empty batch)."""
        return _options.split(
            type(self).__name__,
            tensordict,
            self.value_chunk_size,
            self.num_chunks,
            self.value_chunk_dim,
        )

    def _chunked_value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``V`` on the batch, the value network called once per chunk (``num_chunks`` /
        ``value_chunk_size``: bounded memory on long rollouts)."""
        dims, owner, key = tensordict.batch_dims, type(self).__name__, self.tensor_keys.value
        if self.num_chunks is None and self.value_chunk_size is None:  # one call, no split
            if not -dims <= self.value_chunk_dim < dims:
                _options.chunk_dim(owner, self.value_chunk_dim, dims)  # raises
            outputs = self._value_call(tensordict)
            value = _calls.network_value(outputs, key, owner, self.value_network)
        else:
            values = [
                _calls.network_value(self._value_call(chunk), key, owner, self.value_network)
                for chunk in self._split_value_net_input(tensordict)
            ]
            value = torch.cat(values, self.value_chunk_dim % dims)
        if self.value_normalizer is None:
            return value
        return self.value_normalizer.denormalize(value)  # the critic's units -> return units

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        target_params=None,
        next_value: torch.Tensor | None = None,
        time_dim: int | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """The value target alone (TorchRL's ``value_estimate``), the batch left unchanged;
        ``next_value``, when given, replaces ``V(s')``."""
        batch = tensordict.copy()
        batch.set("next", tensordict.get("next").copy())
        if next_value is not None:
            batch.set(("next", *_compat.unravel_key(self.tensor_keys.value)), next_value)
            if batch.get(self.tensor_keys.value, None) is None:
                batch.set(self.tensor_keys.value, torch.zeros_like(next_value))
            call, self._value_call = self._value_call, None
            try:
                return self.forward(batch, time_dim=time_dim).get(self.tensor_keys.value_target)
            finally:
                self._value_call = call
        out = self.forward(batch, target_params=target_params, time_dim=time_dim, **kwargs)
        return out.get(self.tensor_keys.value_target)

    @accepts_tensor_arguments
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        params=None,
        target_params=None,
        time_dim: int | None = None,
    ) -> TensorDictBase:
        """Write ``advantage`` and ``value_target`` into ``tensordict`` (returned).
        ``params`` / ``target_params``: weights to call the value network with at ``s`` /
        ``s'`` (TorchRL's functional call). ``time_dim``: the batch's time dim (default: the
        estimator's ``time_dim``, else the dim named ``"time"``, else the last).

        A ``shifted_valid`` entry (written by a shifted estimator, or already in the batch, as
        TorchRL reads it) marks the kept steps: the last kept step of a row is bootstrapped, and
        the dropped steps' advantage and value target are 0 (losses reduce over kept steps)."""
        time_dim = self._time_dim(tensordict, time_dim)
        if self.skip_existing is None:
            return self._estimate_batch(tensordict, params, target_params, time_dim)
        with set_skip_existing(self.skip_existing):  # the value network's modules too
            return self._estimate_batch(tensordict, params, target_params, time_dim)

    def _time_dim(self, tensordict: TensorDictBase, time_dim: int | None) -> int:
        """The time dim, non-negative: ``time_dim``, else the estimator's, else the dim named
        ``"time"``, else the last (TorchRL's rule); out of range: an error naming it."""
        dims = tensordict.batch_dims
        if dims < 1:
            raise ValueError(
                f"{type(self).__name__} expects a batch with a time dimension ([*B, T]); got "
                f"batch_size={tuple(tensordict.batch_size)}."
            )
        time_dim = self.time_dim if time_dim is None else time_dim
        if time_dim is None:
            names = tensordict.names if tensordict._has_names() else ()
            return names.index("time") if "time" in names else dims - 1
        if not -dims <= time_dim < dims:
            raise ValueError(
                f"{type(self).__name__}: time_dim={time_dim} is not a dimension of the batch, "
                f"whose batch_size {list(tensordict.batch_size)} has {dims} dims; pass a "
                f"time_dim in [{-dims}, {dims})."
            )
        return time_dim % dims

    def _estimate_batch(self, tensordict, params, target_params, time_dim: int):
        """:meth:`forward` once its time dim is resolved."""
        with torch.set_grad_enabled(self.differentiable and torch.is_grad_enabled()):
            value, next_value, valid = self._values(tensordict, params, target_params, time_dim)
            if valid is None:  # a mask in the batch is applied, as TorchRL applies it
                valid = tensordict.get(SHIFTED_VALID_KEY, None)
            extra = self._estimate_inputs(tensordict, value, valid)
            steps = tensordict.get(self.tensor_keys.steps_to_next_obs, None)
            reward = self._read(tensordict, "reward", nested=True)
            if self.average_rewards:  # TorchRL's reward standardisation
                reward = self._standardized_rewards(reward, tensordict)
            steps = None if steps is None else steps.view_as(reward)
            gamma = rlf.bootstrap_discount(self.gamma, steps, reward.dtype)
            done = self._read(tensordict, "done", nested=True)
            terminated = self._terminated(tensordict)
            if valid is not None:
                done, terminated = shifted_flags(done, terminated, valid, time_dim)
            advantage, value_target = self.estimate(
                reward=reward,
                value=value,
                next_value=next_value,
                done=done,
                terminated=terminated,
                gamma=gamma,
                time_dim=time_dim,
                **extra,
            )
        if valid is not None:  # the dropped steps' outputs are 0
            advantage, value_target = (
                _shifted.kept(advantage, valid),
                _shifted.kept(value_target, valid),
            )
            tensordict.set(SHIFTED_VALID_KEY, valid)
        tensordict.set(self.tensor_keys.advantage, advantage)
        tensordict.set(self.tensor_keys.value_target, value_target)
        if self.value_normalizer is not None:  # in training mode: the returns enter the moments
            self.value_normalizer.update(value_target.detach(), _update_mask(tensordict, valid))
        return tensordict


def _update_mask(tensordict: TensorDictBase, valid: torch.Tensor | None):
    """The steps whose value targets enter a value normaliser's moments: not padding, kept."""
    padding = tensordict.get(PADDING_MASK_KEY, None)
    if valid is None or padding is None:
        return padding if valid is None else valid
    return padding & valid
