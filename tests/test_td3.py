"""TD3Loss: TorchRL parity, clipped double-Q target with smoothing against a naive loop,
separate actor / critic losses, ensembles, n-step, prioritized replay, updaters, compile."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from torchrl.data import Bounded
from torchrl.modules import MLP, Actor, ValueOperator
from torchrl.objectives import SoftUpdate

import rlloss

OBS, ACT, B = 5, 2, 16


def actor():
    net = torch.nn.Sequential(
        MLP(in_features=OBS, out_features=ACT, num_cells=[16]), torch.nn.Tanh()
    )
    return Actor(net, in_keys=["observation"])


def qvalue():
    return ValueOperator(
        MLP(in_features=OBS + ACT, out_features=1, num_cells=[16]),
        in_keys=["observation", "action"],
    )


def transitions(batch=B):
    terminated = torch.rand(batch, 1) < 0.3
    return TensorDict(
        {
            "observation": torch.randn(batch, OBS),
            "action": torch.rand(batch, ACT) * 2 - 1,
            "next": {
                "observation": torch.randn(batch, OBS),
                "reward": torch.randn(batch, 1),
                "terminated": terminated,
                "done": terminated | (torch.rand(batch, 1) < 0.2),
            },
        },
        [batch],
    )


def shift_targets(loss, seed=3):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name in ("target_actor_network_params", "target_qvalue_network_params"):
            params = getattr(loss, name).flatten_keys(".")
            for key in sorted(params.keys()):
                params[key].add_(0.1 * torch.randn_like(params[key]))


def pair(name="TD3Loss", **kwargs):
    policy, critics = actor(), [qvalue() for _ in range(kwargs.pop("num", 2))]
    kwargs = {"bounds": (-1.0, 1.0), **kwargs}
    ours = getattr(rlloss, name)(
        copy.deepcopy(policy),
        copy.deepcopy(critics),
        priority_weighting="normalized",
        num_qvalue_nets=len(critics),
        **kwargs,
    )
    theirs = getattr(torchrl_objectives, name)(
        copy.deepcopy(policy), copy.deepcopy(critics), num_qvalue_nets=len(critics), **kwargs
    )
    theirs.make_value_estimator(gamma=0.99)
    shift_targets(ours), shift_targets(theirs)
    return ours, theirs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy_noise": 0.0},
        {"policy_noise": 0.3, "noise_clip": 0.2, "num": 3},
        {"loss_function": "l2", "policy_noise": 0.0},
    ],
)
def test_matches_torchrl(kwargs, name="TD3Loss"):
    ours, theirs = pair(name, **kwargs)
    batch = transitions()
    batch["priority_weight"] = torch.rand(B)
    mine, reference = batch.clone(), batch.clone()
    torch.manual_seed(0)
    out_ours = ours(mine)
    torch.manual_seed(0)
    out_theirs = theirs(reference)
    for key in out_theirs.keys():
        theirs_value = out_theirs[key]
        if key == "state_action_value_actor" and name == "TD3Loss":  # Q_1 only (docstring)
            assert out_ours[key].shape == (1, B)
            theirs_value = theirs_value[:1]
        torch.testing.assert_close(out_ours[key], theirs_value, msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    (out_ours["loss_actor"] + out_ours["loss_qvalue"]).backward()
    (out_theirs["loss_actor"] + out_theirs["loss_qvalue"]).backward()
    theirs_q = theirs.qvalue_network_params.flatten_keys(".")
    for key, parameter in ours.qvalue_network_params.flatten_keys(".").items():
        torch.testing.assert_close(parameter.grad, theirs_q[key].grad, msg=key)
    theirs_actor = theirs.actor_network_params.flatten_keys(".")
    for key, parameter in ours.actor_network.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs_actor[key].grad, msg=key)


def test_target_against_naive_loop_with_smoothing_and_n_step():
    loss = rlloss.TD3Loss(
        actor(),
        [qvalue() for _ in range(3)],
        num_qvalue_nets=3,
        bounds=(-0.5, 0.5),
        policy_noise=0.4,
        noise_clip=0.3,
        gamma=0.9,
        reduction="none",
    )
    shift_targets(loss)
    batch = transitions()
    batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    torch.manual_seed(7)
    out = loss(batch.clone())
    torch.manual_seed(7)
    noise = (torch.randn(B, ACT) * 0.4).clamp(-0.3, 0.3)
    target_actor = copy.deepcopy(loss.actor_network)
    for name, parameter in target_actor.named_parameters():
        parameter.data.copy_(loss.target_actor_network_params.flatten_keys(".")[name])
    critics = []
    for i in range(3):
        critic = qvalue()
        for name, parameter in critic.named_parameters():
            parameter.data.copy_(loss.target_qvalue_network_params.flatten_keys(".")[name][i])
        critics.append(critic)
    for b in range(B):
        with torch.no_grad():
            step = batch[b : b + 1].clone()
            next_action = (target_actor(step["next"].clone())["action"] + noise[b]).clamp(-0.5, 0.5)
            next_step = step["next"].clone().set("action", next_action)
            bootstrap = min(float(c(next_step.clone())["state_action_value"]) for c in critics)
            n = int(step["steps_to_next_obs"])
            alive = 0.0 if bool(step["next", "terminated"]) else 1.0
            expected = float(step["next", "reward"]) + 0.9**n * alive * bootstrap
        assert float(out["target_value"][b]) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_actor_and_critic_losses_are_separate():
    loss = rlloss.TD3Loss(actor(), qvalue(), bounds=(-1.0, 1.0))
    batch = transitions()
    actor_loss, _ = loss.loss_actor(batch)
    actor_loss.backward()
    assert all(p.grad is None for p in loss.qvalue_network_params.values(True, True))
    assert all(p.grad is not None for p in loss.actor_network.parameters())
    loss.zero_grad(set_to_none=True)
    critic_loss, info = loss.loss_qvalue(batch)
    critic_loss.backward()
    assert all(p.grad is None for p in loss.actor_network.parameters())
    assert info["pred_value"].shape == (2, B)


def test_torchrl_method_names_give_torchrl_values():
    """TorchRL's ``actor_loss`` / ``value_loss`` names reach the same halves, with its numbers."""
    ours, theirs = pair(policy_noise=0.0)
    batch = transitions()
    for name in ("actor_loss", "value_loss"):
        assert callable(getattr(torchrl_objectives.TD3Loss, name))
        torch.testing.assert_close(
            getattr(ours, name)(batch.clone())[0], getattr(theirs, name)(batch.clone())[0]
        )


def test_single_module_ensemble_members_differ_and_lists_keep_weights():
    critic = qvalue()
    loss = rlloss.TD3Loss(actor(), critic, num_qvalue_nets=2, bounds=(-1.0, 1.0))
    weights = loss.qvalue_network_params.flatten_keys(".")["module.0.weight"]
    torch.testing.assert_close(weights[0], critic.module[0].weight.detach())
    assert not torch.equal(weights[0], weights[1])
    # member 1 is a fresh draw of nn.Linear's own initialisation, U(+-1/sqrt(fan_in)) (TorchRL
    # redraws every member uniformly between each tensor's min and max: docs/differences.md)
    bound = critic.module[0].in_features ** -0.5
    assert weights[1].abs().max() <= bound and weights[1].std() > bound / 3
    critics = [qvalue(), qvalue(), qvalue()]
    loss = rlloss.TD3Loss(actor(), critics, num_qvalue_nets=3, bounds=(-1.0, 1.0))
    stacked = loss.qvalue_network_params.flatten_keys(".")["module.0.weight"]
    for i, c in enumerate(critics):
        torch.testing.assert_close(stacked[i], c.module[0].weight.detach())
    with pytest.raises(ValueError, match="num_qvalue_nets=2"):
        rlloss.TD3Loss(actor(), critics, num_qvalue_nets=2, bounds=(-1.0, 1.0))


def test_bounds_from_action_spec_and_errors():
    spec = Bounded(-2.0, 2.0, shape=(ACT,))
    loss = rlloss.TD3Loss(actor(), qvalue(), action_spec=spec)
    assert float(loss.max_action.max()) == 2.0
    with pytest.raises(ValueError, match="but not both"):
        rlloss.TD3Loss(actor(), qvalue())
    with pytest.raises(ValueError, match="low > high"):
        rlloss.TD3Loss(actor(), qvalue(), bounds=(1.0, -1.0))
    assert rlloss.TD3Loss(
        actor(), qvalue(), bounds=(-1.0, 1.0), separate_losses=True
    ).separate_losses


def test_updaters_targets_and_state_dict():
    loss = rlloss.TD3Loss(actor(), qvalue(), bounds=(-1.0, 1.0))
    updater = SoftUpdate(loss, tau=0.5)
    parameters = list(loss.parameters())
    targets = list(loss.target_qvalue_network_params.values(True, True))
    targets += list(loss.target_actor_network_params.values(True, True))
    assert not {id(t) for t in targets} & {id(p) for p in parameters}
    optimizer = torch.optim.SGD(parameters, lr=0.5)
    out = loss(transitions())
    (out["loss_actor"] + out["loss_qvalue"]).backward()
    optimizer.step()
    before = loss.target_qvalue_network_params.clone()
    updater.step()
    online = loss.qvalue_network_params
    for key, value in loss.target_qvalue_network_params.items(True, True):
        torch.testing.assert_close(value, 0.5 * before[key] + 0.5 * online[key].detach())
    other = rlloss.TD3Loss(actor(), qvalue(), bounds=(-1.0, 1.0))
    other.load_state_dict(loss.state_dict())
    batch = transitions()
    torch.manual_seed(0)
    expected = loss(batch.clone())
    torch.manual_seed(0)
    torch.testing.assert_close(other(batch.clone())["loss_qvalue"], expected["loss_qvalue"])


def test_rllosss_soft_update_gives_torchrls_targets():
    """The MuJoCo tutorials train with each library's own ``SoftUpdate`` (the trajectory tests
    use TorchRL's for both): rlloss's moves every target (the actor's, each critic's) as
    TorchRL's does, over several steps with the online weights changing between them."""
    loss = rlloss.TD3Loss(actor(), qvalue(), bounds=(-1.0, 1.0))
    twin = copy.deepcopy(loss)
    ours, theirs = rlloss.SoftUpdate(loss, tau=0.005), SoftUpdate(twin, tau=0.005)
    shift_targets(loss)
    shift_targets(twin)  # the same shifts (seeded)
    names = ("target_actor_network_params", "target_qvalue_network_params")
    start = {name: getattr(loss, name).clone() for name in names}
    for step in range(3):
        torch.manual_seed(step)
        with torch.no_grad():
            for a, b in zip(loss.parameters(), twin.parameters(), strict=True):
                a.add_(torch.randn_like(a))
                b.copy_(a)
        ours.step()
        theirs.step()
    for name in names:
        mine, reference = getattr(loss, name), getattr(twin, name)
        for key, value in mine.items(True, True):
            assert not torch.equal(value, start[name][key]), (name, key)  # it moved
            torch.testing.assert_close(value, reference[key], rtol=0, atol=0, msg=str(key))


def test_compiles_as_one_graph_without_recompiling():
    torch._dynamo.reset()
    loss = rlloss.TD3Loss(actor(), qvalue(), bounds=(-1.0, 1.0), policy_noise=0.0)
    SoftUpdate(loss, tau=0.1)
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")

    def batch_with_per():
        batch = transitions()
        batch["priority_weight"] = torch.rand(B)
        return batch

    compiled(batch_with_per())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            batch = batch_with_per()
            mine, reference = batch.clone(), batch.clone()
            out, expected = compiled(mine), loss(reference)
            for key in ("loss_actor", "loss_qvalue"):
                torch.testing.assert_close(out[key], expected[key])
            torch.testing.assert_close(mine["td_error"], reference["td_error"])
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "kwargs",
    [{"policy_noise": 0.0}, {"alpha": 0.5, "num": 3}, {"loss_function": "l2", "reduction": "sum"}],
)
def test_td3_bc_matches_torchrl(kwargs):
    test_matches_torchrl(kwargs, name="TD3BCLoss")


def test_td3_bc_split_losses_under_torchrl_names_match_torchrl():
    """A loop that steps the critic and the actor apart calls TorchRL's TD3BCLoss.qvalue_loss and
    actor_loss: the same names give the same numbers here."""
    ours, theirs = pair("TD3BCLoss", policy_noise=0.0)
    batch = transitions()
    for method in ("qvalue_loss", "actor_loss"):
        torch.manual_seed(0)
        value, _ = getattr(ours, method)(batch.clone())
        torch.manual_seed(0)
        expected, _ = getattr(theirs, method)(batch.clone())
        torch.testing.assert_close(value, expected, msg=method)


def test_td3_bc_actor_loss_against_the_paper():
    """Fujimoto & Gu's eq. 3 written out: lambda = alpha / mean|Q|, plus the mean squared error
    to the dataset's actions; lambda carries no gradient."""
    value = torch.tensor([[2.0], [-4.0]], requires_grad=True)
    action = torch.tensor([[0.5, -0.5], [0.0, 1.0]], requires_grad=True)
    data = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    loss, bc, lmbd = rlloss.functional.td3_bc_actor_loss(value, action, data, 2.5)
    assert lmbd.item() == pytest.approx(2.5 / 3.0)
    assert bc.item() == pytest.approx((0.25 + 0.25 + 0.0 + 1.0) / 4)
    torch.testing.assert_close(loss, -lmbd * value.detach() + bc.detach())
    loss.sum().backward()
    torch.testing.assert_close(value.grad, torch.full((2, 1), -2.5 / 3.0))
    torch.testing.assert_close(action.grad, 2 * 2 * (action.detach() - data) / 4)


def test_td3_bc_refuses_a_bad_alpha():
    with pytest.raises(ValueError, match="alpha must be in"):
        rlloss.TD3BCLoss(actor(), qvalue(), bounds=(-1.0, 1.0), alpha=0.0)
    loss = rlloss.TD3BCLoss(actor(), qvalue(), bounds=(-1.0, 1.0))
    with pytest.raises(ValueError, match="alpha must be in"):
        loss.alpha = -1.0
