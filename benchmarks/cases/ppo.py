"""The on-policy family, continuous actions (IndependentNormal actor + value critic): PPOLoss,
ClipPPOLoss, KLPENPPOLoss, RPOLoss, A2CLoss and ReinforceLoss, and their hand-written
plain-torch baseline."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import torchrl.objectives
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor, ValueOperator

from benchmarks import harness
from benchmarks.cases.common import described, loss_module_method, on_device, rlloss_attr
from benchmarks.cases.handwritten import hand_ppo_loss
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (64, 4096)
OBS_DIM, ACT_DIM, HIDDEN = 17, 6, (64, 64)
COMMON = dict(
    entropy_coeff=0.01,
    critic_coeff=1.0,
    loss_critic_type="smooth_l1",
    normalize_advantage=False,
    entropy_bonus=True,
)
VARIANTS = {
    "PPOLoss": {},
    "ClipPPOLoss": {"clip_epsilon": 0.2},
    # Factors of 1 keep beta fixed, so that TorchRL's gradient (which sees the post-update
    # beta) is comparable in the gate; the update rule still runs in every implementation.
    "KLPENPPOLoss": {"dtarg": 0.01, "beta": 1.0, "increment": 1.0, "decrement": 1.0},
    "RPOLoss": {"clip_epsilon": 0.2, "rpo_alpha": 0.5},
    "A2CLoss": {},
    "ReinforceLoss": {},
}
LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")
POLICY_GRADIENT = ("A2CLoss", "ReinforceLoss")  # log pi(a|s) A, no ratio
HAND_WRITTEN = ("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "A2CLoss")  # with a CleanRL-style step


def loss_kwargs(name: str) -> dict:
    """The constructor keywords of case ``name`` (A2C and REINFORCE take fewer of them)."""
    if name == "ReinforceLoss":  # no entropy bonus, no critic coefficient
        return {"loss_critic_type": COMMON["loss_critic_type"]}
    kwargs = {**COMMON, **VARIANTS[name]}
    if name == "A2CLoss":
        del kwargs["normalize_advantage"]
    return kwargs


def loss_keys(name: str) -> tuple[str, ...]:
    return ("loss_actor", "loss_value") if name == "ReinforceLoss" else LOSS_KEYS


def networks(seed: int) -> dict[str, nn.Module]:
    """The actor and the critic, as TensorDict modules and as the raw networks inside them."""
    torch.manual_seed(seed)
    actor_net = nn.Sequential(
        MLP(
            in_features=OBS_DIM,
            out_features=2 * ACT_DIM,
            num_cells=list(HIDDEN),
            activation_class=nn.Tanh,
        ),
        NormalParamExtractor(),
    )
    critic_net = MLP(
        in_features=OBS_DIM,
        out_features=1,
        num_cells=list(HIDDEN),
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


def plain_ppo_loss(name: str, nets: dict, batch, keys: tuple) -> Callable:
    """The PPO-family loss ``name`` written by hand on tensors: what a user would write, with
    the diagnostics the libraries return alongside the losses."""
    kwargs = {**COMMON, **VARIANTS[name]}
    entropy_bonus, has_ratio = name != "ReinforceLoss", name not in POLICY_GRADIENT
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
        if not has_ratio:  # A2C / REINFORCE: the plain policy gradient
            gain = dist.log_prob(action).unsqueeze(-1) * adv
            loss_actor = -gain.mean()
            value = critic_net(obs)
            loss_critic = critic_coeff * F.smooth_l1_loss(value_target, value)
            if not entropy_bonus:
                return loss_actor + loss_critic
            entropy = dist.entropy()
            with torch.no_grad():
                entropy.mean()  # the diagnostic
            return loss_actor + loss_critic - ent_coeff * entropy.mean()
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
        with torch.no_grad():  # the diagnostics, computed as the libraries do, then dropped
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


def batches(nets: dict[str, nn.Module], keys: tuple, batch_size: int, seed: int) -> dict:
    """The timed on-policy batch (all ratios 1) and the gate-only off-policy one, whose
    behaviour log-probs are shifted so that ratios spread over ~[0.5, 2] and the clip branch
    is exercised; on the harness's device."""
    actor, critic = nets["actor"], nets["critic"]
    g = torch.Generator().manual_seed(seed + 1)
    td = TensorDict(
        observation=torch.randn(batch_size, OBS_DIM, generator=g), batch_size=[batch_size]
    )
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        actor(td)
        critic(td)
    td["advantage"] = torch.randn(batch_size, 1, generator=g)
    td["value_target"] = torch.randn(batch_size, 1, generator=g)
    bench = td.select(
        "observation", "loc", "scale", *keys, "advantage", "value_target", "state_value"
    )
    offpolicy = bench.clone()
    offpolicy[keys[1]] = offpolicy[keys[1]] + 0.4 * torch.randn(batch_size, generator=g)
    return {"on-policy": bench.to(harness.DEVICE), "off-policy": offpolicy.to(harness.DEVICE)}


def named(m: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """Every parameter of the actor and the critic, gated."""
    out = {f"actor.{n}": p for n, p in m["actor_net"].named_parameters()}
    out.update({f"critic.{n}": p for n, p in m["critic_net"].named_parameters()})
    return out


def build(name: str, batch_size: int, seed: int) -> CaseSetup:
    """The case ``name`` of the family at ``batch_size``."""
    nets = networks(seed)
    actor = nets["actor"]
    keys = (actor.dist_sample_keys[0], actor.log_prob_keys[0])
    batch_by_name = batches(nets, keys, batch_size, seed)
    on_device(*nets.values())
    kwargs = loss_kwargs(name)

    def module_factory(cls_getter: Callable[[], type], **extra) -> Callable[[Any], Method]:
        def make(batch) -> Method:
            m = copy.deepcopy(nets)  # one memo: wrappers and raw nets stay linked
            loss = cls_getter()(m["actor"], m["critic"], **kwargs, **extra)
            return loss_module_method(loss, batch, named(m), loss_keys(name))

        return make

    def step_factory(step: Callable, diagnostics: bool) -> Callable[[Any], Method]:
        """A loss written by hand: ``step(m, batch, diagnostics)`` on a copy ``m`` of the nets."""

        def make(batch) -> Method:
            m = copy.deepcopy(nets)
            loss = step(m, batch, diagnostics)
            trainable = (*m["actor_net"].parameters(), *m["critic_net"].parameters())
            return Method(loss=loss, params=named(m), trainable=trainable)

        return make

    def plain(m, batch, _):
        return plain_ppo_loss(name, m, batch, keys)

    def hand(m, batch, diagnostics):
        return hand_ppo_loss(name, m, batch, keys, {**COMMON, **VARIANTS[name]}, diagnostics)

    factories = {
        "plain": step_factory(plain, True),
        "rlloss": module_factory(lambda: rlloss_attr(name)),
        "rlloss-min": module_factory(lambda: rlloss_attr(name), diagnostics=False),
    }
    if name in HAND_WRITTEN:
        factories.update({"hand": step_factory(hand, True), "hand-min": step_factory(hand, False)})
    if hasattr(torchrl.objectives, name):
        factories["torchrl"] = module_factory(lambda: getattr(torchrl.objectives, name))
    return CaseSetup(
        batches=batch_by_name,
        factories=factories,
        reference="torchrl" if "torchrl" in factories else "plain",
        description=(
            f"{described(name, kwargs)}; IndependentNormal actor + value critic, MLP {OBS_DIM}->"
            f"{'x'.join(map(str, HIDDEN))} tanh, action dim {ACT_DIM}"
        ),
    )


CASES = {name: partial(build, name) for name in VARIANTS}
