"""Bad inputs, catalogued for the LLM family (GRPOLoss, DAPO, CISPOLoss, DrGRPOLoss, GSPOLoss on
TorchRL's token layout; SFTLoss and DistillationLoss on chat histories; MCAdvantage), on the
machinery of ``test_bad_inputs_new_classes.py``: each missing entry named, tokens of another
dtype explained, NaN/inf in the tokens no loss counts (padding, the prompt) reaching no output
and no gradient, extreme but valid log-probs and advantages finite, state dicts round-tripped,
the caller's batch left as it was, bad constructor values and later assignments refused."""

from __future__ import annotations

import functools
import math

import pytest
import tensordict
import torch
from tensordict import TensorDict

import rlloss
from tests.llm_nets import TokenActor, token_batch
from tests.test_bad_inputs import assert_assignment_refused
from tests.test_bad_inputs_new_classes import (
    Pad,
    Subject,
    cases,
    check_bad_action,
    check_extreme,
    check_missing_entry,
    check_no_mutation,
    check_padding,
    check_state_round_trip,
    each,
    expect_error,
    missing_key_cases,
    mutation_cases,
    padding_cases,
)

TOKENS, LOG_PROBS, REF = (
    ("tokens", "full"),
    ("log_probs", "full"),
    ("next", "ref_log_probs", "full"),
)
GRPO_FAMILY = ["GRPOLoss", "DAPO", "CISPOLoss", "DrGRPOLoss", "GSPOLoss"]


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


def _grpo(name):
    def build():
        seed = int(torch.randint(1000, ()))  # another model for each build (state round trip)
        return getattr(rlloss, name)(TokenActor(seed), kl_to_ref_coeff=0.1), token_batch()

    return build


def _uncounted(batch):
    """The tokens no loss counts: left padding and the prompt (``Masks``' attention mask
    stored as it is)."""
    attention = batch["masks", "all_attention_mask"]
    prompt = torch.arange(attention.shape[-1]) < batch["tokens", "prompt"].shape[-1]
    return attention, ~attention | prompt


def _llm_extreme(batch):
    """Sampling log-probs of very unlikely tokens (-60 nats) and advantages 100x."""
    batch[LOG_PROBS] = batch[LOG_PROBS] - 60.0
    batch[REF] = batch[REF] - 60.0
    batch["advantage"] = batch["advantage"] * 100.0
    return batch


GRPO_SUBJECTS = [
    Subject(
        name,
        _grpo(name),
        [TOKENS, LOG_PROBS, "advantage", REF],
        TOKENS,
        pad=Pad([LOG_PROBS, REF, "advantage"], ("masks", "all_attention_mask"), _uncounted),
        extreme=_llm_extreme,
        missing_error=(KeyError, ValueError),  # TorchRL's: a ValueError for the advantage
    )
    for name in GRPO_FAMILY
]


@functools.cache
def _chat_setup():
    from tests.llm_nets import chat_batch, tiny_model, tiny_tokenizer, with_ref_log_probs

    with tensordict.set_list_to_stack(True):
        tokenizer, model = tiny_tokenizer(), tiny_model()
        batch = with_ref_log_probs(chat_batch(tokenizer), model, tokenizer)
        batch = with_ref_log_probs(batch, model, tokenizer, "teacher_log_probs")
    return tokenizer, batch


def _chat(cls, **kwargs):
    def build():
        from tests.llm_nets import history_actor, tiny_model

        tokenizer, batch = _chat_setup()
        model = tiny_model(int(torch.randint(1000, ())))
        keywords = {"tokenizer": tokenizer, "tokenizer_kwargs": {"chat_template_name": "qwen"}}
        return cls(history_actor(model, tokenizer), **keywords, **kwargs), batch.clone()

    return build


def _shifted_teacher(batch):
    """Reference / teacher log-probs 60 nats below the student's."""
    for key in ("ref_log_probs", "teacher_log_probs"):
        for one in batch.tensordicts:
            one["next", key, "full"] = one["next", key, "full"] - 60.0
    return batch


CHAT_SUBJECTS = [
    Subject(
        "SFTLoss",
        _chat(rlloss.SFTLoss, kl_to_ref_coeff=0.1),
        [("history", "full"), REF],
        extreme=_shifted_teacher,
        missing_error=(KeyError, ValueError),  # TorchRL's: a ValueError for the reference
    ),
    Subject(
        "DistillationLoss",
        _chat(rlloss.DistillationLoss),
        [("history", "full"), ("next", "teacher_log_probs", "full")],
        extreme=_shifted_teacher,
    ),
]
SUBJECTS = GRPO_SUBJECTS + CHAT_SUBJECTS


def _missing_cases():
    for ident, subject, key in missing_key_cases(SUBJECTS):
        if key == ("history", "full"):
            continue  # the actor's input: TorchRL's wrapper raises its own error (below)
        yield ident, subject, key


@pytest.mark.parametrize("subject, key", cases(_missing_cases))
def test_missing_entry_is_named(subject, key):
    check_missing_entry(subject, key, bare=True)


@pytest.mark.parametrize("subject", each(GRPO_SUBJECTS))
def test_tokens_of_a_floating_dtype_are_explained(subject):
    check_bad_action(subject, "dtype")


@pytest.mark.parametrize("subject, key, value", cases(lambda: padding_cases(SUBJECTS)))
def test_non_finite_uncounted_tokens_reach_no_output_and_no_gradient(subject, key, value):
    check_padding(subject, key, value)


@pytest.mark.parametrize("subject", each(SUBJECTS))
def test_extreme_valid_inputs_give_finite_outputs_and_gradients(subject):
    check_extreme(subject)


@pytest.mark.parametrize("subject", each(SUBJECTS))
def test_state_dict_round_trip_gives_the_same_outputs(subject):
    check_state_round_trip(subject)


@pytest.mark.parametrize("subject, padded", cases(lambda: mutation_cases(GRPO_SUBJECTS)))
def test_the_callers_batch_is_left_as_it_was(subject, padded):
    check_no_mutation(subject, padded)


# ----------------------------------------------------------------------------- hyperparameters
def _grpo_with(name, **kwargs):
    return lambda: getattr(rlloss, name)(TokenActor(), **kwargs)


def _chat_with(cls, **kwargs):
    return lambda: cls(actor_network=None, tokenizer=_chat_setup()[0], **kwargs)


CONSTRUCTION = [
    *[
        row
        for name in GRPO_FAMILY
        for row in (
            (f"{name}-clip_epsilon-0", _grpo_with(name, clip_epsilon=0.0), "clip_epsilon"),
            (f"{name}-clip_epsilon-triple", _grpo_with(name, clip_epsilon=(0.1, 0.2, 0.3)), "clip"),
            (f"{name}-aggregation", _grpo_with(name, aggregation="mean"), "aggregation"),
            (f"{name}-masking", _grpo_with(name, masking_strategy="x"), "masking_strategy"),
            (f"{name}-kl_to_ref-neg", _grpo_with(name, kl_to_ref_coeff=-0.1), "kl_to_ref_coeff"),
        )
    ],
    ("SFT-loss_function", _chat_with(rlloss.SFTLoss, loss_function="dpo"), "loss_function"),
    ("SFT-reduction", _chat_with(rlloss.SFTLoss, reduction="max"), "reduction"),
    ("SFT-kl_to_ref-neg", _chat_with(rlloss.SFTLoss, kl_to_ref_coeff=-1.0), "kl_to_ref_coeff"),
    (
        "SFT-beta-neg",
        _chat_with(rlloss.SFTLoss, loss_function="minor_sft", beta=-1.0),
        r"beta must be in \(0.0, inf\]",
    ),
    (
        "Distillation-kl_direction",
        _chat_with(rlloss.DistillationLoss, kl_direction="sideways"),
        "kl_direction",
    ),
    ("Distillation-reduction", _chat_with(rlloss.DistillationLoss, reduction="avg"), "reduction"),
]


@pytest.mark.parametrize("build, pattern", cases(lambda: CONSTRUCTION))
def test_bad_hyperparameter_at_construction(build, pattern):
    expect_error((ValueError, TypeError), pattern, build)


ASSIGNMENT = [
    (f"{name}-{attr}", name, attr, value)
    for name in GRPO_FAMILY
    for attr, value in (
        ("clip_epsilon_low", 1.5),
        ("clip_epsilon_high", 0.0),
        ("kl_to_ref_coeff", -0.1),
        ("entropy_coeff", math.nan),
    )
]


@pytest.mark.parametrize("name, attr, value", cases(lambda: ASSIGNMENT))
def test_bad_assignment_is_refused_and_changes_nothing(name, attr, value):
    assert_assignment_refused(getattr(rlloss, name)(TokenActor()), attr, value)


@pytest.mark.parametrize("value", [-1.0, 0.0], ids=["SFT-beta-neg", "SFT-beta-0"])
def test_sft_beta_assignment_is_refused(value):
    """MinorSFT's ``-log sigmoid(beta ...)``: beta <= 0 rewards moving away from the data."""
    module, _ = CHAT_SUBJECTS[0].build()
    assert_assignment_refused(module, "beta", value)


# ----------------------------------------------------------------------------- MCAdvantage
def _trajectory(group=0, rewards=(0.0, 1.0)):
    n = len(rewards)
    return TensorDict(
        {
            "group_id": torch.full((n,), group),
            ("next", "reward"): torch.tensor(rewards).reshape(n, 1),
            ("next", "done"): torch.tensor([False] * (n - 1) + [True]).reshape(n, 1),
        },
        [n],
    )


def _advantage(**kwargs):
    return rlloss.MCAdvantage(**{"grpo_size": 2, "prompt_key": "group_id", **kwargs})


@pytest.mark.parametrize("key", ["group_id", ("next", "reward"), ("next", "done")])
def test_mc_advantage_names_a_missing_entry(key):
    adv = _advantage()
    expect_error(
        KeyError,
        rf"['\"]?{key if isinstance(key, str) else key[-1]}",
        lambda: adv.inv(_trajectory().exclude(key)),
    )


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"grpo_size": 0}, "grpo_size"),
        ({"grpo_size": 1.5}, "grpo_size"),
        ({"trajectory_return": "prod"}, "trajectory_return"),
        ({"keep_return_bounds": (0.9, 0.1), "trajectory_return": "sum"}, "increasing"),
    ],
    ids=["grpo_size-0", "grpo_size-1.5", "trajectory_return", "bounds-decreasing"],
)
def test_mc_advantage_bad_keyword(kwargs, pattern):
    expect_error((ValueError, TypeError), pattern, lambda: _advantage(**kwargs))


@pytest.mark.parametrize("scale", [1e18, 1e-30], ids=["large", "tiny"])
def test_mc_advantage_extreme_rewards_give_finite_advantages(scale):
    adv = _advantage(trajectory_return="sum")
    assert adv.inv(_trajectory(0, (0.0, scale))) is None
    out = adv.inv(_trajectory(0, (scale, 2 * scale)))
    assert torch.isfinite(out["advantage"]).all(), out["advantage"]


def test_mc_advantage_equal_returns_give_zero_advantages():
    adv = _advantage(trajectory_return="sum")
    adv.inv(_trajectory(0, (1.0, 1.0)))
    out = adv.inv(_trajectory(0, (2.0, 0.0)))
    torch.testing.assert_close(out["advantage"], torch.zeros_like(out["advantage"]))


def test_mc_advantage_leaves_the_written_trajectory_as_it_was():
    adv = _advantage()
    first, second = _trajectory(0, (0.0, 1.0)), _trajectory(0, (1.0, 1.0))
    before = [first.clone(), second.clone()]
    adv.inv(first)
    adv.inv(second)
    for td, old in zip((first, second), before, strict=True):
        assert set(td.keys(True, True)) == set(old.keys(True, True))
        assert (td == old).all()


@pytest.mark.parametrize(
    "build, pattern",
    [
        (lambda: rlloss.MCAdvantageSelector("best"), "strategy"),
        (
            lambda: rlloss.MCAdvantageSelector().select(
                TensorDict({"return": torch.zeros(3, 2)}, [3]), group_size=2
            ),
            "one scalar per candidate",
        ),
        (
            lambda: rlloss.MCAdvantageSelector().select(
                TensorDict({"return": torch.zeros(3)}, [3]), group_size=4
            ),
            "group_size|candidates",
        ),
    ],
    ids=["strategy", "returns-2d", "group-larger-than-pool"],
)
def test_mc_advantage_selector_bad_input(build, pattern):
    expect_error((ValueError, TypeError), pattern, build)
