"""``rlloss.LossModule``: the base every rlloss loss derives from.

It subclasses :class:`torchrl.objectives.LossModule`, so TorchRL's ``SoftUpdate``,
``HardUpdate``, trainers and ``isinstance`` checks accept rlloss losses unchanged. What it holds
is what every loss needs:

- key handling: each loss declares its keys in an ``_AcceptedKeys`` dataclass; ``set_keys``
  rejects unknown names with the list of valid ones; :meth:`_get` raises a ``KeyError`` that
  names the loss, the missing key, the keys present and the ``set_keys`` call that remaps it;
- the ``reduction`` argument's check;
- value estimators: :meth:`make_value_estimator` takes TorchRL's ``ValueEstimators`` members
  and builds rlloss's own estimators;
- a hook, :meth:`_refresh_views`, run whenever the module's tensors are replaced (``.to()``,
  ``.double()``, deep copies), for losses that keep views of their tensors;
- policy-loss add-ons (:mod:`rlloss.addons`): :meth:`_with_policy_addons` adds their terms to
  an actor loss, and every loss's ``in_keys`` / ``out_keys`` list their entries.

Replay, target networks and ensembles belong to the off-policy base,
:class:`rlloss.offpolicy.TDTargetLoss`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.objectives import LossModule as TorchRLLossModule

from rlloss import _compat, _fast
from rlloss._checks import (
    CoefficientOwner,
    MissingKeyError,
    batch_mask,
    check_choice,
    missing_key_message,
    next_key,
    remap_keys,
)
from rlloss._dispatch import (  # re-exported: each loss's forward is decorated with it
    accepts_tensor_arguments as accepts_tensor_arguments,
)
from rlloss._state_checks import state_dict_mismatch
from rlloss.addons import ActorOutput, check_policy_addons
from rlloss.estimators.registry import build_value_estimator
from rlloss.functional.reduce import REDUCTIONS

# TorchRL's loss_mask_key="auto" entries, unravelled once
_AUTO_MASK_PATHS = tuple(_compat.unravel_key(k) for k in (("collector", "mask"), "shifted_valid"))


class LossModule(CoefficientOwner, TorchRLLossModule, metaclass=_compat.LossMeta):
    """Base class of rlloss losses (see the module docstring).

    Subclasses declare ``_AcceptedKeys`` (a dataclass: one field per key, with its default and a
    comment documenting it, from which the API page's keys table is generated: a comment
    beginning ``written:`` for a key the loss writes, the shape in brackets, ``[*B, 1]``),
    ``default_value_estimator`` and, if they use one, ``_value_network_name`` (the
    attribute holding the network a value estimator should call). Hyperparameters that are
    checked or scheduled are :class:`rlloss._checks.Coefficient` class attributes; string
    settings checked on assignment too are listed in ``_choices``.
    """

    _choices = {"reduction": REDUCTIONS}

    @dataclasses.dataclass
    class _AcceptedKeys:
        pass

    _value_network_name: str | None = None
    # estimator key name -> the loss's key name it mirrors, where they differ (TorchRL's)
    _estimator_keys: dict[str, str] = {}
    # the output entry policy-loss add-ons add to (``None``: the loss has no actor loss), and
    # whether the actor is deterministic (an add-on may refuse it)
    _actor_loss_key: str | None = None
    _deterministic_actor = False
    _addon_keys: tuple[str, ...] = ()  # the add-ons' output entries, ``addon_<name>``
    # whether the loss reads the masks TorchRL's ``loss_mask_key`` names (``"auto"``:
    # ``("collector", "mask")`` and ``"shifted_valid"``). A loss whose TorchRL namesake reads
    # none declares ``False``: its ``loss_mask_key`` (TorchRL's property, ``"auto"``) is then
    # accepted and never read, as TorchRL's is.
    _reads_loss_mask: bool = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "out_keys" in cls.__dict__:
            cls.out_keys = selectable_out_keys(cls.__dict__["out_keys"])
        if "in_keys" in cls.__dict__:
            cls.in_keys = with_addon_in_keys(cls.__dict__["in_keys"])
        # TorchRL's list of the buffers a number is written into in place (its __setattr__
        # and its tests read it): the buffer coefficients
        coefficients = cls._coefficients().items()
        cls._all_schedulable_buffers = frozenset(n for n, c in coefficients if c.buffer)

    def __init__(self) -> None:
        super().__init__()
        # TorchRL registers a pre-hook warning about target networks without an updater; the
        # off-policy base registers it again with a target network, the only case where it fires.
        _compat.clear_forward_pre_hooks(self)
        # ``tensor_keys.<name>`` (and whether under "next") -> (key, its unravelled path), see
        # `_read`: resolved here and in `set_keys`, never in a forward (a compiled graph sees a
        # fixed dict)
        self._key_paths: dict[tuple[str, bool], tuple] = {}
        self._resolve_keys()

    # ----------------------------------------------------------------------------- keys
    def set_keys(self, **kwargs) -> None:
        """Remap input/output keys: ``loss.set_keys(advantage=("my", "adv"))``.

        ``None`` restores a key's default. Unknown names raise ``ValueError`` listing the valid
        ones.
        """
        remap_keys(type(self).__name__, self.tensor_keys, self._AcceptedKeys, **kwargs)
        self._resolve_keys()
        self._forward_value_estimator_keys(**kwargs)

    def _resolve_keys(self) -> None:
        """Unravel every ``tensor_keys`` entry, and its ``("next", ...)`` form, once (``_read``
        then looks the path up without unravelling the key on each call)."""
        for field in dataclasses.fields(self._tensor_keys):
            for nested in (False, True):
                self._resolve_key(field.name, nested)

    def _resolve_key(self, name: str, nested: bool) -> tuple:
        key = getattr(self._tensor_keys, name)
        valid = isinstance(key, (str, tuple))  # another type: `_read` lets tensordict refuse it
        path = _compat.unravel_key(next_key(key, nested)) if valid else ()
        self._key_paths[name, nested] = (key, path)
        return self._key_paths[name, nested]

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        estimator = _compat.stored_value_estimator(self)
        if estimator is None:
            return
        names = {field.name: field.name for field in dataclasses.fields(estimator._AcceptedKeys)}
        names.update(self._estimator_keys)
        shared = {
            name: getattr(self.tensor_keys, own)
            for name, own in names.items()
            if hasattr(self.tensor_keys, own)
        }
        estimator.set_keys(**shared)

    def _transition_keys(self, keys: list[NestedKey], next_keys: list[NestedKey]) -> list:
        """``in_keys`` of a loss that learns from transitions (the on- and off-policy losses):
        ``keys`` of the current step, ``next_keys`` under ``"next"``, and the reward and done /
        termination flags under ``"next"``, without repeats."""
        flags = [self.tensor_keys.reward, self.tensor_keys.done, self.tensor_keys.terminated]
        keys = [*keys, *(next_key(k) for k in [*next_keys, *flags])]
        return list(dict.fromkeys(keys))

    def _get(self, tensordict: TensorDictBase, name: str, *, nested: bool = False) -> torch.Tensor:
        """The entry ``tensor_keys.<name>`` of ``tensordict`` (of ``tensordict["next"]`` when
        ``nested``); a clear ``KeyError`` if absent."""
        value = self._read(tensordict, name, nested=nested)
        if value is None:
            key = next_key(getattr(self.tensor_keys, name), nested)
            raise MissingKeyError(missing_key_message(type(self).__name__, name, key, tensordict))
        return value

    def _read(
        self, tensordict: TensorDictBase, name: str, *, nested: bool = False
    ) -> torch.Tensor | None:
        """The entry ``tensor_keys.<name>`` of ``tensordict`` (under ``"next"`` when ``nested``),
        or ``None`` if absent.

        ``tensordict.get`` unravels its key on every call; the unravelled path is resolved
        with the keys (:meth:`_resolve_keys`), again only after a direct assignment
        ``loss.tensor_keys.<name> = key``.
        """
        resolved = self._key_paths.get((name, nested))
        if resolved is None or resolved[0] != getattr(self._tensor_keys, name):
            resolved = self._resolve_key(name, nested)  # assigned directly since set_keys
        key, path = resolved
        if not path:  # not a valid key: tensordict's error names it
            return tensordict.get(next_key(key, nested), None)
        return _fast.get_path(tensordict, path)

    def _write(self, tensordict: TensorDictBase, name: str, value: torch.Tensor) -> None:
        """``tensordict.set(tensor_keys.<name>, value)`` for a ``value`` computed from the batch's
        own entries (so of its batch shape and device)."""
        key = getattr(self._tensor_keys, name)
        path = (key,) if type(key) is str else _compat.unravel_key(key)  # a str: the common case
        _fast.set_computed(tensordict, path, value)

    def _mask_paths(self) -> tuple:
        if not self._reads_loss_mask:
            return ()
        key = self._loss_mask_key  # TorchRL's property's value
        if isinstance(key, str) and key == "auto":
            return _AUTO_MASK_PATHS
        return () if key is None else (_compat.unravel_key(key),)

    def _loss_mask(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        """The valid transitions, as TorchRL's ``loss_mask_key`` says: ``"auto"`` ANDs the masks
        TorchRL writes (``("collector", "mask")``, ``"shifted_valid"``) that the batch holds, a
        key reads that entry, ``None`` masks nothing; a loss that reads no mask
        (``_reads_loss_mask = False``) masks nothing whatever the key."""
        masks = []
        for path in self._mask_paths():
            mask = _fast.get_path(tensordict, path)
            if mask is not None:
                mask = batch_mask(type(self).__name__, path, mask, tensordict.batch_size)
                masks.append(mask.unsqueeze(-1))
        if not masks:
            return None
        return functools.reduce(torch.logical_and, masks)

    def _padding_mask(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        """The batch's valid steps (``[*B]`` boolean), ``None`` when nothing is padded."""
        return None

    # ----------------------------------------------------------------------------- add-ons
    def _register_policy_addons(self, addons) -> None:
        """Hold the ``policy_loss_addons`` keyword's add-ons (checked; a ``TypeError`` for a loss
        without an actor loss)."""
        if addons is None:
            return
        owner = type(self).__name__
        if self._actor_loss_key is None:
            raise TypeError(
                f"{owner} has no actor loss: policy_loss_addons apply to the losses with an "
                "actor (PPO family, A2C, REINFORCE, SAC family, DDPG, TD3, IQL, MPO)."
            )
        addons = check_policy_addons(owner, addons, self._deterministic_actor)
        if addons:
            self._policy_addons = nn.ModuleList(addons)
            self._addon_keys = tuple(addon.out_key for addon in addons)

    @property
    def policy_loss_addons(self) -> tuple:
        """The policy-loss add-ons (:mod:`rlloss.addons`), in the order given."""
        return tuple(self._policy_addons) if self._addon_keys else ()

    def _with_policy_addons(
        self, loss: torch.Tensor, batch: TensorDictBase, actor: ActorOutput, info: dict
    ) -> tuple[torch.Tensor, dict]:
        """``loss`` (the reduced actor loss) plus each add-on's term reduced as the actor loss
        is (:meth:`_reduce_policy_term`), and ``info`` with each term, detached, under its
        ``addon_<name>``. The one place add-ons enter every loss."""
        if not self._addon_keys:
            return loss, info
        actor.action_key = getattr(self.tensor_keys, "action", None)
        for addon in self._policy_addons:
            term = addon(batch, actor)
            if term.shape != batch.batch_size:
                raise ValueError(
                    f"{type(self).__name__}: the policy-loss add-on {addon.name!r} returned a "
                    f"term of shape {tuple(term.shape)}; it must return one value per batch "
                    f"element, shape {tuple(batch.batch_size)}."
                )
            term = self._reduce_policy_term(term, batch)
            loss = loss + term
            info[addon.out_key] = term.detach()
        return loss, info

    def _addon_entries(self, info: dict) -> dict:
        """The add-ons' entries of an actor loss's ``info``, for ``forward``'s output."""
        return {key: info[key] for key in self._addon_keys}

    def _reduce_policy_term(self, term: torch.Tensor, batch: TensorDictBase) -> torch.Tensor:
        """Reduce a per-sample add-on term ``[*B]`` as the actor loss is reduced."""
        raise NotImplementedError(f"{type(self).__name__} does not reduce policy-loss add-ons.")

    # ----------------------------------------------------------------------------- state
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``, with one short ``RuntimeError`` listing every entry
        whose shape differs (saved and current shapes) and, with ``strict``, the missing and
        unexpected names, before anything is copied (a state dict of another loss or of other
        networks is refused whole)."""
        message = state_dict_mismatch(self.state_dict(keep_vars=True), state_dict, strict)
        if message:
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: {message}")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # ----------------------------------------------------------------------------- views
    _moves = 0  # counts ``_apply`` calls (``.to``, ``.double``...): rlloss's updaters re-read

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._moves += 1
        self._refresh_views()
        return out

    def __setstate__(self, state) -> None:
        """After ``copy.deepcopy`` or unpickling, the views a loss keeps point at this copy's
        tensors, not the original's."""
        super().__setstate__(state)
        self._refresh_views()

    def _refresh_views(self) -> None:
        """Point whatever the loss keeps besides its registered tensors (target copies, stacked
        ensembles, detached views...) at its current tensors. Nothing here."""

    def _warn_until_every_target_has_an_updater(self) -> None:
        """Warn (TorchRL's warning) in each forward until every target network has an updater."""
        if not _compat.has_forward_pre_hook(self, _warn_without_updater):
            self.register_forward_pre_hook(_warn_without_updater)

    @torch.no_grad()
    def reset_parameters_recursive(self) -> None:
        """Re-initialise the weights of every network of the loss (each submodule with a
        ``reset_parameters``, e.g. ``nn.Linear``), in place, as TorchRL's method of the same name
        promises. The off-policy base also re-draws each ensemble member and copies the new
        online weights into the target networks."""
        for module in self.modules():
            if module is not self and callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()

    # ----------------------------------------------------------------------------- estimators
    def make_value_estimator(self, value_type=None, **hyperparams):
        """Build the value estimator the loss uses when the batch has no advantage.

        Args:
            value_type: a TorchRL ``ValueEstimators`` member (``TD0``, ``TD1``, ``TDLambda``,
                ``GAE``), or an estimator instance to use as is. Defaults to the loss's
                ``default_value_estimator``.
            **hyperparams: estimator keywords (``gamma``, ``lmbda``...), over TorchRL's defaults
                (``gamma=0.99``, ``lmbda=0.95``).
        """
        estimator, value_type = build_value_estimator(self, value_type, hyperparams)
        _compat.store_value_estimator(self, estimator)
        self.value_type = value_type
        self._forward_value_estimator_keys()
        return self

    @property
    def value_estimator(self):
        if _compat.stored_value_estimator(self) is None:
            self.make_value_estimator()
        return _compat.stored_value_estimator(self)

    @value_estimator.setter
    def value_estimator(self, value) -> None:
        _compat.store_value_estimator(self, value)

    # ----------------------------------------------------------------------------- checks
    @staticmethod
    def _check_reduction(reduction: str | None) -> str:
        reduction = "mean" if reduction is None else reduction
        check_choice("reduction", reduction, REDUCTIONS)
        return reduction


def fill_padding(batch: TensorDictBase, mask: torch.Tensor, keep) -> TensorDictBase:
    """A copy of ``batch`` whose padded steps (``mask`` ``False``, ``[*B]``) hold the content of
    the batch's first valid step, in every entry but the masks (``keep``: their keys).

    Masked reductions select padding out of the value, but not out of the gradient: the backward
    pass of ``ratio * advantage`` multiplies the zero gradient of a padded step by its advantage,
    and ``0 * nan = nan``; a NaN observation in padding reaches the weights' gradient through the
    network's matrix products. Replacing the padding before any arithmetic makes the losses and
    every gradient independent of what padding holds. The donor is a valid step (not zeros), so
    each entry keeps values its network and distribution accept (a ``scale`` of 0 would not).
    No host sync: the first valid index is an ``argmax`` on the device.
    """
    flat = mask.reshape(-1)
    # the first valid index, as a 1-element tensor (0 when nothing is valid: nothing counts then)
    first = flat.to(torch.uint8).argmax().reshape(1)

    def fill(x: torch.Tensor) -> torch.Tensor:
        rest = x.shape[mask.ndim :]
        donor = x.reshape(flat.shape[0], *rest).index_select(0, first).reshape(rest)
        return torch.where(mask.reshape(*mask.shape, *(1,) * (x.ndim - mask.ndim)), x, donor)

    filled = batch.apply(fill)
    for key in keep:
        value = batch.get(key, None)
        if value is not None:
            filled.set(key, value)
    return filled


def selectable_out_keys(declared) -> property:
    """``out_keys`` (a class's list or property) that ``loss.select_out_keys(...)`` can narrow,
    as tensordict's ``select_out_keys`` expects of TorchRL's losses: an assigned list replaces
    the declared keys on that instance."""
    declared_keys = declared.fget if isinstance(declared, property) else lambda self: declared

    def get(self) -> list:
        selected = self.__dict__.get("_selected_out_keys")
        if selected is not None:
            return selected
        return list(dict.fromkeys([*declared_keys(self), *self._addon_keys]))

    def set(self, keys) -> None:
        self.__dict__["_selected_out_keys"] = list(keys)

    return property(get, set, doc="The entries of the output TensorDict.")


def with_addon_in_keys(declared) -> property:
    """``in_keys`` (a class's list or property) followed by the entries the loss's policy-loss
    add-ons read (e.g. an expert action, a prior's inputs), without repeats."""
    declared_keys = declared.fget if isinstance(declared, property) else lambda self: declared

    def get(self) -> list:
        keys = list(declared_keys(self))
        extra = [key for addon in self.policy_loss_addons for key in addon.in_keys]
        return list(dict.fromkeys([*keys, *extra])) if extra else keys

    return property(get, doc="The entries the loss reads.")


def _warn_without_updater(loss: LossModule, args) -> None:
    """TorchRL's forward pre-hook (a warning while a target network has no updater), removed in
    eager mode once every target network has one: an updater stays associated, so the check
    would pass on every later call, and a module with a hook takes ``nn.Module``'s slower call
    path."""
    _compat.warn_without_updater(loss, args)
    if _compat.every_target_has_updater(loss) and not torch.compiler.is_compiling():
        _compat.remove_forward_pre_hook(loss, _warn_without_updater)
