"""Ensembles and copies of the user's networks: ``StackedMLP`` (batched matrix products over
stacked members), ``Ensemble`` (stacked parameters, one call per member or ``vmap``),
``FrozenCopy`` (target networks and detached views), ``FrozenPolicy`` (a target policy) and the
copies they are built from."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import _compat, _fast
from rlloss._call_errors import CALL_ERRORS, explained
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall, _plan, inputs_at_action

# Modules applied elementwise (or along the feature dim only): they act on stacked members as is.
_ELEMENTWISE = (
    nn.ReLU,
    nn.Tanh,
    nn.ELU,
    nn.SiLU,
    nn.GELU,
    nn.LeakyReLU,
    nn.Sigmoid,
    nn.Softplus,
    nn.Mish,
    nn.Identity,
)


class StackedMLP:
    """An ensemble of MLPs (``nn.Linear`` layers and elementwise activations) evaluated on
    stacked parameters with one batched matrix product per layer.

    ``torch.vmap(functional_call(...))`` computes the same, but its batching layer adds a
    dispatch cost to every operation of the forward and the backward (about a millisecond per
    SAC update at batch 256 on one CPU thread, as much as the separate networks' whole
    overhead). ``StackedMLP.of(network, until)`` returns ``None`` when ``network`` is not such
    an MLP behind a single ``TensorDictModule`` (the caller then falls back to ``vmap``).
    """

    def __init__(self, in_keys, out_key, layers) -> None:
        self.in_keys = in_keys
        self.out_key = out_key
        self.layers = layers  # ("linear", weight key, bias key or None) | ("apply", module)

    @classmethod
    def of(cls, network, until: NestedKey | None = None, key_prefix: str = "") -> StackedMLP | None:
        steps = _plan(network, until)
        if steps is None or len(steps) != 1:
            return None
        mlp, in_keys, out_keys = steps[0]
        if len(out_keys) != 1 or not isinstance(mlp, nn.Sequential):
            return None
        if type(mlp).forward not in (nn.Sequential.forward, _MLP_FORWARD):
            return None
        if _compat.mlp_reshapes_output(mlp) or (len(in_keys) > 1 and not _is_mlp(mlp)):
            return None
        prefix = next(name for name, module in network.named_modules() if module is mlp)
        prefix = key_prefix + (f"{prefix}." if prefix else "")
        layers = []
        for index, layer in enumerate(mlp):
            if type(layer) is nn.Linear:
                bias = f"{prefix}{index}.bias" if layer.bias is not None else None
                layers.append(("linear", f"{prefix}{index}.weight", bias))
            elif type(layer) in _ELEMENTWISE:
                layers.append(("apply", layer))
            else:
                return None
        return cls(list(in_keys), out_keys[0], layers)

    def __call__(self, params: Mapping[str, torch.Tensor], inputs: Mapping) -> torch.Tensor:
        """``[size, *B, out]`` outputs of every member; ``params`` holds ``[size, ...]`` stacked
        tensors under the member network's parameter names."""
        values = [inputs[k] for k in self.in_keys]
        x = torch.cat(values, -1) if len(values) > 1 else values[0]
        batch_shape = x.shape[:-1]
        h = x.reshape(1, -1, x.shape[-1])  # the same input for every member
        for kind, *layer in self.layers:
            if kind == "apply":
                h = layer[0](h)
                continue
            weight, bias = params[layer[0]], params[layer[1]] if layer[1] else None
            h = h.expand(weight.shape[0], *h.shape[1:])
            if bias is None:
                h = torch.bmm(h, weight.mT)
            elif torch.compiler.is_compiling():
                # compiled: the bias add fuses into the next pointwise kernel, as inductor does
                # for ``addmm`` on GPUs; a compiled ``baddbmm`` first copies the broadcast bias
                # into its output (one more kernel a layer). Eager: one operation, not two.
                h = torch.bmm(h, weight.mT) + bias.unsqueeze(-2)
            else:
                h = torch.baddbmm(bias.unsqueeze(-2), h, weight.mT)
        return h.reshape(h.shape[0], *batch_shape, h.shape[-1])


def _is_mlp(module) -> bool:
    from torchrl.modules import MLP

    return isinstance(module, MLP)


def _mlp_forward():
    from torchrl.modules import MLP

    return MLP.forward


_MLP_FORWARD = _mlp_forward()


# ----------------------------------------------------------------------------- copies


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters are buffers (detached, never trained)."""
    module = copy.deepcopy(module)
    _compat.frozen_tensordict_params(module)  # multi-agent networks' parameter tables
    for submodule in module.modules():
        for name, parameter in list(submodule.named_parameters(recurse=False)):
            delattr(submodule, name)
            submodule.register_buffer(name, parameter.detach())
    return module


def reinitialised(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every ``reset_parameters`` submodule re-initialised."""
    module = copy.deepcopy(module)
    for submodule in module.modules():
        if hasattr(submodule, "reset_parameters"):
            submodule.reset_parameters()
    return module


def ensemble_members(owner: str, name: str, networks, size: int) -> list[nn.Module]:
    """The ``size`` members of the ensemble ``name`` from ``networks``: one module and ``size -
    1`` re-initialised copies of it (so that they differ), or a list of ``size`` modules (their
    weights kept); another count raises, naming the counts and the fix."""
    modules = list(networks) if isinstance(networks, (list, tuple)) else [networks]
    if len(modules) == 1:
        modules += [reinitialised(modules[0]) for _ in range(size - 1)]
    if len(modules) != size:
        raise ValueError(
            f"{owner}: got {len(modules)} {name} modules for "
            f"num_qvalue_nets={size}; pass one module or a list of num_qvalue_nets modules."
        )
    return modules


def stacked_members(modules: list[nn.Module]) -> TensorDict:
    """The members' tensors stacked along a leading dim (``[len(modules), ...]``), copied: their
    parameters as ``nn.Parameter`` (trained), their buffers as plain tensors."""
    parameter_names = {n for n, _ in modules[0].named_parameters()}
    stacked = TensorDict.from_modules(*modules).flatten_keys(".")
    return TensorDict(
        {
            k: nn.Parameter(v.detach().clone()) if k in parameter_names else v.detach().clone()
            for k, v in stacked.items()
        },
        batch_size=[len(modules)],
    ).unflatten_keys(".")


def redraw_members(stacked: TensorDictBase, template: nn.Module) -> None:
    """Write into each member of ``stacked`` (``[size, ...]``) a fresh draw of ``template``'s
    initialisation (:func:`reinitialised`), in place."""
    for member in range(stacked.batch_size[0]):
        stacked[member].update_(TensorDict.from_module(reinitialised(template)))


def tie_members(stacked: TensorDictBase, parameters: Mapping, shared: Mapping[str, str]) -> None:
    """Point the entries ``shared`` of ``stacked`` (``{stacked key: name in parameters}``) at
    detached expansions of those ``parameters`` (layers the members share with another network,
    e.g. the actor's): the members always use its current values, and send it no gradient."""
    for key, owner_key in shared.items():
        parameter = parameters[owner_key].detach()
        stacked.set(parameter_path(key), parameter.expand(len(stacked), *parameter.shape))


def untie_members(stacked: TensorDictBase, shared: Mapping[str, str]) -> None:
    """Replace the tied entries ``shared`` of ``stacked`` by writable copies (before loading a
    state dict into them; :func:`tie_members` points them back)."""
    for key in shared:
        stacked.set(parameter_path(key), stacked.get(parameter_path(key)).clone())


class FrozenCopy(NetworkCall):
    """A copy of a network whose tensors are not its own parameters: a target network (its
    tensors are the loss's ``target_<name>_params``) or a detached view (its tensors are
    detached views of the online parameters). Called as a :class:`NetworkCall` of the copy.

    Held as a plain attribute, outside the module tree, so its tensors appear once in
    ``state_dict`` (under the loss's own names) and never in ``loss.parameters()``.
    """

    def __init__(self, module: nn.Module, until: NestedKey | None = None) -> None:
        super().__init__(frozen_copy(module), until)

    def use(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Point the copy at ``tensors`` (dotted parameter names, as ``named_parameters``)."""
        if _compat.holds_tensordict_params(self.module):
            _compat.point_at(self.module, tensors)
            return
        for name, tensor in tensors.items():
            owner, _, attribute = name.rpartition(".")
            self.module.get_submodule(owner).register_buffer(attribute, tensor)


class FrozenPolicy(FrozenCopy):
    """A target copy of a policy (a TorchRL ``ProbabilisticActor``): its distribution at a batch,
    computed without gradient from the copy's tensors (:meth:`use`), e.g. PPO-EWMA's proximal
    policy, an exponential moving average of the policy kept by ``SoftUpdate``."""

    def __init__(self, actor: nn.Module) -> None:
        super().__init__(actor)
        self.distribution = DistributionCall(self.module)

    @torch.no_grad()
    def __call__(self, batch: TensorDictBase):
        return self.distribution(batch)


class _MemberCall(nn.Module):
    """A module whose forward is a :class:`NetworkCall`, so ``torch.func.functional_call`` can
    run it with other tensors (its network is the ``network`` submodule)."""

    def __init__(self, call: NetworkCall) -> None:
        super().__init__()
        self.network = call.module
        self.call = call

    def forward(self, inputs: Mapping) -> Mapping:
        return self.call(inputs)


# Up to this many members, an ensemble of a network that is not a plain MLP runs its members one
# after the other on views of the stacked parameters; beyond it, in one ``torch.vmap`` call,
# unless each member's work (input rows x member parameters) reaches ``LOOP_WORK_MIN``: then the
# loop at any size. Measured (TD3, custom critic, loss + backward, CPU, one thread): the loop
# beats vmap by ~10% at 2-4 members for 256x256 critics at batch 256; for 64x64 critics at batch
# 64, by ~7-22% at 2-4 members. With the slots found once (``TensorSlots``), at 10 members
# (REDQ, custom critic, CPU time, loop / vmap): 0.81 for 256x256 critics at batch 256 (18.5 M),
# 0.83 at batch 64 (4.6 M), 0.98 for 128x128 at 128 (2.5 M) and 64x64 at 256 (1.5 M), 1.02 for
# 64x64 at 128 (0.73 M), 1.14 at 64 (0.36 M).
LOOP_MEMBERS_MAX = 4
LOOP_WORK_MIN = 1 << 20


def members_in_turn(
    module: _MemberCall,
    params: Mapping[str, torch.Tensor],
    inputs: Mapping,
    size: int,
    slots: _fast.TensorSlots | None = None,
    split: list | None = None,
) -> dict:
    """``module`` called once per member on ``params[k][i]`` (views: the gradients and in-place
    buffer updates reach the stacked tensors), each output stacked along a leading ``[size]``
    dim: what ``torch.vmap(functional_call)`` gives, without its batching layer.

    With ``slots`` (eager calls: ``module``'s :class:`rlloss._fast.TensorSlots` for the names
    of ``params``, found once per ensemble), the member's tensors are put in them and
    ``module``'s :class:`NetworkCall` runs directly; without (compiled calls), through
    ``functional_call``. A tensor that requires gradient is split with ``unbind``, whose
    backward stacks the members' gradients in one copy (``size`` ``select``s would each write a
    zero tensor of the stacked size and add them up); buffers, updated in place by
    normalisation layers, are indexed (an ``unbind`` output may not be modified in place).
    ``split``: the members' tensors in ``slots.names`` order, already split (see
    :meth:`Ensemble._no_grad_views`)."""
    if slots is None:
        members = {k: v.unbind(0) if v.requires_grad else v for k, v in params.items()}
        outputs = [
            _functional_call(module, {k: v[i] for k, v in members.items()}, inputs)
            for i in range(size)
        ]
    else:
        if split is None:
            split = [
                params[k].unbind(0) if params[k].requires_grad else params[k] for k in slots.names
            ]
        outputs = [slots.call([v[i] for v in split], module.call, inputs) for i in range(size)]
    return {key: torch.stack([out[key] for out in outputs]) for key in _leaf_keys(outputs[0])}


def _rows(inputs: Mapping) -> int:
    """The rows a member's call runs on: the leading dims of the first input tensor."""
    for value in inputs.values():
        if isinstance(value, torch.Tensor):
            return value.shape[:-1].numel()
    return 0


def _leaf_keys(outputs: Mapping):
    """The keys of a member's outputs: every leaf of a TensorDict (a module the loss runs whole,
    e.g. BenchMARL's ``Mlp``, returns the batch with its nested ``("agents", "...")`` entries),
    else the mapping's keys."""
    if isinstance(outputs, TensorDictBase):
        return outputs.keys(include_nested=True, leaves_only=True)
    return outputs.keys()


def _functional_call(module: nn.Module, tensors: Mapping[str, torch.Tensor], inputs: Mapping):
    return torch.func.functional_call(module, tensors, (inputs,))


class Ensemble:
    """``size`` copies of one network architecture evaluated on stacked parameters: batched
    matrix products for MLPs (:class:`StackedMLP`), else one call per member for up to
    ``LOOP_MEMBERS_MAX`` members (:func:`members_in_turn`; at any size in eager calls where each
    member's work reaches ``LOOP_WORK_MIN``) and ``torch.vmap`` beyond.

    The stacked tensors are the loss's (``<name>_params`` and ``target_<name>_params``); call
    :meth:`use` after they are created or replaced (``.to()``, deep copies).
    """

    def __init__(self, template: nn.Module, until: NestedKey | None = None) -> None:
        self.template = frozen_copy(template)
        self.in_keys = list(template.in_keys)
        self.stacked = StackedMLP.of(self.template, until, key_prefix="network.")
        self.member = _MemberCall(NetworkCall(self.template, until))
        # the architecture fixed in train / eval mode (batch or running statistics of
        # normalisation layers) for callers that ask for a mode; the template keeps the mode
        # the user's network had. Built now (not while a compiled graph is traced); they share
        # the template's tensors, which every call replaces by the stacked ones anyway.
        self.member_in_mode = (
            {mode: self._member_copy(until, mode) for mode in (True, False)}
            if self.stacked is None  # an MLP of linear layers has no mode
            else {}
        )
        self.online: dict[str, torch.Tensor] = {}
        self.target: dict[str, torch.Tensor] = {}
        self.slots: dict[_MemberCall, _fast.TensorSlots] = {}  # per member module, found once
        self.views: dict[tuple, tuple] = {}  # (target, detach) -> storages, members' views
        self.member_size = 0  # the tensor elements of one member

    def _member_copy(self, until: NestedKey | None, training: bool) -> _MemberCall:
        tensors = [*self.template.parameters(), *self.template.buffers()]
        module = copy.deepcopy(self.template, memo={id(t): t for t in tensors})
        return _MemberCall(NetworkCall(module.train(training), until))

    def use(self, online: TensorDictBase, target: TensorDictBase | None) -> None:
        """Point the ensemble at the stacked ``online`` and ``target`` tensors."""
        self.online = _flat_member_tensors(online)
        self.target = {} if target is None else _flat_member_tensors(target)
        self.slots = {}  # found again at the next call (a deep copy's modules, other names)
        self.views = {}
        self.member_size = sum(v[0].numel() for v in self.online.values())  # no host sync

    def _slots(self, module: _MemberCall) -> _fast.TensorSlots | None:
        """The slots of ``module``'s tensors named as the stacked ones (``None`` while a
        compiled graph is traced: :func:`members_in_turn` then uses ``functional_call``)."""
        if torch.compiler.is_compiling():
            return None
        slots = self.slots.get(module)
        if slots is None:
            slots = self.slots[module] = _fast.TensorSlots(module, self.online)
        return slots

    def _no_grad_views(self, key: tuple, params: Mapping, slots, size: int) -> list:
        """The members' views (``params[k][i]``) of the target or detached stacked tensors, in
        ``slots.names`` order: made once and kept while each stacked tensor keeps its storage
        (in-place updates, e.g. ``SoftUpdate``'s, reach them; a ``.data`` assignment or
        :meth:`use` makes new ones). Their ``select``s are not repeated each call."""
        tensors = [params[k] for k in slots.names]
        storages = [t.data_ptr() for t in tensors]  # host metadata: no sync
        kept = self.views.get(key)
        if kept is None or kept[0] != storages:
            split = [[t[i] for i in range(size)] for t in tensors]
            kept = self.views[key] = (storages, split)
        return kept[1]

    def _loop_pays(self, inputs: Mapping) -> bool:
        """Whether an eager call runs the members in turn at any ensemble size: each member's
        work (rows x its tensor elements) at least ``LOOP_WORK_MIN``. Compiled graphs keep
        ``vmap`` beyond ``LOOP_MEMBERS_MAX`` (what ``compile_update``'s figures measured)."""
        if torch.compiler.is_compiling():
            return False
        return _rows(inputs) * self.member_size >= LOOP_WORK_MIN

    def __call__(
        self,
        inputs: Mapping,
        *,
        target: bool = False,
        detach: bool = False,
        members: int | torch.Tensor | None = None,
        training: bool | None = None,
    ) -> Mapping:
        """Every member's outputs on ``inputs`` (shared by all members), stacked along a leading
        ``[size]`` dim. ``target``: the target tensors (no gradient); ``detach``: the online
        tensors without gradient; ``members``: only the first ``members`` members, or those
        an integer index tensor names (on the parameters' device: no host sync); ``training``:
        run the members in train (``True``) or eval (``False``) mode, whatever the mode of the
        user's network (``None``: its mode). In train mode, normalisation layers update their
        running statistics in the stacked buffers, in place."""
        params = self.target if target else self.online
        if isinstance(members, torch.Tensor):
            params = {k: v.index_select(0, members) for k, v in params.items()}
        elif members is not None:
            params = {k: v[:members] for k, v in params.items()}
        if detach:
            params = {k: v.detach() for k, v in params.items()}
        with torch.set_grad_enabled(torch.is_grad_enabled() and not target):
            try:
                if self.stacked is not None:  # an MLP: one batched matrix product per layer
                    return {self.stacked.out_key: self.stacked(params, inputs)}

                module = self.member if training is None else self.member_in_mode[training]
                size = next(iter(params.values())).shape[0]
                if size <= LOOP_MEMBERS_MAX or self._loop_pays(inputs):
                    slots, split = self._slots(module), None
                    if slots is not None and (target or detach) and members is None:
                        split = self._no_grad_views((module, target), params, slots, size)
                    return members_in_turn(module, params, inputs, size, slots, split)

                def member(member_params):
                    return torch.func.functional_call(module, member_params, (inputs,))

                return torch.vmap(member, randomness="different")(params)
            except CALL_ERRORS as error:
                values = [inputs.get(k, None) for k in self.in_keys]
                raise explained(error, self.template, self.in_keys, values, inputs) from error

    def at_action(
        self, batch, key: NestedKey, action, samples_dim: int | None = None, **kwargs
    ) -> Mapping:
        """Every member's outputs on ``batch`` with ``action`` as the input ``key`` (``Q_i(s,
        a)`` of a substituted action; ``samples_dim``: see
        :func:`rlloss._networks.inputs_at_action`); ``kwargs`` as in :meth:`__call__`."""
        return self(inputs_at_action(batch, self, key, action, samples_dim), **kwargs)


def _flat_member_tensors(params: TensorDictBase) -> dict[str, torch.Tensor]:
    """``network.<dotted name>`` -> stacked tensor, the names :class:`Ensemble` calls with."""
    return {f"network.{k}": v for k, v in params.flatten_keys(".").items()}


def ensemble_architecture(attribute: str, params: str) -> property:
    """A read-only property returning the architecture of the :class:`Ensemble` held in
    ``attribute`` (e.g. TorchRL's ``loss.qvalue_network``): a module whose own tensors are not
    trained; the ensemble's trained tensors are the loss's ``params``."""

    def architecture(self) -> nn.Module:
        return getattr(self, attribute).template

    architecture.__doc__ = (
        f"The ensemble's architecture (not trained: the trained tensors are ``{params}``)."
    )
    return property(architecture)


def parameter_path(name: str) -> tuple[str, ...]:
    """The TensorDict path of a dotted parameter name."""
    return tuple(name.split("."))


def shared_parameters(module: nn.Module, owner: nn.Module) -> dict[str, str]:
    """``{parameter name in module: its name in owner}`` for the parameters of ``module`` that
    are parameters of ``owner`` itself (layers the two share, e.g. an ensemble member's and the
    actor's)."""
    names = {id(p): n for n, p in owner.named_parameters()}
    return {k: names[id(p)] for k, p in module.named_parameters() if id(p) in names}
