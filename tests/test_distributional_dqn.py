"""DistributionalDQNLoss (C51): parity with TorchRL's (values, priorities, gradients), the
target distribution against the paper's algorithm, n-step, prioritized replay, batch shapes,
extreme rewards and refusals."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from torchrl.modules import MLP, DistributionalQValueActor
from torchrl.objectives.utils import ValueEstimators

import rlloss
from tests import test_dqn
from tests.functional.test_q import naive_projection

OBS, ACTIONS, ATOMS, B = 3, 4, 11, 16
SUPPORT = torch.linspace(-2.0, 3.0, ATOMS)


def c51_actor(action_space="one_hot", support=SUPPORT):
    net = MLP(in_features=OBS, out_features=(len(support), ACTIONS), num_cells=[16])
    return DistributionalQValueActor(
        net, in_keys=["observation"], support=support, action_space=action_space
    )


def transitions(action_space="one_hot", batch=(B,), reward_scale=1.0):
    action = torch.randint(0, ACTIONS, batch)
    if action_space == "one_hot":
        action = torch.nn.functional.one_hot(action, ACTIONS)
    terminated = torch.rand(*batch, 1) < 0.3
    return TensorDict(
        {
            "observation": torch.randn(*batch, OBS),
            "action": action,
            "next": {
                "observation": torch.randn(*batch, OBS),
                "reward": reward_scale * torch.randn(*batch, 1),
                "terminated": terminated,
                "done": terminated | (torch.rand(*batch, 1) < 0.2),
            },
        },
        list(batch),
    )


def pair(action_space="one_hot", delay_value=True, **kwargs):
    actor = c51_actor(action_space)
    ours = rlloss.DistributionalDQNLoss(
        copy.deepcopy(actor), gamma=0.9, delay_value=delay_value, **kwargs
    )
    theirs = torchrl_objectives.DistributionalDQNLoss(
        copy.deepcopy(actor), gamma=0.9, delay_value=delay_value
    )
    if delay_value:  # the targets away from the online weights, identically
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            moved = theirs.target_value_network_params.apply(
                lambda x: x + 0.2 * torch.randn_like(x) if x.requires_grad else x
            )
            theirs.target_value_network_params.update_(moved)
            ours.target_value_network_params.update_(moved)
    return ours, theirs


def test_is_no_dqn_loss_as_in_torchrl():
    """TorchRL's DistributionalDQNLoss derives from LossModule, not from DQNLoss: an
    ``isinstance(loss, DQNLoss)`` dispatch treats both libraries' C51 the same."""
    for library in (rlloss, torchrl_objectives):
        assert not issubclass(library.DistributionalDQNLoss, library.DQNLoss)
        assert issubclass(library.DistributionalDQNLoss, library.LossModule)


@pytest.mark.parametrize("action_space", ["one_hot", "categorical"])
@pytest.mark.parametrize("delay_value", [True, False])
@pytest.mark.parametrize("replay", ["plain", "weights", "n-step", "large-rewards"])
def test_matches_torchrl(action_space, delay_value, replay):
    torch.manual_seed(0)
    ours, theirs = pair(action_space, delay_value, priority_weighting="normalized")
    batch = transitions(action_space, reward_scale=10.0 if replay == "large-rewards" else 1.0)
    if replay == "weights":
        batch["priority_weight"] = torch.rand(B)
    if replay == "n-step":
        batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    test_dqn.assert_same_loss_priority_and_gradients(ours, theirs, batch)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_reductions_match_torchrl(reduction):
    torch.manual_seed(1)
    actor = c51_actor("categorical")
    ours = rlloss.DistributionalDQNLoss(copy.deepcopy(actor), gamma=0.9, reduction=reduction)
    theirs = torchrl_objectives.DistributionalDQNLoss(
        copy.deepcopy(actor), gamma=0.9, reduction=reduction
    )
    batch = transitions("categorical")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(ours(batch.clone())["loss"], theirs(batch.clone())["loss"])


def test_loss_is_the_cross_entropy_with_the_projected_double_q_target():
    """The paper's loss written out: a* from the online network's mean returns, the target
    network's probabilities at a* on r + gamma (1 - terminated) z, projected (Algorithm 1)."""
    torch.manual_seed(2)
    loss, _ = pair("categorical", priority_weighting="mean")
    batch = transitions("categorical")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = loss(batch)
    online = loss.value_network
    target = copy.deepcopy(online)
    loss.target_value_network_params.detach().clone().to_module(target)
    expected = []
    with torch.no_grad():
        for i in range(B):
            obs = batch["observation"][i : i + 1]
            next_obs = batch["next", "observation"][i : i + 1]
            online_next = online(TensorDict(observation=next_obs))["action_value"][0].exp()
            best = int((online_next * SUPPORT[:, None]).sum(0).argmax())
            target_next = target(TensorDict(observation=next_obs))["action_value"][0].exp()
            reward = float(batch["next", "reward"][i])
            alive = 0.0 if bool(batch["next", "terminated"][i]) else 1.0
            m = naive_projection(reward + 0.9 * alive * SUPPORT, target_next[:, best], SUPPORT)
            log_p = online(TensorDict(observation=obs))["action_value"][0][:, batch["action"][i]]
            expected.append(-(m * log_p).sum())
    torch.testing.assert_close(out["loss"], torch.stack(expected).mean().detach())


def test_any_batch_shape_gives_the_flat_batch_numbers():
    torch.manual_seed(3)
    loss, _ = pair("one_hot", reduction="none")
    batch = transitions("one_hot", batch=(3, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shaped = loss(batch)["loss"]
        flat = loss(batch.reshape(-1))["loss"]
    assert shaped.shape == (3, 5)
    torch.testing.assert_close(shaped.reshape(-1), flat)


def test_extreme_rewards_stay_finite():
    loss, _ = pair("one_hot")
    batch = transitions("one_hot", reward_scale=1e30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = loss(batch)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and torch.isfinite(batch["td_error"]).all()
    assert all(torch.isfinite(p.grad).all() for p in loss.value_network.parameters())


def test_only_td0_targets():
    loss, _ = pair()
    loss.make_value_estimator(ValueEstimators.TD0, gamma=0.5)
    assert loss.gamma == 0.5
    for estimator in (ValueEstimators.TD1, ValueEstimators.TDLambda, ValueEstimators.GAE):
        with pytest.raises(NotImplementedError, match="TD0"):
            loss.make_value_estimator(estimator)


def test_networks_without_a_usable_support_are_refused():
    with pytest.raises(TypeError, match="support"):
        rlloss.DistributionalDQNLoss(torch.nn.Linear(OBS, ACTIONS))
    with pytest.raises(ValueError, match="evenly spaced"):
        rlloss.DistributionalDQNLoss(c51_actor(support=torch.tensor([0.0, 1.0, 3.0])))
    with pytest.raises(ValueError, match="increasing"):
        rlloss.DistributionalDQNLoss(c51_actor(support=torch.tensor([1.0, 0.0, -1.0])))
    with pytest.raises(ValueError, match="at least 2"):
        rlloss.DistributionalDQNLoss(c51_actor(support=torch.tensor([1.0])))
    with pytest.raises(RuntimeError, match="set_keys"):
        rlloss.DistributionalDQNLoss(c51_actor(), priority_key="p")
