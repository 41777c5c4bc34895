"""MPO (IndependentNormal actor, Q(s, a) critic) and categorical MPO (Q(s, .) critic): MPOLoss
and DiscreteMPOLoss, and their hand-written plain-torch baseline.

TorchRL has no MPO: the hand-written ``plain`` update is the reference. Acme's defaults are
passed explicitly, so that both implementations read the same numbers.
"""

from __future__ import annotations

import copy
import math
from functools import partial

import torch
import torch.nn.functional as F
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import IndependentNormal, ProbabilisticActor

from benchmarks import harness
from benchmarks.cases.common import (
    ACT_DIM,
    DISCRETE_ACTIONS,
    GAMMA,
    HIDDEN_TEXT,
    OBS_DIM,
    described,
    frozen_copies,
    loss_module_method,
    on_device,
    policy_net,
    q_module,
    q_net,
    replay_batch,
    rlloss_attr,
    soft_update_of,
)
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (256, 1024)
MPO_KWARGS = {
    "num_samples": 20,
    "epsilon": 0.1,
    "epsilon_mean": 2.5e-3,
    "epsilon_stddev": 1e-6,
    "init_log_temperature": 10.0,
    "init_log_alpha_mean": 10.0,
    "init_log_alpha_stddev": 1000.0,
    "loss_function": "l2",
    "gamma": GAMMA,
}
DISCRETE_MPO_KWARGS = {
    "epsilon": 0.1,
    "epsilon_policy": 2.5e-3,
    "init_log_temperature": 3.0,
    "init_log_alpha": 3.0,
    "loss_function": "l2",
    "gamma": GAMMA,
}
LOSS_KEYS = ("loss_actor", "loss_qvalue", "loss_temperature", "loss_alpha")
LOW, HIGH = -1.0, 1.0  # the action bounds (a Bounded spec)
MIN_LOG_DUAL = -18.0  # Acme's floor on the dual parameters
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def mpo_duals(discrete: bool) -> dict[str, nn.Parameter]:
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
            "log_alpha_mean": ((ACT_DIM,), kw["init_log_alpha_mean"]),
            "log_alpha_stddev": ((ACT_DIM,), kw["init_log_alpha_stddev"]),
        }
    return {
        name: nn.Parameter(torch.full(shape, init, device=harness.DEVICE))
        for name, (shape, init) in shapes.items()
    }


def dual_value(parameter: torch.Tensor) -> torch.Tensor:
    """A Lagrange multiplier from its parameter: ``softplus(param) + 1e-8``."""
    return F.softplus(parameter) + 1e-8


@torch.no_grad()
def project_duals(duals: dict[str, nn.Parameter]) -> None:
    """Each dual parameter clamped in place onto ``[-18, inf)``, outside the graph."""
    for parameter in duals.values():
        parameter.clamp_(min=MIN_LOG_DUAL)


def normal_log_prob(value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``sum_d log N(value_d; loc_d, scale_d^2)`` over the last dim."""
    z = (value - loc) / scale
    return (-0.5 * z.square() - torch.log(scale) - LOG_SQRT_2PI).sum(-1)


def normal_kl(loc_p, scale_p, loc_q, scale_q) -> torch.Tensor:
    """``KL(N(loc_p, scale_p^2) || N(loc_q, scale_q^2))`` per dimension."""
    ratio = (scale_p / scale_q) ** 2
    return 0.5 * (ratio + ((loc_p - loc_q) / scale_q) ** 2 - 1 - ratio.log())


def plain_mpo_method(nets: dict, batch, params: dict, discrete: bool) -> Method:
    """MPO / categorical MPO written by hand (Acme's loss terms, rlloss's call order): target
    copies of the actor and the critic, the duals ``nn.Parameter``s; the diagnostics rlloss
    returns are computed and dropped."""
    actor_net, critic, duals = nets["actor_net"], nets["critic"], nets["duals"]
    target_actor, target_critic = frozen_copies([actor_net, critic])
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
            inputs = torch.cat([o.expand(num_samples, *o.shape), u.clamp(LOW, HIGH)], -1)
            return loc, scale, u, target_critic(inputs).squeeze(-1)

    def continuous_critic_loss() -> torch.Tensor:
        """Expected SARSA: ``(Q(s, clip(a)) - r - gamma (1 - term) mean_j Q_t(s', a'_j))^2``."""
        with torch.no_grad():
            next_value = target_samples(next_obs)[3].mean(0).unsqueeze(-1)
            target = reward + gamma * not_terminated * next_value
        value = critic(torch.cat([obs, action.clamp(LOW, HIGH)], -1))
        td_error = (value - target).detach().abs().squeeze(-1)  # noqa: F841 - the priority
        return F.mse_loss(value, target)

    def continuous_loss() -> torch.Tensor:
        """The decoupled M-step, the E-step's temperature dual and the KL duals, and the critic."""
        critic_loss = continuous_critic_loss()  # draws first, as rlloss's forward does
        project_duals(duals)
        eta = dual_value(duals["log_temperature"])
        alpha_mean = dual_value(duals["log_alpha_mean"])
        alpha_stddev = dual_value(duals["log_alpha_stddev"])
        t_loc, t_scale, u, q = target_samples(obs)
        loc, scale = actor_net(obs)
        # E-step: weights over the samples, temperature dual
        weights = torch.softmax(q / eta.detach(), dim=0)
        lse = torch.logsumexp(q / eta, dim=0) - math.log(num_samples)
        temperature_loss = (eta * (kw["epsilon"] + lse)).mean()
        # M-step: decoupled likelihoods, per-dimension KLs, their penalties and duals
        kl_mean = normal_kl(t_loc, t_scale, loc, t_scale)
        kl_stddev = normal_kl(t_loc, t_scale, t_loc, scale)
        actor_loss = (
            -(weights * normal_log_prob(u, loc, t_scale)).sum(0)
            - (weights * normal_log_prob(u, t_loc, scale)).sum(0)
            + (alpha_mean.detach() * kl_mean).sum(-1)
            + (alpha_stddev.detach() * kl_stddev).sum(-1)
        ).mean()
        alpha_loss = (
            (alpha_mean * (kw["epsilon_mean"] - kl_mean.detach())).sum(-1)
            + (alpha_stddev * (kw["epsilon_stddev"] - kl_stddev.detach())).sum(-1)
        ).mean()
        # computed as rlloss does, then dropped
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
        td_error = (value - target).detach().abs().squeeze(-1)  # noqa: F841 - the priority
        return F.mse_loss(value, target)

    def discrete_loss() -> torch.Tensor:
        """Categorical E-step over every action, cross-entropy M-step with its KL dual, critic."""
        critic_loss = discrete_critic_loss()
        project_duals(duals)
        eta, alpha = dual_value(duals["log_temperature"]), dual_value(duals["log_alpha"])
        with torch.no_grad():
            target_log_p = target_actor(obs).log_softmax(-1)
            q = target_critic(obs)
        log_p = actor_net(obs).log_softmax(-1)
        log_weights = (target_log_p + q / eta.detach()).log_softmax(-1)
        temperature_loss = eta * (kw["epsilon"] + torch.logsumexp(target_log_p + q / eta, -1))
        kl = (target_log_p.exp() * (target_log_p - log_p)).sum(-1)
        actor_loss = (-(log_weights.exp() * log_p).sum(-1) + alpha.detach() * kl).mean()
        alpha_loss = (alpha * (kw["epsilon_policy"] - kl.detach())).mean()
        # computed as rlloss does, then dropped
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


def actor_of(net: nn.Module, discrete: bool) -> ProbabilisticActor:
    """The policy: categorical over logits, or an IndependentNormal."""
    if discrete:
        head = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
        return ProbabilisticActor(
            head, in_keys=["logits"], distribution_class=torch.distributions.Categorical
        )
    head = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(head, in_keys=["loc", "scale"], distribution_class=IndependentNormal)


def named(nets: dict, duals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One critic (no stacked copies): every network parameter and every dual is gated."""
    out = {f"actor.{n}": p for n, p in nets["actor_net"].named_parameters()}
    out.update({f"critic.{n}": p for n, p in nets["critic"].named_parameters()})
    out.update({f"dual.{n}": p for n, p in duals.items()})
    return out


def build(name: str, discrete: bool, batch_size: int, seed: int) -> CaseSetup:
    """The case ``name`` (categorical MPO with ``discrete``) at ``batch_size``."""
    torch.manual_seed(seed)
    act_dim = DISCRETE_ACTIONS if discrete else ACT_DIM
    actor_net = policy_net(discrete, act_dim)
    critic = q_net(discrete, act_dim)
    g = torch.Generator().manual_seed(seed + 1)
    if discrete:
        action = torch.randint(0, act_dim, (batch_size,), generator=g)  # an index
    else:
        # stored actions partly outside the bounds (Acme's buffer keeps the unclipped
        # sample): the critic's clipping is exercised
        action = 1.2 * (torch.rand(batch_size, act_dim, generator=g) * 2 - 1)
    batch = replay_batch(torch.randn(batch_size, OBS_DIM, generator=g), action, g)
    on_device(actor_net, critic)
    template = {"actor_net": actor_net, "critic": critic}
    kwargs = DISCRETE_MPO_KWARGS if discrete else MPO_KWARGS

    def rlloss_method(batch) -> Method:
        nets = copy.deepcopy(template)
        actor, qvalue = actor_of(nets["actor_net"], discrete), q_module(nets["critic"], discrete)
        if discrete:
            loss = rlloss_attr("DiscreteMPOLoss")(actor, qvalue, **kwargs)
        else:
            spec = Bounded(LOW, HIGH, shape=(act_dim,), device=harness.DEVICE)
            loss = rlloss_attr("MPOLoss")(actor, qvalue, action_spec=spec, **kwargs)
        duals = {n: getattr(loss, n) for n in mpo_duals(discrete)}
        return loss_module_method(loss, batch, named(nets, duals), LOSS_KEYS)

    def plain(batch) -> Method:
        nets = copy.deepcopy(template)
        nets["duals"] = mpo_duals(discrete)
        return plain_mpo_method(nets, batch, named(nets, nets["duals"]), discrete)

    return CaseSetup(
        batches={"replay": batch},
        factories={"plain": plain, "rlloss": rlloss_method},
        reference="plain",  # TorchRL has no MPO
        description=(
            f"{described(name, kwargs)}; "
            + (
                "Categorical actor, Q(s, .) critic"
                if discrete
                else f"IndependentNormal actor, Q(s, a) critic, bounds [{LOW}, {HIGH}]"
            )
            + f", MLPs {HIDDEN_TEXT} relu, obs {OBS_DIM}, "
            f"{'actions' if discrete else 'action dim'} {act_dim}, target actor and critic"
        ),
    )


CASES = {
    "MPOLoss": partial(build, "MPOLoss", False),
    "DiscreteMPOLoss": partial(build, "DiscreteMPOLoss", True),
}
