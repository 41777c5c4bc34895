"""DPOLoss, SimPOLoss and KTOLoss on TorchRL's LLM wrappers and their contracts: the responses
as TensorDict entries in the ``TransformersWrapper``'s token and chat-history layouts (the
sequence log-probs equal to the wrapper's own), a reference network or stored reference
log-probs (per token or per response, equal), padding and NaN padding reaching neither value
nor gradient, an empty response, reductions, and every bad input named (missing entries with
the ``set_keys`` call, shapes, ranges). TRL parity: ``test_llm_preference_trl.py``; the shared
contract (compile, state dict, set_keys, host reads): ``test_contract.py``."""

from __future__ import annotations

import copy

import pytest
import tensordict
import torch
from tensordict import TensorDict, lazy_stack

import rlloss
from rlloss import functional as rlf
from rlloss.llm import DPOLoss, KTOLoss, SimPOLoss
from tests.preference_nets import CausalBigram, kto_batch, pair_batch, response_mask


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


def sequence_sums(td, strategy="sft"):
    """The bigram's summed response log-probs and token counts, computed directly."""
    model = CausalBigram()
    tokens = td["tokens", "full"]
    logits = torch.cat(
        [torch.zeros(tokens.shape[0], 1, 16, dtype=torch.float64), model.logits(tokens[:, :-1])], 1
    )
    log_prob = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    mask = response_mask(td, strategy)
    return torch.where(mask, log_prob, 0.0).sum(-1), mask.sum(-1).double()


@pytest.mark.parametrize("strategy", ["sft", "generic"])
def test_dpo_reads_the_responses_as_the_actor_scores_them(strategy):
    batch = pair_batch()
    loss = DPOLoss(CausalBigram(), beta=0.2, masking_strategy=strategy, reduction="none")
    out = loss(batch.clone())
    chosen, _ = sequence_sums(batch["chosen"], strategy)
    rejected, _ = sequence_sums(batch["rejected"], strategy)
    ref = [
        torch.where(response_mask(batch[k], strategy), batch[k]["ref_log_probs", "full"], 0.0)
        for k in ("chosen", "rejected")
    ]
    margin = (chosen - ref[0].sum(-1)) - (rejected - ref[1].sum(-1))
    torch.testing.assert_close(out["loss_dpo"], -torch.nn.functional.logsigmoid(0.2 * margin))
    assert out["loss_dpo"].shape == (3,)
    reward_chosen = 0.2 * (chosen - ref[0].sum(-1))
    torch.testing.assert_close(out["reward_chosen"], reward_chosen.mean())
    accuracy = ((chosen - ref[0].sum(-1)) > (rejected - ref[1].sum(-1))).double().mean()
    torch.testing.assert_close(out["reward_accuracy"], accuracy)


def test_stored_reference_per_token_per_response_and_network_agree():
    actor, reference = CausalBigram(seed=0), CausalBigram(seed=1)
    batch = pair_batch()
    for name in ("chosen", "rejected"):  # the reference's own log-probs, per token
        with torch.no_grad():
            dist = reference._get_sft_dist(batch[name])
            log_prob = dist.log_prob(batch[name]["tokens", "full"])
        batch[name]["ref_log_probs", "full"] = torch.where(dist.mask, log_prob, torch.nan)
    per_response = batch.clone()
    for name in ("chosen", "rejected"):
        token = batch[name]["ref_log_probs", "full"]
        total = torch.where(response_mask(batch[name]), token, 0.0).sum(-1, keepdim=True)
        per_response[name]["ref_log_probs", "full"] = total  # [B, 1]
    outputs = [
        DPOLoss(actor, loss_type="ipo")(batch.clone()),
        DPOLoss(actor, loss_type="ipo")(per_response),
        DPOLoss(actor, reference_network=reference, loss_type="ipo")(
            batch.exclude(("chosen", "ref_log_probs"), ("rejected", "ref_log_probs"))
        ),
    ]
    for out in outputs[1:]:
        torch.testing.assert_close(out["loss_dpo"], outputs[0]["loss_dpo"])
    actor.zero_grad()
    outputs[2]["loss_dpo"].backward()
    assert actor.logits.weight.grad.abs().sum() > 0
    assert reference.logits.weight.grad is None


def test_nan_on_padding_and_prompt_reaches_nothing():
    """NaN reference log-probs (and a NaN-producing prompt) outside the scored tokens: finite
    losses and gradients, equal to those of the same batch with zeros there."""
    batch = pair_batch()
    for name in ("chosen", "rejected"):
        mask = response_mask(batch[name])
        batch[name]["ref_log_probs", "full"] = torch.where(
            mask, batch[name]["ref_log_probs", "full"], torch.nan
        )
    clean = batch.apply(lambda t: t.nan_to_num() if t.is_floating_point() else t)
    for loss_type in ("sigmoid", "ipo", "hinge", "robust"):
        eps = 0.1 if loss_type == "robust" else 0.0
        grads = []
        for data in (batch, clean):
            actor = CausalBigram()
            out = DPOLoss(actor, loss_type=loss_type, label_smoothing=eps)(data.clone())
            out["loss_dpo"].backward()
            assert torch.isfinite(out["loss_dpo"]) and all(torch.isfinite(v) for v in out.values())
            grads.append(actor.logits.weight.grad)
        torch.testing.assert_close(grads[0], grads[1])


def test_an_empty_response_is_finite():
    batch = pair_batch()
    batch["rejected"]["masks", "all_attention_mask"][-1, 4:] = False  # no response token left
    actor = CausalBigram()
    for loss in (DPOLoss(actor, loss_type="ipo"), SimPOLoss(actor)):
        out = loss(batch.clone())
        key = "loss_dpo" if isinstance(loss, DPOLoss) else "loss_simpo"
        out[key].backward()
        assert torch.isfinite(out[key]) and torch.isfinite(actor.logits.weight.grad).all()


def test_simpo_is_reference_free_and_length_normalised():
    batch = pair_batch(seed=2).exclude(("chosen", "ref_log_probs"), ("rejected", "ref_log_probs"))
    out = SimPOLoss(CausalBigram(), beta=2.0, gamma=0.5, reduction="sum")(batch)
    chosen, n_chosen = sequence_sums(batch["chosen"])
    rejected, n_rejected = sequence_sums(batch["rejected"])
    expected = rlf.simpo_loss(chosen / n_chosen, rejected / n_rejected, 2.0, 0.5).sum()
    torch.testing.assert_close(out["loss_simpo"], expected)


def test_kto_labels_reference_point_and_diagnostics():
    batch = kto_batch()
    out = KTOLoss(CausalBigram(), beta=0.5, reduction="none")(batch.clone())
    policy, _ = sequence_sums(batch["response"])
    ref = torch.where(
        response_mask(batch["response"]), batch["response"]["ref_log_probs", "full"], 0.0
    ).sum(-1)
    kl_policy, _ = sequence_sums(batch["kl_response"])
    kl_ref = torch.where(
        response_mask(batch["kl_response"]), batch["kl_response"]["ref_log_probs", "full"], 0.0
    ).sum(-1)
    z0 = (kl_policy - kl_ref).mean().clamp_min(0)
    torch.testing.assert_close(out["kl"], z0)
    expected = rlf.kto_loss(policy - ref, batch["label"], z0, 0.5)
    torch.testing.assert_close(out["loss_kto"], expected)
    label = batch["label"]
    torch.testing.assert_close(out["reward_chosen"], (0.5 * (policy - ref))[label].mean())
    torch.testing.assert_close(out["reward_rejected"], (0.5 * (policy - ref))[~label].mean())
    # the labels may be [B, 1] and integers
    wide = batch.clone()
    wide["label"] = batch["label"].long()[:, None]
    out_wide = KTOLoss(CausalBigram(), beta=0.5, reduction="none")(wide)
    torch.testing.assert_close(out_wide["loss_kto"], out["loss_kto"])


# ---------------------------------------------------------------- TorchRL's wrappers


def test_dpo_on_transformers_wrapper_in_tokens_mode():
    pytest.importorskip("transformers")
    from tests.llm_nets import tiny_actor, token_batch

    actor = tiny_actor()
    chosen, rejected = token_batch(seed=0), token_batch(seed=1, length=8)
    batch = TensorDict(chosen=chosen, rejected=rejected, batch_size=[3])
    for name in ("chosen", "rejected"):
        batch[name]["ref_log_probs", "full"] = batch[name]["next", "ref_log_probs", "full"]
    loss = DPOLoss(actor, beta=0.1, reduction="none")
    out = loss(batch.clone())
    totals = []
    for name in ("chosen", "rejected"):  # the wrapper's own log-probs, its sft mask
        sub = batch[name].select("tokens", "masks")
        with torch.no_grad():
            own = actor(sub.clone())["log_probs", "full"]
            mask = actor._get_sft_dist(sub.clone()).mask
        ratio = torch.where(mask, own - batch[name]["ref_log_probs", "full"], 0.0).sum(-1)
        totals.append(ratio)
    expected = rlf.dpo_sigmoid_loss(totals[0] - totals[1], 0.1)
    torch.testing.assert_close(out["loss_dpo"], expected.to(out["loss_dpo"]))
    out["loss_dpo"].sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


CHOSEN = "t7 t8 t9"
REJECTED = "t7 t9"


def chats(answer):
    return [
        [
            {"role": "system", "content": "t2 t3"},
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": answer},
        ]
        for prompt in ("t4 t5 t6", "t4 t5")
    ]


def history_responses(answer):
    from torchrl.data import History
    from torchrl.modules.llm.policies.common import ChatHistory

    history = History.from_chats(chats(answer))
    td = TensorDict(history=ChatHistory(full=history, prompt=history[..., :-1]), batch_size=[2])
    return lazy_stack(list(td.unbind(0)))


@pytest.mark.parametrize("strategy", ["rlhf", "sft"])
def test_dpo_on_transformers_wrapper_in_history_mode(strategy):
    pytest.importorskip("transformers")
    from tests.llm_nets import history_actor, tiny_model, tiny_tokenizer

    tokenizer, model = tiny_tokenizer(), tiny_model()
    actor = history_actor(model, tokenizer, return_log_probs=True)
    reference = history_actor(copy.deepcopy(model), tokenizer, return_log_probs=True)
    with torch.no_grad():
        for p in reference.model.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def scored(answer):  # the chats with the tokens and masks the wrapper writes
        responses = history_responses(answer)
        with torch.no_grad():
            out = actor(responses.select(("history", "full")))
        keys = [
            ("tokens", "full"),
            ("masks", "all_assistant_mask"),
            ("masks", "all_attention_mask"),
        ]
        values = [out.get(key, as_list=True) for key in keys]
        rows = []
        for i, row in enumerate(responses.unbind(0)):
            for key, value in zip(keys, values, strict=True):
                row.set(key, value[i])
            rows.append(row)
        return lazy_stack(rows)

    batch = lazy_stack(
        [
            TensorDict(chosen=c, rejected=r)
            for c, r in zip(scored(CHOSEN).unbind(0), scored(REJECTED).unbind(0), strict=True)
        ]
    )
    loss = DPOLoss(actor, reference_network=reference, masking_strategy=strategy)
    out = loss(batch)
    assert torch.isfinite(out["loss_dpo"])
    # the assistant's tokens scored by the wrapper itself: its log-probs over its masks
    totals = []
    for name in ("chosen", "rejected"):
        sums = []
        for net in (actor, reference):
            with torch.no_grad():
                scored = net(batch[name].select(("history", "full")))
            log_probs = scored.get(("log_probs", "full"), as_list=True)
            masks = scored.get(("masks", "all_assistant_mask"), as_list=True)
            sums.append(
                torch.stack([lp[m.bool()].sum() for lp, m in zip(log_probs, masks, strict=True)])
            )
        totals.append(sums[0] - sums[1])
    expected = rlf.dpo_sigmoid_loss(totals[0] - totals[1], 0.1).mean()
    torch.testing.assert_close(out["loss_dpo"], expected, atol=1e-5, rtol=1e-5)
    actor.model.zero_grad()
    out["loss_dpo"].backward()
    assert any(p.grad is not None for p in actor.model.parameters())
    assert all(p.grad is None for p in reference.model.parameters())


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "build, batch, key, name",
    [
        (lambda: DPOLoss(CausalBigram()), pair_batch, "chosen", "chosen"),
        (lambda: DPOLoss(CausalBigram()), pair_batch, "rejected", "rejected"),
        (lambda: DPOLoss(CausalBigram()), pair_batch, ("chosen", "ref_log_probs"), "ref_log_probs"),
        (lambda: DPOLoss(CausalBigram()), pair_batch, ("rejected", "tokens", "full"), "tokens"),
        (lambda: SimPOLoss(CausalBigram()), pair_batch, "rejected", "rejected"),
        (lambda: KTOLoss(CausalBigram()), kto_batch, "label", "label"),
        (lambda: KTOLoss(CausalBigram()), kto_batch, "kl_response", "kl_response"),
        (lambda: KTOLoss(CausalBigram()), kto_batch, "response", "response"),
    ],
)
def test_a_missing_entry_names_itself_and_its_set_keys(build, batch, key, name):
    loss, data = build(), batch()
    del data[key]
    if name == "tokens":  # the actor reads the tokens first: give it a stand-in that does not
        loss.set_keys(tokens=("tokens", "scored"))
        data = batch()
    with pytest.raises(rlloss.MissingKeyError, match=rf"set_keys\({name}="):
        loss(data)


def test_shapes_are_named():
    batch = pair_batch()
    batch["chosen"]["ref_log_probs", "full"] = batch["chosen"]["ref_log_probs", "full"][:, :5]
    with pytest.raises(ValueError, match=r"ref_log_probs.*\(3, 5\).*\(3, 10\)"):
        DPOLoss(CausalBigram())(batch)
    pairs = TensorDict(
        chosen=pair_batch(batch=3)["chosen"],
        rejected=pair_batch(batch=2)["rejected"],
        batch_size=[],
    )
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        DPOLoss(CausalBigram())(pairs)
    data = kto_batch()
    data.batch_size = []
    data["label"] = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"label.*\(3,\).*\(4,\)"):
        KTOLoss(CausalBigram())(data)


def test_a_tensor_where_a_response_belongs_is_refused():
    batch = pair_batch()
    batch = TensorDict(chosen=torch.zeros(3, 4), rejected=batch["rejected"], batch_size=[3])
    with pytest.raises(TypeError, match="'chosen' is a Tensor"):
        DPOLoss(CausalBigram())(batch)


def test_stored_reference_with_a_gradient_is_refused():
    batch = pair_batch()
    ref = batch["chosen"]["ref_log_probs", "full"].clone().requires_grad_()
    batch["chosen"]["ref_log_probs", "full"] = ref
    with pytest.raises(RuntimeError, match="require grad"):
        DPOLoss(CausalBigram())(batch)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: DPOLoss(CausalBigram(), beta=0.0), "beta"),
        (lambda: DPOLoss(CausalBigram(), beta=-1.0), "beta"),
        (lambda: DPOLoss(CausalBigram(), label_smoothing=0.5), "label_smoothing"),
        (lambda: DPOLoss(CausalBigram(), label_smoothing=-0.1), "label_smoothing"),
        (lambda: DPOLoss(CausalBigram(), loss_type="kto"), "loss_type"),
        (lambda: DPOLoss(CausalBigram(), loss_type="ipo", label_smoothing=0.1), "ipo"),
        (lambda: DPOLoss(CausalBigram(), reduction="max"), "reduction"),
        (lambda: DPOLoss(CausalBigram(), masking_strategy="all"), "masking_strategy"),
        (lambda: SimPOLoss(CausalBigram(), gamma=-0.5), "gamma"),
        (lambda: SimPOLoss(CausalBigram(), beta=0.0), "beta"),
        (lambda: KTOLoss(CausalBigram(), desirable_weight=-1.0), "desirable_weight"),
        (lambda: KTOLoss(CausalBigram(), beta=0.0), "beta"),
    ],
)
def test_bad_hyperparameters_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_a_later_assignment_out_of_range_is_refused_and_changes_nothing():
    loss = DPOLoss(CausalBigram(), beta=0.1)
    with pytest.raises(ValueError, match="beta"):
        loss.beta = 0.0
    assert loss.beta.item() == pytest.approx(0.1)
    loss.beta = 0.3  # a schedule's step: written in place
    assert loss.beta.item() == pytest.approx(0.3) and "beta" in loss.state_dict()


def test_explicit_signatures():
    import inspect

    for cls in (DPOLoss, SimPOLoss, KTOLoss):
        params = inspect.signature(cls.__init__).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), cls
        assert all(p.annotation is not p.empty for n, p in params.items() if n != "self"), cls
    with pytest.raises(TypeError):
        DPOLoss(CausalBigram(), gamma=0.5)


# ---------------------------------------------------------------- memory


def frozen_call(method, mode):
    """``method`` marked as the actors' (``tests/test_llm_memory.py``'s ``watch_actor``) for a
    network called under ``torch.no_grad``."""

    def marked(*args, **kwargs):
        mode.in_actor = True
        try:
            return method(*args, **kwargs)
        finally:
            mode.in_actor = False

    return marked


@pytest.mark.parametrize("with_reference_network", [False, True])
def test_no_vocabulary_sized_tensor_beyond_the_actors(with_reference_network):
    """The memory contract of ``tests/test_llm_memory.py``: no ``[batch, tokens, vocab]``
    tensor outside the actors' calls, in the forward; in the backward, only the gradients of
    the actor's logits (one per response entry: two)."""
    pytest.importorskip("transformers")
    from tests.llm_nets import tiny_actor, token_batch
    from tests.test_llm_memory import (
        ACTOR_METHODS,
        BATCH,
        TOKENS,
        WIDE_VOCAB,
        VocabTensors,
        check,
        watch_actor,
    )

    actor = tiny_actor(vocab=WIDE_VOCAB)
    reference = tiny_actor(seed=1, vocab=WIDE_VOCAB) if with_reference_network else None
    parts = {}
    for seed, name in enumerate(("chosen", "rejected")):
        part = token_batch(batch=BATCH, length=TOKENS, seed=seed)
        part["ref_log_probs", "full"] = part["next", "ref_log_probs", "full"]
        parts[name] = part.exclude("next", "advantage", "log_probs")
    batch = TensorDict(parts, batch_size=[BATCH])
    loss = DPOLoss(actor, reference_network=reference)
    mode = VocabTensors(BATCH * TOKENS * WIDE_VOCAB)
    watch_actor(actor, mode)
    if reference is not None:  # called without gradient: no autograd node to track
        for name in ACTOR_METHODS:
            method = getattr(reference, name, None)
            if method is not None:
                setattr(reference, name, frozen_call(method, mode))
    with mode:
        loss(batch)["loss_dpo"].backward()
    for network in (actor, reference):
        for name in ACTOR_METHODS:
            if network is not None:
                network.__dict__.pop(name, None)
    check(mode.found, logits_gradients=2)


@pytest.mark.parametrize("module", ["dpo", "simpo", "kto"])
def test_docstring_examples_run(module):
    """The classes' "Examples:" sections run as written (doctest)."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"rlloss.llm.{module}"))
    assert result.attempted > 0 and result.failed == 0, result
