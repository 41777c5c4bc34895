"""ExponentialQuadraticCost: parity with TorchRL's (values and gradients, every reduction, custom
target and weights), keys, bad input."""

from __future__ import annotations

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict

import rlloss


def gaussian_states(batch=(3, 5), size=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mean = torch.randn(*batch, size, generator=generator, requires_grad=True)
    factor = torch.randn(*batch, size, size, generator=generator)
    covariance = (factor @ factor.mT / size + 0.05 * torch.eye(size)).requires_grad_()
    td = TensorDict({("observation", "mean"): mean, ("observation", "var"): covariance}, batch)
    return td, mean, covariance


def custom_target_and_weights(size=4):
    factor = torch.randn(size, size)
    return torch.randn(size), factor @ factor.T / size + 0.1 * torch.eye(size)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("custom", [False, True])
@pytest.mark.parametrize("batch", [(7,), (3, 5)])
def test_matches_torchrl_values_and_gradients(reduction, custom, batch):
    kwargs = {"reduction": reduction}
    if custom:
        kwargs["target"], kwargs["weights"] = custom_target_and_weights()
    ours, theirs = (
        rlloss.ExponentialQuadraticCost(**kwargs),
        torchrl_objectives.ExponentialQuadraticCost(**kwargs),
    )
    td, mean, covariance = gaussian_states(batch)
    out, expected = ours(td), theirs(td)
    assert out.batch_size == expected.batch_size
    torch.testing.assert_close(out["loss_cost"], expected["loss_cost"])
    grads = torch.autograd.grad(out["loss_cost"].sum(), (mean, covariance))
    expected_grads = torch.autograd.grad(expected["loss_cost"].sum(), (mean, covariance))
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)


def test_set_keys_and_tensor_call():
    cost = rlloss.ExponentialQuadraticCost(reduction="none")
    cost.set_keys(loc="m", scale="S", loss_cost="cost")
    td, mean, covariance = gaussian_states((6,))
    renamed = TensorDict({"m": mean, "S": covariance}, [6])
    assert cost(renamed)["cost"].shape == (6,)
    assert cost.in_keys == ["m", "S"] and cost.out_keys == ["cost"]
    torch.testing.assert_close(cost(m=mean, S=covariance), cost(renamed)["cost"])


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="reduction"):
        rlloss.ExponentialQuadraticCost(reduction="max")
    with pytest.raises(ValueError, match="1-D tensor"):
        rlloss.ExponentialQuadraticCost(target=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="square matrix"):
        rlloss.ExponentialQuadraticCost(weights=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="same state size"):
        rlloss.ExponentialQuadraticCost(target=torch.zeros(3), weights=torch.eye(2))
    td, _, _ = gaussian_states((2,), size=4)
    with pytest.raises(ValueError, match="the state has 4 dimensions"):
        rlloss.ExponentialQuadraticCost(target=torch.zeros(3))(td)
    with pytest.raises(KeyError, match="scale"):
        rlloss.ExponentialQuadraticCost()(td.exclude(("observation", "var")))
    with pytest.raises(ValueError, match="covariance must have shape"):
        td.set(("observation", "var"), torch.ones(2, 4, 3))
        rlloss.ExponentialQuadraticCost()(td)


def test_buffers_follow_the_module():
    target, weights = custom_target_and_weights()
    cost = rlloss.ExponentialQuadraticCost(target=target, weights=weights).double()
    assert cost.target.dtype == torch.float64 and "weights" in cost.state_dict()


def test_reads_no_tensor_on_the_host():
    from tests.test_contract import HostReads

    target, weights = custom_target_and_weights()
    cost = rlloss.ExponentialQuadraticCost(target=target, weights=weights)
    td, _, _ = gaussian_states()
    cost(td)
    with HostReads() as reads:
        cost(td)["loss_cost"].backward()
    assert not reads.seen
