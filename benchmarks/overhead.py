"""Per-update overhead of rlloss losses vs. TorchRL and a hand-written plain-torch baseline.

What is measured
----------------
For every *case* (one loss configuration, e.g. ``ClipPPOLoss``) and every batch size,
four implementations of the same math are run on the same networks:

* ``plain``   -- the same outputs written by hand: straight tensors, no TensorDict; the
  losses plus the diagnostics both libraries return with them (clip fraction, ESS,
  ratios, approximate KL, entropy, explained variance). It calls the very same
  ``nn.Sequential`` modules and the actor's own distribution class. This is the floor:
  what the math costs with zero framework overhead, and the baseline of the targets.
* ``plain-min`` -- the same without the diagnostics (the losses only), for reference.
* ``rlloss``  -- the rlloss loss module (TorchRL's keyword API and output keys).
* ``torchrl`` -- the ``torchrl.objectives`` loss module (the reference).

One timed *step* is what an optimisation step costs minus the optimizer itself:
``zero_grad`` (grads set to ``None``) + forward + ``total.backward()``, where
``total`` is the sum of the loss terms. Each method gets its own deep copy of the
networks (identical weights), and all methods read the same batch.

Method
------
* CPU only, ``torch.set_num_threads(1)``; the garbage collector is disabled inside
  timed blocks (as :mod:`timeit` does) and run between them.
* Equality gate, before any timing: every method must reproduce the TorchRL total
  loss and the gradient of every network parameter to ``--rtol`` (relative; the
  gradient check uses ``||g - g_ref|| <= rtol * ||g_ref||`` per tensor). It runs
  on the timed batch and on gate-only variants (for PPO: an off-policy batch whose
  stored log-probs are shifted so that the clipping branch is active). A method that
  fails is reported as FAILED, is not timed, and the script exits with status 1.
* Warm-up: ``--warmup`` steps per method. Then ``--repeats`` rounds; in round ``r``
  the methods run in an order rotated by ``r`` (interleaving spreads machine-load
  drift evenly over the methods), each for ``--inner`` consecutive steps timed with
  :func:`time.perf_counter`; one sample = block time / inner. ``--inner 0`` (the
  default) picks, per case and batch size, the count that makes the slowest method's
  block last about ``--block-ms``.
* Reported: per method the median of the samples with its interquartile range
  (p25-p75) and min; ratios are medians (and IQR) of the *paired* per-round ratios,
  which cancel most of the load drift between rounds.

Run from the repository root (the working tree's ``rlloss`` is imported)::

    python benchmarks/overhead.py                      # full run
    python benchmarks/overhead.py --smoke              # seconds; for CI
    python benchmarks/overhead.py --batch-sizes 64 4096 --repeats 50 --out my.json

Adding a loss: write a function ``build(batch_size, seed) -> CaseSetup`` that builds
the template networks, the batch(es) and one factory per method, and decorate it
with ``@register_case("Name")``.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # benchmark the working tree, not whatever rlloss may be installed
    sys.path.insert(0, str(REPO_ROOT))

import tensordict  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchrl  # noqa: E402
import torchrl.objectives  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import Bounded  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402
from torchrl.modules import (  # noqa: E402
    MLP,
    Actor,
    IndependentNormal,
    OneHotCategorical,
    ProbabilisticActor,
    QValueActor,
    TanhNormal,
    ValueOperator,
)

METHODS = ("plain", "plain-min", "rlloss", "torchrl")
TAU = 0.005  # soft target update of the "update" level
DEVICE = torch.device("cpu")  # set by --device; the case builders place networks and batches on it
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "overhead.json"


# --------------------------------------------------------------------------- #
# Case registry
# --------------------------------------------------------------------------- #
class MethodUnavailable(Exception):
    """Raised by a method factory when that implementation cannot be built (e.g. not written yet)."""


@dataclass
class Method:
    """One implementation, bound to its own copy of the networks and to one batch."""

    loss: Callable[[], torch.Tensor]  # the forward: the sum of the loss terms
    params: dict[str, torch.Tensor]  # named parameters whose .grad the gate compares
    trainable: tuple[torch.Tensor, ...]  # what the optimizer steps (targets excluded)
    update_targets: Callable[[], None] | None = None  # the target-network update, if any


def soft_update_of(sources: list[nn.Module], targets: list[nn.Module]) -> Callable[[], None]:
    """Polyak averaging ``target <- (1 - tau) target + tau source`` written by hand."""
    src = [p for m in sources for p in m.parameters()]
    tgt = [p for m in targets for p in m.parameters()]

    @torch.no_grad()
    def update() -> None:
        torch._foreach_lerp_(tgt, src, TAU)

    return update


@dataclass
class CaseSetup:
    # Batches by name. The first one is timed; all of them go through the gate.
    batches: dict[str, Any]
    # Method name -> (batch -> Method). Each call must build fresh copies of the networks.
    factories: dict[str, Callable[[Any], Method]]
    description: str = ""
    # The method the others must reproduce (TorchRL where it has the loss).
    reference: str = "torchrl"


CASES: dict[str, Callable[[int, int], CaseSetup]] = {}


# Each case's (small, large) default batch sizes: overhead-bound and compute-bound.
BATCH_SIZES: dict[str, tuple[int, int]] = {}


def register_case(name: str, batch_sizes: tuple[int, int] = (64, 4096)):
    def deco(fn: Callable[[int, int], CaseSetup]):
        CASES[name] = fn
        BATCH_SIZES[name] = batch_sizes
        return fn

    return deco


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
        import rlloss
    except ImportError as err:
        raise MethodUnavailable(f"cannot import rlloss: {err}") from err
    try:
        return getattr(rlloss, name)
    except AttributeError as err:
        raise MethodUnavailable(f"rlloss has no attribute {name!r}") from err


def _zero_grad(params: tuple[torch.Tensor, ...]) -> None:
    for p in params:
        p.grad = None


def _loss_module_method(loss_module: nn.Module, batch, named_params, loss_keys) -> Method:
    """Wrap a TorchRL-API loss module: ``total = sum(out[k] for k in loss_keys)``; its target
    networks, if any, are updated with its library's ``SoftUpdate``."""
    k0, *rest = loss_keys

    def loss() -> torch.Tensor:
        out = loss_module(batch)
        total = out[k0]
        for k in rest:
            total = total + out[k]
        return total

    has_targets = any("target_" in name for name, _ in loss_module.named_buffers()) or any(
        name.startswith("target_") for name, _ in loss_module.named_children()
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
    )


# --------------------------------------------------------------------------- #
# Cases: the PPO family, continuous actions (IndependentNormal actor + value critic)
# --------------------------------------------------------------------------- #
PPO_OBS_DIM, PPO_ACT_DIM, PPO_HIDDEN = 17, 6, (64, 64)
PPO_COMMON = dict(
    entropy_coeff=0.01,
    critic_coeff=1.0,
    loss_critic_type="smooth_l1",
    normalize_advantage=False,
    entropy_bonus=True,
)
PPO_FAMILY = {
    "PPOLoss": {},
    "ClipPPOLoss": {"clip_epsilon": 0.2},
    # Factors of 1 keep beta fixed, so that TorchRL's gradient (which sees the post-update
    # beta) is comparable in the gate; the update rule still runs in every implementation.
    "KLPENPPOLoss": {"dtarg": 0.01, "beta": 1.0, "increment": 1.0, "decrement": 1.0},
    "RPOLoss": {"clip_epsilon": 0.2, "rpo_alpha": 0.5},
}
PPO_LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")


def _ppo_networks(seed: int) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    actor_net = nn.Sequential(
        MLP(
            in_features=PPO_OBS_DIM,
            out_features=2 * PPO_ACT_DIM,
            num_cells=list(PPO_HIDDEN),
            activation_class=nn.Tanh,
        ),
        NormalParamExtractor(),
    )
    critic_net = MLP(
        in_features=PPO_OBS_DIM,
        out_features=1,
        num_cells=list(PPO_HIDDEN),
        activation_class=nn.Tanh,
    )
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic = ValueOperator(critic_net, in_keys=["observation"])
    return {"actor": actor, "critic": critic, "actor_net": actor_net, "critic_net": critic_net}


def _plain_ppo_loss(name: str, nets: dict, batch, keys: tuple, diagnostics: bool) -> Callable:
    """The PPO-family loss ``name`` written by hand on tensors: what a user would write, with
    (``diagnostics``) or without the diagnostics the libraries return alongside the losses."""
    kwargs = {**PPO_COMMON, **PPO_FAMILY[name]}
    actor_net, critic_net = nets["actor_net"], nets["critic_net"]
    distribution_class = nets["actor"].module[-1].distribution_class
    action_key, lp_key = keys
    obs, action, logp_old = batch["observation"], batch[action_key], batch[lp_key]
    adv, value_target = batch["advantage"], batch["value_target"]
    old_loc, old_scale = batch["loc"], batch["scale"]
    eps = kwargs.get("clip_epsilon", 0.2)
    lo, hi = torch.tensor(-eps).log1p().item(), torch.tensor(eps).log1p().item()
    clip = name in ("ClipPPOLoss", "RPOLoss")
    beta = torch.tensor(kwargs.get("beta", 1.0), device=obs.device)
    dtarg = kwargs.get("dtarg", 0.01)
    ent_coeff, critic_coeff = kwargs["entropy_coeff"], kwargs["critic_coeff"]

    def loss() -> torch.Tensor:
        loc, scale = actor_net(obs)
        if name == "RPOLoss":
            loc = loc + (2 * torch.rand_like(loc) - 1) * kwargs["rpo_alpha"]
        dist = distribution_class(loc, scale)
        log_ratio = (dist.log_prob(action) - logp_old).unsqueeze(-1)
        ratio = log_ratio.exp()
        gain = ratio * adv
        if clip:
            gain = torch.minimum(gain, log_ratio.clamp(lo, hi).exp() * adv)
        if name == "KLPENPPOLoss":
            old = distribution_class(old_loc, old_scale)
            kl = torch.distributions.kl_divergence(old, dist).unsqueeze(-1)
            beta_used = beta.clone()
            gain = gain - beta_used * kl
            with torch.no_grad():
                mean_kl = kl.mean()
                factor = torch.where(
                    mean_kl > 1.5 * dtarg,
                    kwargs["increment"],
                    torch.where(mean_kl < dtarg / 1.5, kwargs["decrement"], 1.0),
                )
                beta.copy_(beta * factor)
        loss_objective = -gain.mean()
        entropy = dist.entropy()
        loss_entropy = -ent_coeff * entropy.mean()
        value = critic_net(obs)
        loss_critic = critic_coeff * F.smooth_l1_loss(value_target, value)
        if diagnostics:  # computed as the libraries do, then dropped
            with torch.no_grad():
                lr = log_ratio.detach()
                outputs = [
                    (-lr).mean(),  # kl_approx
                    (torch.expm1(lr) - lr).mean(),  # kl_k3
                    entropy.mean(),
                    1
                    - (value_target - value).var(correction=0)
                    / (value_target.var(correction=0) + 1e-7),  # explained_variance
                ]
                if clip:
                    weight = (lr - lr.max()).exp()
                    outputs += [
                        ((lr < lo) | (lr > hi)).float().mean(),  # clip_fraction
                        weight.sum().square() / (weight.square().sum() * len(lr)),  # ESS
                        ratio.max(),
                        ratio.mean(),
                    ]
                del outputs
        return loss_objective + loss_critic + loss_entropy

    return loss


def _register_ppo_case(name: str) -> None:
    @register_case(name)
    def build(batch_size: int, seed: int) -> CaseSetup:
        nets = _ppo_networks(seed)
        actor, critic = nets["actor"], nets["critic"]
        keys = (actor.dist_sample_keys[0], actor.log_prob_keys[0])
        g = torch.Generator().manual_seed(seed + 1)
        td = TensorDict(
            observation=torch.randn(batch_size, PPO_OBS_DIM, generator=g), batch_size=[batch_size]
        )
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            actor(td)
            critic(td)
        td["advantage"] = torch.randn(batch_size, 1, generator=g)
        td["value_target"] = torch.randn(batch_size, 1, generator=g)
        bench = td.select(
            "observation", "loc", "scale", *keys, "advantage", "value_target", "state_value"
        )
        # Gate-only variant: behaviour log-probs shifted so that ratios spread over ~[0.5, 2]
        # and the clip branch is exercised (the timed batch is on-policy: all ratios are 1).
        offpolicy = bench.clone()
        offpolicy[keys[1]] = offpolicy[keys[1]] + 0.4 * torch.randn(batch_size, generator=g)
        bench, offpolicy = bench.to(DEVICE), offpolicy.to(DEVICE)
        for module in nets.values():
            module.to(DEVICE)
        kwargs = {**PPO_COMMON, **PPO_FAMILY[name]}

        def named(m: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
            out = {f"actor.{n}": p for n, p in m["actor_net"].named_parameters()}
            out.update({f"critic.{n}": p for n, p in m["critic_net"].named_parameters()})
            return out

        def module_factory(cls_getter: Callable[[], type]) -> Callable[[Any], Method]:
            def make(batch) -> Method:
                m = copy.deepcopy(nets)  # one memo: wrappers and raw nets stay linked
                loss = cls_getter()(m["actor"], m["critic"], **kwargs)
                return _loss_module_method(loss, batch, named(m), PPO_LOSS_KEYS)

            return make

        def trainable(m: dict[str, nn.Module]) -> tuple[torch.Tensor, ...]:
            return (*m["actor_net"].parameters(), *m["critic_net"].parameters())

        def plain_factory(diagnostics: bool) -> Callable[[Any], Method]:
            def make(batch) -> Method:
                m = copy.deepcopy(nets)
                loss = _plain_ppo_loss(name, m, batch, keys, diagnostics)
                return Method(loss=loss, params=named(m), trainable=trainable(m))

            return make

        factories = {
            "plain": plain_factory(True),
            "plain-min": plain_factory(False),
            "rlloss": module_factory(lambda: rlloss_attr(name)),
        }
        if hasattr(torchrl.objectives, name):
            factories["torchrl"] = module_factory(lambda: getattr(torchrl.objectives, name))
        return CaseSetup(
            batches={"on-policy": bench, "off-policy": offpolicy},
            factories=factories,
            reference="torchrl" if "torchrl" in factories else "plain",
            description=(
                f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}); "
                f"IndependentNormal actor + value critic, MLP {PPO_OBS_DIM}->"
                f"{'x'.join(map(str, PPO_HIDDEN))} tanh, action dim {PPO_ACT_DIM}"
            ),
        )


for _name in PPO_FAMILY:
    _register_ppo_case(_name)


# --------------------------------------------------------------------------- #
# Cases: DQN and double DQN (QValueActor over an MLP, one-hot actions, target network)
# --------------------------------------------------------------------------- #
DQN_OBS_DIM, DQN_ACTIONS, DQN_HIDDEN, DQN_GAMMA = 8, 4, (64, 64), 0.99
DQN_FAMILY = {"DQNLoss": {"double_dqn": False}, "DDQNLoss": {"double_dqn": True}}


def _plain_dqn_loss(net: nn.Module, target_net: nn.Module, batch, double_dqn: bool) -> Callable:
    """Double / plain DQN written by hand: what a user would write with a target-net copy."""
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]

    def loss() -> torch.Tensor:
        chosen = (net(obs) * action).sum(-1, keepdim=True)
        with torch.no_grad():
            next_q = target_net(next_obs)
            if double_dqn:
                next_value = next_q.gather(-1, net(next_obs).argmax(-1, keepdim=True))
            else:
                next_value = next_q.max(-1, keepdim=True).values
            target = reward + DQN_GAMMA * (~terminated) * next_value
        td_error = (chosen - target).detach().square()  # noqa: F841 - the priority, as written
        return F.mse_loss(chosen, target)

    return loss


def _register_dqn_case(name: str) -> None:
    @register_case(name)
    def build(batch_size: int, seed: int) -> CaseSetup:
        torch.manual_seed(seed)
        net = MLP(
            in_features=DQN_OBS_DIM,
            out_features=DQN_ACTIONS,
            num_cells=list(DQN_HIDDEN),
            activation_class=nn.ReLU,
        )
        g = torch.Generator().manual_seed(seed + 1)
        action = torch.randint(0, DQN_ACTIONS, (batch_size,), generator=g)
        batch = TensorDict(
            {
                "observation": torch.randn(batch_size, DQN_OBS_DIM, generator=g),
                "action": nn.functional.one_hot(action, DQN_ACTIONS),
                "next": {
                    "observation": torch.randn(batch_size, DQN_OBS_DIM, generator=g),
                    "reward": torch.randn(batch_size, 1, generator=g),
                    "terminated": torch.rand(batch_size, 1, generator=g) < 0.1,
                    "done": torch.rand(batch_size, 1, generator=g) < 0.2,
                },
            },
            [batch_size],
        ).to(DEVICE)
        net.to(DEVICE)
        kwargs = DQN_FAMILY[name]

        def named(module: nn.Module) -> dict[str, torch.Tensor]:
            return {f"q.{n}": p for n, p in module.named_parameters()}

        def module_factory(make_loss: Callable[[nn.Module], nn.Module]) -> Callable:
            def make(batch) -> Method:
                module = copy.deepcopy(net)
                actor = QValueActor(module, in_keys=["observation"], action_space="one-hot")
                return _loss_module_method(make_loss(actor), batch, named(module), ("loss",))

            return make

        def torchrl_loss(actor):
            loss = torchrl.objectives.DQNLoss(actor, action_space="one-hot", **kwargs)
            loss.make_value_estimator(gamma=DQN_GAMMA)
            return loss

        def plain(batch) -> Method:
            module = copy.deepcopy(net)
            target = copy.deepcopy(module).requires_grad_(False)
            return Method(
                loss=_plain_dqn_loss(module, target, batch, **kwargs),
                params=named(module),
                trainable=tuple(module.parameters()),
                update_targets=soft_update_of([module], [target]),
            )

        return CaseSetup(
            batches={"replay": batch},
            factories={
                "plain": plain,
                "rlloss": module_factory(
                    lambda actor: rlloss_attr("DQNLoss")(actor, gamma=DQN_GAMMA, **kwargs)
                ),
                "torchrl": module_factory(torchrl_loss),
            },
            description=(
                f"DQNLoss(double_dqn={kwargs['double_dqn']}, loss_function='l2', gamma={DQN_GAMMA})"
                f"; QValueActor over MLP {DQN_OBS_DIM}->{'x'.join(map(str, DQN_HIDDEN))} relu->"
                f"{DQN_ACTIONS}, one-hot actions, target network"
            ),
        )


for _name in DQN_FAMILY:
    _register_dqn_case(_name)


# --------------------------------------------------------------------------- #
# Cases: DDPG and TD3 (deterministic actor, Q critics over [observation, action])
# --------------------------------------------------------------------------- #
AC_OBS_DIM, AC_ACT_DIM, AC_HIDDEN, AC_GAMMA = 17, 6, (256, 256), 0.99
AC_FAMILY = {"DDPGLoss": 1, "TD3Loss": 2}


def _plain_actor_critic_method(nets: dict, batch, name: str, params: dict) -> Method:
    """DDPG / TD3 (policy_noise=0) written by hand as CleanRL does: one module per critic, target
    copies, ``-Q_1(s, mu(s))`` for the actor."""
    actor, critics = nets["actor"], nets["critics"]
    target_actor = copy.deepcopy(actor).requires_grad_(False)
    target_critics = [copy.deepcopy(c).requires_grad_(False) for c in critics]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]
    distance = F.mse_loss if name == "DDPGLoss" else F.smooth_l1_loss

    def loss() -> torch.Tensor:
        with torch.no_grad():
            next_action = target_actor(next_obs)
            if name == "TD3Loss":
                next_action = next_action.clamp(-1.0, 1.0)
            next_inputs = torch.cat([next_obs, next_action], -1)
            next_value = torch.stack([c(next_inputs) for c in target_critics]).min(0).values
            target = reward + AC_GAMMA * (~terminated) * next_value
        inputs = torch.cat([obs, action], -1)
        values = [c(inputs) for c in critics]
        critic_loss = sum(distance(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().square() for v in values]).max(0)  # noqa: F841
        new_inputs = torch.cat([obs, actor(obs)], -1)
        actor_loss = -torch.func.functional_call(
            critics[0], {k: p.detach() for k, p in critics[0].named_parameters()}, (new_inputs,)
        ).mean()
        return actor_loss + critic_loss

    return Method(
        loss=loss,
        params=params,
        trainable=(*actor.parameters(), *(p for c in critics for p in c.parameters())),
        update_targets=soft_update_of([actor, *critics], [target_actor, *target_critics]),
    )


def _register_actor_critic_case(name: str) -> None:
    @register_case(name, batch_sizes=(256, 4096))
    def build(batch_size: int, seed: int) -> CaseSetup:
        torch.manual_seed(seed)
        actor_net = nn.Sequential(
            MLP(in_features=AC_OBS_DIM, out_features=AC_ACT_DIM, num_cells=list(AC_HIDDEN)),
            nn.Tanh(),
        )
        critics = [
            MLP(in_features=AC_OBS_DIM + AC_ACT_DIM, out_features=1, num_cells=list(AC_HIDDEN))
            for _ in range(AC_FAMILY[name])
        ]
        g = torch.Generator().manual_seed(seed + 1)
        batch = TensorDict(
            {
                "observation": torch.randn(batch_size, AC_OBS_DIM, generator=g),
                "action": torch.rand(batch_size, AC_ACT_DIM, generator=g) * 2 - 1,
                "next": {
                    "observation": torch.randn(batch_size, AC_OBS_DIM, generator=g),
                    "reward": torch.randn(batch_size, 1, generator=g),
                    "terminated": torch.rand(batch_size, 1, generator=g) < 0.1,
                    "done": torch.rand(batch_size, 1, generator=g) < 0.2,
                },
            },
            [batch_size],
        ).to(DEVICE)
        for module in (actor_net, *critics):
            module.to(DEVICE)

        def named(nets: dict) -> dict[str, torch.Tensor]:
            out = {f"actor.{n}": p for n, p in nets["actor"].named_parameters()}
            for i, critic in enumerate(nets["critics"]):
                out.update({f"critic{i}.{n}": p for n, p in critic.named_parameters()})
            return out

        def wrapped(nets: dict):
            actor = Actor(nets["actor"], in_keys=["observation"])
            critics = [ValueOperator(c, in_keys=["observation", "action"]) for c in nets["critics"]]
            return actor, critics

        def loss_method(library) -> Callable:
            def make(batch) -> Method:
                nets = copy.deepcopy({"actor": actor_net, "critics": critics})
                actor, qs = wrapped(nets)
                if name == "DDPGLoss":
                    loss = library.DDPGLoss(
                        actor,
                        qs[0],
                        **({"gamma": AC_GAMMA} if library is not torchrl.objectives else {}),
                    )
                    keys = ("loss_actor", "loss_value")
                else:
                    kwargs = {"bounds": (-1.0, 1.0), "policy_noise": 0.0, "num_qvalue_nets": 2}
                    loss = library.TD3Loss(actor, qs, **kwargs)
                    keys = ("loss_actor", "loss_qvalue")
                loss.make_value_estimator(gamma=AC_GAMMA)
                return _loss_module_method(loss, batch, gated(nets), keys)

            return make

        def gated(nets: dict) -> dict[str, torch.Tensor]:
            # TD3's libraries train stacked copies of the critics (an ensemble): the gate then
            # compares the total loss and the actor's gradients only.
            params = named(nets)
            if name == "TD3Loss":
                params = {k: v for k, v in params.items() if k.startswith("actor.")}
            return params

        def plain(batch) -> Method:
            nets = copy.deepcopy({"actor": actor_net, "critics": critics})
            return _plain_actor_critic_method(nets, batch, name, gated(nets))

        return CaseSetup(
            batches={"replay": batch},
            factories={
                "plain": plain,
                "rlloss": loss_method(rlloss_module()),
                "torchrl": loss_method(torchrl.objectives),
            },
            reference="torchrl",
            description=(
                f"{name}; MLP actor and {AC_FAMILY[name]} critic(s) "
                f"{'x'.join(map(str, AC_HIDDEN))} relu, obs {AC_OBS_DIM}, action {AC_ACT_DIM}, "
                "target networks" + (", policy_noise=0" if name == "TD3Loss" else "")
            ),
        )


for _name in AC_FAMILY:
    _register_actor_critic_case(_name)


# --------------------------------------------------------------------------- #
# Cases: SAC (TanhNormal actor, two Q critics) and discrete SAC (categorical actor, Q(s, .))
# --------------------------------------------------------------------------- #
SAC_ACTIONS = 6  # discrete SAC: number of actions
LOG2 = math.log(2.0)


def _detached_call(module: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """``module(*inputs)`` with its parameters detached: the actor's gradient through a critic
    that must not train (what CleanRL gets by stepping only the actor's optimizer)."""
    params = {k: p.detach() for k, p in module.named_parameters()}
    return torch.func.functional_call(module, params, inputs)


def _plain_sac_method(nets: dict, batch, params: dict, discrete: bool) -> Method:
    """SAC / discrete SAC written by hand (CleanRL's structure, TorchRL's loss terms): one module
    per critic, target copies of the critics, ``log_alpha`` a parameter."""
    actor_net, critics = nets["actor_net"], nets["critics"]
    target_critics = [copy.deepcopy(c).requires_grad_(False) for c in critics]
    log_alpha = nets["log_alpha"]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    if discrete:
        target_entropy = -math.log(1.0 / SAC_ACTIONS) * 0.98
    else:
        target_entropy = -float(AC_ACT_DIM)

    def sample(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised tanh-Gaussian action and its log-probability [B]."""
        loc, scale = actor_net(o)
        eps = torch.randn_like(loc)
        u = loc + scale * eps
        log_prob = -0.5 * eps.square() - scale.log() - 0.5 * math.log(2 * math.pi)
        log_prob = log_prob - 2.0 * (LOG2 - u - F.softplus(-2.0 * u))  # tanh's Jacobian
        return torch.tanh(u), log_prob.sum(-1)

    def continuous_loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = sample(next_obs)
            inputs = torch.cat([next_obs, next_action], -1)
            next_q = torch.stack([c(inputs) for c in target_critics]).min(0).values
            next_value = next_q - alpha * next_log_prob.unsqueeze(-1)
            target = reward + AC_GAMMA * not_terminated * next_value
        inputs = torch.cat([obs, action], -1)
        values = [c(inputs) for c in critics]
        critic_loss = sum(F.mse_loss(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().abs() for v in values]).max(0)  # noqa: F841
        new_action, log_prob = sample(obs)
        inputs = torch.cat([obs, new_action], -1)
        q = torch.stack([_detached_call(c, inputs) for c in critics]).min(0).values.squeeze(-1)
        actor_loss = (alpha * log_prob - q).mean()
        alpha_loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
        entropy = -log_prob.detach().mean()  # noqa: F841 - reported by the libraries
        return actor_loss + critic_loss + alpha_loss

    def discrete_loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_log_p = actor_net(next_obs).log_softmax(-1)
            next_q = torch.stack([c(next_obs) for c in target_critics]).min(0).values
            next_value = (next_log_p.exp() * (next_q - alpha * next_log_p)).sum(-1, keepdim=True)
            target = reward + AC_GAMMA * not_terminated * next_value
        values = [(c(obs) * action).sum(-1, keepdim=True) for c in critics]
        critic_loss = sum(F.mse_loss(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().abs() for v in values]).max(0)  # noqa: F841
        log_p = actor_net(obs).log_softmax(-1)
        p = log_p.exp()
        q = torch.stack([_detached_call(c, obs) for c in critics]).min(0).values
        actor_loss = (p * (alpha * log_p - q)).sum(-1).mean()
        neg_entropy = (p * log_p).sum(-1).detach()
        alpha_loss = -(log_alpha * (neg_entropy + target_entropy)).mean()
        return actor_loss + critic_loss + alpha_loss

    return Method(
        loss=discrete_loss if discrete else continuous_loss,
        params=params,
        trainable=(
            log_alpha,
            *actor_net.parameters(),
            *(p for c in critics for p in c.parameters()),
        ),
        update_targets=soft_update_of(critics, target_critics),
    )


def _register_sac_case(name: str, discrete: bool) -> None:
    @register_case(name, batch_sizes=(256, 4096))
    def build(batch_size: int, seed: int) -> CaseSetup:
        torch.manual_seed(seed)
        act_dim = SAC_ACTIONS if discrete else AC_ACT_DIM
        if discrete:
            actor_net = MLP(in_features=AC_OBS_DIM, out_features=act_dim, num_cells=list(AC_HIDDEN))
        else:
            actor_net = nn.Sequential(
                MLP(in_features=AC_OBS_DIM, out_features=2 * act_dim, num_cells=list(AC_HIDDEN)),
                NormalParamExtractor(),
            )
        critic_in, critic_out = (AC_OBS_DIM, act_dim) if discrete else (AC_OBS_DIM + act_dim, 1)
        critics = [
            MLP(in_features=critic_in, out_features=critic_out, num_cells=list(AC_HIDDEN))
            for _ in range(2)
        ]
        g = torch.Generator().manual_seed(seed + 1)
        if discrete:
            index = torch.randint(0, act_dim, (batch_size,), generator=g)
            action = nn.functional.one_hot(index, act_dim)
        else:
            action = torch.rand(batch_size, act_dim, generator=g) * 2 - 1
        batch = TensorDict(
            {
                "observation": torch.randn(batch_size, AC_OBS_DIM, generator=g),
                "action": action,
                "next": {
                    "observation": torch.randn(batch_size, AC_OBS_DIM, generator=g),
                    "reward": torch.randn(batch_size, 1, generator=g),
                    "terminated": torch.rand(batch_size, 1, generator=g) < 0.1,
                    "done": torch.rand(batch_size, 1, generator=g) < 0.2,
                },
            },
            [batch_size],
        ).to(DEVICE)
        for module in (actor_net, *critics):
            module.to(DEVICE)
        template = {"actor_net": actor_net, "critics": critics}

        def actor_of(net: nn.Module) -> ProbabilisticActor:
            if discrete:
                head = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
                return ProbabilisticActor(
                    head, in_keys=["logits"], distribution_class=OneHotCategorical
                )
            head = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
            return ProbabilisticActor(
                head,
                in_keys=["loc", "scale"],
                distribution_class=TanhNormal,
                distribution_kwargs={"low": -1.0, "high": 1.0},
            )

        def critic_of(net: nn.Module) -> nn.Module:
            if discrete:
                return TensorDictModule(net, in_keys=["observation"], out_keys=["action_value"])
            return ValueOperator(net, in_keys=["observation", "action"])

        def named(actor_net: nn.Module, log_alpha: torch.Tensor) -> dict[str, torch.Tensor]:
            # the libraries train stacked copies of the critics: the gate compares the total
            # loss and the actor's and temperature's gradients
            out = {f"actor.{n}": p for n, p in actor_net.named_parameters()}
            out["log_alpha"] = log_alpha
            return out

        def loss_method(library) -> Callable:
            def make(batch) -> Method:
                nets = copy.deepcopy(template)
                actor, qs = actor_of(nets["actor_net"]), [critic_of(c) for c in nets["critics"]]
                kwargs = {"num_qvalue_nets": 2, "loss_function": "l2", "alpha_init": 1.0}
                if discrete:
                    loss = library.DiscreteSACLoss(
                        actor, qs, num_actions=act_dim, action_space="one-hot", **kwargs
                    )
                else:
                    loss = library.SACLoss(actor, qs, target_entropy=-float(act_dim), **kwargs)
                loss.make_value_estimator(gamma=AC_GAMMA)
                keys = ("loss_actor", "loss_qvalue", "loss_alpha")
                return _loss_module_method(
                    loss, batch, named(nets["actor_net"], loss.log_alpha), keys
                )

            return make

        def plain(batch) -> Method:
            nets = copy.deepcopy(template)
            nets["log_alpha"] = nn.Parameter(torch.zeros((), device=DEVICE))
            params = named(nets["actor_net"], nets["log_alpha"])
            return _plain_sac_method(nets, batch, params, discrete)

        return CaseSetup(
            batches={"replay": batch},
            factories={
                "plain": plain,
                "rlloss": loss_method(rlloss_module()),
                "torchrl": loss_method(torchrl.objectives),
            },
            reference="torchrl",
            description=(
                f"{name}(loss_function='l2', alpha_init=1); "
                + ("categorical actor, Q(s, .) critics" if discrete else "TanhNormal actor")
                + f", 2 critics, MLPs {'x'.join(map(str, AC_HIDDEN))} relu, obs {AC_OBS_DIM}, "
                f"{'actions' if discrete else 'action dim'} {act_dim}, target critics"
            ),
        )


_register_sac_case("SACLoss", discrete=False)
_register_sac_case("DiscreteSACLoss", discrete=True)


# --------------------------------------------------------------------------- #
# Cases: MPO (IndependentNormal actor, Q(s, a) critic) and categorical MPO (Q(s, .) critic)
# --------------------------------------------------------------------------- #
# TorchRL has no MPO: the hand-written ``plain`` update is the reference. Acme's defaults,
# passed explicitly so that both implementations read the same numbers.
MPO_KWARGS = {
    "num_samples": 20,
    "epsilon": 0.1,
    "epsilon_mean": 2.5e-3,
    "epsilon_stddev": 1e-6,
    "init_log_temperature": 10.0,
    "init_log_alpha_mean": 10.0,
    "init_log_alpha_stddev": 1000.0,
    "loss_function": "l2",
    "gamma": AC_GAMMA,
}
DISCRETE_MPO_KWARGS = {
    "epsilon": 0.1,
    "epsilon_policy": 2.5e-3,
    "init_log_temperature": 3.0,
    "init_log_alpha": 3.0,
    "loss_function": "l2",
    "gamma": AC_GAMMA,
}
MPO_LOSS_KEYS = ("loss_actor", "loss_qvalue", "loss_temperature", "loss_alpha")
MPO_LOW, MPO_HIGH = -1.0, 1.0  # the action bounds (a Bounded spec)
MPO_MIN_LOG_DUAL = -18.0  # Acme's floor on the dual parameters
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _mpo_duals(discrete: bool) -> dict[str, nn.Parameter]:
    """The dual parameters (softplus space) named as rlloss names them, at their initial values."""
    if discrete:
        kw = DISCRETE_MPO_KWARGS
        shapes = {
            "log_temperature": ((), kw["init_log_temperature"]),
            "log_alpha": ((), kw["init_log_alpha"]),
        }
    else:
        kw = MPO_KWARGS
        shapes = {
            "log_temperature": ((), kw["init_log_temperature"]),
            "log_alpha_mean": ((AC_ACT_DIM,), kw["init_log_alpha_mean"]),
            "log_alpha_stddev": ((AC_ACT_DIM,), kw["init_log_alpha_stddev"]),
        }
    return {
        name: nn.Parameter(torch.full(shape, init, device=DEVICE))
        for name, (shape, init) in shapes.items()
    }


def _dual_value(parameter: torch.Tensor) -> torch.Tensor:
    """A Lagrange multiplier from its parameter: ``softplus(param) + 1e-8``."""
    return F.softplus(parameter) + 1e-8


@torch.no_grad()
def _project_duals(duals: dict[str, nn.Parameter]) -> None:
    """Each dual parameter clamped in place onto ``[-18, inf)``, outside the graph."""
    for parameter in duals.values():
        parameter.clamp_(min=MPO_MIN_LOG_DUAL)


def _normal_log_prob(value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``sum_d log N(value_d; loc_d, scale_d^2)`` over the last dim."""
    z = (value - loc) / scale
    return (-0.5 * z.square() - torch.log(scale) - LOG_SQRT_2PI).sum(-1)


def _normal_kl(loc_p, scale_p, loc_q, scale_q) -> torch.Tensor:
    """``KL(N(loc_p, scale_p^2) || N(loc_q, scale_q^2))`` per dimension."""
    ratio = (scale_p / scale_q) ** 2
    return 0.5 * (ratio + ((loc_p - loc_q) / scale_q) ** 2 - 1 - ratio.log())


def _plain_mpo_method(nets: dict, batch, params: dict, discrete: bool, diagnostics: bool) -> Method:
    """MPO / categorical MPO written by hand (Acme's loss terms, rlloss's call order): target
    copies of the actor and the critic, the duals ``nn.Parameter``s; the diagnostics rlloss
    returns (``diagnostics``) are computed and dropped."""
    actor_net, critic, duals = nets["actor_net"], nets["critic"], nets["duals"]
    target_actor = copy.deepcopy(actor_net).requires_grad_(False)
    target_critic = copy.deepcopy(critic).requires_grad_(False)
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    kw = DISCRETE_MPO_KWARGS if discrete else MPO_KWARGS
    gamma, num_samples = kw["gamma"], kw.get("num_samples", 0)

    def target_samples(o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Under no_grad: the target policy's loc, scale [B, D], N draws u [N, B, D] and their
        target values Q_target(s, clip(u)) [N, B]."""
        with torch.no_grad():
            loc, scale = target_actor(o)
            u = loc + scale * torch.randn(
                (num_samples, *loc.shape), dtype=loc.dtype, device=loc.device
            )
            inputs = torch.cat([o.expand(num_samples, *o.shape), u.clamp(MPO_LOW, MPO_HIGH)], -1)
            return loc, scale, u, target_critic(inputs).squeeze(-1)

    def continuous_critic_loss() -> torch.Tensor:
        """Expected SARSA: ``(Q(s, clip(a)) - r - gamma (1 - term) mean_j Q_t(s', a'_j))^2``."""
        with torch.no_grad():
            next_value = target_samples(next_obs)[3].mean(0).unsqueeze(-1)
            target = reward + gamma * not_terminated * next_value
        value = critic(torch.cat([obs, action.clamp(MPO_LOW, MPO_HIGH)], -1))
        if diagnostics:
            td_error = (value - target).detach().abs().squeeze(-1)  # noqa: F841 - the priority
        return F.mse_loss(value, target)

    def continuous_loss() -> torch.Tensor:
        """The decoupled M-step, the E-step's temperature dual and the KL duals, and the critic."""
        critic_loss = continuous_critic_loss()  # draws first, as rlloss's forward does
        _project_duals(duals)
        eta = _dual_value(duals["log_temperature"])
        alpha_mean = _dual_value(duals["log_alpha_mean"])
        alpha_stddev = _dual_value(duals["log_alpha_stddev"])
        t_loc, t_scale, u, q = target_samples(obs)
        loc, scale = actor_net(obs)
        # E-step: weights over the samples, temperature dual
        weights = torch.softmax(q / eta.detach(), dim=0)
        lse = torch.logsumexp(q / eta, dim=0) - math.log(num_samples)
        temperature_loss = (eta * (kw["epsilon"] + lse)).mean()
        # M-step: decoupled likelihoods, per-dimension KLs, their penalties and duals
        kl_mean = _normal_kl(t_loc, t_scale, loc, t_scale)
        kl_stddev = _normal_kl(t_loc, t_scale, t_loc, scale)
        actor_loss = (
            -(weights * _normal_log_prob(u, loc, t_scale)).sum(0)
            - (weights * _normal_log_prob(u, t_loc, scale)).sum(0)
            + (alpha_mean.detach() * kl_mean).sum(-1)
            + (alpha_stddev.detach() * kl_stddev).sum(-1)
        ).mean()
        alpha_loss = (
            (alpha_mean * (kw["epsilon_mean"] - kl_mean.detach())).sum(-1)
            + (alpha_stddev * (kw["epsilon_stddev"] - kl_stddev.detach())).sum(-1)
        ).mean()
        if diagnostics:  # computed as rlloss does, then dropped
            with torch.no_grad():
                outputs = [
                    eta,
                    alpha_mean.mean(),
                    alpha_stddev.mean(),
                    kl_mean.sum(-1).mean(),
                    kl_stddev.sum(-1).mean(),
                    (weights * torch.log(num_samples * weights + 1e-8)).sum(0).mean(),  # kl_q
                    q.mean(),
                ]
                del outputs
        return actor_loss + critic_loss + temperature_loss + alpha_loss

    def discrete_critic_loss() -> torch.Tensor:
        """Exact expected SARSA: ``(Q(s, a) - r - gamma (1 - term) sum_a' pi_t Q_t(s', a'))^2``."""
        with torch.no_grad():
            next_p = target_actor(next_obs).softmax(-1)
            next_value = (next_p * target_critic(next_obs)).sum(-1, keepdim=True)
            target = reward + gamma * not_terminated * next_value
        value = critic(obs).gather(-1, action.unsqueeze(-1))
        if diagnostics:
            td_error = (value - target).detach().abs().squeeze(-1)  # noqa: F841 - the priority
        return F.mse_loss(value, target)

    def discrete_loss() -> torch.Tensor:
        """Categorical E-step over every action, cross-entropy M-step with its KL dual, critic."""
        critic_loss = discrete_critic_loss()
        _project_duals(duals)
        eta, alpha = _dual_value(duals["log_temperature"]), _dual_value(duals["log_alpha"])
        with torch.no_grad():
            target_log_p = target_actor(obs).log_softmax(-1)
            q = target_critic(obs)
        log_p = actor_net(obs).log_softmax(-1)
        log_weights = (target_log_p + q / eta.detach()).log_softmax(-1)
        temperature_loss = eta * (kw["epsilon"] + torch.logsumexp(target_log_p + q / eta, -1))
        kl = (target_log_p.exp() * (target_log_p - log_p)).sum(-1)
        actor_loss = (-(log_weights.exp() * log_p).sum(-1) + alpha.detach() * kl).mean()
        alpha_loss = (alpha * (kw["epsilon_policy"] - kl.detach())).mean()
        if diagnostics:  # computed as rlloss does, then dropped
            with torch.no_grad():
                kl_q = (log_weights.exp() * (log_weights - target_log_p)).sum(-1)
                outputs = [eta, alpha, kl.mean(), kl_q.mean(), q.mean()]
                del outputs
        return actor_loss + critic_loss + temperature_loss.mean() + alpha_loss

    return Method(
        loss=discrete_loss if discrete else continuous_loss,
        params=params,
        trainable=(*duals.values(), *actor_net.parameters(), *critic.parameters()),
        update_targets=soft_update_of([actor_net, critic], [target_actor, target_critic]),
    )


def _register_mpo_case(name: str, discrete: bool) -> None:
    @register_case(name, batch_sizes=(256, 1024))
    def build(batch_size: int, seed: int) -> CaseSetup:
        torch.manual_seed(seed)
        act_dim = SAC_ACTIONS if discrete else AC_ACT_DIM
        if discrete:
            actor_net = MLP(in_features=AC_OBS_DIM, out_features=act_dim, num_cells=list(AC_HIDDEN))
        else:
            actor_net = nn.Sequential(
                MLP(in_features=AC_OBS_DIM, out_features=2 * act_dim, num_cells=list(AC_HIDDEN)),
                NormalParamExtractor(),
            )
        critic_in, critic_out = (AC_OBS_DIM, act_dim) if discrete else (AC_OBS_DIM + act_dim, 1)
        critic = MLP(in_features=critic_in, out_features=critic_out, num_cells=list(AC_HIDDEN))
        g = torch.Generator().manual_seed(seed + 1)
        if discrete:
            action = torch.randint(0, act_dim, (batch_size,), generator=g)  # an index
        else:
            # stored actions partly outside the bounds (Acme's buffer keeps the unclipped
            # sample): the critic's clipping is exercised
            action = 1.2 * (torch.rand(batch_size, act_dim, generator=g) * 2 - 1)
        batch = TensorDict(
            {
                "observation": torch.randn(batch_size, AC_OBS_DIM, generator=g),
                "action": action,
                "next": {
                    "observation": torch.randn(batch_size, AC_OBS_DIM, generator=g),
                    "reward": torch.randn(batch_size, 1, generator=g),
                    "terminated": torch.rand(batch_size, 1, generator=g) < 0.1,
                    "done": torch.rand(batch_size, 1, generator=g) < 0.2,
                },
            },
            [batch_size],
        ).to(DEVICE)
        for module in (actor_net, critic):
            module.to(DEVICE)
        template = {"actor_net": actor_net, "critic": critic}

        def actor_of(net: nn.Module) -> ProbabilisticActor:
            if discrete:
                head = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
                return ProbabilisticActor(
                    head, in_keys=["logits"], distribution_class=torch.distributions.Categorical
                )
            head = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
            return ProbabilisticActor(
                head, in_keys=["loc", "scale"], distribution_class=IndependentNormal
            )

        def critic_of(net: nn.Module) -> nn.Module:
            if discrete:
                return TensorDictModule(net, in_keys=["observation"], out_keys=["action_value"])
            return ValueOperator(net, in_keys=["observation", "action"])

        def named(nets: dict, duals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            # one critic (no stacked copies): every network parameter and every dual is gated
            out = {f"actor.{n}": p for n, p in nets["actor_net"].named_parameters()}
            out.update({f"critic.{n}": p for n, p in nets["critic"].named_parameters()})
            out.update({f"dual.{n}": p for n, p in duals.items()})
            return out

        def rlloss_method(batch) -> Method:
            nets = copy.deepcopy(template)
            actor, qvalue = actor_of(nets["actor_net"]), critic_of(nets["critic"])
            if discrete:
                loss = rlloss_attr("DiscreteMPOLoss")(actor, qvalue, **DISCRETE_MPO_KWARGS)
            else:
                spec = Bounded(MPO_LOW, MPO_HIGH, shape=(act_dim,), device=DEVICE)
                loss = rlloss_attr("MPOLoss")(actor, qvalue, action_spec=spec, **MPO_KWARGS)
            duals = {n: getattr(loss, n) for n in _mpo_duals(discrete)}
            return _loss_module_method(loss, batch, named(nets, duals), MPO_LOSS_KEYS)

        def plain_factory(diagnostics: bool) -> Callable[[Any], Method]:
            def make(batch) -> Method:
                nets = copy.deepcopy(template)
                nets["duals"] = _mpo_duals(discrete)
                params = named(nets, nets["duals"])
                return _plain_mpo_method(nets, batch, params, discrete, diagnostics)

            return make

        kwargs = DISCRETE_MPO_KWARGS if discrete else MPO_KWARGS
        return CaseSetup(
            batches={"replay": batch},
            factories={
                "plain": plain_factory(True),
                "plain-min": plain_factory(False),
                "rlloss": rlloss_method,
            },
            reference="plain",  # TorchRL has no MPO
            description=(
                f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}); "
                + (
                    "Categorical actor, Q(s, .) critic"
                    if discrete
                    else f"IndependentNormal actor, Q(s, a) critic, bounds [{MPO_LOW}, {MPO_HIGH}]"
                )
                + f", MLPs {'x'.join(map(str, AC_HIDDEN))} relu, obs {AC_OBS_DIM}, "
                f"{'actions' if discrete else 'action dim'} {act_dim}, target actor and critic"
            ),
        )


_register_mpo_case("MPOLoss", discrete=False)
_register_mpo_case("DiscreteMPOLoss", discrete=True)


# --------------------------------------------------------------------------- #
# Gate
# --------------------------------------------------------------------------- #
LEVELS = ("forward", "backward", "update")
MODES = ("eager", "compiled")


def level_steps(method: Method, compiled: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """The three timed levels of one method: ``forward`` (the loss, autograd graph built),
    ``backward`` (zero_grad + forward + backward) and ``update`` (backward + Adam step + target
    update). ``compiled`` wraps the loss in ``torch.compile`` (the same for every method)."""
    loss = torch.compile(method.loss) if compiled else method.loss
    params = method.trainable
    optimizer = torch.optim.Adam(params, lr=1e-6, foreach=True)

    def backward() -> torch.Tensor:
        _zero_grad(params)
        total = loss()
        total.backward()
        return total

    def update() -> torch.Tensor:
        total = backward()
        optimizer.step()
        if method.update_targets is not None:
            method.update_targets()
        return total

    return {"forward": loss, "backward": backward, "update": update}


def _values(backward: Callable[[], torch.Tensor], method: Method) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)  # methods that draw noise draw the same
    total = backward()
    vals = {"loss": total.detach().clone()}
    for name, p in method.params.items():
        if p.grad is None:
            raise AssertionError(f"no gradient reached parameter {name}")
        vals[f"grad/{name}"] = p.grad.detach().clone()
    return vals


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _compare(vals: dict, ref: dict, rtol: float, batch_name: str, entry: dict) -> None:
    for key, r in ref.items():
        err = _rel_err(vals[key], r)
        if err > entry["max_rel_err"] or math.isnan(err):
            entry["max_rel_err"], entry["worst"] = err, f"{batch_name}:{key}"
        if not err <= rtol:
            entry["ok"] = False


def gate(
    setup: CaseSetup, names: list[str], rtol: float, compiled: bool
) -> tuple[dict[str, dict], dict[str, Method]]:
    """Compare every method with the case's eager reference on every batch: the total loss and
    the gradient of every gated parameter. ``compiled``: the methods' compiled losses are
    compared (with the same eager reference). Returns the per-method report and, for the methods
    that passed, fresh instances on the timed batch (compiled ones already warm)."""
    report: dict[str, dict] = {}
    # Compiled losses draw their noise (RPO, TD3 smoothing, SAC) with inductor's own generator
    # unless told to fall back to eager's; the gate checks the math, so it uses eager's stream.
    with torch._inductor.config.patch(fallback_random=True):
        for batch_name, batch in setup.batches.items():
            reference = setup.factories[setup.reference](batch)
            ref = _values(level_steps(reference, False)["backward"], reference)
            for name in names:
                entry = report.setdefault(name, {"ok": True, "max_rel_err": 0.0, "worst": None})
                if name == setup.reference and not compiled or "unsupported" in entry:
                    continue
                try:
                    method = setup.factories[name](batch)
                    _compare(
                        _values(level_steps(method, compiled)["backward"], method),
                        ref,
                        rtol,
                        batch_name,
                        entry,
                    )
                except Exception as err:  # noqa: BLE001 - any failure of a method fails its gate
                    message = f"{type(err).__name__}: {err}"[:500]
                    if compiled and name == "torchrl" and _is_compile_error(err):
                        # TorchRL's own loss does not compile: a row without it, not a failure
                        entry["unsupported"] = f"does not compile: {message}"
                        continue
                    entry["ok"], entry["error"] = False, message
                    traceback.print_exc()
    if compiled:
        torch._dynamo.reset()  # the timed methods compile afresh, with the default generator
    names = [n for n in names if report[n]["ok"] and "unsupported" not in report[n]]
    timed_batch = next(iter(setup.batches.values()))
    fresh = {name: setup.factories[name](timed_batch) for name in names}
    return report, fresh


def _is_compile_error(err: BaseException) -> bool:
    """Whether ``err`` was raised by torch.compile (dynamo or a backend) rather than the loss."""
    import torch._dynamo.exc as dynamo_exc

    return isinstance(err, (dynamo_exc.BackendCompilerFailed, dynamo_exc.Unsupported))


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #
def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _time_block(step: Callable[[], Any], inner: int) -> float:
    gc.collect()
    gc.disable()
    try:
        _sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        _sync()
        return (time.perf_counter() - t0) / inner
    finally:
        gc.enable()


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _summary(xs: list[float], scale: float = 1.0) -> dict[str, float]:
    return {
        "median": _quantile(xs, 0.5) * scale,
        "p25": _quantile(xs, 0.25) * scale,
        "p75": _quantile(xs, 0.75) * scale,
        "min": min(xs) * scale,
        "max": max(xs) * scale,
    }


def time_methods(
    steps: dict[str, Callable[[], Any]], repeats: int, inner: int, warmup: int, block_ms: float
) -> tuple[dict[str, list[float]], int]:
    names = list(steps)
    if not names:
        return {}, 0
    for name in names:
        for _ in range(warmup):
            steps[name]()
    if inner <= 0:  # calibrate on the slowest method
        slowest = max(_time_block(steps[n], 3) for n in names)
        inner = max(1, round(block_ms / 1e3 / slowest))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(_time_block(steps[name], inner))
    return samples, inner


# --------------------------------------------------------------------------- #
# Reporting
# --------------------------------------------------------------------------- #
def machine_info() -> dict[str, Any]:
    cpu_model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    git = None
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        git = {"commit": rev, "dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "torchrl": torchrl.__version__,
        "git": git,
    }


def _fmt_time(row: dict, name: str) -> str:
    m = row["methods"].get(name, {})
    if m.get("status") in ("FAILED", "n/a"):
        return m["status"]
    if "time_us" not in m:
        return "skipped"
    t = m["time_us"]
    return f"{t['median']:.1f} [{t['p25']:.1f}-{t['p75']:.1f}]"


def _fmt_ratio(row: dict, key: str) -> str:
    r = row["ratios"].get(key)
    return "-" if r is None else f"{r['median']:.2f}x [{r['p25']:.2f}-{r['p75']:.2f}]"


def print_table(case: str, description: str, rows: list[dict]) -> None:
    header = [
        "mode",
        "level",
        "batch",
        "plain (us)",
        "plain-min (us)",
        "rlloss (us)",
        "torchrl (us)",
        "rlloss/plain",
        "torchrl/rlloss",
    ]
    body = [
        [
            row["mode"],
            row["level"],
            str(row["batch_size"]) + ("" if row["status"] == "ok" else " FAILED"),
            _fmt_time(row, "plain"),
            _fmt_time(row, "plain-min"),
            _fmt_time(row, "rlloss"),
            _fmt_time(row, "torchrl"),
            _fmt_ratio(row, "rlloss/plain"),
            _fmt_ratio(row, "torchrl/rlloss"),
        ]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    print(f"\n{case}: {description}")
    print("median per step [p25-p75]; ratios: median [IQR] of paired per-round ratios")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for cells in body:
        print(line(cells))


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #
@dataclass
class Config:
    cases: list[str]
    batch_sizes: list[int]
    levels: list[str]
    modes: list[str]
    repeats: int
    inner: int
    warmup: int
    block_ms: float
    rtol: float
    compiled_rtol: float
    seed: int
    require_all: bool
    out: Path
    device: str = "cpu"
    smoke: bool = False


RATIOS = (("rlloss", "plain"), ("rlloss", "plain-min"), ("torchrl", "rlloss"), ("torchrl", "plain"))


def run_case(case: str, batch_size: int, cfg: Config) -> list[dict]:
    """One row per (mode, level): every method gated, then timed interleaved."""
    setup = CASES[case](batch_size, cfg.seed)
    statuses: dict[str, dict] = {}
    available = []
    for name in METHODS:
        if name not in setup.factories:
            statuses[name] = {"status": "n/a", "reason": "no such loss in that library"}
            continue
        try:
            setup.factories[name](next(iter(setup.batches.values())))
            available.append(name)
        except MethodUnavailable as err:
            statuses[name] = {"status": "skipped", "reason": str(err)}
            print(f"[{case} B={batch_size}] {name}: skipped ({err})", file=sys.stderr)

    rows = []
    for mode in cfg.modes:
        compiled = mode == "compiled"
        names = [n for n in available if not (compiled and n == "plain-min")]
        if compiled:
            torch._dynamo.reset()  # every method compiles afresh, none hits a cache limit
        t0 = time.perf_counter()
        report, methods = gate(setup, names, cfg.compiled_rtol if compiled else cfg.rtol, compiled)
        gate_s = time.perf_counter() - t0
        methods_status = dict(statuses)
        for name, rep in report.items():
            if "unsupported" in rep:
                methods_status[name] = {"status": "n/a", "reason": rep["unsupported"]}
                print(f"[{case} B={batch_size} {mode}] {name}: {rep['unsupported']}", file=sys.stderr)
                continue
            methods_status[name] = {"status": "ok" if rep["ok"] else "FAILED", "gate": rep}
            if not rep["ok"]:
                print(f"[{case} B={batch_size} {mode}] {name}: gate FAILED {rep}", file=sys.stderr)
        if compiled and "plain-min" in available:
            methods_status["plain-min"] = {"status": "n/a", "reason": "eager only"}
        skipped = [n for n, m in methods_status.items() if m["status"] == "skipped"]
        failed = [n for n, m in methods_status.items() if m["status"] == "FAILED"]
        status = "FAILED" if failed or (skipped and cfg.require_all) else "ok"
        steps = {n: level_steps(m, compiled) for n, m in methods.items()}
        for level in cfg.levels:  # "update" last: it changes the weights
            samples, inner = time_methods(
                {n: s[level] for n, s in steps.items()},
                cfg.repeats,
                cfg.inner,
                cfg.warmup,
                cfg.block_ms,
            )
            row: dict[str, Any] = {
                "case": case,
                "description": setup.description,
                "batch_size": batch_size,
                "mode": mode,
                "level": level,
                "device": str(DEVICE),
                "status": status,
                "inner": inner,
                "gate_and_compile_s": gate_s,
                "methods": copy.deepcopy(methods_status),
                "ratios": {},
            }
            for name, xs in samples.items():
                row["methods"][name]["time_us"] = _summary(xs, 1e6)
                row["methods"][name]["samples_us"] = [x * 1e6 for x in xs]
            for num, den in RATIOS:
                if num in samples and den in samples:
                    paired = [a / b for a, b in zip(samples[num], samples[den], strict=True)]
                    row["ratios"][f"{num}/{den}"] = _summary(paired)
            rows.append(row)
    return rows


def batch_sizes_of(case: str, cfg: Config) -> list[int]:
    """``--batch-sizes`` if given, else the case's (small, large) pair, or its small one with
    ``--smoke``."""
    if cfg.batch_sizes:
        return cfg.batch_sizes
    small, large = BATCH_SIZES[case]
    return [small] if cfg.smoke else [small, large]


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument(
        "--batch-sizes",
        nargs="+",
        default=None,
        help="e.g. '64 4096' or '64,4096' (default: each case's small and large sizes, 64 and 4096 "
        "for PPO and DQN, 256 and 4096 for DDPG, TD3 and SAC, 256 and 1024 for MPO; the small "
        "one with --smoke)",
    )
    p.add_argument("--levels", nargs="+", default=list(LEVELS), choices=LEVELS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--repeats", type=int, default=30, help="interleaved rounds (samples per method)"
    )
    p.add_argument(
        "--inner", type=int, default=0, help="steps per timed block; 0 = auto (--block-ms)"
    )
    p.add_argument("--warmup", type=int, default=20, help="untimed steps per method before timing")
    p.add_argument("--block-ms", type=float, default=50.0, help="target block length for --inner 0")
    p.add_argument("--rtol", type=float, default=1e-5, help="equality-gate relative tolerance")
    p.add_argument(
        "--compiled-rtol", type=float, default=1e-4, help="gate tolerance of compiled losses"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--require-all", action="store_true", help="a method that cannot be built is a failure"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--smoke", action="store_true", help="tiny run (seconds) that still checks the gate"
    )
    a = p.parse_args(argv)
    if a.smoke:
        a.repeats, a.inner, a.warmup = min(a.repeats, 3), a.inner or 2, min(a.warmup, 2)
    levels = [level for level in LEVELS if level in a.levels]  # "update" last
    return Config(
        cases=a.cases,
        batch_sizes=[int(b) for arg in a.batch_sizes or [] for b in arg.split(",") if b],
        levels=levels,
        modes=a.modes,
        repeats=a.repeats,
        inner=a.inner,
        warmup=a.warmup,
        block_ms=a.block_ms,
        rtol=a.rtol,
        compiled_rtol=a.compiled_rtol,
        seed=a.seed,
        require_all=a.require_all,
        out=a.out,
        device=a.device,
        smoke=a.smoke,
    )


def main(argv: list[str] | None = None) -> int:
    global DEVICE
    cfg = parse_args(argv)
    DEVICE = torch.device(cfg.device)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set, or parallel work already started

    rows = []
    for case in cfg.cases:
        case_rows = [row for b in batch_sizes_of(case, cfg) for row in run_case(case, b, cfg)]
        rows.extend(case_rows)
        print_table(case, case_rows[0]["description"], case_rows)

    ok = all(r["status"] == "ok" for r in rows)
    result = {
        "machine": machine_info(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "method": "per step: forward (loss, graph built) | backward (zero_grad(set_to_none) + "
        "forward + backward) | update (backward + Adam step + soft target update); eager or "
        "torch.compile'd loss; 1 CPU thread; interleaved rotated rounds; microseconds per step",
        "ok": ok,
        "results": rows,
    }
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {cfg.out}" + ("" if ok else "  (some rows FAILED)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
