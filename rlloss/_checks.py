"""Keys, errors and argument checks: the leaf every rlloss module may import.

This module imports nothing from rlloss (a test holds it to that), so no import loop can pass
through it. The checks compare Python numbers and shapes only: they never synchronise host and
device, and under ``torch.compile`` they run once, at trace time. The opt-in scan of batches for
non-finite values (``set_checks``, which syncs) is in :mod:`rlloss._data_checks`, the checks of
a state dict being loaded in :mod:`rlloss._state_checks`.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey


class MissingKeyError(KeyError):
    """A ``KeyError`` whose message prints as written (``KeyError`` quotes its argument)."""

    def __str__(self) -> str:
        return str(self.args[0])


def missing_key_message(owner: str, name: str, key: NestedKey, tensordict: TensorDictBase) -> str:
    """The text of the ``KeyError`` raised for a missing input entry: the owner, the key, the
    entries present and the ``set_keys`` call that remaps it."""
    present = sorted(str(k) for k in tensordict.keys(include_nested=True, leaves_only=True))
    return (
        f"{owner}: the input TensorDict has no entry {key!r} (tensor_keys.{name}). "
        f"Entries present: {present}. If the data is stored under another key, remap it with "
        f"loss.set_keys({name}=<your key>)."
    )


def next_key(key: NestedKey, nested: bool = True) -> NestedKey:
    """``("next", *key)`` when ``nested``, else ``key``."""
    if not nested:
        return key
    return ("next", *((key,) if isinstance(key, str) else key))


class UnknownKeyError(ValueError, KeyError):
    """``set_keys`` with a name the module does not have (a ``ValueError`` as TorchRL's losses
    raise, and a ``KeyError`` as its value estimators do)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def remap_keys(owner: str, tensor_keys, accepted_keys: type, **kwargs: NestedKey | None) -> None:
    """``set_keys`` of losses and estimators: set ``tensor_keys.<name> = key`` for each keyword
    (``None`` restores the default); an unknown name raises ``ValueError`` listing the valid ones.

    Args:
        owner: the class name, for the message.
        tensor_keys: the instance of ``accepted_keys`` to update in place.
        accepted_keys: the ``_AcceptedKeys`` dataclass declaring the names and their defaults.
    """
    valid = [field.name for field in dataclasses.fields(accepted_keys)]
    unknown = [name for name in kwargs if name not in valid]
    if unknown:
        raise UnknownKeyError(
            f"{owner}.set_keys got unknown key name(s) {unknown}; valid names are {valid}."
        )
    defaults = accepted_keys()
    for name, key in kwargs.items():
        setattr(tensor_keys, name, getattr(defaults, name) if key is None else key)


def check_in_range(
    name: str,
    value,
    low=None,
    high=None,
    *,
    low_open=False,
    high_open=False,
    integer=False,
    finite=False,
):
    """Raise ``ValueError`` naming ``name`` and the accepted range if ``value`` is outside it
    (or, with ``integer``, is not a whole number: ``2.5`` is not silently truncated to 2; with
    ``finite``, is infinite; NaN is refused always); a ``TypeError`` if it is not a number. A
    0-dim tensor is read on the host: callers check a device tensor only where a sync is
    acceptable."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        if not hasattr(value, "__float__") or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, got {value!r}.")
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(f"{name} must be a number, got a tensor of shape {tuple(value.shape)}.")
    number = value
    value = float(value)
    if value != value:  # NaN is in no range
        raise ValueError(f"{name} must be a number, got nan.")
    if integer and (value in (float("inf"), float("-inf")) or value != int(value)):
        raise ValueError(f"{name} must be an integer, got {number!r}.")
    if finite and value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number, got {value}.")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        low_text = "-inf" if low is None else low
        high_text = "inf" if high is None else high
        shown = number if isinstance(number, (int, float)) else value
        raise ValueError(f"{name} must be in {left}{low_text}, {high_text}{right}, got {shown}.")


class Coefficient:
    """A scalar hyperparameter of a module, declared on its class, checked on every assignment.

    ``entropy_coeff = Coefficient(low=0.0, buffer=True)`` in a class body (of a
    :class:`CoefficientOwner`: every rlloss loss and policy-loss add-on) declares the attribute;
    :meth:`CoefficientOwner._register_coefficients` stores its first value; on a plain object
    (an updater, ``KLEarlyStopping``) a plain assignment does, Python's own descriptor rule
    needing no mixin there. The range keywords
    are :func:`check_in_range`'s (``finite=True`` alone: any finite number): a number assigned
    at construction or later (``loss.entropy_coeff = 0.02``, a schedule) outside it raises its
    ``ValueError``, naming the attribute and the range, and changes nothing; a tensor is checked
    when it is a CPU scalar (reading a device tensor would synchronise). Without a range the
    value is not checked.

    ``buffer=True``: a 0-dim buffer, in ``state_dict``; a number assigned later is written into
    it in place, so a compiled graph that reads it stays valid (TorchRL's
    ``_schedulable_buffers`` rule, and the class lists the name in ``_all_schedulable_buffers``
    as TorchRL's do); a tensor replaces it and ``None`` leaves a plain ``None`` attribute
    (``nn.Module``'s rules). A parameter may hold the name instead (SAC's ``log_alpha``).
    Otherwise the attribute is a plain number, an ``int`` with ``integer``, else a ``float``.

    ``at_most`` / ``at_least``: the name of the attribute this one must not exceed / fall below
    (a pair of bounds, KLPEN's ``beta_min <= beta_max``), checked on every assignment once both
    are set (:func:`check_bounds_order`; ``None`` is unbounded).
    """

    def __init__(
        self,
        low=None,
        high=None,
        *,
        low_open=False,
        high_open=False,
        integer=False,
        finite=False,
        buffer=False,
        at_most: str | None = None,
        at_least: str | None = None,
    ) -> None:
        self.order = (at_most, at_least)
        self.range = {"low": low, "high": high, "low_open": low_open, "high_open": high_open}
        self.range.update(integer=integer, finite=finite)
        self.checked = low is not None or high is not None or integer or finite
        self.buffer = buffer
        self.name = self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        # A plain value lives in the instance dict under another name than the attribute's:
        # torch.compile (dynamo 2.11) reads ``module.__dict__[name]`` as ``getattr(module,
        # name)``, which would call this descriptor again, without end.
        self.name, self.slot = name, f"_coefficient_{name}"

    def check(self, value, name: str | None = None) -> None:
        """:func:`check_in_range` of ``value`` (``None`` passes), under ``name`` (default: the
        attribute's)."""
        if self.checked and value is not None:
            check_in_range(name or self.name, value, **self.range)

    def register(self, module: torch.nn.Module, value, device=None) -> None:
        """Check ``value`` and store it as the attribute's first value: a buffer coefficient as
        a 0-dim buffer on ``device`` (``None``: a plain ``None`` attribute)."""
        self.check(value)
        if self.buffer and value is not None:
            module.__dict__.pop(self.slot, None)
            module.register_buffer(self.name, torch.tensor(float(value), device=device))
        else:
            self.__set__(module, value)

    def __get__(self, module, owner=None):
        if module is None:
            return self
        state = module.__dict__
        name, slot = self.name, self.slot
        if slot in state:
            return state[slot]
        buffers = state.get("_buffers", {})  # absent before nn.Module.__init__
        if name in buffers:
            return buffers[name]
        parameters = state.get("_parameters", {})
        if name in parameters:
            return parameters[name]
        raise AttributeError(f"'{type(module).__name__}' object has no attribute '{name}'")

    def check_order(self, module, value) -> None:
        """Refuse ``value`` on the wrong side of its partner bound (``at_most``/``at_least``),
        once the partner is set."""
        at_most, at_least = self.order
        if at_most is not None:
            check_bounds_order(self.name, value, at_most, getattr(module, at_most, None), self.name)
        if at_least is not None:
            check_bounds_order(
                at_least, getattr(module, at_least, None), self.name, value, self.name
            )

    def __set__(self, module, value) -> None:
        if _readable_number(value):
            self.check(value)
            self.check_order(module, value)
        name = self.name
        buffers = module.__dict__.get("_buffers", {})  # none on a plain object (an updater)
        current = buffers.get(name)
        if current is not None and isinstance(value, (int, float)):  # a schedule's step
            with torch.no_grad():
                current.copy_(torch.as_tensor(value, dtype=current.dtype, device=current.device))
        elif name in buffers or name in module.__dict__.get("_parameters", {}):
            torch.nn.Module.__setattr__(module, name, value)  # nn.Module's rules
        elif isinstance(value, torch.nn.Parameter):
            module.__dict__.pop(self.slot, None)
            module.register_parameter(name, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            module.__dict__[self.slot] = int(value) if self.range["integer"] else float(value)
        else:
            module.__dict__[self.slot] = value

    def __repr__(self) -> str:
        shown = {key: value for key, value in self.range.items() if value not in (None, False)}
        return f"Coefficient({self.name!r}, buffer={self.buffer}, {shown})"


class CoefficientOwner:
    """Mixin of the modules that declare :class:`Coefficient` attributes: ``nn.Module``'s
    ``__setattr__`` stores tensors itself, skipping data descriptors; here an assignment to a
    declared coefficient goes to the descriptor (Python's own rule).

    ``_choices`` (a class attribute: name -> accepted values, a subclass extends its base's)
    lists the string settings checked at construction (``reduction``, ``loss_function``...):
    a later assignment outside them raises :func:`check_choice`'s ``ValueError`` and changes
    nothing. They stay plain attributes (read at plain-attribute speed)."""

    _choices: dict[str, tuple] = {}

    def __setattr__(self, name: str, value) -> None:
        if isinstance(getattr(type(self), name, None), Coefficient):
            object.__setattr__(self, name, value)  # Coefficient.__set__
            return
        choices = type(self)._choices.get(name)
        if choices is not None:
            check_choice(name, value, choices)
        super().__setattr__(name, value)

    def _register_coefficients(self, device=None, **values) -> None:
        """Check and store the first value of each declared coefficient named in ``values``
        (buffers on ``device``; see :meth:`Coefficient.register`)."""
        for name, value in values.items():
            getattr(type(self), name).register(self, value, device)

    @classmethod
    def _coefficients(cls) -> dict[str, Coefficient]:
        """The declared coefficients, by name (those of the bases included)."""
        found = {}
        for base in reversed(cls.__mro__):
            found.update((k, v) for k, v in vars(base).items() if isinstance(v, Coefficient))
        return found


def _readable_number(value) -> bool:
    """Whether ``value`` can be range-checked without a host sync."""
    if isinstance(value, torch.Tensor):
        return value.device.type == "cpu" and value.numel() == 1
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_choice(name: str, value, choices) -> None:
    """Raise ``ValueError`` naming ``name`` and the accepted values if ``value`` is not one."""
    if value not in choices:
        also = getattr(choices, "also", "")
        raise ValueError(f"{name} must be one of {tuple(choices)}{also}, got {value!r}.")


class ChoicesOr(tuple):
    """String choices (a ``_choices`` entry) that also admit the values of other types that
    ``admits`` accepts (a callable loss function, a spec, ``None``); ``also`` says which, in
    :func:`check_choice`'s message. A string outside the choices is refused."""

    def __new__(cls, choices, admits, also: str):
        made = super().__new__(cls, choices)
        made.admits, made.also = admits, also
        return made

    def __contains__(self, value) -> bool:
        if isinstance(value, str):
            return tuple.__contains__(self, value)
        return bool(self.admits(value))


def check_bounds_order(low_name: str, low, high_name: str, high, assigned: str) -> None:
    """Refuse a lower bound above its upper bound (either ``None``: unbounded), naming the
    attribute just ``assigned`` (one of the two names), both values and the fix."""
    if low is None or high is None or not _readable_number(low) or not _readable_number(high):
        return
    if float(low) > float(high):
        other = high_name if assigned == low_name else low_name
        value = low if assigned == low_name else high
        raise ValueError(
            f"{assigned} must be {'<=' if assigned == low_name else '>='} {other} "
            f"({high if assigned == low_name else low}), got {value}: assign {other} first "
            f"when moving both bounds."
        )


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every tensor has the shape of the first one.

    Silent broadcasting between ``[B]`` and ``[B, 1]`` turns an elementwise loss into a ``[B, B]``
    matrix; this check refuses it and names both shapes.
    """
    shapes = iter(tensors.values())
    reference = next(shapes).shape
    for tensor in shapes:  # the common case: no name looked up
        if tensor.shape != reference:
            break
    else:
        return
    names = list(tensors)
    for name in names[1:]:
        shape = tensors[name].shape
        if shape != reference:
            raise ValueError(
                f"shape mismatch: {names[0]} has shape {tuple(reference)} but {name} has shape "
                f"{tuple(shape)}; they must be equal (rlloss never broadcasts [B] against [B, 1], "
                "which would silently give a [B, B] outer product: "
                "reward, done, value and advantage tensors carry a trailing singleton dim, "
                "log-probs do not)."
            )


def warn_terminated_from_done(owner: str, terminated: NestedKey, done: NestedKey) -> None:
    """The warning of TorchRL's fallback: a batch without ``("next", terminated)`` is read with
    ``("next", done)`` in its place, so truncated steps are not bootstrapped."""
    warnings.warn(
        f"{owner}: the batch has no ('next', {terminated!r}); using ('next', {done!r}) instead "
        "(as TorchRL does), which treats truncations as terminations. Store 'terminated' to "
        "bootstrap truncated steps.",
        stacklevel=4,
    )


def batch_mask(owner: str, key: NestedKey, mask: torch.Tensor, batch_size: torch.Size):
    """A padding mask read from the batch, as a boolean ``[*B]`` tensor (``[*B, 1]`` is
    squeezed); a clear error for another dtype or shape. Shapes only: no host sync."""
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{owner}: the mask {key!r} has dtype {mask.dtype}; it must be boolean (True for "
            "valid steps, False for padding): store mask.bool()."
        )
    if mask.shape == batch_size + (1,):
        mask = mask.squeeze(-1)
    if mask.shape != batch_size:
        raise ValueError(
            f"{owner}: the mask {key!r} has shape {tuple(mask.shape)}; it must have the batch's "
            f"shape {tuple(batch_size)} (or {tuple(batch_size + (1,))}): one flag per step."
        )
    return mask


def check_entry_shape(owner: str, key: NestedKey, value: torch.Tensor, batch_size: torch.Size):
    """Refuse a per-transition entry (importance weights, ``steps_to_next_obs``) whose shape is
    neither ``[*B]`` nor ``[*B, 1]``, naming the key and both shapes."""
    if value.shape != batch_size and value.shape != batch_size + (1,):
        raise ValueError(
            f"{owner}: the entry {key!r} has shape {tuple(value.shape)}; it must hold one value "
            f"per transition, of shape {tuple(batch_size)} or {tuple(batch_size + (1,))}."
        )


def check_concatenable(owner: str, current: dict, following: dict) -> None:
    """Refuse network inputs at ``s`` (``current``) and at ``s'`` (``following``, read under
    ``"next"``, or sampled) that cannot be joined along the first batch dim into one network
    call: each key must have the same shape and dtype in both, named with both otherwise."""
    for key, value in current.items():
        other = following[key]
        if value.shape != other.shape or value.dtype != other.dtype:
            raise ValueError(
                f"{owner} evaluates the critics on (s, a) and (s', a') in one call, joined along "
                f"the first batch dim, so each critic input must have the same shape and dtype "
                f"at s and at s': {key!r} has shape {tuple(value.shape)} and dtype {value.dtype} "
                f"at s, but shape {tuple(other.shape)} and dtype {other.dtype} at s' (the batch's "
                f"('next', ...) entry, or the action the policy samples there). Store the next "
                f"step's entries like the current step's (and actions of the policy's size)."
            )


def check_network(owner: str, name: str, network, *, ensemble: bool = False) -> None:
    """Refuse what is not a TensorDict module (with ``in_keys``), or a list of networks where
    one is expected, with a ``TypeError`` saying what to pass. ``ensemble``: a list of such
    modules is accepted too (one per ensemble member)."""
    if isinstance(network, (list, tuple)):
        if not ensemble:
            raise TypeError(
                f"{owner}: {name} must be one network, got a {type(network).__name__} of "
                f"{len(network)}. {owner} does not take an ensemble here (SACLoss and TD3Loss "
                "build num_qvalue_nets copies of one Q network)."
            )
        for index, member in enumerate(network):
            check_network(owner, f"{name}[{index}]", member)
        return
    if not isinstance(network, torch.nn.Module) or not hasattr(network, "in_keys"):
        raise TypeError(
            f"{owner}: {name} must be a TensorDict module with in_keys and out_keys (TorchRL's "
            "ProbabilisticActor, ValueOperator, QValueActor, or TensorDictModule(net, "
            f"in_keys=[...], out_keys=[...])), got {type(network).__name__}."
        )


def check_support(owner: str, support) -> None:
    """A distributional network's ``support``: a 1-D tensor of ``K >= 2`` finite, increasing,
    evenly spaced atoms (read once, at construction)."""
    fix = (
        "pass a DistributionalQValueActor built with support=torch.linspace(v_min, v_max, "
        "num_atoms), or give the network such a 'support' buffer."
    )
    if not isinstance(support, torch.Tensor):
        raise TypeError(f"{owner}: the value network has no 'support' tensor; {fix}")
    if support.ndim != 1 or support.numel() < 2 or not support.is_floating_point():
        raise ValueError(
            f"{owner}: the support must be a 1-D floating tensor of at least 2 atoms, got "
            f"shape {tuple(support.shape)} and dtype {support.dtype}; {fix}"
        )
    steps = support.diff()
    if not (torch.isfinite(support).all() and (steps > 0).all()):
        raise ValueError(f"{owner}: the support must be finite and increasing; {fix}")
    if not torch.allclose(steps, steps.mean(), rtol=1e-4, atol=0.0):
        raise ValueError(
            f"{owner}: the support must be evenly spaced (C51 projects onto a uniform grid), "
            f"got steps from {steps.min().item():.4g} to {steps.max().item():.4g}; {fix}"
        )


def check_atoms(owner: str, action_values: torch.Tensor, support: torch.Tensor) -> None:
    """A distributional network's output ``[*B, K, A]`` has as many atoms ``K`` as its support
    (a shape check: no host sync)."""
    atoms = action_values.shape[-2] if action_values.ndim >= 2 else None
    if atoms != support.shape[0]:
        raise ValueError(
            f"{owner}: the value network gives {atoms} atoms per action (action_value of shape "
            f"{tuple(action_values.shape)}, atoms at dim -2) but its support has "
            f"{support.shape[0]}; build the network with num_atoms = len(support) outputs per "
            f"action (e.g. MLP(out_features=({support.shape[0]}, num_actions))) or give it "
            f"support=torch.linspace(v_min, v_max, {atoms})."
        )
