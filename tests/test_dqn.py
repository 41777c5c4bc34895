"""DQNLoss / DDQNLoss: TorchRL parity, targets against a naive loop, n-step, prioritized replay."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import QValueActor
from torchrl.objectives import HardUpdate, SoftUpdate

import rlloss
from rlloss.data import PrioritizedSampler
from tests.nets import perturbed

OBS, ACTIONS, B = 3, 4, 32


def q_actor(action_space="one-hot"):
    net = torch.nn.Sequential(
        torch.nn.Linear(OBS, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACTIONS)
    )
    return QValueActor(net, in_keys=["observation"], action_space=action_space)


def transitions(action_space="one-hot", batch=B):
    action = torch.randint(0, ACTIONS, (batch,))
    if action_space == "one-hot":
        action = torch.nn.functional.one_hot(action, ACTIONS)
    terminated = torch.rand(batch, 1) < 0.3
    return TensorDict(
        {
            "observation": torch.randn(batch, OBS),
            "action": action,
            "next": {
                "observation": torch.randn(batch, OBS),
                "reward": torch.randn(batch, 1),
                "terminated": terminated,
                "done": terminated | (torch.rand(batch, 1) < 0.2),
            },
        },
        [batch],
    )


def shift_targets(loss, seed=5):
    """Move the target parameters away from the online ones, identically for any loss."""
    torch.manual_seed(seed)
    with torch.no_grad():
        params = loss.target_value_network_params.flatten_keys(".")
        for key in sorted(params.keys()):
            params[key].add_(0.2 * torch.randn_like(params[key]))


@pytest.mark.parametrize("action_space", ["one-hot", "categorical"])
@pytest.mark.parametrize("double_dqn", [False, True])
@pytest.mark.parametrize("loss_function", ["l2", "smooth_l1"])
def test_matches_torchrl(action_space, double_dqn, loss_function):
    actor = q_actor(action_space)
    kwargs = dict(double_dqn=double_dqn, loss_function=loss_function, action_space=action_space)
    ours = rlloss.DQNLoss(copy.deepcopy(actor), priority_weighting="normalized", **kwargs)
    theirs = torchrl_objectives.DQNLoss(copy.deepcopy(actor), **kwargs)
    theirs.make_value_estimator(gamma=0.9)
    ours.make_value_estimator(gamma=0.9)
    shift_targets(ours), shift_targets(theirs)
    batch = transitions(action_space)
    batch["priority_weight"] = torch.rand(B)
    assert_same_loss_priority_and_gradients(ours, theirs, batch)


def assert_same_loss_priority_and_gradients(ours, theirs, batch):
    """Both Q losses on copies of ``batch``: the same ``loss``, written ``td_error`` and
    gradients of the value network."""
    mine, reference = batch.clone(), batch.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no target updater: irrelevant here
        out_ours, out_theirs = ours(mine), theirs(reference)
    torch.testing.assert_close(out_ours["loss"], out_theirs["loss"])
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    out_ours["loss"].backward(), out_theirs["loss"].backward()
    theirs_params = theirs.value_network_params.flatten_keys(".")
    for name, parameter in ours.value_network.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs_params[name].grad, msg=name)


def naive_target(loss, batch, gamma, double_dqn):
    """The Q-learning / double Q-learning target, one transition at a time."""
    online = loss.value_network
    target_net = copy.deepcopy(online)
    params = loss.target_value_network_params.flatten_keys(".")
    with torch.no_grad():
        for name, parameter in target_net.named_parameters():
            parameter.copy_(params[name])
        targets = []
        for i in range(batch.shape[0]):
            step = batch[i : i + 1]
            q_target = target_net(step["next"].clone())["action_value"][0]
            if double_dqn:
                chosen = int(online(step["next"].clone())["action_value"][0].argmax())
                bootstrap = q_target[chosen]
            else:
                bootstrap = q_target.max()
            n = int(step.get("steps_to_next_obs", torch.ones(1, 1))[0])
            not_terminated = 0.0 if bool(step["next", "terminated"][0]) else 1.0
            targets.append(step["next", "reward"][0, 0] + gamma**n * not_terminated * bootstrap)
    return torch.stack(targets)


@pytest.mark.parametrize("double_dqn", [False, True])
def test_target_against_naive_loop_with_n_step(double_dqn):
    loss = rlloss.DQNLoss(q_actor(), double_dqn=double_dqn, gamma=0.9, reduction="none")
    shift_targets(loss)
    batch = transitions()
    batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    out = loss(batch)
    q = loss.value_network(batch.clone())["action_value"]
    chosen = (q * batch["action"]).sum(-1)
    expected = naive_target(loss, batch, 0.9, double_dqn)
    torch.testing.assert_close(out["loss"], (chosen - expected) ** 2)
    torch.testing.assert_close(batch["td_error"].squeeze(-1), (chosen - expected).detach() ** 2)


def test_double_dqn_with_identical_networks_is_q_learning():
    actor = q_actor()
    batch = transitions()
    double = rlloss.DQNLoss(copy.deepcopy(actor), double_dqn=True)
    single = rlloss.DQNLoss(copy.deepcopy(actor), double_dqn=False)
    torch.testing.assert_close(double(batch.clone())["loss"], single(batch.clone())["loss"])
    assert rlloss.DDQNLoss(copy.deepcopy(actor)).double_dqn


def test_priority_weights_follow_the_formula():
    batch = transitions()
    weights = torch.rand(B)
    unweighted = rlloss.DQNLoss(q_actor(), reduction="none")
    per_sample = unweighted(batch.clone())["loss"].detach()
    batch["priority_weight"] = weights
    for weighting, expected in (
        ("mean", (weights * per_sample).mean()),
        ("normalized", (weights * per_sample).sum() / weights.sum()),
    ):
        loss = copy.deepcopy(unweighted)
        loss.reduction, loss.priority_weighting = "mean", weighting
        torch.testing.assert_close(loss(batch.clone())["loss"], expected)
    loss = copy.deepcopy(unweighted)
    loss.reduction, loss.use_prioritized_weights = "mean", False
    torch.testing.assert_close(loss(batch.clone())["loss"], per_sample.mean())


def test_priorities_reach_a_prioritized_sampler():
    """The loss's td_error, through update_tensordict_priority, becomes the sampler's priority
    (rlloss.data.PrioritizedSampler: TorchRL's needs its C++ extension, which does not load with
    every torch build)."""
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64),
        sampler=PrioritizedSampler(64, alpha=0.7, beta=1.0),
        batch_size=16,
    )
    buffer.extend(transitions(batch=64))
    loss = rlloss.DQNLoss(q_actor())
    sample = buffer.sample()
    assert "priority_weight" in sample.keys()
    loss(sample)
    buffer.update_tensordict_priority(sample)
    index = sample["index"]
    last = index.unsqueeze(-1) == index  # a repeated index keeps its last priority
    last = torch.arange(16).masked_fill(~last, -1).amax(-1)
    td_error = sample["td_error"].squeeze(-1).double()[last]
    sampler = buffer.sampler
    leaf = index + sampler._trees.shape[-1] // 2
    torch.testing.assert_close(sampler._trees[2, leaf], td_error)  # the raw priorities
    expected = ((td_error + sampler._eps) ** sampler.alpha).float().double()
    torch.testing.assert_close(sampler._trees[0, leaf], expected)  # the sampling masses


@pytest.mark.parametrize("updater", ["soft", "hard"])
def test_torchrl_updaters_and_target_state(updater):
    loss = rlloss.DQNLoss(q_actor())
    update = (
        SoftUpdate(loss, tau=0.5)
        if updater == "soft"
        else HardUpdate(loss, value_network_update_interval=0)
    )
    optimizer = torch.optim.SGD(loss.parameters(), lr=0.5)
    loss(transitions())["loss"].backward()
    optimizer.step()
    update.step()
    online = loss.value_network_params.flatten_keys(".")
    target = loss.target_value_network_params.flatten_keys(".")
    assert all(not t.requires_grad for t in target.values())
    assert {id(p) for p in loss.parameters()} == {id(p) for p in loss.value_network.parameters()}
    assert any(not torch.equal(online[k], target[k]) for k in online.keys()) == (updater == "soft")
    other = rlloss.DQNLoss(q_actor())
    other.load_state_dict(loss.state_dict())
    batch = transitions()
    torch.testing.assert_close(other(batch.clone())["loss"], loss(batch.clone())["loss"])


def test_without_target_network_bootstraps_from_the_online_network():
    loss = rlloss.DQNLoss(q_actor(), delay_value=False, gamma=0.5, reduction="none")
    assert not any(name.startswith("target_") for name, _ in loss.named_children())
    batch = transitions()
    q = loss.value_network(batch.clone())["action_value"].detach()
    next_q = loss.value_network(batch["next"].clone())["action_value"].detach()
    target = (
        batch["next", "reward"]
        + 0.5 * (~batch["next", "terminated"]) * next_q.max(-1, keepdim=True).values
    )
    chosen = (q * batch["action"]).sum(-1, keepdim=True)
    torch.testing.assert_close(loss(batch)["loss"], ((chosen - target) ** 2).squeeze(-1))


def test_bad_arguments():
    with pytest.raises(ValueError, match="double_dqn=True needs delay_value=True"):
        rlloss.DQNLoss(q_actor(), double_dqn=True, delay_value=False)
    with pytest.raises(ValueError, match="loss_function must be one of"):
        rlloss.DQNLoss(q_actor(), loss_function="huber")
    with pytest.raises(ValueError, match="gamma must be in"):
        rlloss.DQNLoss(q_actor(), gamma=1.5)
    with pytest.raises(NotImplementedError, match="use ValueEstimators.TD0, TD1 or TDLambda"):
        from torchrl.objectives.utils import ValueEstimators

        rlloss.DQNLoss(q_actor()).make_value_estimator(ValueEstimators.GAE)
    batch = transitions()
    reference = batch.clone()
    reference["next", "terminated"] = reference["next", "done"].clone()
    del batch["next", "terminated"], batch["next", "done"]
    with pytest.raises(KeyError, match=r"set_keys\(terminated="):  # neither flag: a clear error
        rlloss.DQNLoss(q_actor())(batch.clone())
    # without terminated, done stops bootstrapping (TorchRL's fallback), with a warning
    batch["next", "done"] = reference["next", "done"].clone()
    loss = rlloss.DQNLoss(q_actor())
    with pytest.warns(UserWarning, match="treats truncations as terminations"):
        fallback = loss(batch)["loss"]
    torch.testing.assert_close(fallback, loss(reference)["loss"])


def test_compiles_as_one_graph_without_recompiling():
    torch._dynamo.reset()
    loss = rlloss.DQNLoss(q_actor(), double_dqn=True)
    SoftUpdate(loss, tau=0.1)
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")

    def batch_with_per_and_n_step():
        batch = transitions()
        batch["priority_weight"] = torch.rand(B)
        batch["steps_to_next_obs"] = torch.randint(1, 3, (B, 1))
        return batch

    compiled(batch_with_per_and_n_step())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            batch = batch_with_per_and_n_step()
            mine, reference = batch.clone(), batch.clone()
            torch.testing.assert_close(compiled(mine)["loss"], loss(reference)["loss"])
            torch.testing.assert_close(mine["td_error"], reference["td_error"])
    torch._dynamo.reset()


def test_eager_calls_between_compiled_calls_do_not_recompile():
    """The compiled and the eager forward of one loss share its table of resolved keys: eager
    calls between compiled ones change nothing that the graph's guards read."""
    torch._dynamo.reset()
    loss = rlloss.DQNLoss(q_actor(), double_dqn=True)
    SoftUpdate(loss, tau=0.1)
    compiled = torch.compile(loss, fullgraph=True, backend="eager")
    compiled(transitions())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            batch = transitions()
            torch.testing.assert_close(loss(batch.clone())["loss"], compiled(batch)["loss"])
    torch._dynamo.reset()


def test_keys_assigned_without_set_keys_are_read():
    """``loss.tensor_keys.<name> = key`` (TorchRL's key dataclass, assigned directly) takes effect
    on the next forward, as ``set_keys`` does."""
    loss = rlloss.DQNLoss(q_actor(), delay_value=False)
    batch = transitions()
    expected = loss(batch)["loss"]
    renamed = batch.clone()
    renamed["next", "my_reward"] = renamed["next"].pop("reward")
    loss.tensor_keys.reward = "my_reward"
    torch.testing.assert_close(loss(renamed)["loss"], expected)
    loss.tensor_keys.reward = ("my", "reward")
    renamed["next", "my", "reward"] = renamed["next"].pop("my_reward")
    torch.testing.assert_close(loss(renamed)["loss"], expected)


def test_keys_remapped_after_a_forward_are_read_and_written():
    """Key lookups are memoised per name; remapping a key after a forward takes effect."""
    loss = rlloss.DQNLoss(q_actor(), delay_value=False)
    batch = transitions()
    expected = loss(batch)["loss"]
    renamed = batch.clone()
    renamed["next", "my_reward"] = renamed["next"].pop("reward")
    loss.set_keys(reward="my_reward", priority=("stats", "td_error"))
    torch.testing.assert_close(loss(renamed)["loss"], expected)
    torch.testing.assert_close(renamed["stats", "td_error"], batch["td_error"])
    with pytest.raises(KeyError, match="my_reward"):
        loss(batch)


# ----------------------------------------------------------------------------- discrete CQL
@pytest.mark.parametrize("action_space", ["one-hot", "categorical"])
def test_discrete_cql_matches_torchrl(action_space):
    """Fresh losses (target network equal to the online one, where TorchRL's target is read
    from the online network too): the same losses, diagnostics, td_error and gradients."""
    q = q_actor(action_space)
    ours = rlloss.DiscreteCQLLoss(copy.deepcopy(q), action_space=action_space)
    theirs = torchrl_objectives.DiscreteCQLLoss(copy.deepcopy(q), action_space=action_space)
    batch = transitions(action_space)
    mine, reference = batch.clone(), batch.clone()
    out_ours, out_theirs = ours(mine), theirs(reference)
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    (out_ours["loss_qvalue"] + out_ours["loss_cql"]).backward()
    (out_theirs["loss_qvalue"] + out_theirs["loss_cql"]).backward()
    theirs_params = theirs.value_network_params.flatten_keys(".")
    for key, parameter in ours.value_network.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs_params[key].grad, msg=key)
    # TorchRL's value_loss: the critic's term alone, its diagnostics, td_error written
    mine, reference = batch.clone(), batch.clone()
    (loss, info), (ref_loss, ref_info) = ours.value_loss(mine), theirs.value_loss(reference)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(loss, out_ours["loss_qvalue"])
    assert info.keys() == ref_info.keys()
    for key, value in ref_info.items():
        torch.testing.assert_close(info[key], value, msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])


def test_discrete_cql_bootstraps_from_the_target_network():
    """The paper's target: ``r + gamma (1 - terminated) max_a Q_target(s', a)``, read from the
    target network (TorchRL hands its target weights to ``value_estimate(params=...)``, which
    then reads V(s') from the online network: a kept difference, see the README)."""
    loss = rlloss.DiscreteCQLLoss(q_actor("categorical"), action_space="categorical")
    target = perturbed(loss.value_network, 0.5)
    with torch.no_grad():
        loss.target_value_network_params.update_(TensorDict.from_module(target))
    batch = transitions("categorical")
    out = loss(batch)
    with torch.no_grad():
        next_q = target(batch["next"].clone())["action_value"].max(-1, keepdim=True).values
    expected = batch["next", "reward"] + 0.99 * (~batch["next", "terminated"]) * next_q
    torch.testing.assert_close(out["target_value"], expected.mean())


def test_cql_penalty_and_method():
    action_values = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    chosen = torch.tensor([[3.0], [0.0]])
    expected = torch.tensor([[math.log(math.e + math.e**2 + math.e**3) - 3.0], [math.log(3.0)]])
    torch.testing.assert_close(rlloss.functional.cql_penalty(action_values, chosen), expected)
    loss = rlloss.DiscreteCQLLoss(q_actor("categorical"), action_space="categorical")
    batch = transitions("categorical")
    torch.testing.assert_close(loss.cql_loss(batch)[0], loss(batch)["loss_cql"])
