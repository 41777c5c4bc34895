"""What the families of cases share: the library loss wrapped as a method, the hand-written
target update, the replay batch, and the networks of the off-policy cases."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torchrl.objectives
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import MLP, ValueOperator

from benchmarks import harness
from benchmarks.harness import Method, MethodUnavailable

TAU = 0.005  # soft target update of the "update" level
# The off-policy continuous-control cases (DDPG, TD3, SAC, MPO): sizes and discount.
OBS_DIM, ACT_DIM, HIDDEN, GAMMA = 17, 6, (256, 256), 0.99
HIDDEN_TEXT = "x".join(map(str, HIDDEN))  # for the descriptions
DISCRETE_ACTIONS = 6  # discrete SAC and categorical MPO
LOG2 = math.log(2.0)


# --------------------------------------------------------------------------- #
# Methods
# --------------------------------------------------------------------------- #
def rlloss_module():
    """The ``rlloss`` package of the working tree, or MethodUnavailable."""
    try:
        import rlloss
    except ImportError as err:
        raise MethodUnavailable(f"cannot import rlloss: {err}") from err
    return rlloss


def rlloss_attr(name: str):
    """``rlloss.<name>`` from the working tree, or MethodUnavailable if it does not exist yet."""
    try:
        return getattr(rlloss_module(), name)
    except AttributeError as err:
        raise MethodUnavailable(f"rlloss has no attribute {name!r}") from err


def soft_update_of(sources: list[nn.Module], targets: list[nn.Module]) -> Callable[[], None]:
    """Polyak averaging ``target <- (1 - tau) target + tau source`` written by hand."""
    src = [p for m in sources for p in m.parameters()]
    tgt = [p for m in targets for p in m.parameters()]

    @torch.no_grad()
    def update() -> None:
        torch._foreach_lerp_(tgt, src, TAU)

    return update


def loss_module_method(
    loss_module: nn.Module,
    batch,
    named_params,
    loss_keys,
    fresh_batch: bool = False,
    soft_update: bool = True,
) -> Method:
    """Wrap a TorchRL-API loss module: ``total = sum(out[k] for k in loss_keys)``; its target
    networks, if any, are updated with its library's ``SoftUpdate``. ``fresh_batch``: each call
    reads a shallow copy of ``batch``, as a freshly sampled batch (for a loss that writes
    tensors with a graph back into its input in place, which the next call's backward would
    go through). ``soft_update=False``: no target update even where the loss holds a
    ``target_*`` network (RND's frozen random target is no copy to track)."""
    k0, *rest = loss_keys

    def loss() -> torch.Tensor:
        out = loss_module(batch.copy() if fresh_batch else batch)
        total = out.get(k0)  # get: a TensorDict's and an LLM loss's tensorclass output alike
        for k in rest:
            total = total + out.get(k)
        return total

    def loss_scale() -> torch.Tensor:
        # a forward of its own, for the gate only: the timed loss keeps no output around
        with torch.no_grad():
            out = loss_module(batch.copy() if fresh_batch else batch)
        return sum(out.get(k).abs().sum() for k in loss_keys)

    has_targets = soft_update and (
        any(
            "target_" in name and "target_entropy" not in name  # SAC's: no network
            for name, _ in loss_module.named_buffers()
        )
        or any(name.startswith("target_") for name, _ in loss_module.named_children())
    )
    # each library's own updater: rlloss.SoftUpdate for rlloss losses, TorchRL's for TorchRL's
    ours = type(loss_module).__module__.startswith("rlloss")
    updater_class = rlloss_attr("SoftUpdate") if ours else torchrl.objectives.SoftUpdate
    updater = updater_class(loss_module, tau=TAU) if has_targets else None
    return Method(
        loss=loss,
        params=named_params,
        trainable=tuple(loss_module.parameters()),
        update_targets=updater.step if updater is not None else None,
        loss_scale=loss_scale,
    )


def library_factories(
    plain: Callable[[Any], Method], library_method: Callable[[Any], Callable[[Any], Method]]
) -> dict[str, Callable[[Any], Method]]:
    """The factories of a case both libraries have the loss of: the hand-written ``plain`` and
    ``library_method(library)`` for rlloss and for ``torchrl.objectives``."""
    return {
        "plain": plain,
        "rlloss": library_method(rlloss_module()),
        "torchrl": library_method(torchrl.objectives),
    }


def tanh_normal_sample(
    actor_net: nn.Module, obs: torch.Tensor, params: tuple | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised tanh-Gaussian action on [-1, 1] and its log-probability ``[B]``, from
    the actor's ``(loc, scale)`` at ``obs`` (or ``params`` if already computed)."""
    loc, scale = actor_net(obs) if params is None else params
    eps = torch.randn(loc.shape, dtype=loc.dtype, device=loc.device)  # not randn_like: see
    # rlloss.functional.distributions.standard_normal_like (AOTAutograd merged two draws)
    u = loc + scale * eps
    log_prob = -0.5 * eps.square() - scale.log() - 0.5 * math.log(2 * math.pi)
    log_prob = log_prob - 2.0 * (LOG2 - u - F.softplus(-2.0 * u))  # tanh's Jacobian
    return torch.tanh(u), log_prob.sum(-1)


def detached_call(module: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """``module(*inputs)`` with its parameters detached: the actor's gradient through a critic
    that must not train (what CleanRL gets by stepping only the actor's optimizer)."""
    params = {k: p.detach() for k, p in module.named_parameters()}
    return torch.func.functional_call(module, params, inputs)


def frozen_copies(modules: list[nn.Module]) -> list[nn.Module]:
    """Target networks: a copy of each module that no gradient reaches."""
    return [copy.deepcopy(m).requires_grad_(False) for m in modules]


def prefixed(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s parameters named ``<prefix>.<name>``, as the gate reports them."""
    return {f"{prefix}.{n}": p for n, p in module.named_parameters()}


def described(name: str, kwargs: dict) -> str:
    """``Name(k=v, ...)``: a loss constructed with ``kwargs``."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


# --------------------------------------------------------------------------- #
# Batches and networks
# --------------------------------------------------------------------------- #
def replay_batch(
    observation: torch.Tensor, action: torch.Tensor, generator: torch.Generator
) -> TensorDict:
    """A replay sample on the harness's device: ``observation`` and ``action`` as drawn by the
    case, then the next observation, reward, terminated (10 %) and done (20 %) drawn here."""
    batch_size, obs_dim = observation.shape
    return TensorDict(
        {
            "observation": observation,
            "action": action,
            "next": {
                "observation": torch.randn(batch_size, obs_dim, generator=generator),
                "reward": torch.randn(batch_size, 1, generator=generator),
                "terminated": torch.rand(batch_size, 1, generator=generator) < 0.1,
                "done": torch.rand(batch_size, 1, generator=generator) < 0.2,
            },
        },
        [batch_size],
    ).to(harness.DEVICE)


def random_replay(
    batch_size: int,
    seed: int,
    act_dim: int = ACT_DIM,
    discrete: bool = False,
    scale: float = 1.0,
    obs_dim: int = OBS_DIM,
) -> TensorDict:
    """A random replay sample drawn from generator seed ``seed``: one-hot actions (``discrete``)
    or uniform on ``[-scale, scale]``, then the observations, then :func:`replay_batch`'s."""
    g = torch.Generator().manual_seed(seed)
    if discrete:
        action = F.one_hot(torch.randint(0, act_dim, (batch_size,), generator=g), act_dim)
    else:
        action = scale * (torch.rand(batch_size, act_dim, generator=g) * 2 - 1)
    return replay_batch(torch.randn(batch_size, obs_dim, generator=g), action, g)


def mlp(in_features: int, out_features: int, activation: type[nn.Module] = nn.Tanh) -> MLP:
    """An off-policy case's network: ``HIDDEN`` layers of ``activation`` (TorchRL's ``MLP``
    default, tanh)."""
    return MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(HIDDEN),
        activation_class=activation,
    )


def policy_net(discrete: bool, act_dim: int, activation: type[nn.Module] = nn.Tanh) -> nn.Module:
    """The actor's network: logits over ``act_dim`` actions, or a Gaussian's ``(loc, scale)``."""
    if discrete:
        return mlp(OBS_DIM, act_dim, activation)
    return nn.Sequential(mlp(OBS_DIM, 2 * act_dim, activation), NormalParamExtractor())


class CustomCritic(nn.Module):
    """A critic written the common way, not a TorchRL ``MLP``: its inputs concatenated, then
    ``HIDDEN`` relu layers of its own (the libraries cannot stack it into batched matrix
    products; rlloss's ensembles call it per member or through ``torch.vmap``)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        sizes = (in_features, *HIDDEN)
        pairs = zip(sizes[:-1], sizes[1:], strict=True)
        hidden = [m for a, b in pairs for m in (nn.Linear(a, b), nn.ReLU())]
        self.layers = nn.Sequential(*hidden, nn.Linear(sizes[-1], out_features))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.cat(inputs, -1) if len(inputs) > 1 else inputs[0])


def q_net(
    discrete: bool, act_dim: int, custom: bool = False, activation: type[nn.Module] = nn.Tanh
) -> nn.Module:
    """A critic's network: ``Q(s, .)`` over ``act_dim`` actions, or ``Q(s, a)``; a TorchRL
    ``MLP`` of ``activation`` layers, or with ``custom`` a :class:`CustomCritic` of the same
    shape (relu)."""
    in_features, out_features = (OBS_DIM, act_dim) if discrete else (OBS_DIM + act_dim, 1)
    if custom:
        return CustomCritic(in_features, out_features)
    return mlp(in_features, out_features, activation)


CUSTOM_SUFFIX = "-custom-critic"  # the case name of a loss timed with CustomCritic critics


def q_module(net: nn.Module, discrete: bool) -> nn.Module:
    """A critic network as the libraries read it: ``action_value`` from the observation, or
    ``state_action_value`` from the observation and the action."""
    if discrete:
        return TensorDictModule(net, in_keys=["observation"], out_keys=["action_value"])
    return ValueOperator(net, in_keys=["observation", "action"])


def on_device(*modules: nn.Module) -> None:
    """Move the template networks to the harness's device."""
    for module in modules:
        module.to(harness.DEVICE)
