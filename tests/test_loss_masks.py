"""Every loss of the contract table (tests/test_contract.py's LOSSES) keeps the mask behaviour it
declares: a loss that reads TorchRL's ``loss_mask_key`` masks (``_reads_loss_mask``, the
default) leaves the rows a ``("collector", "mask")`` marks False out of every loss term, value
and reduction; a loss that reads none (QMixerLoss and the LLM losses, as their TorchRL
namesakes) gives the numbers of the unmasked batch, whatever the mask."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tests.test_contract import LOSSES, is_loss

MASK = ("collector", "mask")

# the classes that read no loss_mask_key mask: TorchRL's QMixerLoss reads none; the LLM losses
# count the tokens of their own token masks (docs/differences.md for GRPO's token_mean)
READS_NO_MASK = {
    "QMixerLoss",
    "GRPOLoss",
    "DAPO",
    "CISPOLoss",
    "DrGRPOLoss",
    "GSPOLoss",
    "SFTLoss",
    "DistillationLoss",
    "DPOLoss",
    "SimPOLoss",
    "KTOLoss",
}

# loss terms whose "sum" reduction is not a sum of per-row terms: a statistic over the valid
# rows scales every row (the additivity check leaves them out; the other checks still apply)
BATCH_STATISTICS = {
    "TD3BCLoss": ("loss_actor",),  # lambda = alpha / mean |Q| over the valid rows
    "TD3BCLoss-addons": ("loss_actor",),
    "ClipPPOLoss": ("loss_objective",),  # normalize_advantage: the valid rows' mean and std
    "MAPPOLoss": ("loss_objective",),  # normalize_advantage (MAPPO's default)
    "IPPOLoss": ("loss_objective",),
    "GAILLoss-grad-penalty": ("loss",),  # the penalty's interpolation mixes expert and policy rows
}


def loss_terms(loss, batch: TensorDict, mask=None, reduction=None) -> dict:
    """The loss entries of a forward of a copy of ``loss`` (so a state the forward changes,
    such as KLPEN's beta, does not carry over) on a copy of ``batch``, with ``mask`` under
    ``("collector", "mask")``, the same random draws every time."""
    loss = copy.deepcopy(loss)
    if reduction is not None:
        loss.reduction = reduction
    batch = batch.clone()
    if mask is not None:
        batch.set(MASK, mask)
    torch.manual_seed(0)
    out = loss(batch)
    return {key: out.get(key) for key in out.keys() if is_loss(key)}


def every_other_row(batch: TensorDict) -> torch.Tensor:
    mask = torch.zeros(batch.batch_size, dtype=torch.bool)
    mask.view(-1)[::2] = True
    return mask


def perturb_rows(batch: TensorDict, rows: torch.Tensor) -> TensorDict:
    """``batch`` with every floating entry changed on ``rows`` (``x -> 3 x + 1``)."""

    def perturb(value):
        if not value.is_floating_point():
            return value
        where = rows.reshape(*rows.shape, *(1,) * (value.ndim - rows.ndim)).expand_as(value)
        return torch.where(where, 3 * value + 1, value)

    return batch.apply(perturb)


def assert_same(first: dict, second: dict, **tolerance) -> None:
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], msg=key, **tolerance)


@pytest.fixture(params=list(LOSSES))
def case(request):
    row = LOSSES[request.param]
    torch.manual_seed(0)
    return request.param, row.build(), row.batch()


def test_the_declaration(case):
    _, loss, _ = case
    assert loss._reads_loss_mask is (type(loss).__name__ not in READS_NO_MASK)


def test_an_all_false_mask(case):
    """Reads masks: every loss term is 0 (TorchRL's ``sum / max(count, 1)``) and no parameter
    gets a gradient. Reads none: the unmasked batch's numbers."""
    _, loss, batch = case
    none_valid = torch.zeros(batch.batch_size, dtype=torch.bool)
    if not loss._reads_loss_mask:
        assert_same(loss_terms(loss, batch, none_valid), loss_terms(loss, batch))
        return
    loss = copy.deepcopy(loss)
    masked = batch.clone()
    masked.set(MASK, none_valid)
    torch.manual_seed(0)
    out = loss(masked)
    terms = [out.get(key) for key in out.keys() if is_loss(key)]
    for key, term in zip([k for k in out.keys() if is_loss(k)], terms, strict=True):
        assert torch.equal(term, torch.zeros_like(term)), key
    total = sum(term.sum() for term in terms if term.requires_grad)
    params = [p for p in loss.parameters() if p.requires_grad]
    if torch.is_tensor(total) and total.requires_grad:
        for grad in torch.autograd.grad(total, params, allow_unused=True):
            assert grad is None or torch.equal(grad, torch.zeros_like(grad))


def test_a_mixed_mask(case):
    """Reads masks: the rows marked False change no loss term (their contents may be anything),
    and with ``reduction="sum"`` the two halves of a batch add up to the whole (each row counted
    once, padding none). Reads none: the unmasked batch's numbers."""
    key, loss, batch = case
    valid = every_other_row(batch)
    if not loss._reads_loss_mask:
        assert_same(loss_terms(loss, batch, valid), loss_terms(loss, batch))
        return
    masked, plain = loss_terms(loss, batch, valid), loss_terms(loss, batch)
    assert any(not torch.allclose(masked[name], plain[name]) for name in masked)  # it is read
    assert_same(loss_terms(loss, perturb_rows(batch, ~valid), valid), masked)
    halves = [loss_terms(loss, batch, rows, reduction="sum") for rows in (valid, ~valid)]
    whole = loss_terms(loss, batch, reduction="sum")
    for name in whole.keys() - set(BATCH_STATISTICS.get(key, ())):
        torch.testing.assert_close(
            halves[0][name] + halves[1][name], whole[name], msg=name, rtol=1e-4, atol=1e-5
        )
