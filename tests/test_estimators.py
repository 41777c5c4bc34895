"""GAE, TD0Estimator, TDLambdaEstimator modules: parity with TorchRL's estimators."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import value as torchrl_value
from torchrl.objectives.utils import ValueEstimators

import rlloss
from rlloss import functional as rlf
from tests.nets import make_actor, make_critic, rollout

ESTIMATORS = [
    ("GAE", {"gamma": 0.97, "lmbda": 0.9}),
    ("GAE", {"gamma": 0.99, "lmbda": 0.95, "average_gae": True}),
    ("TD0Estimator", {"gamma": 0.9}),
    ("TDLambdaEstimator", {"gamma": 0.95, "lmbda": 0.7}),
]


def sequence_batch(batch_size=(4, 25)):
    batch = rollout(make_actor(), batch_size=batch_size)
    del batch["advantage"], batch["value_target"], batch["state_value"]
    if batch.numel() >= 100:  # both truncations (done, not terminated) and terminations
        assert (batch["next", "done"] & ~batch["next", "terminated"]).any()
        assert batch["next", "terminated"].any()
    return batch


@pytest.mark.parametrize("name, kwargs", ESTIMATORS)
def test_estimator_with_value_network_matches_torchrl(name, kwargs):
    critic = make_critic()
    batch = sequence_batch()
    ours = getattr(rlloss, name)(value_network=critic, **kwargs)(batch.clone())
    theirs = getattr(torchrl_value, name)(value_network=critic, **kwargs)(batch.clone())
    for key in ("advantage", "value_target", "state_value", ("next", "state_value")):
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5, msg=str(key))
    assert not ours["advantage"].requires_grad


def test_gae_without_value_network_reads_values_from_batch():
    batch = sequence_batch()
    batch["state_value"] = torch.randn(4, 25, 1)
    batch["next", "state_value"] = torch.randn(4, 25, 1)
    ours = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=None)(batch.clone())
    theirs = torchrl_value.GAE(gamma=0.9, lmbda=0.8, value_network=None)(batch.clone())
    torch.testing.assert_close(ours["advantage"], theirs["advantage"])
    torch.testing.assert_close(ours["value_target"], theirs["value_target"])


def test_truncation_bootstraps_and_termination_does_not():
    batch = sequence_batch(batch_size=(1, 3))
    batch["state_value"] = torch.zeros(1, 3, 1)
    batch["next", "state_value"] = torch.full((1, 3, 1), 10.0)
    batch["next", "reward"] = torch.zeros(1, 3, 1)
    batch["next", "done"] = torch.tensor([[[True], [True], [False]]])
    batch["next", "terminated"] = torch.tensor([[[True], [False], [False]]])
    out = rlloss.TD0Estimator(gamma=0.5)(batch)
    torch.testing.assert_close(out["value_target"].flatten(), torch.tensor([0.0, 5.0, 5.0]))


def test_n_step_uses_gamma_to_the_n():
    batch = sequence_batch(batch_size=(1, 4))
    batch["state_value"] = torch.zeros(1, 4, 1)
    batch["next", "state_value"] = torch.ones(1, 4, 1)
    batch["next", "terminated"] = torch.zeros(1, 4, 1, dtype=torch.bool)
    batch["steps_to_next_obs"] = torch.tensor([[1, 2, 3, 3]])
    out = rlloss.TD0Estimator(gamma=0.5)(batch)
    expected = batch["next", "reward"].flatten() + torch.tensor([0.5, 0.25, 0.125, 0.125])
    torch.testing.assert_close(out["value_target"].flatten(), expected)


def test_time_dim_other_than_last():
    batch = sequence_batch(batch_size=(25, 4))
    batch["state_value"] = torch.randn(25, 4, 1)
    batch["next", "state_value"] = torch.randn(25, 4, 1)
    out = rlloss.GAE(gamma=0.9, lmbda=0.8)(batch.clone(), time_dim=0)
    transposed = batch.transpose(0, 1)
    reference = rlf.gae_advantage(
        transposed["next", "reward"],
        transposed["state_value"],
        transposed["next", "state_value"],
        transposed["next", "done"],
        transposed["next", "terminated"],
        0.9,
        0.8,
    )
    torch.testing.assert_close(out["advantage"], reference.transpose(0, 1))


def test_missing_terminated_falls_back_to_done_with_a_warning():
    """TorchRL's fallback: without ("next", "terminated"), done stops bootstrapping."""
    batch = sequence_batch()
    reference = batch.clone()
    reference["next", "terminated"] = reference["next", "done"].clone()
    del batch["next", "terminated"]
    gae = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=make_critic())
    with pytest.warns(UserWarning, match="treats truncations as terminations"):
        out = gae(batch)
    expected = gae(reference)
    torch.testing.assert_close(out["advantage"], expected["advantage"])


def test_functional_params_and_value_estimate():
    """``estimator(batch, params=..., target_params=...)`` calls the value network with those
    weights, and ``value_estimate`` returns the value target alone."""
    critic = make_critic()
    other = make_critic()
    params = TensorDict.from_module(other)
    gae = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic)
    batch = sequence_batch()
    with_params = gae(batch.clone(), params=params)
    expected = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=other)(batch.clone())
    torch.testing.assert_close(with_params["advantage"], expected["advantage"])
    target = gae.value_estimate(batch.clone())
    torch.testing.assert_close(target, gae(batch.clone())["value_target"])


@pytest.mark.parametrize("kwargs", [{"gamma": 1.5, "lmbda": 0.9}, {"gamma": 0.9, "lmbda": -0.1}])
def test_bad_hyperparameters(kwargs):
    with pytest.raises(ValueError, match="must be in"):
        rlloss.GAE(value_network=None, **kwargs)


def test_set_keys_remaps_estimator_keys():
    batch = sequence_batch()
    gae = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=make_critic())
    gae.set_keys(advantage="adv", value_target="target")
    out = gae(batch)
    assert "adv" in out.keys() and "target" in out.keys()
    with pytest.raises(ValueError, match="valid names"):
        gae.set_keys(advantages="x")


@pytest.mark.parametrize(
    "value_type, cls, lmbda",
    [
        (ValueEstimators.GAE, rlloss.GAE, 0.95),
        (ValueEstimators.TD0, rlloss.TD0Estimator, None),
        (ValueEstimators.TD1, rlloss.TD1Estimator, 1.0),
        (ValueEstimators.TDLambda, rlloss.TDLambdaEstimator, 0.95),
    ],
)
def test_make_value_estimator_accepts_torchrl_members(value_type, cls, lmbda):
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    loss.make_value_estimator(value_type, gamma=0.9)
    estimator = loss.value_estimator
    assert type(estimator) is cls and estimator.gamma == 0.9
    assert getattr(estimator, "lmbda", None) == lmbda
    assert estimator.value_network is loss.critic_network
    batch = sequence_batch()
    out = loss(batch)  # no advantage in the batch: the estimator provides it
    assert torch.isfinite(out["loss_objective"])


def test_make_value_estimator_rejects_unknown_types_and_keeps_instances():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    with pytest.raises(ValueError, match="unsupported value_type"):
        loss.make_value_estimator("not-an-estimator")
    gae = rlloss.GAE(gamma=0.5, lmbda=0.5, value_network=loss.critic_network)
    loss.make_value_estimator(gae)
    assert loss.value_estimator is gae
    loss.set_keys(advantage="adv")
    assert gae.tensor_keys.advantage == "adv"


def test_vtrace_scores_the_taken_action():
    """VTrace's ratio is pi(a|s) / mu(a|s) of the batch's action, the current policy held out of
    the graph; the targets are functional.vtrace's."""
    actor, critic = make_actor(), make_critic()
    batch = sequence_batch()
    batch["action_log_prob"] = batch["action_log_prob"] + 0.3 * torch.randn_like(
        batch["action_log_prob"]
    )
    out = rlloss.VTrace(gamma=0.9, actor_network=actor, value_network=critic)(batch.clone())
    with torch.no_grad():
        log_pi = actor.get_dist(batch.clone()).log_prob(batch["action"])
        value = critic(batch.clone())["state_value"]
        next_value = critic(batch["next"].clone())["state_value"]
    advantage, target = rlloss.functional.vtrace(
        batch["next", "reward"],
        value,
        next_value,
        batch["next", "done"],
        batch["next", "terminated"],
        (log_pi - batch["action_log_prob"]).unsqueeze(-1),
        0.9,
    )
    torch.testing.assert_close(out["advantage"], advantage)
    torch.testing.assert_close(out["value_target"], target)
    loss = rlloss.ClipPPOLoss(actor, critic)
    loss.make_value_estimator(ValueEstimators.VTrace, gamma=0.9)
    assert isinstance(loss.value_estimator, rlloss.VTrace)
    assert loss.value_estimator.actor_network is actor


def test_multi_agent_gae_broadcasts_team_signals():
    """MultiAgentGAE on per-agent values ``[B, T, n, 1]`` with team rewards ``[B, T, 1]`` is
    GAE on the rewards copied to every agent."""
    batch = sequence_batch()
    agents = 3
    value = torch.randn(*batch.shape, agents, 1)
    next_value = torch.randn(*batch.shape, agents, 1)
    multi = batch.clone()
    multi["state_value"], multi["next", "state_value"] = value, next_value
    out = rlloss.MultiAgentGAE(gamma=0.9, lmbda=0.8)(multi)
    for agent in range(agents):
        single = batch.clone()
        single["state_value"] = value[..., agent, :]
        single["next", "state_value"] = next_value[..., agent, :]
        expected = rlloss.GAE(gamma=0.9, lmbda=0.8)(single)
        torch.testing.assert_close(out["advantage"][..., agent, :], expected["advantage"])


def test_differentiable_estimator_holds_the_value_network_out():
    """GAE(differentiable=True): the advantage has a gradient path to the value network's
    inputs but none to its weights (TorchRL's hold_out_net), and V(s') is detached, so a policy
    loss built on it never trains the critic."""
    critic = make_critic()
    batch = sequence_batch()
    batch["observation"].requires_grad_(True)
    gae = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, differentiable=True)
    advantage = gae(batch)["advantage"]
    assert advantage.requires_grad
    advantage.sum().backward()
    assert all(p.grad is None for p in critic.parameters())
    assert batch["observation"].grad is not None and batch["observation"].grad.abs().sum() > 0
    assert all(p.requires_grad for p in critic.parameters())  # restored after the call


# ----------------------------------------------------------------------------- group_key
def _grouped_batch():
    batch = sequence_batch(batch_size=(6, 10))
    batch["task"] = torch.tensor([3, 0, 3, 9, 0, 3]).unsqueeze(-1).expand(6, 10).contiguous()
    return batch


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("GAE", {"gamma": 0.95, "lmbda": 0.9, "average_gae": True}),
        ("TD0Estimator", {"gamma": 0.9, "average_rewards": True}),
        ("TDLambdaEstimator", {"gamma": 0.9, "lmbda": 0.8, "average_rewards": True}),
    ],
)
def test_group_key_standardises_within_groups_as_torchrl(name, kwargs):
    """TorchRL 0.14.1's ``group_key``: the advantage (GAE) or reward standardisation is done
    within the batch elements sharing an id (e.g. a task), values as TorchRL's."""
    critic, batch = make_critic(), _grouped_batch()
    ours_module = getattr(rlloss, name)(value_network=critic, group_key="task", **kwargs)
    theirs_module = getattr(torchrl_value, name)(value_network=critic, group_key="task", **kwargs)
    ours, theirs = ours_module(batch.clone()), theirs_module(batch.clone())
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5, msg=str(key))
    assert "task" in ours_module.in_keys
    ungrouped = getattr(rlloss, name)(value_network=critic, **kwargs)(batch.clone())
    assert not torch.allclose(ours["advantage"], ungrouped["advantage"])


def test_group_key_missing_from_the_batch_is_named():
    batch = sequence_batch()
    gae = rlloss.GAE(
        gamma=0.9, lmbda=0.9, value_network=make_critic(), average_gae=True, group_key="task"
    )
    with pytest.raises(KeyError, match=r"task"):
        gae(batch)


@pytest.mark.parametrize("group", [False, True], ids=["per-agent", "per-group-and-agent"])
def test_multi_agent_gae_standardises_each_agent_on_its_own_as_torchrl(group):
    """TorchRL 0.14.1: ``MultiAgentGAE(average_gae=True)`` keeps the agent dim independent (a
    high-variance agent is not flattened into the others), within groups with ``group_key``."""
    batch = _grouped_batch()
    agents = 3
    batch["state_value"] = torch.randn(*batch.shape, agents, 1) * torch.tensor(
        [1.0, 10.0, 0.1]
    ).view(3, 1)
    batch["next", "state_value"] = torch.randn(*batch.shape, agents, 1)
    kwargs = {"gamma": 0.9, "lmbda": 0.8, "average_gae": True, "value_network": None}
    if group:
        kwargs["group_key"] = "task"
    ours = rlloss.MultiAgentGAE(**kwargs)(batch.clone())
    theirs = torchrl_value.MultiAgentGAE(**kwargs)(batch.clone())
    torch.testing.assert_close(ours["advantage"], theirs["advantage"], rtol=1e-5, atol=1e-5)
    per_agent_std = ours["advantage"].std(dim=(0, 1, 3))
    if not group:
        torch.testing.assert_close(per_agent_std, torch.ones(agents), rtol=1e-5, atol=1e-5)
