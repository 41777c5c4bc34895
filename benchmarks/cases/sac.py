"""SAC (TanhNormal actor, two Q critics) and discrete SAC (categorical actor, Q(s, .) critics):
SACLoss and DiscreteSACLoss, and their hand-written plain-torch baseline."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import OneHotCategorical, ProbabilisticActor, TanhNormal

from benchmarks import harness
from benchmarks.cases.common import (
    ACT_DIM,
    CUSTOM_SUFFIX,
    DISCRETE_ACTIONS,
    GAMMA,
    HIDDEN_TEXT,
    OBS_DIM,
    detached_call,
    frozen_copies,
    library_factories,
    loss_module_method,
    on_device,
    policy_net,
    q_module,
    q_net,
    random_replay,
    soft_update_of,
    tanh_normal_sample,
)
from benchmarks.cases.handwritten import hand_sac_loss
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (256, 4096)


def plain_sac_method(nets: dict, batch, params: dict, discrete: bool) -> Method:
    """SAC / discrete SAC written by hand (CleanRL's structure, TorchRL's loss terms): one module
    per critic, target copies of the critics, ``log_alpha`` a parameter."""
    actor_net, critics = nets["actor_net"], nets["critics"]
    target_critics = frozen_copies(critics)
    log_alpha = nets["log_alpha"]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    if discrete:
        target_entropy = -math.log(1.0 / DISCRETE_ACTIONS) * 0.98
    else:
        target_entropy = -float(ACT_DIM)

    sample = partial(tanh_normal_sample, actor_net)

    def continuous_loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = sample(next_obs)
            inputs = torch.cat([next_obs, next_action], -1)
            next_q = torch.stack([c(inputs) for c in target_critics]).min(0).values
            next_value = next_q - alpha * next_log_prob.unsqueeze(-1)
            target = reward + GAMMA * not_terminated * next_value
        inputs = torch.cat([obs, action], -1)
        values = [c(inputs) for c in critics]
        critic_loss = sum(F.mse_loss(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().abs() for v in values]).max(0)  # noqa: F841
        new_action, log_prob = sample(obs)
        inputs = torch.cat([obs, new_action], -1)
        q = torch.stack([detached_call(c, inputs) for c in critics]).min(0).values.squeeze(-1)
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
            target = reward + GAMMA * not_terminated * next_value
        values = [(c(obs) * action).sum(-1, keepdim=True) for c in critics]
        critic_loss = sum(F.mse_loss(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().abs() for v in values]).max(0)  # noqa: F841
        log_p = actor_net(obs).log_softmax(-1)
        p = log_p.exp()
        q = torch.stack([detached_call(c, obs) for c in critics]).min(0).values
        actor_loss = (p * (alpha * log_p - q)).sum(-1).mean()
        neg_entropy = (p * log_p).sum(-1).detach()
        alpha_loss = -(log_alpha * (neg_entropy + target_entropy)).mean()
        return actor_loss + critic_loss + alpha_loss

    loss = discrete_loss if discrete else continuous_loss
    return soft_actor_critic_method(nets, loss, target_critics, params)


def actor_of(net: nn.Module, discrete: bool) -> ProbabilisticActor:
    """The policy: one-hot categorical over logits, or a TanhNormal on [-1, 1]."""
    if discrete:
        head = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
        return ProbabilisticActor(head, in_keys=["logits"], distribution_class=OneHotCategorical)
    head = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        head,
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -1.0, "high": 1.0},
    )


def named(actor_net: nn.Module, log_alpha: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gated parameters. The libraries train stacked copies of the critics: the gate compares
    the total loss and the actor's and temperature's gradients."""
    out = {f"actor.{n}": p for n, p in actor_net.named_parameters()}
    out["log_alpha"] = log_alpha
    return out


def library_loss(library, nets: dict, discrete: bool) -> nn.Module:
    """``library``'s (rlloss or TorchRL) SAC or discrete SAC loss on ``nets``."""
    actor = actor_of(nets["actor_net"], discrete)
    qs = [q_module(c, discrete) for c in nets["critics"]]
    kwargs = {"num_qvalue_nets": 2, "loss_function": "l2", "alpha_init": 1.0}
    if discrete:
        loss = library.DiscreteSACLoss(
            actor, qs, num_actions=DISCRETE_ACTIONS, action_space="one-hot", **kwargs
        )
    else:
        loss = library.SACLoss(actor, qs, target_entropy=-float(ACT_DIM), **kwargs)
    loss.make_value_estimator(gamma=GAMMA)
    return loss


def soft_actor_critic_factories(
    template: dict,
    library_loss: Callable[[object, dict], nn.Module],
    plain_method: Callable[[dict, object, dict], Method],
    keys: tuple[str, ...] = ("loss_actor", "loss_qvalue", "loss_alpha"),
    library_grads: Callable[[nn.Module], Callable[[], dict]] | None = None,
    hand_loss: Callable[[dict, dict, object, bool], Callable] | None = None,
) -> dict[str, Callable]:
    """The factories of a case on SAC's networks (``template``: ``actor_net`` and ``critics``),
    each on its own deep copy: ``library_loss(library, nets)`` summed over ``keys`` for rlloss
    and TorchRL, ``plain_method(nets, batch, params)`` with ``nets["log_alpha"]`` added. The gate
    compares the actor's and the temperature's gradients (see :func:`named`), and those of
    ``library_grads(loss)`` (the plain method's ``gated_grads`` must name the same). With
    ``hand_loss(nets, targets, batch, diagnostics)`` (:mod:`benchmarks.cases.handwritten`), the
    ``hand`` and ``hand-min`` methods too."""

    def loss_method(library) -> Callable:
        def make(batch) -> Method:
            nets = copy.deepcopy(template)
            loss = library_loss(library, nets)
            method = loss_module_method(loss, batch, named(nets["actor_net"], loss.log_alpha), keys)
            if library_grads is not None:
                method.gated_grads = library_grads(loss)
            return method

        return make

    def with_log_alpha() -> dict:
        nets = copy.deepcopy(template)
        nets["log_alpha"] = nn.Parameter(torch.zeros((), device=harness.DEVICE))
        return nets

    def plain(batch) -> Method:
        nets = with_log_alpha()
        return plain_method(nets, batch, named(nets["actor_net"], nets["log_alpha"]))

    def hand(diagnostics: bool) -> Callable:
        def make(batch) -> Method:
            nets = with_log_alpha()
            targets = {"critics": frozen_copies(nets["critics"])}
            return soft_actor_critic_method(
                nets,
                hand_loss(nets, targets, batch, diagnostics),
                targets["critics"],
                named(nets["actor_net"], nets["log_alpha"]),
            )

        return make

    factories = library_factories(plain, loss_method)
    if hand_loss is not None:
        factories |= {"hand": hand(True), "hand-min": hand(False)}
    return factories


def soft_actor_critic_method(
    nets: dict, loss: Callable, target_critics: list[nn.Module], params: dict
) -> Method:
    """A hand-written SAC-family step on ``nets`` (``actor_net``, ``critics``, ``log_alpha``): it
    trains all three; its ``target_critics`` follow the critics."""
    return Method(
        loss=loss,
        params=params,
        trainable=(
            nets["log_alpha"],
            *nets["actor_net"].parameters(),
            *(p for c in nets["critics"] for p in c.parameters()),
        ),
        update_targets=soft_update_of(nets["critics"], target_critics),
    )


def build(name: str, discrete: bool, batch_size: int, seed: int, custom: bool = False) -> CaseSetup:
    """The case ``name`` (discrete SAC with ``discrete``) at ``batch_size`` (``custom``:
    :class:`CustomCritic` critics)."""
    torch.manual_seed(seed)
    act_dim = DISCRETE_ACTIONS if discrete else ACT_DIM
    actor_net = policy_net(discrete, act_dim)
    critics = [q_net(discrete, act_dim, custom) for _ in range(2)]
    batch = random_replay(batch_size, seed + 1, act_dim, discrete)
    on_device(actor_net, *critics)
    template = {"actor_net": actor_net, "critics": critics}

    return CaseSetup(
        batches={"replay": batch},
        factories=soft_actor_critic_factories(
            template,
            partial(library_loss, discrete=discrete),
            partial(plain_sac_method, discrete=discrete),
            hand_loss=hand_sac_loss if custom and not discrete else None,
        ),
        description=(
            f"{name}(loss_function='l2', alpha_init=1); "
            + ("categorical actor, Q(s, .) critics" if discrete else "TanhNormal actor")
            + f", 2 {'custom ' if custom else ''}critics, MLPs {HIDDEN_TEXT} relu, obs {OBS_DIM}, "
            f"{'actions' if discrete else 'action dim'} {act_dim}, target critics"
        ),
    )


CASES = {
    "SACLoss": partial(build, "SACLoss", False),
    "DiscreteSACLoss": partial(build, "DiscreteSACLoss", True),
    "SACLoss" + CUSTOM_SUFFIX: partial(build, "SACLoss", False, custom=True),
    "DiscreteSACLoss" + CUSTOM_SUFFIX: partial(build, "DiscreteSACLoss", True, custom=True),
}
