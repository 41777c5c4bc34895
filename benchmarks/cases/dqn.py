"""DQN and double DQN (QValueActor over an MLP, one-hot actions, target network): DQNLoss and
DDQNLoss, and their hand-written plain-torch baseline."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
import torchrl.objectives
from torch import nn
from torchrl.modules import MLP, QValueActor

from benchmarks.cases.common import (
    frozen_copies,
    loss_module_method,
    on_device,
    prefixed,
    replay_batch,
    rlloss_attr,
    soft_update_of,
)
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (64, 4096)
OBS_DIM, ACTIONS, HIDDEN, GAMMA = 8, 4, (64, 64), 0.99
VARIANTS = {"DQNLoss": {"double_dqn": False}, "DDQNLoss": {"double_dqn": True}}


def plain_dqn_loss(net: nn.Module, target_net: nn.Module, batch, double_dqn: bool) -> Callable:
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
            target = reward + GAMMA * (~terminated) * next_value
        td_error = (chosen - target).detach().square()  # noqa: F841 - the priority, as written
        return F.mse_loss(chosen, target)

    return loss


def build(name: str, batch_size: int, seed: int) -> CaseSetup:
    """The case ``name`` of the family at ``batch_size``."""
    torch.manual_seed(seed)
    net = MLP(
        in_features=OBS_DIM,
        out_features=ACTIONS,
        num_cells=list(HIDDEN),
        activation_class=nn.ReLU,
    )
    g = torch.Generator().manual_seed(seed + 1)
    action = torch.randint(0, ACTIONS, (batch_size,), generator=g)
    observation = torch.randn(batch_size, OBS_DIM, generator=g)
    batch = replay_batch(observation, nn.functional.one_hot(action, ACTIONS), g)
    on_device(net)
    kwargs = VARIANTS[name]

    def module_factory(make_loss: Callable[[nn.Module], nn.Module]) -> Callable:
        def make(batch) -> Method:
            module = copy.deepcopy(net)
            actor = QValueActor(module, in_keys=["observation"], action_space="one-hot")
            return loss_module_method(make_loss(actor), batch, prefixed("q", module), ("loss",))

        return make

    def torchrl_loss(actor):
        loss = torchrl.objectives.DQNLoss(actor, action_space="one-hot", **kwargs)
        loss.make_value_estimator(gamma=GAMMA)
        return loss

    def plain(batch) -> Method:
        module = copy.deepcopy(net)
        (target,) = frozen_copies([module])
        return Method(
            loss=plain_dqn_loss(module, target, batch, **kwargs),
            params=prefixed("q", module),
            trainable=tuple(module.parameters()),
            update_targets=soft_update_of([module], [target]),
        )

    return CaseSetup(
        batches={"replay": batch},
        factories={
            "plain": plain,
            "rlloss": module_factory(
                lambda actor: rlloss_attr("DQNLoss")(actor, gamma=GAMMA, **kwargs)
            ),
            "torchrl": module_factory(torchrl_loss),
        },
        description=(
            f"DQNLoss(double_dqn={kwargs['double_dqn']}, loss_function='l2', gamma={GAMMA})"
            f"; QValueActor over MLP {OBS_DIM}->{'x'.join(map(str, HIDDEN))} relu->"
            f"{ACTIONS}, one-hot actions, target network"
        ),
    )


CASES = {name: partial(build, name) for name in VARIANTS}
