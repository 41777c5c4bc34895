"""Bad-input catalogue, issue 49's sweep of later assignments: every value a constructor refuses
is refused when assigned later too (``ValueError`` naming the attribute, the value and the
accepted range or choices; the attribute left as it was), for the value estimators' ``gamma``,
``lmbda`` and V-trace thresholds, ``ValueNormalizer``'s ``eps`` and ``clip_threshold``, the LLM
losses' ``aggregation``, ``masking_strategy``, ``loss_function`` and ``kl_direction``, the
discrete losses' ``action_space``, ``BCLoss.loss_function``, ``KLAdaptiveLR``'s settings, and
the two rules across attributes: KLPEN's ``beta_min <= beta_max`` and DreamerV3's replay value
loss, which needs the model loss's output with its graph (``detach_output=False``)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torchrl.data import Categorical

import rlloss
from tests import test_bad_inputs, test_bad_inputs_llm, test_bad_inputs_new_classes
from tests.test_bad_inputs import assert_assignment_refused, expect_error
from tests.test_dreamer_v3 import composed, learner, real_sequences

BY_NAME = {**test_bad_inputs.BY_NAME, **test_bad_inputs_new_classes.BY_NAME}


def subject(name: str):
    """A valid module of the catalogue's subject ``name``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BY_NAME[name].build()[0]


def value_normalizer():
    return rlloss.ValueNormalizer(eps=1e-8, clip_threshold=5.0)


def grpo(name: str):
    from tests.llm_nets import TokenActor

    return lambda: getattr(rlloss, name)(TokenActor())


def chat(name: str):
    return next(s for s in test_bad_inputs_llm.CHAT_SUBJECTS if s.name == name).build()[0]


def kl_adaptive_lr(**kwargs):
    optimizer = torch.optim.Adam(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    return rlloss.KLAdaptiveLR(optimizer, **kwargs)


ESTIMATORS = ["GAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace"]
GRPO_FAMILY = ["GRPOLoss", "DAPO", "CISPOLoss", "DrGRPOLoss", "GSPOLoss"]
# the losses that keep an action_space attribute (TorchRL's DQNLoss, DiscreteCQLLoss and
# DiscreteSACLoss keep theirs; rlloss's read the action's dtype instead: see below)
ACTION_SPACE_SUBJECTS = ["DistributionalDQNLoss", "DiscreteIQLLoss", "QMixerLoss"]

# (id, build, attribute, value): refused on assignment, the attribute unchanged
ASSIGNMENT = [
    *[(f"{n}-gamma-1.5", lambda n=n: subject(n), "gamma", 1.5) for n in ESTIMATORS],
    *[(f"{n}-gamma-neg", lambda n=n: subject(n), "gamma", -0.1) for n in ESTIMATORS],
    ("MultiAgentGAE-gamma-nan", lambda: subject("MultiAgentGAE"), "gamma", math.nan),
    ("GAE-lmbda-neg", lambda: subject("GAE"), "lmbda", -0.1),
    ("GAE-lmbda-tensor", lambda: subject("GAE"), "lmbda", torch.tensor(2.0)),
    ("MultiAgentGAE-lmbda-2", lambda: subject("MultiAgentGAE"), "lmbda", 2.0),
    ("TDLambda-lmbda-1.5", lambda: subject("TDLambdaEstimator"), "lmbda", 1.5),
    ("TD1-lmbda-2", lambda: subject("TD1Estimator"), "lmbda", 2.0),
    ("VTrace-rho_thresh-0", lambda: subject("VTrace"), "rho_thresh", 0.0),
    ("VTrace-c_thresh-neg", lambda: subject("VTrace"), "c_thresh", -1.0),
    ("ValueNormalizer-eps-neg", value_normalizer, "eps", -1e-3),
    ("ValueNormalizer-clip_threshold-0", value_normalizer, "clip_threshold", 0.0),
    *[(f"{n}-aggregation-mean", grpo(n), "aggregation", "mean") for n in GRPO_FAMILY],
    *[(f"{n}-aggregation-None", grpo(n), "aggregation", None) for n in GRPO_FAMILY[:1]],
    *[(f"{n}-masking_strategy-all", grpo(n), "masking_strategy", "all") for n in GRPO_FAMILY],
    ("SFT-loss_function-dpo", lambda: chat("SFTLoss"), "loss_function", "dpo"),
    ("Distillation-kl_direction-both", lambda: chat("DistillationLoss"), "kl_direction", "both"),
    *[
        (f"{n}-action_space-onehot", lambda n=n: subject(n), "action_space", "onehot")
        for n in ACTION_SPACE_SUBJECTS
    ],
    ("BC-loss_function-huber", lambda: subject("BCLoss"), "loss_function", "huber"),
    ("BC-loss_function-number", lambda: subject("BCLoss"), "loss_function", 2.0),
    ("KLAdaptiveLR-kl_threshold-0", kl_adaptive_lr, "kl_threshold", 0.0),
    ("KLAdaptiveLR-kl_threshold-nan", kl_adaptive_lr, "kl_threshold", math.nan),
    ("KLAdaptiveLR-min_lr-neg", kl_adaptive_lr, "min_lr", -1e-6),
    ("KLAdaptiveLR-min_lr-above-max_lr", kl_adaptive_lr, "min_lr", 1.0),
    ("KLAdaptiveLR-max_lr-below-min_lr", kl_adaptive_lr, "max_lr", 1e-7),
    ("KLAdaptiveLR-kl_factor-1", kl_adaptive_lr, "kl_factor", 1.0),
    ("KLAdaptiveLR-lr_factor-0.5", kl_adaptive_lr, "lr_factor", 0.5),
    (
        "KLAdaptiveLR-torchrl-min_lr-above-max_lr",
        lambda: kl_adaptive_lr(target_kl=0.01, factor=1.5),
        "min_lr",
        0.5,
    ),
]


@pytest.mark.parametrize(
    "build, name, value", [pytest.param(*case[1:], id=case[0]) for case in ASSIGNMENT]
)
def test_bad_assignment_is_refused_and_changes_nothing(build, name, value):
    assert_assignment_refused(build(), name, value)


@pytest.mark.parametrize(
    "build, name, value",
    [
        pytest.param(lambda: subject("GAE"), "gamma", 0.5, id="GAE-gamma"),
        pytest.param(lambda: subject("GAE"), "lmbda", 0.0, id="GAE-lmbda"),
        pytest.param(lambda: subject("VTrace"), "c_thresh", 2.0, id="VTrace-c_thresh"),
        pytest.param(value_normalizer, "clip_threshold", None, id="ValueNormalizer-no-clip"),
        pytest.param(grpo("GRPOLoss"), "aggregation", "prompt_mean", id="GRPO-aggregation"),
        pytest.param(grpo("DAPO"), "masking_strategy", "generic", id="DAPO-masking"),
        pytest.param(lambda: chat("SFTLoss"), "loss_function", "minor_sft", id="SFT"),
        pytest.param(lambda: chat("DistillationLoss"), "kl_direction", "forward", id="Distill"),
        pytest.param(lambda: subject("DQNLoss"), "action_space", "categorical", id="DQN"),
        pytest.param(lambda: subject("QMixerLoss"), "action_space", Categorical(3), id="spec"),
        pytest.param(
            lambda: subject("BCLoss"),
            "loss_function",
            torch.nn.functional.l1_loss,
            id="BC-callable",
        ),
        pytest.param(lambda: subject("BCLoss"), "loss_function", None, id="BC-None"),
        pytest.param(kl_adaptive_lr, "max_lr", 0.5, id="KLAdaptiveLR-max_lr"),
    ],
)
def test_valid_assignment_is_taken(build, name, value):
    module = build()
    setattr(module, name, value)
    assert getattr(module, name) is value or getattr(module, name) == value


@pytest.mark.parametrize("name", ["DQNLoss", "DiscreteCQLLoss", "DiscreteSACLoss"])
def test_action_space_the_loss_does_not_keep_is_refused_as_at_construction(name):
    """The keyword is checked at construction and not stored (the action's dtype decides): a
    later assignment is held to the constructor's choices too, not stored silently."""
    module = subject(name)
    expect_error(ValueError, "action_space must be one of", _set(module, "action_space", "onehot"))
    assert "action_space" not in vars(module)


def test_estimator_assignment_changes_the_targets():
    """The assigned value is the one the estimator computes with (stored, not shadowed)."""
    module, batch = test_bad_inputs.BY_NAME["TD0Estimator"].build()
    first = module(batch.clone())["value_target"]
    module.gamma = 0.5
    second = module(batch.clone())["value_target"]
    assert not torch.allclose(first, second)


# --------------------------------------------------------------- rules across two attributes
def klpen(beta_min=0.1, beta_max=1.0):
    module = subject("KLPENPPOLoss")
    module.beta_max, module.beta_min = beta_max, beta_min
    return module


def test_klpen_beta_bounds_stay_ordered_on_assignment():
    expect_error(
        ValueError, r"beta_min must be <= beta_max \(1.0\), got 2.0", _set(klpen(), "beta_min", 2.0)
    )
    expect_error(
        ValueError,
        r"beta_max must be >= beta_min \(0.1\), got 0.05",
        _set(klpen(), "beta_max", 0.05),
    )
    module = klpen()
    assert_assignment_refused(module, "beta_min", 2.0)
    assert_assignment_refused(module, "beta_max", 0.05)
    module.beta_max, module.beta_min = 5.0, 2.0  # the upper bound first: both moved
    assert (module.beta_min, module.beta_max) == (2.0, 5.0)
    module.beta_max = None  # unbounded: any lower bound
    module.beta_min = 9.0
    assert module.beta_min == 9.0


def test_kl_adaptive_lr_bounds_message_names_both():
    expect_error(
        ValueError,
        r"min_lr must be <= max_lr \(0.01\), got 1.0: assign max_lr first",
        _set(kl_adaptive_lr(), "min_lr", 1.0),
    )


def _set(module, name, value):
    return lambda: setattr(module, name, value)


def dreamer_v3(weight: float):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return composed(rlloss, learner(), replay_value_loss_weight=weight)


def test_dreamer_v3_replay_weight_needs_the_model_output_on_assignment():
    loss = dreamer_v3(0.0)
    loss.model_loss.detach_output = True
    expect_error(
        ValueError,
        r"replay_value_loss_weight must be 0 while model_loss.detach_output is True, got 0.3.*"
        r"detach_output=False",
        _set(loss, "replay_value_loss_weight", 0.3),
    )
    assert loss.replay_value_loss_weight == 0.0
    loss.replay_value_loss_weight = 0.0  # zero is always accepted
    loss.model_loss.detach_output = False
    loss.replay_value_loss_weight = 0.3
    assert loss.replay_value_loss_weight == 0.3


def test_dreamer_v3_detached_model_output_with_a_replay_weight_is_refused_at_the_call():
    """``detach_output`` is the model loss's: set there after construction, the composed loss
    refuses it at its next call (a Python setting: no tensor read)."""
    loss = dreamer_v3(0.3)
    loss.model_loss.detach_output = True
    expect_error(
        ValueError,
        "replay_value_loss_weight must be 0 while model_loss.detach_output is True",
        lambda: loss(real_sequences()),
    )
