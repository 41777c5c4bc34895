"""QMixerLoss (QMIX / VDN): parity with TorchRL's on the same networks and batch, the target
against a naive per-sample reference, and the keys a multi-agent pipeline remaps."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Categorical, OneHot
from torchrl.modules import QValueModule, SafeSequential
from torchrl.modules.models.multiagent import QMixer, VDNMixer
from torchrl.objectives.multiagent import QMixerLoss as TorchRLQMixerLoss
from torchrl.objectives.utils import ValueEstimators

import rlloss

AGENTS, OBS, ACTIONS, STATE = 3, 5, 4, 6


def local_q(space: str) -> SafeSequential:
    spec = OneHot(ACTIONS) if space == "one_hot" else Categorical(ACTIONS)
    net = TensorDictModule(
        nn.Sequential(nn.Linear(OBS, 16), nn.Tanh(), nn.Linear(16, ACTIONS)),
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "action_value")],
    )
    head = QValueModule(
        action_value_key=("agents", "action_value"),
        out_keys=[
            ("agents", "action"),
            ("agents", "action_value"),
            ("agents", "chosen_action_value"),
        ],
        spec=spec,
    )
    return SafeSequential(net, head)


def mixer(kind: str) -> TensorDictModule:
    if kind == "vdn":
        return TensorDictModule(
            VDNMixer(n_agents=AGENTS, device="cpu"),
            in_keys=[("agents", "chosen_action_value")],
            out_keys=["chosen_action_value"],
        )
    return TensorDictModule(
        QMixer(state_shape=(STATE,), mixing_embed_dim=8, n_agents=AGENTS, device="cpu"),
        in_keys=[("agents", "chosen_action_value"), "state"],
        out_keys=["chosen_action_value"],
    )


def team_batch(space: str, batch=(8,)) -> TensorDict:
    index = torch.randint(ACTIONS, (*batch, AGENTS))
    action = nn.functional.one_hot(index, ACTIONS) if space == "one_hot" else index
    terminated = torch.rand(*batch, 1) < 0.3

    def step():
        return {
            "agents": TensorDict(
                {"observation": torch.randn(*batch, AGENTS, OBS)}, [*batch, AGENTS]
            ),
            "state": torch.randn(*batch, STATE),
        }

    data = TensorDict(step(), batch)
    data["agents", "action"] = action
    data["next"] = TensorDict(
        {
            **step(),
            "reward": torch.randn(*batch, 1),
            "terminated": terminated,
            "done": terminated | (torch.rand(*batch, 1) < 0.2),
        },
        batch,
    )
    return data


def pair(space: str, kind: str, **kwargs):
    """rlloss's and TorchRL's loss on copies of the same networks, targets moved alike."""
    torch.manual_seed(0)
    q, m = local_q(space), mixer(kind)
    ours = rlloss.QMixerLoss(q, m, **kwargs)
    theirs = TorchRLQMixerLoss(copy.deepcopy(q), copy.deepcopy(m), **kwargs)
    if kwargs.get("delay_value", True):
        torch.manual_seed(1)
        for loss in (ours, theirs):
            rlloss.SoftUpdate(loss, eps=0.5)
        for name in ("target_local_value_network_params", "target_mixer_network_params"):
            torch.manual_seed(2)
            for ours_t, theirs_t in zip(
                getattr(ours, name).flatten_keys(".").values(),
                getattr(theirs, name).flatten_keys(".").values(),
                strict=True,
            ):
                noise = 0.1 * torch.randn_like(ours_t)
                ours_t.data.add_(noise)
                theirs_t.data.add_(noise)
    return ours, theirs


@pytest.mark.parametrize("space", ["categorical", "one_hot"])
@pytest.mark.parametrize("kind", ["qmix", "vdn"])
@pytest.mark.parametrize("delay_value", [True, False])
def test_matches_torchrl(space, kind, delay_value):
    ours, theirs = pair(space, kind, delay_value=delay_value)
    batch = team_batch(space)
    out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    torch.testing.assert_close(out_ours["loss"], out_theirs["loss"])
    out_ours["loss"].backward()
    out_theirs["loss"].backward()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("estimator", [ValueEstimators.TD1, ValueEstimators.TDLambda])
def test_multi_step_targets_match_torchrl(estimator):
    ours, theirs = pair("categorical", "qmix")
    for loss in (ours, theirs):
        loss.make_value_estimator(estimator, gamma=0.9)
    batch = team_batch("categorical", batch=(2, 7))
    torch.testing.assert_close(ours(batch.clone())["loss"], theirs(batch.clone())["loss"])


def test_target_and_priority_against_a_naive_reference():
    """``y = r + gamma (1 - terminated) f_target(max_a Q_target(o', a); s')``, per sample."""
    ours, _ = pair("categorical", "vdn")
    ours.make_value_estimator(ValueEstimators.TD0, gamma=0.9)
    batch = team_batch("categorical")
    ours(batch)
    with torch.no_grad():
        params = ours.target_local_value_network_params.flatten_keys(".")
        w0, b0 = params["module.0.module.0.weight"], params["module.0.module.0.bias"]
        w2, b2 = params["module.0.module.2.weight"], params["module.0.module.2.bias"]
        q_next = torch.tanh(batch["next", "agents", "observation"] @ w0.T + b0) @ w2.T + b2
        team_next = q_next.max(-1).values.sum(-1, keepdim=True)  # VDN: the sum over agents
        not_done = (~batch["next", "terminated"]).float()
        target = batch["next", "reward"] + 0.9 * not_done * team_next
        q = ours.local_value_network(batch.clone())["agents", "action_value"]
        chosen = q.gather(-1, batch["agents", "action"].unsqueeze(-1)).sum(-2)
    torch.testing.assert_close(batch["td_error"], (chosen - target).square())


def test_keys_remapped_as_a_pipeline_does():
    """Custom agent keys set after construction are read and written."""
    q = SafeSequential(
        TensorDictModule(nn.Linear(OBS, ACTIONS), [("team", "obs")], [("team", "q")]),
        QValueModule(
            action_value_key=("team", "q"),
            out_keys=[("team", "act"), ("team", "q"), ("team", "local")],
            spec=Categorical(ACTIONS),
        ),
    )
    m = TensorDictModule(VDNMixer(n_agents=AGENTS, device="cpu"), [("team", "local")], ["q_tot"])
    loss = rlloss.QMixerLoss(q, m, delay_value=False)
    loss.set_keys(
        action_value=("team", "q"),
        action=("team", "act"),
        local_value=("team", "local"),
        global_value="q_tot",
        priority="prio",
    )
    batch = team_batch("categorical").rename_key_(("agents", "observation"), ("team", "obs"))
    batch.rename_key_(("next", "agents", "observation"), ("next", "team", "obs"))
    batch.rename_key_(("agents", "action"), ("team", "act"))
    out = loss(batch)
    assert out["loss"].isfinite() and "prio" in batch.keys()
    assert ("team", "obs") in loss.in_keys and ("next", "team", "obs") in loss.in_keys


def test_plain_modules_are_wrapped_as_torchrl_does():
    loss = rlloss.QMixerLoss(
        nn.Linear(OBS, ACTIONS), VDNMixer(n_agents=AGENTS, device="cpu"), action_space="categorical"
    )
    assert loss.mixer_network.in_keys == [("agents", "chosen_action_value")]
    assert loss.local_value_network.in_keys == ["observation"]
