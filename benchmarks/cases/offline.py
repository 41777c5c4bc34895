"""The offline family on SAC's networks: IQL (TanhNormal actor, or categorical over Q(s, .)
critics, a state-value network) and CQL (SAC with the conservative penalty): IQLLoss,
DiscreteIQLLoss and CQLLoss, and their hand-written plain-torch baselines."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torchrl.modules import TanhNormal, ValueOperator

from benchmarks import harness
from benchmarks.cases.common import (
    ACT_DIM,
    DISCRETE_ACTIONS,
    GAMMA,
    HIDDEN_TEXT,
    OBS_DIM,
    detached_call,
    frozen_copies,
    library_factories,
    loss_module_method,
    mlp,
    on_device,
    policy_net,
    prefixed,
    q_module,
    q_net,
    random_replay,
    soft_update_of,
    tanh_normal_sample,
)
from benchmarks.cases.sac import actor_of, soft_actor_critic_factories
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (256, 4096)
IQL = {"expectile": 0.7, "temperature": 3.0, "loss_function": "l2"}
# One action per proposal: TorchRL groups CQL's log-sum-exp per proposal sample and evaluates
# the pi(.|s') samples at s' (see rlloss.CQLLoss), so the three agree only with num_random=1 and
# s' = s (the timed batch has both; its cost is that of any batch of the same size).
CQL = {"num_random": 1, "loss_function": "l2", "alpha_init": 1.0}
IQL_KEYS = ("loss_actor", "loss_qvalue", "loss_value")
CQL_KEYS = ("loss_actor", "loss_actor_bc", "loss_qvalue", "loss_cql", "loss_alpha")


# --------------------------------------------------------------------------- #
# IQL
# --------------------------------------------------------------------------- #
def plain_iql_method(nets: dict, batch, params: dict, discrete: bool) -> Method:
    """IQL written by hand (the authors' structure): the expectile value loss against the target
    critics' minimum, the Q regression towards ``r + gamma V(s')``, advantage-weighted
    behaviour cloning; the actor's own distribution class for ``log pi(a|s)``."""
    actor_net, critics, value_net = nets["actor_net"], nets["critics"], nets["value_net"]
    target_critics = frozen_copies(critics)
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    expectile, temperature = IQL["expectile"], IQL["temperature"]

    def q_of(c: nn.Module) -> torch.Tensor:
        """``Q(s, a)`` of the dataset's action, ``[B, 1]``."""
        if discrete:
            return (c(obs) * action).sum(-1, keepdim=True)
        return c(torch.cat([obs, action], -1))

    def log_prob_of_data() -> torch.Tensor:
        if discrete:
            return (actor_net(obs).log_softmax(-1) * action).sum(-1)
        loc, scale = actor_net(obs)
        return TanhNormal(loc, scale, low=-1.0, high=1.0).log_prob(action)

    def loss() -> torch.Tensor:
        with torch.no_grad():
            min_q = torch.stack([q_of(c) for c in target_critics]).min(0).values  # [B, 1]
            target = reward + GAMMA * not_terminated * value_net(next_obs)
        value = value_net(obs)
        diff = min_q - value
        weight = torch.where(diff > 0, expectile, 1 - expectile)
        value_loss = (weight * diff.square()).mean()
        values = [q_of(c) for c in critics]
        critic_loss = sum(F.mse_loss(v, target, reduction="none") for v in values).mean()
        td_error = torch.stack([(v - target).detach().square() for v in values]).max(0)  # noqa: F841
        log_prob = log_prob_of_data()
        advantage_weight = ((min_q - value.detach()) * temperature).exp().clamp_max(100.0)
        actor_loss = -(advantage_weight.squeeze(-1) * log_prob).mean()
        entropy = -log_prob.detach().mean()  # noqa: F841 - reported by the libraries
        return actor_loss + critic_loss + value_loss

    return Method(
        loss=loss,
        params=params,
        trainable=(
            *actor_net.parameters(),
            *value_net.parameters(),
            *(p for c in critics for p in c.parameters()),
        ),
        update_targets=soft_update_of(critics, target_critics),
    )


def iql_loss(library, nets: dict, discrete: bool) -> nn.Module:
    """``library``'s (rlloss or TorchRL) IQL or discrete IQL loss on ``nets``."""
    actor = actor_of(nets["actor_net"], discrete)
    key = "state_action_value" if discrete else None  # DiscreteIQL's Q(s, .) key
    qs = [
        q_module(c, False) if not discrete else ValueOperator(c, ["observation"], [key])
        for c in nets["critics"]
    ]
    value = ValueOperator(nets["value_net"], in_keys=["observation"])
    if discrete:
        loss = library.DiscreteIQLLoss(actor, qs, value, action_space="one-hot", **IQL)
    else:
        loss = library.IQLLoss(actor, qs, value, **IQL)
    loss.make_value_estimator(gamma=GAMMA)
    return loss


def build_iql(name: str, discrete: bool, batch_size: int, seed: int) -> CaseSetup:
    """The case ``name`` (discrete IQL with ``discrete``) at ``batch_size``."""
    torch.manual_seed(seed)
    act_dim = DISCRETE_ACTIONS if discrete else ACT_DIM
    template = {
        "actor_net": policy_net(discrete, act_dim),
        "critics": [q_net(discrete, act_dim) for _ in range(2)],
        "value_net": mlp(OBS_DIM, 1),
    }
    batch = random_replay(batch_size, seed + 1, act_dim, discrete, scale=0.99)  # dataset actions
    on_device(template["actor_net"], *template["critics"], template["value_net"])

    def gated(nets: dict) -> dict[str, torch.Tensor]:
        """The actor's and the value network's gradients (the libraries train stacked copies of
        the critics: those enter the gate through the total loss)."""
        return {**prefixed("actor", nets["actor_net"]), **prefixed("value", nets["value_net"])}

    def loss_method(library) -> Callable:
        def make(batch) -> Method:
            nets = copy.deepcopy(template)
            loss = iql_loss(library, nets, discrete)
            return loss_module_method(loss, batch, gated(nets), IQL_KEYS)

        return make

    def plain(batch) -> Method:
        nets = copy.deepcopy(template)
        return plain_iql_method(nets, batch, gated(nets), discrete)

    options = ", ".join(f"{k}={v!r}" for k, v in IQL.items())
    return CaseSetup(
        batches={"replay": batch},
        factories=library_factories(plain, loss_method),
        description=(
            f"{name}({options}); "
            + ("categorical actor, Q(s, .) critics" if discrete else "TanhNormal actor")
            + f", 2 critics and a value network, MLPs {HIDDEN_TEXT} relu, obs {OBS_DIM}, "
            f"{'actions' if discrete else 'action dim'} {act_dim}, target critics"
        ),
    )


# --------------------------------------------------------------------------- #
# CQL
# --------------------------------------------------------------------------- #
def plain_cql_method(nets: dict, batch, params: dict) -> Method:
    """CQL(H) on SAC written by hand (the authors' structure): the deterministic backup, the
    penalty ``T logsumexp_k((Q_i(s, a_k) - log q(a_k)) / T) - Q_i(s, a)`` over the uniform,
    ``pi(.|s')`` and ``pi(.|s)`` proposals, SAC's actor and temperature losses and the
    behaviour-cloning actor loss; noise drawn in the libraries' order."""
    actor_net, critics = nets["actor_net"], nets["critics"]
    target_critics = frozen_copies(critics)
    log_alpha = nets["log_alpha"]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    num, target_entropy = CQL["num_random"], -float(ACT_DIM)
    uniform_log_density = -ACT_DIM * math.log(2.0)

    def q_all(modules, o, a, call=lambda c, x: c(x)) -> torch.Tensor:
        x = torch.cat([o, a], -1)
        return torch.stack([call(c, x) for c in modules])  # [2, ..., 1]

    def loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, _ = tanh_normal_sample(actor_net, next_obs)
            next_value = q_all(target_critics, next_obs, next_action).min(0).values
            target = reward + GAMMA * not_terminated * next_value
        values = q_all(critics, obs, action)  # [2, B, 1]
        critic_loss = F.mse_loss(values, target.expand_as(values), reduction="none").sum(0).mean()
        td_error = (values - target).detach().square().max(0)  # noqa: F841
        # the penalty: num uniform actions, num from pi(.|s), num from pi(.|s'), at s
        batch_size = obs.shape[0]
        uniform = obs.new_empty(batch_size * num, ACT_DIM).uniform_(-1, 1).view(batch_size, num, -1)
        with torch.no_grad():
            current, current_lp = tanh_normal_sample(actor_net, obs.repeat_interleave(num, 0))
            following, following_lp = tanh_normal_sample(
                actor_net, next_obs.repeat_interleave(num, 0)
            )
        proposals = torch.cat(
            [uniform, following.view(batch_size, num, -1), current.view(batch_size, num, -1)], 1
        )
        log_q = torch.cat(
            [
                obs.new_full((batch_size, num), uniform_log_density),
                following_lp.view(batch_size, num),
                current_lp.view(batch_size, num),
            ],
            1,
        )
        states = obs.unsqueeze(1).expand(-1, 3 * num, -1)
        sampled = q_all(critics, states, proposals).squeeze(-1)  # [2, B, 3 num]
        penalty = torch.logsumexp(sampled - log_q, -1, keepdim=True) - values  # [2, B, 1]
        cql_loss = penalty.sum(0).mean()
        # behaviour cloning, then the actor and the temperature
        loc, scale = actor_net(obs)
        bc_action, bc_log_prob = tanh_normal_sample(actor_net, obs, (loc, scale))
        data_log_prob = TanhNormal(loc, scale, low=-1.0, high=1.0).log_prob(action)
        bc_loss = (alpha * bc_log_prob - data_log_prob).mean()
        new_action, log_prob = tanh_normal_sample(actor_net, obs)
        q = q_all(critics, obs, new_action, detached_call).min(0).values.squeeze(-1)
        actor_loss = (alpha * log_prob - q).mean()
        alpha_loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
        entropy = -log_prob.detach().mean()  # noqa: F841 - reported by the libraries
        return actor_loss + bc_loss + critic_loss + cql_loss + alpha_loss

    return Method(
        loss=loss,
        params=params,
        trainable=(
            log_alpha,
            *actor_net.parameters(),
            *(p for c in critics for p in c.parameters()),
        ),
        update_targets=soft_update_of(critics, target_critics),
    )


def build_cql(batch_size: int, seed: int) -> CaseSetup:
    """``CQLLoss`` at ``batch_size``."""
    from torchrl.data import Bounded

    torch.manual_seed(seed)
    template = {"actor_net": policy_net(False, ACT_DIM), "critics": [mlp(OBS_DIM + ACT_DIM, 1)]}
    template["critics"].append(mlp(OBS_DIM + ACT_DIM, 1))
    batch = random_replay(batch_size, seed + 1, scale=0.99)
    batch["next", "observation"] = batch["observation"].clone()  # s' = s, see CQL
    on_device(template["actor_net"], *template["critics"])

    def library_loss(library, nets: dict) -> nn.Module:
        actor = actor_of(nets["actor_net"], False)
        qs = [q_module(c, False) for c in nets["critics"]]
        spec = Bounded(-1.0, 1.0, shape=(ACT_DIM,), device=harness.DEVICE)
        loss = library.CQLLoss(actor, qs, action_spec=spec, **CQL)
        loss.make_value_estimator(gamma=GAMMA)
        return loss

    options = ", ".join(f"{k}={v!r}" for k, v in CQL.items())
    return CaseSetup(
        batches={"replay": batch},
        factories=soft_actor_critic_factories(template, library_loss, plain_cql_method, CQL_KEYS),
        description=(
            f"CQLLoss({options}); TanhNormal actor, 2 critics, MLPs {HIDDEN_TEXT} relu, obs "
            f"{OBS_DIM}, action dim {ACT_DIM}, target critics; s' = s in the batch; "
            f"total {' + '.join(CQL_KEYS)}"
        ),
    )


CASES = {
    "IQLLoss": partial(build_iql, "IQLLoss", False),
    "DiscreteIQLLoss": partial(build_iql, "DiscreteIQLLoss", True),
    "CQLLoss": build_cql,
}
