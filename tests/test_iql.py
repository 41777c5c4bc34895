"""IQLLoss: parity with TorchRL's IQLLoss (values and gradients), the expectile and the
advantage weights against the paper, prioritized replay weights."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict.nn import TensorDictModule
from torchrl.modules import MLP, ValueOperator

import rlloss
from rlloss import functional as rlf
from tests import test_sac

B = 16


def value_network():
    return ValueOperator(
        MLP(in_features=test_sac.OBS, out_features=1, num_cells=[16]), ["observation"]
    )


def pair(num=2, **kwargs):
    """rlloss's and TorchRL's IQLLoss on the same networks, their target Q networks moved away
    from the online ones by the same amount."""
    actor, critics, value = (
        test_sac.actor(),
        [test_sac.qvalue() for _ in range(num)],
        value_network(),
    )
    ours = rlloss.IQLLoss(
        copy.deepcopy(actor),
        copy.deepcopy(critics),
        copy.deepcopy(value),
        num_qvalue_nets=num,
        **kwargs,
    )
    theirs = torchrl_objectives.IQLLoss(
        copy.deepcopy(actor),
        copy.deepcopy(critics),
        copy.deepcopy(value),
        num_qvalue_nets=num,
        **kwargs,
    )
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        moved = theirs.target_qvalue_network_params.apply(lambda x: x + 0.1 * torch.randn_like(x))
        theirs.target_qvalue_network_params.update_(moved)
        ours.target_qvalue_network_params.update_(moved)
    return ours, theirs


def assert_same_gradients(ours, theirs):
    for name in ("actor_network", "value_network", "qvalue_network"):
        theirs_params = getattr(theirs, f"{name}_params").flatten_keys(".")
        ours_params = getattr(ours, f"{name}_params").flatten_keys(".")
        for key in theirs_params.keys():
            torch.testing.assert_close(
                ours_params[key].grad, theirs_params[key].grad, msg=f"{name}.{key}"
            )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"expectile": 0.7, "temperature": 3.0, "num": 3},
        {"reduction": "none"},
        {"loss_function": "l2", "reduction": "sum"},
    ],
    ids=["default", "expectile-0.7-3-nets", "none", "l2-sum"],
)
def test_matches_torchrl(kwargs):
    ours, theirs = pair(**kwargs)
    batch = test_sac.transitions(B)
    mine, reference = batch.clone(), batch.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out_ours, out_theirs = ours(mine), theirs(reference)
    assert set(out_ours.keys()) == set(out_theirs.keys())
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    total = sum(out_ours[k].sum() for k in ("loss_actor", "loss_qvalue", "loss_value"))
    total.backward()
    sum(out_theirs[k].sum() for k in ("loss_actor", "loss_qvalue", "loss_value")).backward()
    assert_same_gradients(ours, theirs)


def test_expectile_loss_against_the_paper():
    """``L_tau(u) = |tau - 1(u < 0)| u^2`` (eq. 5): its minimiser over a constant is the
    expectile, here checked by its first-order condition on a small sample."""
    u = torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0])
    torch.testing.assert_close(
        rlf.expectile_loss(u, 0.8), torch.tensor([0.2 * 4, 0.2 * 0.25, 0.0, 0.8, 0.8 * 9])
    )
    target = torch.tensor([0.0, 1.0, 2.0, 10.0])
    v = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.SGD([v], lr=0.05)
    for _ in range(2000):
        optimizer.zero_grad()
        rlf.expectile_loss(target - v, 0.9).mean().backward()
        optimizer.step()
    weights = torch.where(target - v.detach() < 0, 0.1, 0.9)
    assert (weights * (target - v.detach())).sum().abs() < 1e-3  # the expectile's condition
    assert v.item() > target.mean()  # tau > 0.5 leans towards the upper values


def test_advantage_weights_are_capped_and_carry_no_gradient():
    advantage = torch.tensor([-1.0, 0.0, 2.0, 10.0], requires_grad=True)
    weights = rlf.advantage_weights(advantage, 3.0)
    expected = torch.exp(3.0 * advantage.detach()).clamp_max(100.0)
    torch.testing.assert_close(weights, expected)
    assert not weights.requires_grad


def test_prioritized_weights_weight_every_loss():
    """rlloss applies the replay weights to all three losses, as to every off-policy loss
    (TorchRL's IQLLoss ignores them): with equal weights nothing changes, with others the
    weighted means follow."""
    ours, _ = pair(reduction="none")
    batch = test_sac.transitions(B)
    per_sample = ours(batch.clone())
    weighted = rlloss.IQLLoss(
        ours.actor_network, [test_sac.qvalue(), test_sac.qvalue()], ours.value_network
    )
    weighted.load_state_dict(ours.state_dict())
    batch["priority_weight"] = torch.rand(B)
    out = weighted(batch.clone())
    for key in ("loss_actor", "loss_qvalue", "loss_value"):
        expected = (per_sample[key] * batch["priority_weight"]).mean()
        torch.testing.assert_close(out[key], expected, msg=key)


def test_bad_arguments_are_named():
    actor, critic, value = test_sac.actor(), test_sac.qvalue(), value_network()
    for kwargs, message in [
        ({"expectile": 1.5}, "expectile must be in"),
        ({"temperature": -1.0}, "temperature must be in"),
        ({"num_qvalue_nets": 2.5}, "integer"),
        ({"priority_key": "td"}, "set_keys"),
    ]:
        with pytest.raises((ValueError, RuntimeError), match=message):
            rlloss.IQLLoss(actor, critic, value, **kwargs)


def discrete_qvalue():
    return TensorDictModule(
        MLP(in_features=test_sac.OBS, out_features=test_sac.NUM_ACTIONS, num_cells=[16]),
        ["observation"],
        ["state_action_value"],
    )


@pytest.mark.parametrize("one_hot", [True, False], ids=["one-hot", "index"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_discrete_matches_torchrl(one_hot, reduction):
    actor, critics, value = (
        test_sac.discrete_actor(one_hot),
        [discrete_qvalue(), discrete_qvalue()],
        value_network(),
    )
    space = "one-hot" if one_hot else "categorical"
    kwargs = {"action_space": space, "reduction": reduction, "expectile": 0.8}
    ours = rlloss.DiscreteIQLLoss(
        copy.deepcopy(actor), copy.deepcopy(critics), copy.deepcopy(value), **kwargs
    )
    theirs = torchrl_objectives.DiscreteIQLLoss(
        copy.deepcopy(actor), copy.deepcopy(critics), copy.deepcopy(value), **kwargs
    )
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        moved = theirs.target_qvalue_network_params.apply(lambda x: x + 0.1 * torch.randn_like(x))
        theirs.target_qvalue_network_params.update_(moved)
        ours.target_qvalue_network_params.update_(moved)
    batch = test_sac.discrete_transitions(one_hot, B)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    sum(out_ours[k].sum() for k in ("loss_actor", "loss_qvalue", "loss_value")).backward()
    sum(out_theirs[k].sum() for k in ("loss_actor", "loss_qvalue", "loss_value")).backward()
    assert_same_gradients(ours, theirs)
