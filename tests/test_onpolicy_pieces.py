"""The on-policy losses' pieces as functions of tensors, against naive references written from
the formulas: the critic regression (``rlloss.onpolicy.critic``: distance, PPO's value clipping,
``vf_clip_param``'s clamp, padding, the diagnostics) and the entropy bonus
(``rlloss.onpolicy.entropy``: one distribution, a composite one with or without TorchRL's
per-head map); and the off-policy critics' reported diagnostics."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import CompositeDistribution
from torch import distributions as D

from rlloss import functional as rlf
from rlloss.onpolicy.critic import critic_regression
from rlloss.onpolicy.entropy import entropy_bonus, entropy_coefficients
from tests import reference

DTYPE = torch.float64
KINDS = ["l1", "l2", "smooth_l1"]
REDUCTIONS = ["mean", "sum", "none"]


def critic_batch(rows: int = 9, seed: int = 0) -> dict[str, torch.Tensor]:
    """``[rows, 1]`` values, old values and targets whose differences cross Huber's kink and the
    clip range used below, and a padding mask with valid and padded steps."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(rows, 1, generator=generator, dtype=DTYPE)
    value = target + 2 * torch.randn(rows, 1, generator=generator, dtype=DTYPE)
    old_value = value + 0.5 * torch.randn(rows, 1, generator=generator, dtype=DTYPE)
    mask = torch.arange(rows) % 3 != 1
    return {"value": value, "target": target, "old_value": old_value, "mask": mask}


def naive_critic_loss(batch, kind, coeff, clip, limit, use_mask, reduction):
    """``coeff * L`` per step (value-clipped with ``clip``, clamped to ``[0, limit]``), reduced
    over the valid steps, from the scalar references."""
    rows = batch["value"].shape[0]
    mask = batch["mask"].tolist() if use_mask else [True] * rows
    losses = []
    for i in range(rows):
        v, old, y = (float(batch[k][i, 0]) for k in ("value", "old_value", "target"))
        loss = reference.distance(v, y, kind)
        if clip is not None:
            loss = reference.clipped_value_loss(v, old, y, clip, kind)
        if limit is not None:
            loss = min(max(loss, 0.0), limit)
        losses.append(coeff * loss)
    if reduction == "none":
        return torch.tensor(
            [[x if keep else 0.0] for x, keep in zip(losses, mask, strict=True)], dtype=DTYPE
        )
    if reduction == "sum":
        return torch.tensor(
            sum(x for x, keep in zip(losses, mask, strict=True) if keep), dtype=DTYPE
        )
    return torch.tensor(reference.masked_mean(losses, mask), dtype=DTYPE)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("use_mask", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("limit", [None, 0.7], ids=["no-clamp", "clamp"])
@pytest.mark.parametrize("clip", [None, 0.3], ids=["no-clip", "clip"])
@pytest.mark.parametrize("kind", KINDS)
def test_critic_regression_matches_reference(kind, clip, limit, use_mask, reduction):
    batch = critic_batch()
    loss, info = critic_regression(
        batch["value"],
        batch["target"],
        None if clip is None else batch["old_value"],
        batch["mask"] if use_mask else None,
        coeff=torch.tensor(0.5, dtype=DTYPE),
        distance=kind,
        reduction=reduction,
        clip_value=None if clip is None else torch.tensor(clip, dtype=DTYPE),
        vf_clip_param=limit,
        explained_variance=False,
        clip_fraction=False,
    )
    expected = naive_critic_loss(batch, kind, 0.5, clip, limit, use_mask, reduction)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert info == {}


@pytest.mark.parametrize("use_mask", [False, True], ids=["unpadded", "padded"])
def test_critic_regression_diagnostics_match_reference(use_mask):
    """``explained_variance`` (population variances over the valid steps) and
    ``value_clip_fraction`` (the share of valid steps whose value moved more than the clip)."""
    batch, clip = critic_batch(), 0.3
    _, info = critic_regression(
        batch["value"],
        batch["target"],
        batch["old_value"],
        batch["mask"] if use_mask else None,
        coeff=torch.tensor(1.0, dtype=DTYPE),
        distance="l2",
        reduction="mean",
        clip_value=torch.tensor(clip, dtype=DTYPE),
        vf_clip_param=None,
        explained_variance=True,
        clip_fraction=True,
    )
    keep = batch["mask"] if use_mask else torch.ones(9, dtype=torch.bool)
    value, old, target = (batch[k][keep, 0].tolist() for k in ("value", "old_value", "target"))
    clipped = [float(abs(v - o) > clip) for v, o in zip(value, old, strict=True)]
    explained = reference.explained_variance(value, target)
    torch.testing.assert_close(info["explained_variance"], torch.tensor([explained], dtype=DTYPE))
    torch.testing.assert_close(
        info["value_clip_fraction"], torch.tensor(sum(clipped) / len(clipped), dtype=DTYPE)
    )
    assert not info["explained_variance"].requires_grad


def test_critic_regression_gradient_reaches_the_value_only():
    """The target and the old value are constants of the regression: only ``V(s)`` gets a
    gradient, ``coeff * dL/dV`` (``2 coeff (V - y) / N`` for the mean squared error)."""
    batch = critic_batch()
    value = batch["value"].clone().requires_grad_(True)
    target = batch["target"].clone().requires_grad_(True)
    loss, _ = critic_regression(
        value,
        target.detach(),
        None,
        None,
        coeff=torch.tensor(0.5, dtype=DTYPE),
        distance="l2",
        reduction="mean",
        clip_value=None,
        vf_clip_param=None,
        explained_variance=False,
        clip_fraction=False,
    )
    (grad,) = torch.autograd.grad(loss, value)
    torch.testing.assert_close(grad, 0.5 * 2 * (value - target).detach() / value.numel())


def categorical(rows: int = 6, actions: int = 4, seed: int = 1) -> D.Categorical:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, actions, generator=generator, dtype=DTYPE)
    return D.Categorical(logits=logits, validate_args=False)


def naive_entropies(distribution: D.Categorical) -> list[float]:
    return [reference.categorical_entropy(row) for row in distribution.logits.tolist()]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("use_mask", [False, True], ids=["unpadded", "padded"])
def test_entropy_bonus_matches_reference(use_mask, reduction):
    distribution = categorical()
    mask = torch.tensor([True, False, True, True, False, True])
    keep = mask.tolist() if use_mask else [True] * 6
    loss, info = entropy_bonus(
        distribution,
        mask if use_mask else None,
        coeff=torch.tensor(0.2, dtype=DTYPE),
        coeff_map=None,
        samples=1,
        reduction=reduction,
        diagnostics=True,
    )
    entropies = naive_entropies(distribution)
    valid = [h for h, k in zip(entropies, keep, strict=True) if k]
    if reduction == "none":
        expected = [-0.2 * h if k else 0.0 for h, k in zip(entropies, keep, strict=True)]
    else:
        expected = -0.2 * (sum(valid) if reduction == "sum" else sum(valid) / len(valid))
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=DTYPE), rtol=1e-12, atol=1e-12)
    mean = torch.tensor(sum(valid) / len(valid), dtype=DTYPE)
    torch.testing.assert_close(info["entropy"], mean, rtol=1e-12, atol=1e-12)


def test_entropy_bonus_without_diagnostics_reports_nothing():
    loss, info = entropy_bonus(
        categorical(),
        None,
        coeff=torch.tensor(0.2, dtype=DTYPE),
        coeff_map=None,
        samples=1,
        reduction="mean",
        diagnostics=False,
    )
    assert info == {}
    expected = -0.2 * sum(naive_entropies(categorical())) / 6
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=DTYPE))


def composite() -> tuple[CompositeDistribution, D.Categorical, D.Categorical]:
    heads = {"move": categorical(seed=2), "turn": categorical(actions=3, seed=3)}
    params = TensorDict(
        {name: {"logits": head.logits} for name, head in heads.items()}, batch_size=[6]
    )
    distribution_map = {"move": D.Categorical, "turn": D.Categorical}
    return CompositeDistribution(params, distribution_map=distribution_map), *heads.values()


@pytest.mark.parametrize("per_head", [False, True], ids=["one-coeff", "per-head-map"])
def test_composite_entropy_bonus_matches_reference(per_head):
    """``-sum_h c_h H_h`` averaged over the steps, ``c_h`` TorchRL's per-head coefficient (the
    map's keys are the heads' entropy entries) or the one coefficient; ``entropy`` reports the
    mean of the heads' sum, ``composite_entropy`` each head's."""
    distribution, move, turn = composite()
    # the map as the constructor keeps it (checked, keys unravelled)
    _, coeff_map = entropy_coefficients({"move_entropy": 0.5, "turn_entropy": 2.0})
    coeff_map = coeff_map if per_head else None
    loss, info = entropy_bonus(
        distribution,
        None,
        coeff=torch.tensor(0.1, dtype=DTYPE),
        coeff_map=coeff_map,
        samples=1,
        reduction="mean",
        diagnostics=True,
    )
    c_move, c_turn = (0.5, 2.0) if per_head else (0.1, 0.1)
    h_move, h_turn = naive_entropies(move), naive_entropies(turn)
    expected = -sum(c_move * a + c_turn * b for a, b in zip(h_move, h_turn, strict=True)) / 6
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=DTYPE))
    mean = sum(a + b for a, b in zip(h_move, h_turn, strict=True)) / 6
    torch.testing.assert_close(info["entropy"], torch.tensor(mean, dtype=DTYPE))
    per_head_entropy = info["composite_entropy"]
    torch.testing.assert_close(per_head_entropy["move_entropy"], torch.tensor(h_move, dtype=DTYPE))
    torch.testing.assert_close(per_head_entropy["turn_entropy"], torch.tensor(h_turn, dtype=DTYPE))


def test_composite_entropy_bonus_names_a_head_missing_from_the_map():
    distribution, _, _ = composite()
    with pytest.raises(KeyError, match="no coefficient for the head.*turn_entropy"):
        entropy_bonus(
            distribution,
            None,
            coeff=torch.tensor(0.1, dtype=DTYPE),
            coeff_map=entropy_coefficients({"move_entropy": 0.5})[1],
            samples=1,
            reduction="mean",
            diagnostics=False,
        )


@pytest.mark.parametrize("members", [None, 3], ids=["one-critic", "ensemble"])
def test_regression_diagnostics_drop_the_last_dim_and_the_gradient(members):
    shape = (5, 1) if members is None else (members, 5, 1)
    values = torch.randn(shape, dtype=DTYPE, requires_grad=True)
    target = torch.randn(5, 1, dtype=DTYPE)
    info = rlf.regression_diagnostics(values, target)
    assert set(info) == {"pred_value", "target_value"}
    torch.testing.assert_close(info["pred_value"], values.detach()[..., 0])
    torch.testing.assert_close(info["target_value"], target[:, 0])
    assert not info["pred_value"].requires_grad
