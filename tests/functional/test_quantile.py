"""Quantile critics (QR-DQN's quantile Huber loss, TQC's truncated mixture) against loops
written from the papers, plus identities and gradient stops."""

from __future__ import annotations

import pytest
import torch

from rlloss.functional import (
    quantile_huber_loss,
    quantile_midpoints,
    quantile_td_error,
    truncated_mixture_atoms,
)
from tests import reference

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}


def rows(tensor):
    return tensor.detach().double().reshape(-1, tensor.shape[-1]).tolist()


def test_midpoints_are_the_centres_of_m_equal_bins():
    torch.testing.assert_close(
        quantile_midpoints(4, torch.float64), torch.tensor([1, 3, 5, 7], dtype=torch.float64) / 8
    )
    torch.testing.assert_close(quantile_midpoints(1), torch.tensor([0.5]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(1,), (6,), (2, 3)])
@pytest.mark.parametrize("num_quantiles, num_targets", [(1, 1), (5, 7), (8, 3)])
@pytest.mark.parametrize("kappa", [1.0, 0.3, 4.0])
def test_quantile_huber_loss_matches_the_paper(dtype, batch, num_quantiles, num_targets, kappa):
    generator = torch.Generator().manual_seed(num_quantiles * 10 + num_targets)
    quantiles = 2 * torch.randn(*batch, num_quantiles, generator=generator, dtype=dtype)
    targets = 2 * torch.randn(*batch, num_targets, generator=generator, dtype=dtype)
    got = quantile_huber_loss(quantiles, targets, kappa)
    expected = [
        reference.quantile_huber_loss(q, y, kappa)
        for q, y in zip(rows(quantiles), rows(targets), strict=True)
    ]
    assert got.shape == batch and got.dtype == dtype
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=dtype).reshape(batch), **TOLERANCE[dtype]
    )
    td = quantile_td_error(quantiles, targets)
    expected_td = [
        reference.mean_absolute_pairwise_error(q, y)
        for q, y in zip(rows(quantiles), rows(targets), strict=True)
    ]
    torch.testing.assert_close(
        td, torch.tensor(expected_td, dtype=dtype).reshape(batch), **TOLERANCE[dtype]
    )


def test_small_kappa_gives_the_pinball_loss():
    """``kappa -> 0``: ``rho_tau(u) -> |tau - 1(u < 0)| |u|``, quantile regression's loss
    (Koenker & Bassett, 1978), whose minimiser over a single atom is the tau-quantile."""
    quantiles, targets = (
        torch.randn(4, 3, dtype=torch.float64),
        torch.randn(4, 9, dtype=torch.float64),
    )
    tau = quantile_midpoints(3, torch.float64).view(3, 1)
    u = targets.unsqueeze(-2) - quantiles.unsqueeze(-1)
    pinball = ((tau - (u < 0).double()).abs() * u.abs()).mean((-2, -1))
    torch.testing.assert_close(quantile_huber_loss(quantiles, targets, 1e-9), pinball)


def test_minimiser_of_one_atom_is_the_target_quantile():
    """One atom (tau = 1/2) against 101 target atoms: gradient descent on the loss drives it to
    their median (the 1/2-quantile)."""
    targets = torch.linspace(-3, 7, 101, dtype=torch.float64) ** 3
    atom = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.SGD([atom], lr=50.0)
    for _ in range(3000):
        optimiser.zero_grad()
        quantile_huber_loss(atom, targets, kappa=1e-3).backward()
        optimiser.step()
    assert abs(atom.item() - targets.median().item()) < 0.2


def test_targets_and_indicator_get_no_gradient():
    quantiles = torch.randn(5, 4, requires_grad=True)
    targets = torch.randn(5, 6, requires_grad=True)
    quantile_huber_loss(quantiles, targets).sum().backward()
    assert targets.grad is None and quantiles.grad is not None
    # the gradient is that of the reference's per-pair cost with a fixed indicator
    u = targets.detach().unsqueeze(-2) - quantiles.detach().unsqueeze(-1)
    tau = quantile_midpoints(4).view(4, 1)
    weight = (tau - (u < 0).float()).abs()
    expected = -(weight * u.clamp(-1, 1)).mean(-1) / 4  # 1/(MK) sum_k
    torch.testing.assert_close(quantiles.grad, expected)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(2, 4\)"):
        quantile_huber_loss(torch.randn(3, 4), torch.randn(2, 4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("critics, atoms, dropped", [(1, 1, 0), (2, 5, 1), (5, 25, 2), (3, 4, 3)])
def test_truncated_mixture_matches_the_paper(dtype, critics, atoms, dropped):
    quantiles = torch.randn(critics, 2, 3, atoms, dtype=dtype)
    got = truncated_mixture_atoms(quantiles, dropped * critics)
    assert got.shape == (2, 3, critics * atoms - dropped * critics)
    per_sample = quantiles.movedim(0, -2).reshape(6, critics, atoms).tolist()
    expected = [reference.truncated_mixture(sample, dropped) for sample in per_sample]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype).reshape(got.shape))


def test_truncated_mixture_with_nothing_dropped_is_the_sorted_mixture():
    quantiles = torch.randn(3, 7, 4)
    pooled = torch.cat(list(quantiles), -1)
    torch.testing.assert_close(truncated_mixture_atoms(quantiles, 0), pooled.sort(-1).values)


@pytest.mark.parametrize("dropped", [-1, 8])
def test_truncated_mixture_refuses_to_drop_everything(dropped):
    with pytest.raises(ValueError, match="smaller"):
        truncated_mixture_atoms(torch.randn(2, 5, 4), dropped)
