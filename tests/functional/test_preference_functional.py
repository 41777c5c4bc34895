"""rlloss.functional.preference against the naive references written from the papers
(:mod:`tests.reference_preference`): DPO and conservative DPO, robust DPO, hinge, IPO, SimPO
and KTO, plus identities, gradient stops and extreme margins."""

from __future__ import annotations

import pytest
import torch

from rlloss.functional import sequence_log_likelihood
from rlloss.functional.preference import (
    dpo_hinge_loss,
    dpo_log_ratio_margin,
    dpo_sigmoid_loss,
    ipo_loss,
    kto_loss,
    kto_reference_point,
    robust_dpo_loss,
    simpo_loss,
)
from tests import reference
from tests import reference_preference as ref

BETAS = [0.05, 0.1, 1.0, 2.5]
SMOOTHING = [0.0, 0.1, 0.3]


def pairs(n=7, seed=0, dtype=torch.float64):
    """Summed log-probs of chosen and rejected responses under the policy and the reference."""
    g = torch.Generator().manual_seed(seed)
    values = -torch.rand(4, n, generator=g, dtype=dtype) * 20
    return values.unbind(0)


def token_pairs(shape=(5, 9), seed=1, dtype=torch.float64):
    """Token log-probs of chosen and rejected responses ``[B, T]`` (policy, reference) and
    their masks (rows of different lengths, one token at least)."""
    g = torch.Generator().manual_seed(seed)
    tokens = -torch.rand(4, *shape, generator=g, dtype=dtype) * 3
    masks = torch.rand(2, *shape, generator=g) > 0.4
    masks[..., 0] = True
    return tokens.unbind(0), masks.unbind(0)


@pytest.mark.parametrize("eps", SMOOTHING)
@pytest.mark.parametrize("beta", BETAS)
def test_dpo_sigmoid_loss(beta, eps):
    chosen, rejected, ref_chosen, ref_rejected = pairs()
    margin = dpo_log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    out = dpo_sigmoid_loss(margin, beta, eps)
    expected = reference.elementwise(
        lambda a, b, c, d: ref.dpo_loss(a, b, c, d, beta, eps),
        chosen,
        rejected,
        ref_chosen,
        ref_rejected,
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("eps", SMOOTHING)
@pytest.mark.parametrize("beta", BETAS)
def test_robust_dpo_loss(beta, eps):
    chosen, rejected, ref_chosen, ref_rejected = pairs(seed=1)
    margin = dpo_log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    out = robust_dpo_loss(margin, beta, eps)
    expected = reference.elementwise(
        lambda a, b, c, d: ref.robust_dpo_loss(a, b, c, d, beta, eps),
        chosen,
        rejected,
        ref_chosen,
        ref_rejected,
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("beta", BETAS)
def test_dpo_hinge_loss(beta):
    chosen, rejected, ref_chosen, ref_rejected = pairs(seed=2)
    margin = dpo_log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    expected = reference.elementwise(
        lambda a, b, c, d: ref.hinge_loss(a, b, c, d, beta),
        chosen,
        rejected,
        ref_chosen,
        ref_rejected,
    )
    torch.testing.assert_close(dpo_hinge_loss(margin, beta), expected)
    assert (expected == 0).any() or beta < 1  # the hinge's flat part is reached on this grid


def _rows(tokens, mask):
    return [
        [x for x, m in zip(t, k, strict=True) if m]
        for t, k in zip(tokens.tolist(), mask.tolist(), strict=True)
    ]


@pytest.mark.parametrize("tau", BETAS)
def test_ipo_loss(tau):
    (chosen, rejected, ref_chosen, ref_rejected), (mask_c, mask_r) = token_pairs()
    total = lambda x, m: sequence_log_likelihood(x, m, normalize=False)  # noqa: E731
    out = ipo_loss(
        total(chosen, mask_c) - total(ref_chosen, mask_c),
        total(rejected, mask_r) - total(ref_rejected, mask_r),
        mask_c.sum(-1).double(),
        mask_r.sum(-1).double(),
        tau,
    )
    rows = zip(
        _rows(chosen, mask_c),
        _rows(rejected, mask_r),
        _rows(ref_chosen, mask_c),
        _rows(ref_rejected, mask_r),
        strict=True,
    )
    expected = torch.tensor([ref.ipo_loss(*row, tau) for row in rows], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.6])
@pytest.mark.parametrize("beta", [0.1, 2.0, 2.5])
def test_simpo_loss(beta, gamma, eps):
    (chosen, rejected, _, _), (mask_c, mask_r) = token_pairs(seed=3)
    mean = lambda x, m: sequence_log_likelihood(x, m, normalize=True)  # noqa: E731
    out = simpo_loss(mean(chosen, mask_c), mean(rejected, mask_r), beta, gamma, eps)
    rows = zip(_rows(chosen, mask_c), _rows(rejected, mask_r), strict=True)
    expected = torch.tensor(
        [ref.simpo_loss(c, r, beta, gamma, eps) for c, r in rows], dtype=torch.float64
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.33), (0.5, 2.0)])
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("kl_shift", [-3.0, 0.0, 3.0])  # z0 floored at 0 / positive
def test_kto_loss(beta, weights, kl_shift):
    log_prob, ref_log_prob, kl_log_prob, kl_ref = pairs(n=8, seed=4)
    kl_log_prob = kl_ref + kl_shift + torch.linspace(-1, 1, 8, dtype=torch.float64)
    desirable = torch.tensor([True, False, True, True, False, False, True, False])
    z0 = kto_reference_point(kl_log_prob, kl_ref)
    expected_z0 = ref.kto_reference_point(kl_log_prob.tolist(), kl_ref.tolist())
    assert z0.item() == pytest.approx(expected_z0, abs=1e-12)
    out = kto_loss(log_prob - ref_log_prob, desirable, z0, beta, *weights)
    expected = reference.elementwise(
        lambda a, b, d: ref.kto_loss(a, b, bool(d), expected_z0, beta, *weights),
        log_prob,
        ref_log_prob,
        desirable.double(),
    )
    torch.testing.assert_close(out, expected)


def test_identities():
    chosen, rejected, ref_chosen, ref_rejected = pairs(seed=5)
    margin = dpo_log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    # robust DPO without flipped labels is DPO
    torch.testing.assert_close(robust_dpo_loss(margin, 0.3, 0.0), dpo_sigmoid_loss(margin, 0.3))
    # conservative DPO at eps = 1/2 cannot tell chosen from rejected: even in the margin
    torch.testing.assert_close(
        dpo_sigmoid_loss(margin, 0.3, 0.5), dpo_sigmoid_loss(-margin, 0.3, 0.5)
    )
    # SimPO with gamma = 0 on equal lengths is DPO with a zero reference and beta / length
    zero = torch.zeros_like(chosen)
    torch.testing.assert_close(
        simpo_loss(chosen / 4, rejected / 4, 2.0, 0.0),
        dpo_sigmoid_loss(dpo_log_ratio_margin(chosen, rejected, zero, zero), 0.5),
    )
    # swapping chosen and rejected flips the margin
    swapped = dpo_log_ratio_margin(rejected, chosen, ref_rejected, ref_chosen)
    torch.testing.assert_close(swapped, -margin)


def test_no_gradient_to_the_reference_or_the_reference_point():
    chosen, rejected, ref_chosen, ref_rejected = (t.clone().requires_grad_() for t in pairs())
    margin = dpo_log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    dpo_sigmoid_loss(margin, 0.1).sum().backward()
    assert ref_chosen.grad is None and ref_rejected.grad is None
    assert chosen.grad is not None and (chosen.grad < 0).all() and (rejected.grad > 0).all()
    kl, kl_ref = (t.clone().requires_grad_() for t in pairs(seed=6)[:2])
    z0 = kto_reference_point(kl, kl_ref)
    assert not z0.requires_grad
    log_ratio = torch.randn(7, dtype=torch.float64, requires_grad=True)
    z = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    kto_loss(log_ratio, torch.rand(7) > 0.5, z, 0.1).sum().backward()
    assert z.grad is None and log_ratio.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_margins_are_finite(dtype):
    margin = torch.tensor([-1e4, -50.0, 0.0, 50.0, 1e4], dtype=dtype, requires_grad=True)
    ones = torch.ones_like(margin)
    losses = [
        dpo_sigmoid_loss(margin, 1.0, 0.1),
        robust_dpo_loss(margin, 1.0, 0.1),
        dpo_hinge_loss(margin, 1.0),
        ipo_loss(margin, -margin, ones, ones, 0.1),
        simpo_loss(margin, -margin, 2.0, 1.0, 0.1),
        kto_loss(margin, margin > 0, torch.tensor(1.0, dtype=dtype), 1.0),
    ]
    for loss in losses:
        (grad,) = torch.autograd.grad(loss.sum(), margin)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


def test_shape_mismatch_is_refused():
    chosen, rejected, ref_chosen, ref_rejected = pairs()
    with pytest.raises(ValueError, match=r"\(7,\).*\(7, 1\)|\(7, 1\).*\(7,\)"):
        dpo_log_ratio_margin(chosen, rejected[:, None], ref_chosen, ref_rejected)
    with pytest.raises(ValueError, match="desirable"):
        kto_loss(chosen, torch.ones(7, 1, dtype=torch.bool), torch.tensor(0.0), 0.1)
