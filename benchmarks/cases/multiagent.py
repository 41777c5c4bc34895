"""The multi-agent family on TorchRL's multi-agent networks: MAPPOLoss and IPPOLoss (a
``MultiAgentMLP`` IndependentNormal actor shared by the agents, a centralised or per-agent
``MultiAgentMLP`` critic, per-agent advantages in the batch) and QMixerLoss (a shared local
Q network with TorchRL's ``QMixer`` or ``VDNMixer``, target copies of both), and their
hand-written plain-torch baselines."""

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
from torchrl.data import Categorical
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    IndependentNormal,
    MultiAgentMLP,
    ProbabilisticActor,
    QValueModule,
    SafeSequential,
)
from torchrl.modules.models.multiagent import QMixer, VDNMixer

from benchmarks import harness
from benchmarks.cases.common import (
    described,
    frozen_copies,
    loss_module_method,
    on_device,
    prefixed,
    rlloss_attr,
    soft_update_of,
)
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (64, 4096)  # timesteps; each carries AGENTS agents
AGENTS, OBS_DIM, ACT_DIM, HIDDEN = 3, 16, 2, (64, 64)
HIDDEN_TEXT = "x".join(map(str, HIDDEN))
# MAPPO's own defaults (normalize_advantage=True over all dims but the agent dim, entropy 0.01)
# plus the PPO family's critic settings, spelled out for both libraries.
PPO_KWARGS = dict(
    clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=1.0, loss_critic_type="smooth_l1"
)
PPO_CENTRALIZED = {"MAPPOLoss": True, "IPPOLoss": False}  # the critic sees every agent
PPO_LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")
ADV_EPS = torch.finfo(torch.float).resolution  # TorchRL's clamp of the advantage's std
ADV_STATS_DIMS = (0, 2)  # the advantage's statistics: every dim of [B, n_agents, 1] but agents'
ACTIONS, STATE_DIM, MIXING_EMBED, GAMMA = 5, AGENTS * OBS_DIM, 32, 0.99
MIXERS = {"QMixerLoss": "qmix", "QMixerLoss-vdn": "vdn"}


# --------------------------------------------------------------------------- #
# MAPPO / IPPO
# --------------------------------------------------------------------------- #
def agents_mlp(out_features: int, centralized: bool, activation: type[nn.Module]) -> MultiAgentMLP:
    """One ``MultiAgentMLP`` shared by the agents (``OBS_DIM -> HIDDEN -> out_features``), of
    each agent's own observation or (``centralized``) of every agent's."""
    return MultiAgentMLP(
        n_agent_inputs=OBS_DIM,
        n_agent_outputs=out_features,
        n_agents=AGENTS,
        centralized=centralized,
        share_params=True,
        depth=len(HIDDEN),
        num_cells=HIDDEN[0],
        activation_class=activation,
    )


def ppo_networks(centralized: bool, seed: int) -> dict[str, nn.Module]:
    """The agents' actor (one ``MultiAgentMLP`` shared by the agents, Gaussian head) and the
    critic (``centralized``: every agent's observation; else its own), as TensorDict modules and
    as the raw networks inside them."""
    torch.manual_seed(seed)
    actor_net = nn.Sequential(agents_mlp(2 * ACT_DIM, False, nn.Tanh), NormalParamExtractor())
    critic_net = agents_mlp(1, centralized, nn.Tanh)
    actor = ProbabilisticActor(
        TensorDictModule(
            actor_net, [("agents", "observation")], [("agents", "loc"), ("agents", "scale")]
        ),
        in_keys={"loc": ("agents", "loc"), "scale": ("agents", "scale")},
        out_keys=[("agents", "action")],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic = TensorDictModule(critic_net, [("agents", "observation")], [("agents", "state_value")])
    return {"actor": actor, "critic": critic, "actor_net": actor_net, "critic_net": critic_net}


def ppo_diagnostics(
    log_ratio: torch.Tensor,
    entropy: torch.Tensor,
    value: torch.Tensor,
    value_target: torch.Tensor,
    bounds: tuple[float, float],
) -> list[torch.Tensor]:
    """What the libraries report beside ClipPPO's losses, computed as they do (then dropped):
    approximate KLs, entropy, explained variance, clip fraction, ESS and the ratio's max and
    mean."""
    lo, hi = bounds
    with torch.no_grad():
        lr = log_ratio.detach()
        ratio = lr.exp()
        weight = (lr - lr.max()).exp()
        return [
            (-lr).mean(),  # kl_approx
            (torch.expm1(lr) - lr).mean(),  # kl_k3
            entropy.detach().mean(),
            1
            - (value_target - value.detach()).var(correction=0)
            / (value_target.var(correction=0) + 1e-7),  # explained_variance
            ((lr < lo) | (lr > hi)).float().mean(),  # clip_fraction
            weight.sum().square() / (weight.square().sum() * lr.numel()),  # ESS
            ratio.max(),
            ratio.mean(),
        ]


def plain_mappo_loss(nets: dict, batch, keys: tuple) -> Callable:
    """Multi-agent clipped PPO written by hand on tensors: each agent's advantage standardised
    over the batch (the agent dim excluded, as TorchRL's ``normalize_advantage_exclude_dims=
    (-2,)``), the clipped surrogate on per-agent ratios, the entropy bonus and a smooth-L1
    critic loss on the ``[B, n_agents, 1]`` values; the raw ``MultiAgentMLP`` modules called
    directly."""
    actor_net, critic_net = nets["actor_net"], nets["critic_net"]
    distribution_class = nets["actor"].module[-1].distribution_class
    action_key, lp_key = keys
    obs, action, logp_old = batch["agents", "observation"], batch[action_key], batch[lp_key]
    adv, value_target = batch["advantage"], batch["value_target"]  # [B, n_agents, 1]
    eps = PPO_KWARGS["clip_epsilon"]
    bounds = torch.tensor(-eps).log1p().item(), torch.tensor(eps).log1p().item()
    ent_coeff, critic_coeff = PPO_KWARGS["entropy_coeff"], PPO_KWARGS["critic_coeff"]
    stats_dims = ADV_STATS_DIMS

    def loss() -> torch.Tensor:
        std = adv.std(stats_dims, keepdim=True).clamp_min(ADV_EPS)
        advantage = (adv - adv.mean(stats_dims, keepdim=True)) / std
        loc, scale = actor_net(obs)
        dist = distribution_class(loc, scale)
        log_ratio = (dist.log_prob(action) - logp_old).unsqueeze(-1)  # [B, n_agents, 1]
        clipped = log_ratio.clamp(*bounds).exp() * advantage
        loss_objective = -torch.minimum(log_ratio.exp() * advantage, clipped).mean()
        entropy = dist.entropy()  # [B, n_agents]
        loss_entropy = -ent_coeff * entropy.mean()
        value = critic_net(obs)  # [B, n_agents, 1]
        loss_critic = critic_coeff * F.smooth_l1_loss(value_target, value)
        ppo_diagnostics(log_ratio, entropy, value, value_target, bounds)  # then dropped
        return loss_objective + loss_critic + loss_entropy

    return loss


def ppo_batches(nets: dict[str, nn.Module], keys: tuple, batch_size: int, seed: int) -> dict:
    """The timed on-policy batch (all ratios 1, per-agent advantages and value targets
    ``[B, n_agents, 1]``) and the gate-only off-policy one, whose log-probs are shifted so that
    the clip branch is exercised; on the harness's device."""
    g = torch.Generator().manual_seed(seed + 1)
    agents = (batch_size, AGENTS)
    td = TensorDict(
        {"agents": TensorDict({"observation": torch.randn(*agents, OBS_DIM, generator=g)}, agents)},
        [batch_size],
    )
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        nets["actor"](td)
        nets["critic"](td)
    td["advantage"] = torch.randn(*agents, 1, generator=g)
    td["value_target"] = torch.randn(*agents, 1, generator=g)
    bench = td.select(
        ("agents", "observation"), *keys, ("agents", "state_value"), "advantage", "value_target"
    )
    offpolicy = bench.clone()
    offpolicy[keys[1]] = offpolicy[keys[1]] + 0.4 * torch.randn(*agents, generator=g)
    return {"on-policy": bench.to(harness.DEVICE), "off-policy": offpolicy.to(harness.DEVICE)}


def build_ppo(name: str, batch_size: int, seed: int) -> CaseSetup:
    """``MAPPOLoss`` or ``IPPOLoss`` at ``batch_size`` timesteps of ``AGENTS`` agents."""
    nets = ppo_networks(PPO_CENTRALIZED[name], seed)
    actor = nets["actor"]
    keys = (actor.dist_sample_keys[0], actor.log_prob_keys[0])
    batch_by_name = ppo_batches(nets, keys, batch_size, seed)
    on_device(*nets.values())

    def named(m: dict) -> dict[str, torch.Tensor]:
        return {**prefixed("actor", m["actor_net"]), **prefixed("critic", m["critic_net"])}

    def module_factory(cls_getter: Callable[[], type], **extra) -> Callable[[Any], Method]:
        def make(batch) -> Method:
            m = copy.deepcopy(nets)  # one memo: wrappers and raw nets stay linked
            loss = cls_getter()(m["actor"], m["critic"], **PPO_KWARGS, **extra)
            loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
            return loss_module_method(loss, batch, named(m), PPO_LOSS_KEYS)

        return make

    def plain(batch) -> Method:
        m = copy.deepcopy(nets)
        trainable = (*m["actor_net"].parameters(), *m["critic_net"].parameters())
        return Method(plain_mappo_loss(m, batch, keys), named(m), trainable)

    critic_text = "centralised" if PPO_CENTRALIZED[name] else "per-agent"
    return CaseSetup(
        batches=batch_by_name,
        factories={
            "plain": plain,
            "rlloss": module_factory(lambda: rlloss_attr(name)),
            "rlloss-min": module_factory(lambda: rlloss_attr(name), diagnostics=False),
            "torchrl": module_factory(lambda: getattr(torchrl.objectives, name)),
        },
        description=(
            f"{described(name, PPO_KWARGS)} (normalize_advantage=True, exclude_dims=(-2,)); "
            f"{AGENTS} agents, MultiAgentMLP IndependentNormal actor (shared) + {critic_text} "
            f"MultiAgentMLP critic, {OBS_DIM}->{HIDDEN_TEXT} tanh, action dim {ACT_DIM}; "
            "per-agent advantages [B, n_agents, 1] in the batch"
        ),
    )


# --------------------------------------------------------------------------- #
# QMIX / VDN
# --------------------------------------------------------------------------- #
def qmix_networks(kind: str, seed: int) -> dict[str, nn.Module]:
    """The agents' local Q network (a ``MultiAgentMLP`` shared by the agents, greedy
    ``QValueModule`` head, categorical actions) and the mixer (``QMixer`` on the global state,
    or ``VDNMixer``), as TensorDict modules and as the raw networks inside them."""
    torch.manual_seed(seed)
    q_net = agents_mlp(ACTIONS, False, nn.ReLU)
    head = QValueModule(
        action_value_key=("agents", "action_value"),
        out_keys=[
            ("agents", "action"),
            ("agents", "action_value"),
            ("agents", "chosen_action_value"),
        ],
        spec=Categorical(ACTIONS),
    )
    local = SafeSequential(
        TensorDictModule(q_net, [("agents", "observation")], [("agents", "action_value")]), head
    )
    if kind == "vdn":
        mixer_net = VDNMixer(n_agents=AGENTS, device="cpu")
        in_keys = [("agents", "chosen_action_value")]
    else:
        mixer_net = QMixer(
            state_shape=(STATE_DIM,), mixing_embed_dim=MIXING_EMBED, n_agents=AGENTS, device="cpu"
        )
        in_keys = [("agents", "chosen_action_value"), "state"]
    mixer = TensorDictModule(mixer_net, in_keys, ["chosen_action_value"])
    return {"local": local, "mixer": mixer, "q_net": q_net, "mixer_net": mixer_net}


def plain_qmix_loss(
    q_net: nn.Module, mixer: nn.Module, targets: list[nn.Module], batch, kind: str
) -> Callable:
    """QMIX / VDN's TD(0) loss written by hand: each agent's Q of its chosen action, mixed into
    ``Q_tot``; the target ``r + gamma (1 - terminated) f_target(max_a Q_target(o', a); s')`` from
    the target copies, without gradient; the squared TD error kept as the priority."""
    target_q, target_mixer = targets
    obs, action = batch["agents", "observation"], batch["agents", "action"]
    next_obs = batch["next", "agents", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]
    state = () if kind == "vdn" else (batch["state"],)
    next_state = () if kind == "vdn" else (batch["next", "state"],)

    def loss() -> torch.Tensor:
        chosen = q_net(obs).gather(-1, action.unsqueeze(-1))  # [B, n_agents, 1]
        q_tot = mixer(chosen, *state)  # [B, 1]
        with torch.no_grad():
            next_value = target_q(next_obs).max(-1, keepdim=True).values
            target = reward + GAMMA * (~terminated) * target_mixer(next_value, *next_state)
        priority = (q_tot - target).detach().square()  # noqa: F841 - the priority, as written
        return F.mse_loss(q_tot, target)

    return loss


def team_batch(batch_size: int, seed: int) -> TensorDict:
    """A replay sample of team transitions: per-agent observations and categorical actions, the
    global state, and the team's reward and flags ``[B, 1]``; on the harness's device."""
    g = torch.Generator().manual_seed(seed + 1)
    agents = (batch_size, AGENTS)

    def step() -> dict:
        return {
            "agents": TensorDict(
                {"observation": torch.randn(*agents, OBS_DIM, generator=g)}, agents
            ),
            "state": torch.randn(batch_size, STATE_DIM, generator=g),
        }

    data = TensorDict(step(), [batch_size])
    data["agents", "action"] = torch.randint(ACTIONS, agents, generator=g)
    terminated = torch.rand(batch_size, 1, generator=g) < 0.1
    data["next"] = TensorDict(
        {
            **step(),
            "reward": torch.randn(batch_size, 1, generator=g),
            "terminated": terminated,
            "done": terminated | (torch.rand(batch_size, 1, generator=g) < 0.2),
        },
        [batch_size],
    )
    return data.to(harness.DEVICE)


def build_qmix(name: str, batch_size: int, seed: int) -> CaseSetup:
    """``QMixerLoss`` with TorchRL's ``QMixer`` (or ``VDNMixer``) at ``batch_size``."""
    kind = MIXERS[name]
    nets = qmix_networks(kind, seed)
    batch = team_batch(batch_size, seed)
    on_device(*nets.values())

    def named(m: dict) -> dict[str, torch.Tensor]:
        return {**prefixed("q", m["q_net"]), **prefixed("mixer", m["mixer_net"])}

    def module_factory(make_loss: Callable[[nn.Module, nn.Module], nn.Module]) -> Callable:
        def make(batch) -> Method:
            m = copy.deepcopy(nets)
            loss = make_loss(m["local"], m["mixer"])
            return loss_module_method(loss, batch, named(m), ("loss",))

        return make

    def torchrl_loss(local, mixer):
        loss = torchrl.objectives.QMixerLoss(local, mixer)
        loss.make_value_estimator(gamma=GAMMA)
        return loss

    def plain(batch) -> Method:
        m = copy.deepcopy(nets)
        sources = [m["q_net"], m["mixer_net"]]
        targets = frozen_copies(sources)
        return Method(
            loss=plain_qmix_loss(*sources, targets, batch, kind),
            params=named(m),
            trainable=(*m["q_net"].parameters(), *m["mixer_net"].parameters()),
            update_targets=soft_update_of(sources, targets),
        )

    mixer_text = (
        "VDNMixer"
        if kind == "vdn"
        else f"QMixer(mixing_embed_dim={MIXING_EMBED}) on a {STATE_DIM}-dim state"
    )
    return CaseSetup(
        batches={"replay": batch},
        factories={
            "plain": plain,
            "rlloss": module_factory(
                lambda local, mixer: rlloss_attr("QMixerLoss")(local, mixer, gamma=GAMMA)
            ),
            "torchrl": module_factory(torchrl_loss),
        },
        description=(
            f"QMixerLoss(loss_function='l2', delay_value=True, gamma={GAMMA}), {mixer_text}; "
            f"{AGENTS} agents, local Q: MultiAgentMLP (shared) {OBS_DIM}->{HIDDEN_TEXT} relu->"
            f"{ACTIONS} + QValueModule, categorical actions, target copies of both networks"
        ),
    )


CASES = {
    **{name: partial(build_ppo, name) for name in PPO_CENTRALIZED},
    **{name: partial(build_qmix, name) for name in MIXERS},
}
