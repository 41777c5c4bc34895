"""DQN, double DQN, discrete CQL and C51 (QValueActor / DistributionalQValueActor over an MLP,
one-hot actions, target network): DQNLoss, DDQNLoss, DiscreteCQLLoss and DistributionalDQNLoss,
and their hand-written plain-torch baselines."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
import torchrl.objectives
from torch import nn
from torchrl.modules import MLP, DistributionalQValueActor, QValueActor

from benchmarks.cases.common import (
    frozen_copies,
    loss_module_method,
    on_device,
    prefixed,
    random_replay,
    rlloss_module,
    soft_update_of,
)
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (64, 4096)
OBS_DIM, ACTIONS, HIDDEN, GAMMA = 8, 4, (64, 64), 0.99
VARIANTS = {"DQNLoss": {"double_dqn": False}, "DDQNLoss": {"double_dqn": True}}
ATOMS, V_MIN, V_MAX = 51, 0.0, 100.0  # C51's support
CQL_KEYS = ("loss_qvalue", "loss_cql")


def plain_dqn_loss(
    net: nn.Module, target_net: nn.Module, batch, double_dqn: bool, diagnostics: bool = True
) -> Callable:
    """Double / plain DQN written by hand as CleanRL's ``dqn.py`` does, with a target-net copy:
    also the harness's hand-written step (``hand``; ``hand-min`` without ``diagnostics``, the
    squared TD error rlloss writes as the priority)."""
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]
    logged = {}

    def loss() -> torch.Tensor:
        chosen = (net(obs) * action).sum(-1, keepdim=True)
        with torch.no_grad():
            next_q = target_net(next_obs)
            if double_dqn:
                next_value = next_q.gather(-1, net(next_obs).argmax(-1, keepdim=True))
            else:
                next_value = next_q.max(-1, keepdim=True).values
            target = reward + GAMMA * (~terminated) * next_value
        if diagnostics:
            logged["td_error"] = (chosen - target).detach().square()
        return F.mse_loss(chosen, target)

    return loss


def plain_discrete_cql_loss(net: nn.Module, target_net: nn.Module, batch) -> Callable:
    """Discrete CQL(H) written by hand: DQN's regression halved (TorchRL's convention) and the
    penalty ``logsumexp_a Q(s, a) - Q(s, a_data)``; ``loss_qvalue + loss_cql`` (weight 1)."""
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]

    def loss() -> torch.Tensor:
        q = net(obs)
        chosen = (q * action).sum(-1, keepdim=True)
        with torch.no_grad():
            next_value = target_net(next_obs).max(-1, keepdim=True).values
            target = reward + GAMMA * (~terminated) * next_value
        td_error = (chosen - target).detach().square()  # noqa: F841 - the priority, as written
        pred_value = q.detach().mean()  # noqa: F841 - reported by the libraries
        loss_qvalue = 0.5 * F.mse_loss(chosen, target)
        loss_cql = (torch.logsumexp(q, -1, keepdim=True) - chosen).mean()
        return loss_qvalue + loss_cql

    return loss


def plain_c51_loss(net: nn.Module, target_net: nn.Module, batch) -> Callable:
    """C51 with double-Q bootstrapping written by hand (Algorithm 1, the projection as two
    ``scatter_add``), as a user would write it with a target-net copy."""
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"]
    support = torch.linspace(V_MIN, V_MAX, ATOMS)
    delta = (V_MAX - V_MIN) / (ATOMS - 1)

    def log_probs(module, x):
        return module(x).view(*x.shape[:-1], ATOMS, ACTIONS).log_softmax(-2)

    def loss() -> torch.Tensor:
        chosen = (log_probs(net, obs) * action.unsqueeze(-2)).sum(-1)  # [B, K]
        with torch.no_grad():
            greedy = (log_probs(net, next_obs).exp() * support[:, None]).sum(-2).argmax(-1)
            next_probs = log_probs(target_net, next_obs).exp()
            index = greedy.view(-1, 1, 1).expand(-1, ATOMS, 1)
            p = next_probs.gather(-1, index).squeeze(-1)
            tz = (reward + GAMMA * (~terminated) * support).clamp(V_MIN, V_MAX)
            b = (tz - V_MIN) / delta
            low = b.floor()
            m = torch.zeros_like(p).scatter_add(-1, low.long(), p * (low + 1 - b))
            m = m.scatter_add(-1, (low.long() + 1).clamp(max=ATOMS - 1), p * (b - low))
        cross_entropy = -(m * chosen).sum(-1)
        priority = cross_entropy.detach()  # noqa: F841 - the priority, as written
        return cross_entropy.mean()

    return loss


def network_and_batch(out_features: int, batch_size: int, seed: int):
    """The Q network (an MLP with ``out_features`` outputs, on the benchmark device) and a
    replay batch of one-hot actions, seeded."""
    torch.manual_seed(seed)
    net = MLP(
        in_features=OBS_DIM,
        out_features=out_features,
        num_cells=list(HIDDEN),
        activation_class=nn.ReLU,
    )
    on_device(net)
    return net, random_replay(batch_size, seed + 1, ACTIONS, True, obs_dim=OBS_DIM)


def plain_method(net: nn.Module, plain_loss: Callable) -> Callable:
    """The plain-torch factory: a copy of ``net``, a frozen target copy, ``plain_loss(net,
    target, batch)`` and a hand-written soft update."""

    def plain(batch) -> Method:
        module = copy.deepcopy(net)
        (target,) = frozen_copies([module])
        return Method(
            loss=plain_loss(module, target, batch),
            params=prefixed("q", module),
            trainable=tuple(module.parameters()),
            update_targets=soft_update_of([module], [target]),
        )

    return plain


def library_methods(
    net: nn.Module,
    actor_of: Callable,
    make_loss: Callable,
    keys: tuple = ("loss",),
    torchrl_fresh: bool = False,
) -> dict[str, Callable]:
    """rlloss's and TorchRL's factories: a copy of ``net`` made an actor by ``actor_of``, the
    loss ``make_loss(library, actor)`` summed over ``keys``. ``torchrl_fresh``: TorchRL's loss
    writes its predictions, graph and all, into the batch in place (the next call's backward
    would go through them), so each of its calls reads a fresh shallow copy of the batch."""

    def factory(library) -> Callable:
        def make(batch) -> Method:
            module = copy.deepcopy(net)
            loss = make_loss(library, actor_of(module))
            fresh = torchrl_fresh and library is torchrl.objectives
            return loss_module_method(loss, batch, prefixed("q", module), keys, fresh_batch=fresh)

        return make

    return {"rlloss": factory(rlloss_module()), "torchrl": factory(torchrl.objectives)}


def q_actor(module: nn.Module) -> QValueActor:
    """The greedy one-hot actor over the Q network."""
    return QValueActor(module, in_keys=["observation"], action_space="one-hot")


def c51_actor(module: nn.Module) -> DistributionalQValueActor:
    """The distributional actor over the network's ``ATOMS x ACTIONS`` outputs."""
    return DistributionalQValueActor(
        nn.Sequential(module, nn.Unflatten(-1, (ATOMS, ACTIONS))),
        in_keys=["observation"],
        support=torch.linspace(V_MIN, V_MAX, ATOMS),
        action_space="one-hot",
    )


def library_loss(name: str, library, actor: nn.Module, **kwargs) -> nn.Module:
    """``library``'s loss ``name`` on ``actor``: given ``gamma`` (rlloss's losses, TorchRL's C51),
    or TorchRL's with the one-hot action space and a value estimator of ``gamma``."""
    if library is not torchrl.objectives or name == "DistributionalDQNLoss":
        return getattr(library, name)(actor, gamma=GAMMA, **kwargs)
    loss = getattr(library, name)(actor, action_space="one-hot", **kwargs)
    loss.make_value_estimator(gamma=GAMMA)
    return loss


def build_c51(batch_size: int, seed: int) -> CaseSetup:
    """``DistributionalDQNLoss`` at ``batch_size``."""
    net, batch = network_and_batch(ATOMS * ACTIONS, batch_size, seed)
    return CaseSetup(
        batches={"replay": batch},
        factories={
            "plain": plain_method(net, plain_c51_loss),
            **library_methods(net, c51_actor, partial(library_loss, "DistributionalDQNLoss")),
        },
        description=(
            f"DistributionalDQNLoss(gamma={GAMMA}), {ATOMS} atoms on [{V_MIN}, {V_MAX}]; "
            f"DistributionalQValueActor over MLP {OBS_DIM}->{'x'.join(map(str, HIDDEN))} relu->"
            f"{ATOMS}x{ACTIONS}, one-hot actions, double-Q target network"
        ),
    )


def build_discrete_cql(batch_size: int, seed: int) -> CaseSetup:
    """``DiscreteCQLLoss`` at ``batch_size``."""
    net, batch = network_and_batch(ACTIONS, batch_size, seed)
    make_loss = partial(library_loss, "DiscreteCQLLoss")
    return CaseSetup(
        batches={"replay": batch},
        factories={
            "plain": plain_method(net, plain_discrete_cql_loss),
            **library_methods(net, q_actor, make_loss, CQL_KEYS, torchrl_fresh=True),
        },
        description=(
            f"DiscreteCQLLoss(loss_function='l2', gamma={GAMMA}), loss_qvalue + loss_cql"
            f"; QValueActor over MLP {OBS_DIM}->{'x'.join(map(str, HIDDEN))} relu->"
            f"{ACTIONS}, one-hot actions, target network; TorchRL's reads a shallow copy of the "
            "batch each call"
        ),
    )


def build(name: str, batch_size: int, seed: int) -> CaseSetup:
    """The case ``name`` of the family at ``batch_size``."""
    net, batch = network_and_batch(ACTIONS, batch_size, seed)
    kwargs = VARIANTS[name]
    make_loss = partial(library_loss, "DQNLoss", **kwargs)
    return CaseSetup(
        batches={"replay": batch},
        factories={
            "plain": plain_method(net, partial(plain_dqn_loss, **kwargs)),
            "hand": plain_method(net, partial(plain_dqn_loss, **kwargs)),
            "hand-min": plain_method(net, partial(plain_dqn_loss, **kwargs, diagnostics=False)),
            **library_methods(net, q_actor, make_loss),
        },
        description=(
            f"DQNLoss(double_dqn={kwargs['double_dqn']}, loss_function='l2', gamma={GAMMA})"
            f"; QValueActor over MLP {OBS_DIM}->{'x'.join(map(str, HIDDEN))} relu->"
            f"{ACTIONS}, one-hot actions, target network"
        ),
    )


CASES = {name: partial(build, name) for name in VARIANTS}
CASES["DiscreteCQLLoss"] = build_discrete_cql
CASES["DistributionalDQNLoss"] = build_c51
