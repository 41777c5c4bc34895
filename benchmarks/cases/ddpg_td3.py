"""DDPG, TD3 and TD3+BC (deterministic actor, Q critics over [observation, action]): DDPGLoss,
TD3Loss and TD3BCLoss, and their hand-written plain-torch baseline."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
import torchrl.objectives
from torch import nn
from torchrl.modules import Actor, ValueOperator

from benchmarks.cases.common import (
    ACT_DIM,
    CUSTOM_SUFFIX,
    GAMMA,
    HIDDEN_TEXT,
    OBS_DIM,
    detached_call,
    frozen_copies,
    library_factories,
    loss_module_method,
    mlp,
    on_device,
    prefixed,
    q_net,
    replay_batch,
    soft_update_of,
)
from benchmarks.cases.handwritten import hand_deterministic_loss
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (256, 4096)
CRITICS = {"DDPGLoss": 1, "TD3Loss": 2, "TD3BCLoss": 2}
TD3_BC_ALPHA = 2.5  # the paper's weight of the RL term


def plain_actor_critic_method(nets: dict, batch, name: str, params: dict) -> Method:
    """DDPG / TD3 / TD3+BC (policy_noise=0) written by hand as CleanRL does: one module per
    critic, target copies, ``-Q_1(s, mu(s))`` for the actor (TD3+BC: ``-lambda Q_1(s, mu(s)) +
    mean((mu(s) - a)^2)``, ``lambda = alpha / mean|Q_1|``, the authors' code)."""
    actor, critics = nets["actor"], nets["critics"]
    target_actor, *target_critics = frozen_copies([actor, *critics])
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]
    distance = F.mse_loss if name == "DDPGLoss" else F.smooth_l1_loss

    def loss() -> torch.Tensor:
        with torch.no_grad():
            next_action = target_actor(next_obs)
            if name != "DDPGLoss":
                next_action = next_action.clamp(-1.0, 1.0)
            next_inputs = torch.cat([next_obs, next_action], -1)
            next_value = torch.stack([c(next_inputs) for c in target_critics]).min(0).values
            target = reward + GAMMA * (~terminated) * next_value
        inputs = torch.cat([obs, action], -1)
        values = [c(inputs) for c in critics]
        critic_loss = sum(distance(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().square() for v in values]).max(0)  # noqa: F841
        new_action = actor(obs)
        q = detached_call(critics[0], torch.cat([obs, new_action], -1))
        if name != "TD3BCLoss":
            return -q.mean() + critic_loss
        lmbd = TD3_BC_ALPHA / q.abs().mean().detach()
        actor_loss = -lmbd * q.mean() + F.mse_loss(new_action, action)
        return actor_loss + critic_loss

    return Method(
        loss=loss,
        params=params,
        trainable=(*actor.parameters(), *(p for c in critics for p in c.parameters())),
        update_targets=soft_update_of([actor, *critics], [target_actor, *target_critics]),
    )


def library_loss(library, name: str, nets: dict) -> tuple[nn.Module, tuple[str, ...]]:
    """``library``'s (rlloss or TorchRL) loss ``name`` on ``nets``, and its loss keys."""
    actor = Actor(nets["actor"], in_keys=["observation"])
    qs = [ValueOperator(c, in_keys=["observation", "action"]) for c in nets["critics"]]
    if name == "DDPGLoss":
        gamma = {"gamma": GAMMA} if library is not torchrl.objectives else {}
        loss, keys = library.DDPGLoss(actor, qs[0], **gamma), ("loss_actor", "loss_value")
    else:
        kwargs = {"bounds": (-1.0, 1.0), "policy_noise": 0.0, "num_qvalue_nets": 2}
        if name == "TD3BCLoss":
            kwargs["alpha"] = TD3_BC_ALPHA
        loss, keys = getattr(library, name)(actor, qs, **kwargs), ("loss_actor", "loss_qvalue")
    loss.make_value_estimator(gamma=GAMMA)
    return loss, keys


def gated(name: str, nets: dict) -> dict[str, torch.Tensor]:
    """The parameters the gate compares. TD3's libraries train stacked copies of the critics
    (an ensemble): the gate then compares the total loss and the actor's gradients only."""
    params = prefixed("actor", nets["actor"])
    if name == "DDPGLoss":
        for i, critic in enumerate(nets["critics"]):
            params.update(prefixed(f"critic{i}", critic))
    return params


def build(name: str, custom: bool, batch_size: int, seed: int) -> CaseSetup:
    """The case ``name`` of the family at ``batch_size`` (``custom``: :class:`CustomCritic`
    critics)."""
    torch.manual_seed(seed)
    actor_net = nn.Sequential(mlp(OBS_DIM, ACT_DIM), nn.Tanh())
    critics = [q_net(False, ACT_DIM, custom) for _ in range(CRITICS[name])]
    g = torch.Generator().manual_seed(seed + 1)
    observation = torch.randn(batch_size, OBS_DIM, generator=g)
    batch = replay_batch(observation, torch.rand(batch_size, ACT_DIM, generator=g) * 2 - 1, g)
    on_device(actor_net, *critics)

    def loss_method(library) -> Callable:
        def make(batch) -> Method:
            nets = copy.deepcopy({"actor": actor_net, "critics": critics})
            loss, keys = library_loss(library, name, nets)
            return loss_module_method(loss, batch, gated(name, nets), keys)

        return make

    def plain(batch) -> Method:
        nets = copy.deepcopy({"actor": actor_net, "critics": critics})
        return plain_actor_critic_method(nets, batch, name, gated(name, nets))

    def hand(diagnostics: bool) -> Callable:
        def make(batch) -> Method:
            nets = copy.deepcopy({"actor": actor_net, "critics": critics})
            # DDPG's libraries take a' from the online actor (no target actor by default)
            online = nets["critics"] if name == "DDPGLoss" else [nets["actor"], *nets["critics"]]
            copies = frozen_copies(online)
            targets = {"critics": copies[-len(nets["critics"]) :]}
            if name != "DDPGLoss":
                targets["actor"] = copies[0]
            return Method(
                loss=hand_deterministic_loss(name, nets, targets, batch, diagnostics),
                params=gated(name, nets),
                trainable=tuple(
                    p for m in [nets["actor"], *nets["critics"]] for p in m.parameters()
                ),
                update_targets=soft_update_of(online, copies),
            )

        return make

    factories = library_factories(plain, loss_method)
    if custom:
        factories |= {"hand": hand(True), "hand-min": hand(False)}
    return CaseSetup(
        batches={"replay": batch},
        factories=factories,
        description=(
            f"{name}; MLP actor and {CRITICS[name]} {'custom ' if custom else ''}critic(s) "
            f"{HIDDEN_TEXT} relu, obs {OBS_DIM}, "
            f"action {ACT_DIM}, target networks"
            + ("" if name == "DDPGLoss" else ", policy_noise=0")
            + (f", alpha={TD3_BC_ALPHA}" if name == "TD3BCLoss" else "")
        ),
    )


CASES = {name: partial(build, name, False) for name in CRITICS}
CASES.update({name + CUSTOM_SUFFIX: partial(build, name, True) for name in ("DDPGLoss", "TD3Loss")})
