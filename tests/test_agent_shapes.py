"""The agent-dim shape table of the off-policy losses multi-agent pipelines use (SAC, discrete
SAC, DDPG, TD3, DQN), on TorchRL's ``MultiAgentMLP`` networks with per-agent values
``[B, n_agents, 1]`` (issue 35, deliverable 3).

Each of ``reward`` / ``done`` / ``terminated`` is given in the shapes a multi-agent user sends:
per group ``[B, 1]`` (the team's), per agent ``[B, n, 1]``, ``[B, 1, 1]``, ``[B, n]`` (no
trailing dim), ``[B]``, another agent count ``[B, m, 1]``. A shape is either broadcast, and then
the loss equals the loss on the same signals expanded by hand to ``[B, n, 1]``, or refused with
a ``ValueError`` naming the entry, its shape, the expected shapes and the fix. The rule is one
function, ``rlloss._agent_dims.broadcast_to_agents``, shared with ``MultiAgentGAE``
(``tests/test_mappo.py`` has its table).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import OneHotCategorical, ProbabilisticActor
from torchrl.objectives.utils import ValueEstimators

import rlloss
from rlloss._agent_dims import broadcast_to_agents
from tests import test_multiagent_networks as nets

N, B, OBS, ACTIONS = nets.N, nets.B, nets.OBS, nets.ACTIONS
ENTRIES = ("reward", "done", "terminated")

# shape given -> broadcast (the by-hand expansion to [B, n, 1] is the reference)
BROADCAST = {"team [B,1]": (B, 1), "per-agent [B,n,1]": (B, N, 1), "shared [B,1,1]": (B, 1, 1)}
# shape given -> a piece of the fix the error must state
REFUSED = {
    "per-agent [B,n]": ((B, N), ".unsqueeze(-1)"),
    "team [B]": ((B,), ".unsqueeze(-1)"),
    "other agent count [B,m,1]": ((B, N + 2, 1), f"It holds {N + 2} agents, the values {N}"),
    "time dim too many [B,2,n,1]": ((B, 2, N, 1), f"Reshape it to {(B, N, 1)}"),
}


def discrete_sac():
    logits = TensorDictModule(
        nets.mlp(OBS, ACTIONS, share=True), [("agents", "observation")], [("agents", "logits")]
    )
    actor = ProbabilisticActor(
        logits,
        in_keys={"logits": ("agents", "logits")},
        out_keys=[("agents", "action")],
        distribution_class=OneHotCategorical,
    )
    qvalue = TensorDictModule(
        nets.mlp(OBS, ACTIONS), [("agents", "observation")], [("agents", "action_value")]
    )
    loss = rlloss.DiscreteSACLoss(actor, qvalue, num_actions=ACTIONS, action_space="one-hot")
    loss.set_keys(
        action=("agents", "action"), action_value=("agents", "action_value"), **nets.AGENT_KEYS
    )
    batch = nets.transitions(discrete=True)
    batch["agents", "action"] = torch.nn.functional.one_hot(batch["agents", "action"], ACTIONS)
    return loss, batch


LOSSES = {
    "SACLoss": nets.sac,
    "DiscreteSACLoss": discrete_sac,
    "DDPGLoss": nets.ddpg,
    "TD3Loss": nets.td3,
    "DQNLoss": nets.dqn,
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def with_signals(name: str, signals: dict[str, torch.Tensor]):
    """The loss ``name`` and a batch whose reward and flags are ``signals``, at the root of
    ``"next"`` (where any shape can be stored)."""
    torch.manual_seed(0)
    loss, batch = LOSSES[name]()
    loss.set_keys(reward="reward", done="done", terminated="terminated")
    for key, value in signals.items():
        batch["next", key] = value
    return loss, batch


def signals(entry: str, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Per-agent ``[B, n, 1]`` signals, with ``entry`` of ``shape`` (random values)."""
    gen = torch.Generator().manual_seed(3)
    out = {
        "reward": torch.randn(B, N, 1, generator=gen),
        "done": torch.rand(B, N, 1, generator=gen) < 0.3,
        "terminated": torch.rand(B, N, 1, generator=gen) < 0.3,
    }
    value = torch.randn(shape, generator=gen)
    out[entry] = value if entry == "reward" else value > 0
    return out


def expanded_by_hand(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.shape == (B, 1):
        tensor = tensor.unsqueeze(1)
    return tensor.expand(B, N, 1).clone()


def seeded_outputs(loss, batch):
    torch.manual_seed(1)
    return loss(batch)


@pytest.mark.parametrize("shape", sorted(BROADCAST))
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_broadcast_signals_give_the_loss_of_the_signals_expanded_by_hand(name, entry, shape):
    given = signals(entry, BROADCAST[shape])
    by_hand = {**given, entry: expanded_by_hand(given[entry])}
    got = seeded_outputs(*with_signals(name, given))
    expected = seeded_outputs(*with_signals(name, by_hand))
    assert set(got.keys()) == set(expected.keys())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], msg=f"{name} {key}")


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_team_reward_is_the_reward_of_every_agent(name):
    """Not only equal to the expansion: a team reward changes the loss as each agent's would."""
    team = signals("reward", (B, 1))
    other = {**team, "reward": team["reward"] + 1.0}
    first = seeded_outputs(*with_signals(name, team))
    second = seeded_outputs(*with_signals(name, other))
    critic = [k for k in first.keys() if k.startswith("loss") and k != "loss_actor"][0]
    assert not torch.equal(first[critic], second[critic])


@pytest.mark.parametrize("shape", sorted(REFUSED))
@pytest.mark.parametrize("entry", ("reward", "terminated"))
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_ambiguous_signals_are_refused_with_entry_shapes_and_fix(name, entry, shape):
    given_shape, fix = REFUSED[shape]
    loss, batch = with_signals(name, signals(entry, given_shape))
    with pytest.raises(ValueError) as error:
        loss(batch)
    message = str(error.value)
    for piece in (
        name,
        f"{entry} (entry ('next', '{entry}'))",
        f"of shape {given_shape}",
        f"{(B, N, 1)} (per agent)",
        f"{(B, 1)} (team-shared",
        fix,
    ):
        assert piece in message, (piece, message)


def test_done_is_not_read_by_one_step_targets():
    """``done`` enters no one-step target (``terminated`` stops bootstrapping), as in TorchRL:
    any shape of it gives the same loss; a TD(lambda) target reads it through the same rule."""
    loss, batch = with_signals("DDPGLoss", signals("done", (B, N + 2, 1)))
    reference = seeded_outputs(*with_signals("DDPGLoss", signals("done", (B, N, 1))))
    torch.testing.assert_close(seeded_outputs(loss, batch)["loss_value"], reference["loss_value"])


@pytest.mark.parametrize("agent_dim", (-2, 1))
def test_the_rule_on_its_own(agent_dim):
    values = torch.Size((B, N, 1))
    team = torch.randn(B, 1)
    out = broadcast_to_agents(team, values, agent_dim)
    assert out.shape == values and torch.equal(out, team.unsqueeze(1).expand(values))
    assert broadcast_to_agents(torch.ones(B, 1, 1), values, agent_dim).shape == values
    with pytest.raises(ValueError, match=r"got reward of shape \(8, 3\)\. Add the trailing"):
        broadcast_to_agents(torch.ones(B, N), values, agent_dim)


def test_n_step_discounts_reach_every_agent():
    """``steps_to_next_obs`` (one per transition, ``[B]``) with per-agent values: ``gamma^2``
    for two-step transitions, the loss of ``gamma ** 2`` without the entry."""
    given = signals("reward", (B, 1))
    loss, batch = with_signals("DDPGLoss", given)
    batch["steps_to_next_obs"] = torch.full((B,), 2)
    reference, plain = with_signals("DDPGLoss", given)
    reference.gamma = loss.gamma**2
    got = seeded_outputs(loss, batch)["loss_value"]
    torch.testing.assert_close(got, seeded_outputs(reference, plain)["loss_value"])


def rollout_with_agents(team: bool, batch=(4, 5)):
    """A ``[B, T]`` multi-agent rollout for DDPG; reward and flags per team ``[B, T, 1]`` or
    the same values per agent ``[B, T, n, 1]``."""
    gen = torch.Generator().manual_seed(0)
    shape = (*batch, N)

    def agents(**extra):
        observation = torch.randn(*shape, OBS, generator=gen)
        return TensorDict({"observation": observation, **extra}, shape)

    signals = {
        "reward": torch.randn(*batch, 1, generator=gen),
        "done": torch.rand(*batch, 1, generator=gen) < 0.2,
    }
    signals["terminated"] = signals["done"] & (torch.rand(*batch, 1, generator=gen) < 0.5)
    if not team:
        signals = {k: v.unsqueeze(2).expand(*shape, 1).clone() for k, v in signals.items()}
    action = torch.rand(*shape, nets.ACT, generator=gen) * 2 - 1
    next_ = TensorDict({"agents": agents(), **signals}, batch)
    return TensorDict({"agents": agents(action=action), "next": next_}, batch)


@pytest.mark.parametrize("team", (False, True), ids=("per-agent", "team"))
def test_td_lambda_targets_run_over_time_not_over_the_agents(team):
    """A TD(lambda) target on ``[B, T]`` per-agent values ``[B, T, n, 1]``: the recursion runs
    over T (TorchRL's values), not over the agent dim; team signals give the same."""
    torch.manual_seed(0)
    actor, qvalue = nets.deterministic_actor(), nets.qvalue()
    losses = []
    for lib in (rlloss, torchrl.objectives):
        loss = lib.DDPGLoss(copy.deepcopy(actor), copy.deepcopy(qvalue))
        keys = {"reward": "reward", "done": "done", "terminated": "terminated"}
        loss.set_keys(state_action_value=("agents", "state_action_value"), **keys)
        loss.make_value_estimator(ValueEstimators.TDLambda, lmbda=0.9, gamma=0.99)
        losses.append(loss)
    ours = losses[0](rollout_with_agents(team))["loss_value"]
    theirs = losses[1](rollout_with_agents(team=False))["loss_value"]  # TorchRL: per agent only
    torch.testing.assert_close(ours, theirs)
