"""Every loss a multi-agent pipeline builds (BenchMARL's MASAC, MADDPG, MATD3, IQL, independent
Q-learning, QMIX, MAPPO) accepts TorchRL's multi-agent networks, whose weights live in a
``TensorDictParams`` with dotted names (``params.0.weight``): target copies, detached views and
critic ensembles are built, trained and updated as for any network."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives
from tensordict import TensorDict
from tensordict.nn import (
    NormalParamExtractor,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torch import nn
from torchrl.data import Bounded, Categorical, Composite
from torchrl.modules import (
    MultiAgentMLP,
    ProbabilisticActor,
    QValueModule,
    SafeSequential,
    TanhNormal,
)
from torchrl.modules.models.multiagent import VDNMixer

import rlloss
from rlloss import _compat

N, OBS, ACT, ACTIONS, B = 3, 6, 2, 4, 8
AGENT_KEYS = {
    "reward": ("agents", "reward"),
    "done": ("agents", "done"),
    "terminated": ("agents", "terminated"),
}


def mlp(inputs: int, outputs: int, centralized: bool = False, share: bool = False):
    return MultiAgentMLP(
        n_agent_inputs=inputs,
        n_agent_outputs=outputs,
        n_agents=N,
        centralized=centralized,
        share_params=share,
        depth=1,
        num_cells=16,
    )


class ObsAction(nn.Module):
    """A critic of (observation, action) per agent: the concatenation, then a MultiAgentMLP."""

    def __init__(self, centralized: bool) -> None:
        super().__init__()
        self.mlp = mlp(OBS + ACT, 1, centralized=centralized)

    def forward(self, observation, action):
        return self.mlp(torch.cat([observation, action], -1))


def stochastic_actor():
    net = nn.Sequential(mlp(OBS, 2 * ACT, share=True), NormalParamExtractor())
    module = TensorDictModule(
        net, in_keys=[("agents", "observation")], out_keys=[("agents", "loc"), ("agents", "scale")]
    )
    return ProbabilisticActor(
        module,
        in_keys={"loc": ("agents", "loc"), "scale": ("agents", "scale")},
        out_keys=[("agents", "action")],
        distribution_class=TanhNormal,
        return_log_prob=True,
        log_prob_key=("agents", "action_log_prob"),
    )


def deterministic_actor():
    net = nn.Sequential(mlp(OBS, ACT), nn.Tanh())
    return TensorDictModule(net, [("agents", "observation")], [("agents", "action")])


def qvalue(centralized=True):
    return TensorDictModule(
        ObsAction(centralized),
        in_keys=[("agents", "observation"), ("agents", "action")],
        out_keys=[("agents", "state_action_value")],
    )


def state_value():
    return TensorDictModule(mlp(OBS, 1), [("agents", "observation")], [("agents", "state_value")])


def q_network():
    return SafeSequential(
        TensorDictModule(
            mlp(OBS, ACTIONS), [("agents", "observation")], [("agents", "action_value")]
        ),
        QValueModule(
            action_value_key=("agents", "action_value"),
            out_keys=[
                ("agents", "action"),
                ("agents", "action_value"),
                ("agents", "chosen_action_value"),
            ],
            spec=Categorical(ACTIONS),
        ),
    )


def transitions(discrete=False, team=False):
    action = torch.randint(ACTIONS, (B, N)) if discrete else torch.rand(B, N, ACT) * 2 - 1

    def agents(extra=None):
        return TensorDict({"observation": torch.randn(B, N, OBS), **(extra or {})}, [B, N])

    flags = {
        "reward": torch.randn(B, N, 1),
        "done": torch.rand(B, N, 1) < 0.2,
        "terminated": torch.rand(B, N, 1) < 0.1,
    }
    team_flags = {k: v[:, 0] for k, v in flags.items()} if team else {}
    batch = TensorDict(
        {
            "agents": agents({"action": action}),
            "next": TensorDict({"agents": agents(None if team else flags), **team_flags}, [B]),
        },
        [B],
    )
    return batch


def sac():
    loss = rlloss.SACLoss(stochastic_actor(), qvalue(), num_qvalue_nets=2)
    loss.set_keys(
        action=("agents", "action"),
        state_action_value=("agents", "state_action_value"),
        **AGENT_KEYS,
    )
    return loss, transitions()


def ddpg():
    loss = rlloss.DDPGLoss(deterministic_actor(), qvalue())
    loss.set_keys(state_action_value=("agents", "state_action_value"), **AGENT_KEYS)
    return loss, transitions()


def td3():
    loss = rlloss.TD3Loss(deterministic_actor(), qvalue(), bounds=(-1.0, 1.0))
    loss.set_keys(
        action=("agents", "action"),
        state_action_value=("agents", "state_action_value"),
        **AGENT_KEYS,
    )
    return loss, transitions()


def iql():
    loss = rlloss.IQLLoss(stochastic_actor(), qvalue(False), state_value())
    loss.set_keys(
        action=("agents", "action"),
        state_action_value=("agents", "state_action_value"),
        value=("agents", "state_value"),
        **AGENT_KEYS,
    )
    return loss, transitions()


def dqn():
    loss = rlloss.DQNLoss(q_network(), action_space="categorical")
    loss.set_keys(
        action_value=("agents", "action_value"), action=("agents", "action"), **AGENT_KEYS
    )
    return loss, transitions(discrete=True)


def qmix():
    mixer = TensorDictModule(
        VDNMixer(n_agents=N, device="cpu"),
        [("agents", "chosen_action_value")],
        ["chosen_action_value"],
    )
    return rlloss.QMixerLoss(q_network(), mixer), transitions(discrete=True, team=True)


LOSSES = {
    "SACLoss": sac,
    "DDPGLoss": ddpg,
    "TD3Loss": td3,
    "IQLLoss": iql,
    "DQNLoss": dqn,
    "QMixerLoss": qmix,
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_trains_and_updates_targets_of_multi_agent_networks(name):
    loss, batch = LOSSES[name]()
    out = loss(batch)
    total = sum(v for k, v in out.items() if k.startswith("loss"))
    assert torch.isfinite(total)
    total.backward()
    trained = [p for p in loss.parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert trained, "no parameter got a gradient"
    targets = [k for k, _ in loss.named_buffers() if k.startswith("target_")]
    if targets:  # a SoftUpdate moves the target copies towards the (moved) online weights
        updater = rlloss.SoftUpdate(loss, tau=0.5)
        before = {k: v.clone() for k, v in loss.named_buffers() if k.startswith("target_")}
        with torch.no_grad():
            for p in loss.parameters():
                p.add_(1.0)
        updater.step()
        moved = [
            k for k, v in loss.named_buffers() if k in before and not torch.equal(v, before[k])
        ]
        assert moved
        second = loss(batch.clone())  # the targets the copies read are the updated ones
        assert not torch.equal(second[next(iter(second.keys()))], out[next(iter(out.keys()))])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_state_dict_round_trip_with_multi_agent_networks(name):
    torch.manual_seed(0)
    loss, batch = LOSSES[name]()
    other = copy.deepcopy(loss)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.3)
    other.load_state_dict(loss.state_dict())
    torch.manual_seed(1)
    expected = loss(batch.clone())
    torch.manual_seed(1)
    got = other(batch.clone())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key])


def test_the_ensemble_of_a_multi_agent_critic_evaluates_each_member_on_its_weights():
    """SAC's two critics, stacked from one MultiAgentMLP: each member's values are those of a
    network holding that member's weights."""
    loss, batch = sac()
    values = loss._q_values(batch, batch["agents", "action"])  # [2, B, N, 1]
    stacked = loss.qvalue_network_params
    for member in range(2):
        network = copy.deepcopy(loss._qvalue.template)
        _compat.point_at(network, dict(stacked[member].detach().flatten_keys(".").items()))
        expected = network(batch.select(*network.in_keys).clone())["agents", "state_action_value"]
        torch.testing.assert_close(values[member], expected)


def test_ppo_takes_multi_agent_networks_and_torchrl_aliases():
    """MAPPO in BenchMARL: ClipPPOLoss(actor=..., critic=...) over MultiAgentMLP networks."""
    actor = stochastic_actor()
    critic = TensorDictModule(
        mlp(OBS, 1, centralized=True, share=True),
        [("agents", "observation")],
        [("agents", "state_value")],
    )
    loss = rlloss.ClipPPOLoss(actor=actor, critic=critic, normalize_advantage=False)
    loss.set_keys(value=("agents", "state_value"), **AGENT_KEYS)
    batch = transitions()
    with torch.no_grad():
        actor(batch)
    batch["agents", "advantage"] = torch.randn(B, N, 1)
    batch["agents", "value_target"] = torch.randn(B, N, 1)
    loss.set_keys(advantage=("agents", "advantage"), value_target=("agents", "value_target"))
    out = loss(batch)
    (out["loss_objective"] + out["loss_critic"]).backward()
    assert all(p.grad is not None for p in actor.parameters())


class WholeBatchCritic(TensorDictModuleBase):
    """A critic shaped like BenchMARL's ``Mlp`` model: a ``TensorDictModuleBase`` (not a plain
    ``TensorDictModule``: the loss runs it whole, on a TensorDict) reading the agents'
    observations and actions and writing ``("agents", "state_action_value")``; with ``share``,
    a centralised shared critic writes a team value ``[*B, 1]`` at the root, expanded to the
    agents by the next module (BenchMARL's MASAC / MADDPG with ``share_param_critic``)."""

    def __init__(self, share: bool) -> None:
        super().__init__()
        self.share = share
        self.in_keys = [("agents", "observation"), ("agents", "action")]
        self.out_keys = ["state_action_value" if share else ("agents", "state_action_value")]
        self.mlp = MultiAgentMLP(
            n_agent_inputs=OBS + ACT,
            n_agent_outputs=1,
            n_agents=N,
            centralized=share,
            share_params=share,
            depth=1,
            num_cells=16,
        )

    def forward(self, tensordict):
        inputs = torch.cat([tensordict.get(key) for key in self.in_keys], -1)
        value = self.mlp(inputs)
        if self.share:  # the centralised shared value is one per team: drop the agent dim
            value = value[..., 0, :]
        tensordict.set(self.out_keys[0], value)
        return tensordict


def whole_batch_critic(share: bool):
    if not share:
        return WholeBatchCritic(share=False)
    expand = TensorDictModule(
        lambda value: value.unsqueeze(-2).expand(*value.shape[:-1], N, 1),
        in_keys=["state_action_value"],
        out_keys=[("agents", "state_action_value")],
    )
    return TensorDictSequential(WholeBatchCritic(share=True), expand)


@pytest.mark.parametrize("share", [False, True], ids=["independent", "centralised-shared"])
def test_sac_ensemble_of_a_critic_run_whole_keeps_its_nested_values(share):
    """BenchMARL's ISAC / MASAC critics: each member's ``("agents", "state_action_value")`` is
    that of the network holding the member's weights (was a KeyError: only the top-level keys
    of the members' output TensorDicts were stacked)."""
    torch.manual_seed(0)
    loss = rlloss.SACLoss(stochastic_actor(), whole_batch_critic(share), num_qvalue_nets=2)
    loss.set_keys(
        action=("agents", "action"),
        state_action_value=("agents", "state_action_value"),
        **AGENT_KEYS,
    )
    batch = transitions()
    values = loss._q_values(batch, batch["agents", "action"])
    assert values.shape == (2, B, N, 1)
    for member in range(2):
        network = copy.deepcopy(loss._qvalue.template)
        params = loss.qvalue_network_params[member].detach()
        _compat.point_at(network, dict(params.flatten_keys(".").items()))
        expected = network(batch.select(*network.in_keys).clone())["agents", "state_action_value"]
        torch.testing.assert_close(values[member], expected)
    out = loss(batch)
    (out["loss_actor"] + out["loss_qvalue"]).backward()
    assert all(torch.isfinite(out[k]) for k in ("loss_actor", "loss_qvalue", "loss_alpha"))


@pytest.mark.parametrize("share", [False, True], ids=["independent", "centralised-shared"])
def test_ddpg_with_a_critic_run_whole_matches_torchrl(share):
    """BenchMARL's IDDPG / MADDPG: the critic is called on a TensorDict of the replay batch's
    size ``[B]``, not the action's leading dims ``[B, n_agents]`` (a team value ``[B, 1]``
    refused by a ``[B, n_agents]`` TensorDict); the losses equal TorchRL's."""
    torch.manual_seed(0)
    actor, critic = deterministic_actor(), whole_batch_critic(share)
    keys = dict(state_action_value=("agents", "state_action_value"), **AGENT_KEYS)
    ours = rlloss.DDPGLoss(actor, critic, delay_value=True)
    theirs = torchrl.objectives.DDPGLoss(actor, critic, delay_value=True)
    for loss in (ours, theirs):
        loss.set_keys(**keys)
    batch = transitions()
    got, expected = ours(batch.clone()), theirs(batch.clone())
    for key in ("loss_actor", "loss_value"):
        torch.testing.assert_close(got[key], expected[key])


def test_sac_target_entropy_counts_the_action_dims_of_one_agent():
    """``target_entropy="auto"`` with BenchMARL's group action spec (a Composite holding
    ``("agents", "action")`` of shape ``[n_agents, D]``): ``-D``, TorchRL's value (was
    ``-n_agents * D``); without a spec, from the batch, the same."""
    spec = Composite(
        {"agents": Composite({"action": Bounded(-1.0, 1.0, (N, ACT))}, shape=(N,))}
    )
    theirs = torchrl.objectives.SACLoss(stochastic_actor(), qvalue(), action_spec=spec)
    theirs.set_keys(action=("agents", "action"))
    ours = rlloss.SACLoss(stochastic_actor(), qvalue(), action_spec=spec)
    assert float(theirs.target_entropy) == -ACT
    assert float(ours.target_entropy) == -ACT
    loss, batch = sac()  # no spec: read from the batch's action at the first call
    loss(batch)
    assert float(loss.target_entropy) == -ACT


@pytest.mark.parametrize("share", [False, True], ids=["independent", "centralised-shared"])
def test_sac_with_a_critic_run_whole_matches_torchrl(share):
    """BenchMARL's ISAC / MASAC losses (group action spec, nested keys set after construction):
    with the same ensemble weights and random state, TorchRL's values."""
    torch.manual_seed(0)
    actor, critic = stochastic_actor(), whole_batch_critic(share)
    spec = Composite(
        {"agents": Composite({"action": Bounded(-1.0, 1.0, (N, ACT))}, shape=(N,))}
    )
    ours = rlloss.SACLoss(actor, critic, num_qvalue_nets=2, action_spec=spec)
    theirs = torchrl.objectives.SACLoss(actor, critic, num_qvalue_nets=2, action_spec=spec)
    with torch.no_grad():  # TorchRL initialises its ensemble members in its own way
        theirs.qvalue_network_params.data.copy_(ours.qvalue_network_params.data)
        theirs.target_qvalue_network_params.data.copy_(ours.target_qvalue_network_params.data)
    for loss in (ours, theirs):
        loss.set_keys(
            action=("agents", "action"),
            state_action_value=("agents", "state_action_value"),
            **AGENT_KEYS,
        )
    batch = transitions()
    torch.manual_seed(1)
    got = ours(batch.clone())
    torch.manual_seed(1)
    expected = theirs(batch.clone())
    for key in ("loss_actor", "loss_qvalue", "loss_alpha", "entropy"):
        torch.testing.assert_close(got[key], expected[key])
