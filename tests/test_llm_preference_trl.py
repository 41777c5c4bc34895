"""Parity of DPOLoss (sigmoid, ipo, hinge, robust), SimPOLoss and KTOLoss with TRL 1.16's own
loss code (:mod:`tests.trl_reference`) on the same model and the same batch: loss values and
the gradients of the model's parameters.

The model is :class:`tests.preference_nets.CausalBigram`: rlloss reads it through TorchRL's
wrapper contract (the distribution of each position's own token), TRL through a causal LM's
logits (position ``j`` predicting ``j + 1``); both see the same token log-probs. Chosen and
rejected responses differ in length, rows are padded on both sides and the stored reference
log-probs are ``NaN`` on the padding."""

from __future__ import annotations

import pytest
import torch

from rlloss.llm import DPOLoss, KTOLoss, SimPOLoss
from tests import trl_reference
from tests.preference_nets import CausalBigram, kto_batch, pair_batch, response_mask

trl_reference.trl_root()  # skips this module without TRL 1.16

# float64: equal to rounding; float32: the two libraries sum in other orders
TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}
DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])


def stored(value: float) -> float:
    """A coefficient as the loss holds it: a float32 buffer (so TRL is given the same
    number, ``0.1`` being ``0.100000001...`` there)."""
    return float(torch.tensor(value))


def stacked(batch, names) -> dict:
    """TRL's layout: the responses ``names`` stacked on the batch dim, right padded to one
    length, their completion masks, and their reference log-probs summed over the mask."""
    parts = [batch[name] for name in names]
    length = max(p["tokens", "full"].shape[-1] for p in parts)
    pad = lambda t: torch.nn.functional.pad(t, (0, length - t.shape[-1]))  # noqa: E731
    ids = torch.cat([pad(p["tokens", "full"]) for p in parts])
    masks = [response_mask(p) for p in parts]
    refs = [
        torch.where(m, p["ref_log_probs", "full"], 0.0).sum(-1)
        for p, m in zip(parts, masks, strict=True)
    ]
    return {
        "input_ids": ids,
        "attention_mask": torch.cat([pad(p["masks", "all_attention_mask"]) for p in parts]),
        "completion_mask": torch.cat([pad(m) for m in masks]).long(),
        "refs": refs,
    }


def gradient(model, loss):
    model.zero_grad()
    loss.backward()
    return model.logits.weight.grad.clone()


def record(request, name, ours, theirs, our_grad, their_grad):
    tolerance = TOLERANCES[ours.dtype]
    """Compare and keep the max abs differences for the report (``-s`` prints them)."""
    value_diff = (ours - theirs).abs().max().item()
    grad_diff = (our_grad - their_grad).abs().max().item()
    print(f"\nTRL parity {name} {ours.dtype}: value {value_diff:.2e}, grad {grad_diff:.2e}")
    torch.testing.assert_close(ours, theirs, **tolerance)
    torch.testing.assert_close(our_grad, their_grad, **tolerance)
    assert their_grad.abs().max() > 0


@pytest.mark.parametrize(
    "loss_type, beta, eps",
    [
        ("sigmoid", 0.1, 0.0),
        ("sigmoid", 1.0, 0.0),
        ("ipo", 0.1, 0.0),
        ("ipo", 0.5, 0.0),
        ("hinge", 0.1, 0.0),
        ("hinge", 0.5, 0.0),
        ("robust", 0.1, 0.1),
        ("robust", 0.5, 0.3),
    ],
)
@DTYPES
def test_dpo_matches_trl(request, dtype, loss_type, beta, eps):
    model, batch = CausalBigram(dtype=dtype), pair_batch(dtype=dtype)
    loss = DPOLoss(model, beta=beta, loss_type=loss_type, label_smoothing=eps)
    ours = loss(batch.clone())["loss_dpo"]
    our_grad = gradient(model, ours)
    inputs = stacked(batch, ("chosen", "rejected"))
    ref_chosen, ref_rejected = inputs.pop("refs")
    inputs.update(ref_chosen_logps=ref_chosen, ref_rejected_logps=ref_rejected)
    theirs = trl_reference.dpo_loss(
        trl_reference.FusedHeadModel(model.lm_logits), inputs, loss_type, stored(beta), stored(eps)
    )
    their_grad = gradient(model, theirs)
    record(request, f"DPO {loss_type} beta={beta} eps={eps}", ours, theirs, our_grad, their_grad)


@pytest.mark.parametrize("beta, gamma, eps", [(2.0, 1.0, 0.0), (2.5, 0.5, 0.0), (0.1, 0.5, 0.2)])
@DTYPES
def test_simpo_matches_trl(request, dtype, beta, gamma, eps):
    model, batch = CausalBigram(dtype=dtype), pair_batch(seed=3, dtype=dtype)
    ours = SimPOLoss(model, beta=beta, gamma=gamma, label_smoothing=eps)(batch.clone())
    our_grad = gradient(model, ours["loss_simpo"])
    inputs = stacked(batch, ("chosen", "rejected"))
    labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
    theirs = trl_reference.simpo_loss(
        model.lm_logits(inputs["input_ids"]), labels, *map(stored, (beta, gamma, eps))
    )
    their_grad = gradient(model, theirs)
    name = f"SimPO beta={beta} gamma={gamma} eps={eps}"
    record(request, name, ours["loss_simpo"], theirs, our_grad, their_grad)


@pytest.mark.parametrize(
    "beta, weights", [(0.1, (1.0, 1.0)), (1.0, (1.0, 1.33)), (0.5, (2.0, 0.5))]
)
@DTYPES
def test_kto_matches_trl(request, dtype, beta, weights):
    model, batch = CausalBigram(dtype=dtype), kto_batch(dtype=dtype)
    loss = KTOLoss(model, beta=beta, desirable_weight=weights[0], undesirable_weight=weights[1])
    ours = loss(batch.clone())
    our_grad = gradient(model, ours["loss_kto"])
    main, kl = stacked(batch, ("response",)), stacked(batch, ("kl_response",))
    inputs = {
        "input_ids": main["input_ids"],
        "attention_mask": main["attention_mask"],
        "completion_mask": main["completion_mask"],
        "KL_input_ids": kl["input_ids"],
        "KL_attention_mask": kl["attention_mask"],
        "KL_completion_mask": kl["completion_mask"],
        "label": batch["label"],
        "ref_logps": main["refs"][0],
        "ref_KL_logps": kl["refs"][0],
    }
    fused = trl_reference.FusedHeadModel(model.lm_logits)
    theirs = trl_reference.kto_loss(fused, inputs, stored(beta), tuple(map(stored, weights)))
    their_grad = gradient(model, theirs)
    assert ours["kl"] > 0  # the reference point is not floored on this batch
    record(
        request,
        f"KTO beta={beta} weights={weights}",
        ours["loss_kto"],
        theirs,
        our_grad,
        their_grad,
    )


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_training_loop_matches_trl_on_a_tiny_qwen(loss_type):
    """The same training loop (Adam, 5 steps, a fresh batch of pairs each) on a tiny Qwen2 from
    one initialisation, once with ``DPOLoss`` through TorchRL's ``TransformersWrapper`` (token
    mode, the reference a frozen perturbed copy given as ``reference_network``) and once with
    TRL's ``DPOTrainer._compute_loss`` on the model's causal-LM logits (the reference's summed
    log-probs from TRL's fused-head stand-in): the losses of every step and the final weights
    agree."""
    pytest.importorskip("transformers")
    import copy

    from tensordict import TensorDict
    from torchrl.modules.llm import TransformersWrapper

    from tests.llm_nets import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    ours_model = tiny_model().double()
    reference = copy.deepcopy(ours_model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    theirs_model = copy.deepcopy(ours_model)

    def wrap(model):
        return TransformersWrapper(
            model, tokenizer=tokenizer, generate=False, input_mode="tokens", pad_output=True
        )

    ours_loss = DPOLoss(wrap(ours_model), reference_network=wrap(reference), loss_type=loss_type)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (ours_model, theirs_model)]
    g = torch.Generator().manual_seed(0)
    prompt_length, batch = 4, 4
    for step in range(5):
        full = {
            n: torch.randint(2, 32, (batch, length), generator=g)
            for n, length in (("chosen", 9), ("rejected", 7))
        }
        full["rejected"][:, :prompt_length] = full["chosen"][:, :prompt_length]
        pairs = TensorDict(
            {
                name: {
                    "tokens": {"full": tokens, "prompt": tokens[:, :prompt_length]},
                    "masks": {"all_attention_mask": torch.ones_like(tokens, dtype=torch.bool)},
                }
                for name, tokens in full.items()
            },
            batch_size=[batch],
        )
        ours = ours_loss(pairs)["loss_dpo"]
        ids = torch.cat(
            [
                torch.nn.functional.pad(full[n], (0, 9 - full[n].shape[1]))
                for n in ("chosen", "rejected")
            ]
        )
        completion = torch.zeros_like(ids)
        completion[:batch, prompt_length:9] = 1
        completion[batch:, prompt_length:7] = 1
        labels = ids.masked_fill(completion == 0, -100)
        with torch.no_grad():
            ref_fused = trl_reference.FusedHeadModel(lambda x: reference(input_ids=x).logits)
            ref_logps = ref_fused(input_ids=ids, labels=labels).log_probs.sum(1)
        inputs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "completion_mask": completion,
            "ref_chosen_logps": ref_logps[:batch],
            "ref_rejected_logps": ref_logps[batch:],
        }
        fused = trl_reference.FusedHeadModel(lambda x: theirs_model(input_ids=x).logits)
        theirs = trl_reference.dpo_loss(fused, inputs, loss_type, stored(0.1), 0.0)
        print(f"\nstep {step}: rlloss {ours.item():.12f} TRL {theirs.item():.12f}")
        torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)
        for optimizer, loss in zip(optimizers, (ours, theirs), strict=True):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    gap = max(
        (a - b).abs().max().item()
        for a, b in zip(ours_model.parameters(), theirs_model.parameters(), strict=True)
    )
    print(f"weights after 5 steps, max abs difference: {gap:.2e}")
    assert gap < 1e-8
