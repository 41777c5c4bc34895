"""Bad inputs, catalogued for the classes added since the first catalogue (issues 35-38): the
imitation losses, GAIL, RND, the multi-agent losses, the world-model and Dreamer losses and
PILCO's cost. The LLM family has its rows in ``test_bad_inputs_llm.py`` on this file's
machinery.

Every subject is declared once (a module with a valid batch, the entries it reads, its action
and its padding); the checks below run over every subject: each entry's absence is named, an
action of another size or dtype is explained, NaN/inf in padded steps reaches no output and no
gradient, extreme but valid inputs give finite outputs and gradients, a state dict saved and
loaded into a fresh module gives the same outputs, and a call leaves the caller's batch as it
was. Bad constructor values and later assignments are listed per class.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from tensordict import TensorDict, TensorDictBase, is_tensorclass
from tensordict.nn import TensorDictModule
from torch import nn

import rlloss
from tests import (
    nets,
    test_act,
    test_bc,
    test_diffusion_bc,
    test_dreamer,
    test_dreamer_v3,
    test_dt,
    test_gail,
    test_mappo,
    test_pilco,
    test_qmixer,
    test_rnd,
    test_world_model,
)
from tests.test_bad_inputs import assert_assignment_refused, assert_finite, expect_error

MASK = ("collector", "mask")


# ----------------------------------------------------------------------------- subjects
@dataclass
class Pad:
    """Where a subject's batch marks padding: ``mask_key`` holds ``make(batch)``'s first
    tensor; the second marks (over the leading dims of ``keys``' entries) the padded elements."""

    keys: list
    mask_key: object = MASK
    make: Callable | None = None  # batch -> (stored mask, padded-elements index)


@dataclass
class Subject:
    """A module of one public class with a valid batch, and what its batch holds."""

    name: str
    build: Callable[[], tuple[nn.Module, TensorDictBase]]
    inputs: list  # entries the module reads (each one's absence must be named)
    action: object = None  # the action entry, or None
    action_size: int | None = None  # trailing size of the action, None: not checked
    pad: Pad | None = None
    extreme: Callable | None = None  # batch -> a batch of extreme but valid values
    missing_error: tuple = (KeyError,)
    shared_state: Callable | None = None  # (module, fresh): state held by another loss


def _trailing_pad(batch: TensorDictBase, steps: int = 2):
    """``("collector", "mask")`` leaving out the last ``steps`` of the last batch dim."""
    valid = torch.ones(batch.shape, dtype=torch.bool)
    valid[..., -steps:] = False
    return valid, ~valid


def _chunk_pad(batch: TensorDictBase):
    """``action_is_pad`` over ``[B, CHUNK]``: the last step of every chunk, and more in row 0."""
    pad = torch.zeros(*batch.shape, test_bc.CHUNK, dtype=torch.bool)
    pad[..., -1] = True
    pad[0, 1:] = True
    return pad, pad


def _chunk_loss():
    return test_bc.chunk_loss(), test_bc.chunks()


def _act():
    loss = rlloss.ACTLoss(test_act.policy())
    loss.set_keys(pad_mask="action_is_pad")
    return loss, test_act.chunks()


def _mappo(cls):
    def build():
        actor, critic = test_mappo.actor(), test_mappo.critic()
        loss = getattr(rlloss, cls)(actor, critic)
        loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
        return loss, test_mappo.batch_with_advantage(actor)

    return build


def _qmixer():
    loss = rlloss.QMixerLoss(test_qmixer.local_q("categorical"), test_qmixer.mixer("qmix"))
    return loss, test_qmixer.team_batch("categorical")


def _trajectories():
    return test_dt.trajectories()


def _dreamer_model():
    return rlloss.DreamerModelLoss(test_dreamer.world_model()), test_dreamer.sequences()


def _dreamer_actor():
    loss = rlloss.DreamerActorLoss(
        test_dreamer.actor(), test_dreamer.value_network(), test_dreamer.imagination_env()
    )
    return loss, test_dreamer.starts()


def _same_value_model(module, fresh):
    """An actor loss reads the critic the value loss trains (in the value loss's state dict,
    not the actor loss's, as in TorchRL)."""
    fresh.value_model.load_state_dict(module.value_model.state_dict())


def _dreamer_value():
    batch = test_dreamer.starts()
    batch["lambda_target"] = torch.randn(*batch.shape, 1)
    return rlloss.DreamerValueLoss(test_dreamer.value_network()), batch


def _v3_model():
    ours, _ = test_dreamer_v3.model_pair()
    return ours, test_dreamer_v3.sequences()


def _v3_value():
    return rlloss.DreamerV3ValueLoss(test_dreamer_v3.value_network()), test_dreamer_v3.imagined()


def _v3_actor():
    loss = rlloss.DreamerV3ActorLoss(
        test_dreamer_v3.tanh_normal_actor(True),
        test_dreamer_v3.value_network(),
        test_dreamer_v3.imagination_env(),
        imagination_horizon=test_dreamer_v3.HORIZON,
    )
    return loss, test_dreamer_v3.starts()


def _v3_composed():
    return (
        test_dreamer_v3.composed(rlloss, test_dreamer_v3.learner()),
        test_dreamer_v3.real_sequences(),
    )


def _world_model():
    return rlloss.WorldModelLoss(test_world_model.world_model()), test_world_model.transitions()


def _pilco():
    td, _, _ = test_pilco.gaussian_states((6,))
    return rlloss.ExponentialQuadraticCost(), td.apply(lambda x: x.detach())


def _scaled(keys, factor=1e3):
    def extreme(batch):
        for key in keys:
            batch.set(key, batch.get(key) * factor)
        return batch

    return extreme


def _at_bounds(key, *others):
    """The action at its bounds, exactly (a tanh-squashed policy's hardest valid target)."""

    def extreme(batch):
        action = batch.get(key)
        batch.set(key, torch.where(action > 0, 1.0, -1.0).to(action.dtype))
        return _scaled(others)(batch)

    return extreme


def _scaled_subject(name, build, inputs, factor=1e3, **kwargs) -> Subject:
    """A subject whose extreme batch has every input but the action ``factor`` times larger."""
    scaled = [key for key in inputs if key != kwargs.get("action")]
    return Subject(name, build, inputs, extreme=_scaled(scaled, factor), **kwargs)


def _pilco_extreme(batch):
    """A mean far from the target and a near-singular covariance."""
    batch["observation", "mean"] = batch["observation", "mean"] * 1e3
    batch["observation", "var"] = batch["observation", "var"] * 1e-6
    return batch


NEXT_OBS = ("next", "observation")
BC_ACT = test_bc.ACT
SUBJECTS = [
    Subject(
        "BCLoss",
        lambda: (rlloss.BCLoss(test_bc.deterministic_actor()), test_bc.demonstrations()),
        ["observation", "action"],
        "action",
        BC_ACT,
        Pad(["observation", "action"], make=_trailing_pad),
        _scaled(["observation", "action"]),
    ),
    Subject(
        "BCLoss-stochastic",
        lambda: (rlloss.BCLoss(nets.make_actor("normal")), test_bc.demonstrations()),
        ["observation", "action"],
        "action",
        BC_ACT,
        Pad(["observation", "action"], make=_trailing_pad),
        _scaled(["observation"]),
    ),
    Subject(
        "BCLoss-chunks",
        _chunk_loss,
        ["observation", ("vla_action", "chunk")],
        ("vla_action", "chunk"),
        BC_ACT,
        Pad([("vla_action", "chunk")], "action_is_pad", _chunk_pad),
        _scaled(["observation", ("vla_action", "chunk")]),
    ),
    Subject(
        "DiffusionBCLoss",
        lambda: (
            rlloss.DiffusionBCLoss(test_diffusion_bc.actor()),
            test_diffusion_bc.demonstrations(),
        ),
        ["observation", "action"],
        "action",
        test_diffusion_bc.ACT,
        Pad(["observation", "action"], make=_trailing_pad),
        _scaled(["observation", "action"]),
    ),
    Subject(
        "ACTLoss",
        _act,
        ["observation", ("vla_action", "chunk")],
        ("vla_action", "chunk"),
        test_act.ACT,
        Pad([("vla_action", "chunk")], "action_is_pad", _chunk_pad),
        # 30x: beyond, the CVAE's own log-variance overflows exp (the policy's, not the loss's)
        _scaled(["observation", ("vla_action", "chunk")], 30.0),
    ),
    Subject(
        "GAILLoss",
        lambda: (rlloss.GAILLoss(test_gail.discriminator()), test_gail.pairs()),
        ["observation", "action", "collector_observation", "collector_action"],
        "action",
        test_gail.ACT,
        Pad(
            ["observation", "action", "collector_observation", "collector_action"],
            make=_trailing_pad,
        ),
        _scaled(["observation", "collector_observation"]),
    ),
    *[
        Subject(
            name,
            build,
            ["context", "action"],
            "action",
            test_dt.ACT,
            Pad(["context", "action"], make=_trailing_pad),
            _at_bounds("action", "context"),
        )
        for name, build in (
            ("DTLoss", lambda: (rlloss.DTLoss(test_dt.deterministic_actor()), _trajectories())),
            (
                "DTLoss-regression",
                lambda: (rlloss.DTLoss(test_dt.regression_actor()), _trajectories()),
            ),
            (
                "OnlineDTLoss",
                lambda: (rlloss.OnlineDTLoss(test_dt.stochastic_actor()), _trajectories()),
            ),
        )
    ],
    Subject(
        "RNDLoss",
        lambda: (rlloss.RNDLoss(*test_rnd.networks()), test_rnd.visited((8,))),
        [NEXT_OBS],
        pad=Pad([NEXT_OBS], make=_trailing_pad),
        extreme=_scaled([NEXT_OBS], 1e4),
    ),
    *[
        Subject(
            name,
            _mappo(name),
            [("agents", "observation"), ("agents", "action"), ("agents", "action_log_prob")],
            ("agents", "action"),
            test_mappo.ACT,
            Pad(
                [
                    ("agents", "observation"),
                    ("agents", "action"),
                    ("agents", "action_log_prob"),
                    "advantage",
                    "value_target",
                ],
                make=_trailing_pad,
            ),
            _scaled([("agents", "observation"), "advantage", "value_target"]),
        )
        for name in ("MAPPOLoss", "IPPOLoss")
    ],
    Subject(
        "QMixerLoss",
        _qmixer,
        [
            ("agents", "observation"),
            "state",
            ("agents", "action"),
            ("next", "agents", "observation"),
            ("next", "state"),
            ("next", "reward"),
            ("next", "terminated"),
        ],
        ("agents", "action"),
        None,
        None,
        _scaled([("agents", "observation"), ("next", "reward"), "state"]),
    ),
    _scaled_subject(
        "DreamerModelLoss",
        _dreamer_model,
        ["state", "belief", ("next", "pixels"), ("next", "reward")],
    ),
    _scaled_subject(
        "DreamerActorLoss", _dreamer_actor, ["state", "belief"], 1e2, shared_state=_same_value_model
    ),
    _scaled_subject("DreamerValueLoss", _dreamer_value, ["state", "belief", "lambda_target"]),
    _scaled_subject(
        "DreamerV3ModelLoss",
        _v3_model,
        ["state", "belief", ("next", "observation"), ("next", "reward")],
    ),
    _scaled_subject("DreamerV3ValueLoss", _v3_value, ["state", "belief", "lambda_target"]),
    _scaled_subject(
        "DreamerV3ActorLoss", _v3_actor, ["state", "belief"], 1e2, shared_state=_same_value_model
    ),
    _scaled_subject(
        "DreamerV3Loss",
        _v3_composed,
        [("next", "observation"), ("next", "reward"), "action"],
        action="action",
        action_size=test_dreamer_v3.ACTION,
    ),
    _scaled_subject(
        "WorldModelLoss",
        _world_model,
        ["observation", "action", ("next", "reward")],
        action="action",
        action_size=test_world_model.ACTION,
    ),
    Subject(
        "ExponentialQuadraticCost",
        _pilco,
        [("observation", "mean"), ("observation", "var")],
        extreme=_pilco_extreme,
    ),
]
BY_NAME = {s.name: s for s in SUBJECTS}


# ----------------------------------------------------------------------------- running
def outputs(out) -> TensorDictBase:
    """A call's outputs as one TensorDict (the Dreamer losses return ``(losses, data)``; the
    LLM losses a tensorclass)."""
    if isinstance(out, tuple):
        out = out[0]
    if is_tensorclass(out):
        out = TensorDict(
            {k: v for k, v in out.to_dict().items() if isinstance(v, torch.Tensor)}, []
        )
    if isinstance(out, torch.Tensor):
        out = TensorDict({"loss": out}, [])
    return out


def loss_terms(out: TensorDictBase) -> list[torch.Tensor]:
    return [
        value
        for key, value in out.items(True, True)
        if (key if isinstance(key, str) else key[-1]).startswith("loss")
        and isinstance(value, torch.Tensor)
        and value.is_floating_point()
    ]


def run(module: nn.Module, batch) -> TensorDictBase:
    """The module's outputs on ``batch``, its summed ``loss*`` entries backpropagated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = outputs(module(batch))
        module.zero_grad()
        total = sum(term.sum() for term in loss_terms(out) if term.requires_grad)
        if isinstance(total, torch.Tensor):
            total.backward()
    return out


def key_pattern(key) -> str:
    """The entry's name quoted (``'state'``, or tensordict's ``key "state" not found``)."""
    name = re.escape(key if isinstance(key, str) else key[-1])
    return rf"['\"]{name}['\"]"


def cases(fn):
    return [pytest.param(*args, id=ident) for ident, *args in fn()]


def each(subjects):
    return [pytest.param(s, id=s.name) for s in subjects]


def seeded_run(module, batch, seed=0):
    torch.manual_seed(seed)
    return run(module, batch)


# ----------------------------------------------------------------------------- the checks
def missing_key_cases(subjects):
    for subject in subjects:
        for key in subject.inputs:
            yield f"{subject.name}-{key}", subject, key


def check_missing_entry(subject, key, bare=False):
    """``bare``: the name may stand unquoted (TorchRL's LLM losses' messages)."""
    module, batch = subject.build()
    batch = batch.exclude(key)
    if key == ("next", "terminated"):
        batch = batch.exclude(("next", "done"))  # without either (done alone is a fallback)
    pattern = re.escape(str(key if isinstance(key, str) else key[-1])) if bare else key_pattern(key)
    expect_error(subject.missing_error, pattern, lambda: module(batch))


def action_cases(subjects):
    for subject in subjects:
        if subject.action is None:
            continue
        if subject.action_size is not None:
            yield f"{subject.name}-action-size", subject, "size"
        yield f"{subject.name}-action-dtype", subject, "dtype"


def check_bad_action(subject, problem):
    module, batch = subject.build()
    action = batch.get(subject.action)
    name = subject.action if isinstance(subject.action, str) else subject.action[-1]
    if problem == "size":
        bad = torch.zeros(*action.shape[:-1], 2 * subject.action_size, dtype=action.dtype)
        pattern = rf"{name}.*\b{2 * subject.action_size}\b"
    elif action.is_floating_point():
        bad, pattern = action.double(), rf"{name}.*float64"
    else:
        bad, pattern = action.float(), rf"{name}.*float32"
    batch.set(subject.action, bad)
    expect_error((ValueError, TypeError), pattern, lambda: module(batch))


def padding_cases(subjects):
    for subject in subjects:
        if subject.pad is None:
            continue
        for key in subject.pad.keys:
            for value in (math.nan, math.inf):
                yield f"{subject.name}-{key}-{value}", subject, key, value


def pad(subject, batch, key, value):
    stored, padded = subject.pad.make(batch)
    batch.set(subject.pad.mask_key, stored)
    entry = batch.get(key).clone()
    entry[padded] = value
    batch.set(key, entry)


def check_padding(subject, key, value):
    module, batch = subject.build()
    pad(subject, batch, key, value)
    assert_finite(module, seeded_run(module, batch))


def check_extreme(subject):
    module, batch = subject.build()
    assert_finite(module, seeded_run(module, subject.extreme(batch)))


def check_state_round_trip(subject):
    """A fresh module (other initial weights) loading the state dict gives the same outputs."""
    torch.manual_seed(0)
    module, batch = subject.build()
    seeded_run(module, batch.clone())  # a call moves running statistics, when there are any
    torch.manual_seed(1)
    fresh, _ = subject.build()
    fresh.load_state_dict(copy.deepcopy(module.state_dict()))
    if subject.shared_state is not None:
        subject.shared_state(module, fresh)
    expected, out = seeded_run(module, batch.clone(), 2), seeded_run(fresh, batch.clone(), 2)
    for key, value in expected.items(True, True):
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(out.get(key), value, msg=lambda m, k=key: f"{k}: {m}")


def assert_same_batch(batch, before) -> None:
    """Nothing changed, nothing removed; a replay loss's ``td_error`` (the priorities, TorchRL's
    documented write) is the one entry added."""
    keys, expected = set(batch.keys(True, True)) - {"td_error"}, set(before.keys(True, True))
    assert keys == expected, f"entries added {keys - expected}, removed {expected - keys}"
    for key in expected:
        value, old = batch.get(key), before.get(key)
        if isinstance(old, torch.Tensor):
            assert torch.equal(value, old) or torch.allclose(
                value, old, rtol=0, atol=0, equal_nan=True
            ), f"entry {key!r} changed"


def check_no_mutation(subject, padded=False):
    module, batch = subject.build()
    if padded:
        pad(subject, batch, subject.pad.keys[0], math.nan)
    before = batch.clone()
    seeded_run(module, batch)
    assert_same_batch(batch, before)


@pytest.mark.parametrize("subject, key", cases(lambda: missing_key_cases(SUBJECTS)))
def test_missing_entry_is_named(subject, key):
    check_missing_entry(subject, key)


@pytest.mark.parametrize("subject, problem", cases(lambda: action_cases(SUBJECTS)))
def test_action_of_another_size_or_dtype_is_explained(subject, problem):
    check_bad_action(subject, problem)


@pytest.mark.parametrize(
    "space, pattern",
    [("categorical", r"\[0, 4\)"), ("one_hot", r"shape \(8, 3, 6\).*one-hot action \(8, 3, 4\)")],
)
def test_qmixer_action_out_of_range_or_of_another_size_is_explained(space, pattern):
    module = rlloss.QMixerLoss(test_qmixer.local_q(space), test_qmixer.mixer("qmix"))
    batch = test_qmixer.team_batch(space)
    action = batch["agents", "action"]
    if space == "categorical":
        batch["agents", "action"] = torch.full_like(action, test_qmixer.ACTIONS + 3)
    else:
        batch["agents", "action"] = torch.zeros(*action.shape[:-1], 6, dtype=action.dtype)
    expect_error(ValueError, pattern, lambda: module(batch))


@pytest.mark.parametrize("subject, key, value", cases(lambda: padding_cases(SUBJECTS)))
def test_non_finite_padding_reaches_no_output_and_no_gradient(subject, key, value):
    check_padding(subject, key, value)


@pytest.mark.parametrize("subject", each(s for s in SUBJECTS if s.extreme))
def test_extreme_valid_inputs_give_finite_outputs_and_gradients(subject):
    check_extreme(subject)


@pytest.mark.parametrize("subject", each(SUBJECTS))
def test_state_dict_round_trip_gives_the_same_outputs(subject):
    check_state_round_trip(subject)


def mutation_cases(subjects):
    for subject in subjects:
        yield subject.name, subject, False
        if subject.pad is not None:
            yield f"{subject.name}-padded", subject, True


@pytest.mark.parametrize("subject, padded", cases(lambda: mutation_cases(SUBJECTS)))
def test_the_callers_batch_is_left_as_it_was(subject, padded):
    check_no_mutation(subject, padded)


# ----------------------------------------------------------------------------- hyperparameters
def _with(build, **kwargs):
    return lambda: build(**kwargs)


def _bc(**kwargs):
    return rlloss.BCLoss(test_bc.deterministic_actor(), **kwargs)


def _gail(**kwargs):
    return rlloss.GAILLoss(test_gail.discriminator(), **kwargs)


def _dt(**kwargs):
    return rlloss.DTLoss(test_dt.deterministic_actor(), **kwargs)


def _odt_with(**kwargs):
    return rlloss.OnlineDTLoss(test_dt.stochastic_actor(), **kwargs)


def _rnd(**kwargs):
    return rlloss.RNDLoss(*test_rnd.networks(), **kwargs)


def _mappo_with(**kwargs):
    return rlloss.MAPPOLoss(test_mappo.actor(), test_mappo.critic(), **kwargs)


def _qmixer_with(**kwargs):
    q, m = test_qmixer.local_q("categorical"), test_qmixer.mixer("qmix")
    return rlloss.QMixerLoss(q, m, **kwargs)


def _dreamer_model_with(**kwargs):
    return rlloss.DreamerModelLoss(test_dreamer.world_model(), **kwargs)


def _v3_model_with(**kwargs):
    return rlloss.DreamerV3ModelLoss(test_dreamer_v3.TinyWorldModel(), **kwargs)


def _v3_actor_with(**kwargs):
    return rlloss.DreamerV3ActorLoss(
        test_dreamer_v3.tanh_normal_actor(True),
        test_dreamer_v3.value_network(),
        test_dreamer_v3.imagination_env(),
        **kwargs,
    )


def _dreamer_actor_with(**kwargs):
    return rlloss.DreamerActorLoss(
        test_dreamer.actor(),
        test_dreamer.value_network(),
        test_dreamer.imagination_env(),
        **kwargs,
    )


def _world_model_with(**kwargs):
    return rlloss.WorldModelLoss(test_world_model.world_model(), **kwargs)


CONSTRUCTION = [
    ("BC-loss_function", _with(_bc, loss_function="huber"), "loss_function"),
    ("BC-reduction", _with(_bc, reduction="avg"), "reduction"),
    ("BC-actor-not-a-module", lambda: rlloss.BCLoss(lambda x: x), "actor_network|module"),
    (
        "DiffusionBC-reduction",
        lambda: rlloss.DiffusionBCLoss(test_diffusion_bc.actor(), reduction="max"),
        "reduction",
    ),
    ("ACT-kl_weight-neg", lambda: rlloss.ACTLoss(test_act.policy(), kl_weight=-1.0), "kl_weight"),
    ("ACT-reduction", lambda: rlloss.ACTLoss(test_act.policy(), reduction="avg"), "reduction"),
    ("GAIL-gp_lambda-neg", _with(_gail, gp_lambda=-1.0), "gp_lambda"),
    ("GAIL-gp_lambda-nan", _with(_gail, gp_lambda=math.nan), "gp_lambda.*nan"),
    ("GAIL-reduction", _with(_gail, reduction="avg"), "reduction"),
    ("DT-loss_function", _with(_dt, loss_function="huber"), "loss_function"),
    ("DT-reduction", _with(_dt, reduction="avg"), "reduction"),
    ("OnlineDT-alpha_init-0", _with(_odt_with, alpha_init=0.0), "alpha_init"),
    ("OnlineDT-alpha_init-neg", _with(_odt_with, alpha_init=-1.0), "alpha_init"),
    ("OnlineDT-min_alpha-neg", _with(_odt_with, min_alpha=-0.1), "min_alpha"),
    ("OnlineDT-max-below-min", _with(_odt_with, min_alpha=0.5, max_alpha=0.2), "max_alpha"),
    ("OnlineDT-samples-0", _with(_odt_with, samples_mc_entropy=0), "samples_mc_entropy"),
    ("OnlineDT-reduction", _with(_odt_with, reduction="avg"), "reduction"),
    ("RND-update_fraction-1.5", _with(_rnd, update_fraction=1.5), "update_fraction"),
    ("RND-update_fraction-neg", _with(_rnd, update_fraction=-0.1), "update_fraction"),
    ("RND-reduction", _with(_rnd, reduction="avg"), "reduction"),
    (
        "RND-target-not-a-module",
        lambda: rlloss.RNDLoss(test_rnd.networks()[0], lambda x: x),
        "target_network",
    ),
    ("MAPPO-clip_epsilon-0", _with(_mappo_with, clip_epsilon=0.0), "clip_epsilon"),
    ("MAPPO-entropy_coeff-neg", _with(_mappo_with, entropy_coeff=-0.1), "entropy_coeff"),
    ("MAPPO-critic_coeff-neg", _with(_mappo_with, critic_coeff=-1.0), "critic_coeff"),
    (
        "IPPO-clip_epsilon-1",
        lambda: rlloss.IPPOLoss(test_mappo.actor(), test_mappo.critic(), clip_epsilon=1.0),
        "clip_epsilon",
    ),
    ("QMixer-gamma-1.5", _with(_qmixer_with, gamma=1.5), "gamma"),
    ("QMixer-gamma-neg", _with(_qmixer_with, gamma=-0.1), "gamma"),
    ("QMixer-loss_function", _with(_qmixer_with, loss_function="huber"), "loss_function"),
    ("QMixer-action_space", _with(_qmixer_with, action_space="continuous"), "action_space"),
    ("DreamerModel-reco_loss", _with(_dreamer_model_with, reco_loss="l3"), "reco_loss"),
    ("DreamerModel-lambda_kl-neg", _with(_dreamer_model_with, lambda_kl=-1.0), "lambda_kl"),
    (
        "DreamerModel-lambda_reward-nan",
        _with(_dreamer_model_with, lambda_reward=math.nan),
        "lambda_reward",
    ),
    (
        "DreamerActor-gamma-keyword",
        _with(_dreamer_actor_with, gamma=0.9),
        "make_value_estimator",
    ),
    (
        "DreamerValue-value_loss",
        lambda: rlloss.DreamerValueLoss(test_dreamer.value_network(), value_loss="huber"),
        "value_loss",
    ),
    ("DreamerV3Model-kl_mode", _with(_v3_model_with, kl_mode="mixed"), "kl_mode"),
    ("DreamerV3Model-lambda_reco-neg", _with(_v3_model_with, lambda_reco=-1.0), "lambda_reco"),
    (
        "DreamerV3Model-continue_target_scale",
        _with(_v3_model_with, continue_target_scale=1.5),
        "continue_target_scale",
    ),
    (
        "DreamerV3Value-value_loss",
        lambda: rlloss.DreamerV3ValueLoss(test_dreamer_v3.value_network(), value_loss="mse"),
        "value_loss",
    ),
    (
        "DreamerV3Value-slow-neg",
        lambda: rlloss.DreamerV3ValueLoss(
            test_dreamer_v3.value_network(), slow_critic_regularization=-1.0
        ),
        "slow_critic_regularization|non-negative",
    ),
    (
        "DreamerV3Actor-quantiles",
        _with(_v3_actor_with, return_normalization_quantiles=(0.9, 0.1)),
        "quantiles",
    ),
    (
        "DreamerV3Actor-horizon-0",
        _with(_v3_actor_with, imagination_horizon=0),
        "imagination_horizon",
    ),
    (
        "DreamerV3Actor-entropy_bonus-neg",
        _with(_v3_actor_with, entropy_bonus=-0.1),
        "entropy_bonus",
    ),
    ("WorldModel-losses", _with(_world_model_with, losses=["kl"]), "Unknown loss type|losses"),
    ("WorldModel-reward_loss", _with(_world_model_with, reward_loss="l4"), "reward_loss"),
    ("WorldModel-done_weight-neg", _with(_world_model_with, done_weight=-1.0), "done_weight"),
    (
        "PILCO-reduction",
        lambda: rlloss.ExponentialQuadraticCost(reduction="max"),
        "reduction",
    ),
    (
        "PILCO-target-2d",
        lambda: rlloss.ExponentialQuadraticCost(target=torch.zeros(2, 2)),
        "1-D tensor",
    ),
    (
        "PILCO-weights-not-square",
        lambda: rlloss.ExponentialQuadraticCost(weights=torch.zeros(2, 3)),
        "square matrix",
    ),
    # issue 49: values our own estimators refuse, NaN, ranges of later-assignable attributes
    ("RND-obs_clip-neg", _with(_rnd, obs_clip=-1.0), r"obs_clip must be in \(0.0, inf\]"),
    ("OnlineDT-target_entropy-nan", _with(_odt_with, target_entropy=math.nan), "target_entropy"),
    ("OnlineDT-target_entropy-inf", _with(_odt_with, target_entropy=-math.inf), "finite"),
    (
        "DreamerValue-gamma-neg",
        lambda: rlloss.DreamerValueLoss(test_dreamer.value_network(), gamma=-1.0),
        r"gamma must be in \[0.0, 1.0\], got -1.0",
    ),
    (
        "DreamerV3Value-gamma-1.5",
        lambda: rlloss.DreamerV3ValueLoss(test_dreamer_v3.value_network(), gamma=1.5),
        r"gamma must be in \[0.0, 1.0\], got 1.5",
    ),
    (
        "DreamerV3-lmbda-2",
        lambda: test_dreamer_v3.composed(rlloss, test_dreamer_v3.learner(), lmbda=2.0),
        r"lmbda must be in \[0.0, 1.0\], got 2.0",
    ),
    (
        "DreamerV3-replay_value_loss_weight-neg",
        lambda: test_dreamer_v3.composed(
            rlloss, test_dreamer_v3.learner(), replay_value_loss_weight=-1.0
        ),
        "replay_value_loss_weight must be non-negative",
    ),
    (
        "DreamerV3Model-kl_alpha-1.5",
        _with(_v3_model_with, kl_alpha=1.5),
        r"kl_alpha must be in \[0.0, 1.0\], got 1.5",
    ),
    ("DreamerV3Model-unimix-1", _with(_v3_model_with, unimix=1.0), "unimix must be in"),
    (
        "PILCO-weights-negative-definite",
        lambda: rlloss.ExponentialQuadraticCost(weights=-torch.eye(3)),
        "positive semi-definite.*smallest eigenvalue is -1",
    ),
    (
        "PILCO-weights-indefinite",
        lambda: rlloss.ExponentialQuadraticCost(weights=torch.diag(torch.tensor([1.0, -0.5]))),
        "positive semi-definite.*smallest eigenvalue is -0.5",
    ),
    (
        "PILCO-weights-not-symmetric",
        lambda: rlloss.ExponentialQuadraticCost(weights=torch.tensor([[1.0, 1.0], [0.0, 1.0]])),
        "not symmetric",
    ),
]


@pytest.mark.parametrize("build, pattern", cases(lambda: CONSTRUCTION))
def test_bad_hyperparameter_at_construction(build, pattern):
    expect_error((ValueError, TypeError), pattern, build)


ASSIGNMENT = [
    ("ACT-kl_weight-neg", "ACTLoss", "kl_weight", -1.0),
    ("ACT-kl_weight-nan", "ACTLoss", "kl_weight", math.nan),
    ("GAIL-gp_lambda-neg", "GAILLoss", "gp_lambda", -0.5),
    ("RND-update_fraction-2", "RNDLoss", "update_fraction", 2.0),
    ("MAPPO-clip_epsilon-1.5", "MAPPOLoss", "clip_epsilon", 1.5),
    ("MAPPO-entropy_coeff-neg", "MAPPOLoss", "entropy_coeff", -0.1),
    ("IPPO-critic_coeff-neg", "IPPOLoss", "critic_coeff", -1.0),
    ("QMixer-gamma-1.1", "QMixerLoss", "gamma", 1.1),
    ("DreamerModel-lambda_kl-neg", "DreamerModelLoss", "lambda_kl", -1.0),
    ("DreamerV3Model-lambda_reward-neg", "DreamerV3ModelLoss", "lambda_reward", -1.0),
    ("WorldModel-reward_weight-neg", "WorldModelLoss", "reward_weight", -1.0),
    ("DreamerV3Actor-entropy_bonus-neg", "DreamerV3ActorLoss", "entropy_bonus", -0.1),
    # issue 49: refused at construction, and now on assignment as well
    ("RND-obs_clip-neg", "RNDLoss", "obs_clip", -1.0),
    ("OnlineDT-samples_mc_entropy-0", "OnlineDTLoss", "samples_mc_entropy", 0),
    ("OnlineDT-samples_mc_entropy-1.5", "OnlineDTLoss", "samples_mc_entropy", 1.5),
    ("OnlineDT-target_entropy-nan", "OnlineDTLoss", "target_entropy", math.nan),
    ("DreamerActor-imagination_horizon-0", "DreamerActorLoss", "imagination_horizon", 0),
    ("DreamerV3Actor-imagination_horizon-0", "DreamerV3ActorLoss", "imagination_horizon", 0),
    ("DreamerValue-gamma-neg", "DreamerValueLoss", "gamma", -1.0),
    ("DreamerV3Value-gamma-1.5", "DreamerV3ValueLoss", "gamma", 1.5),
    (
        "DreamerV3Value-slow_critic_regularization-neg",
        "DreamerV3ValueLoss",
        "slow_critic_regularization",
        -1.0,
    ),
    ("DreamerV3-replay_value_loss_weight-neg", "DreamerV3Loss", "replay_value_loss_weight", -1.0),
    ("DreamerV3-lmbda-2", "DreamerV3Loss", "lmbda", 2.0),
    ("DreamerV3-continuation_horizon-0.5", "DreamerV3Loss", "continuation_horizon", 0.5),
    ("DreamerV3Model-kl_alpha-1.5", "DreamerV3ModelLoss", "kl_alpha", 1.5),
    ("DreamerV3Model-unimix-1", "DreamerV3ModelLoss", "unimix", 1.0),
    ("DreamerV3Model-continue_target_scale-0", "DreamerV3ModelLoss", "continue_target_scale", 0.0),
    ("PILCO-weights-negative-definite", "ExponentialQuadraticCost", "weights", -torch.eye(4)),
    # string settings: the constructor's choices hold for a later assignment too
    ("BC-reduction-avg", "BCLoss", "reduction", "avg"),
    ("DT-loss_function-huber", "DTLoss", "loss_function", "huber"),
    ("MAPPO-loss_critic_type-huber", "MAPPOLoss", "loss_critic_type", "huber"),
    ("QMixer-loss_function-huber", "QMixerLoss", "loss_function", "huber"),
    ("DreamerModel-reco_loss-l3", "DreamerModelLoss", "reco_loss", "l3"),
    ("DreamerValue-value_loss-huber", "DreamerValueLoss", "value_loss", "huber"),
    ("DreamerV3Model-kl_mode-mixed", "DreamerV3ModelLoss", "kl_mode", "mixed"),
    ("DreamerV3Model-reco_loss-smooth_l1", "DreamerV3ModelLoss", "reco_loss", "smooth_l1"),
    ("DreamerV3Value-value_loss-mse", "DreamerV3ValueLoss", "value_loss", "mse"),
    ("WorldModel-done_loss-l4", "WorldModelLoss", "done_loss", "l4"),
    ("PILCO-reduction-max", "ExponentialQuadraticCost", "reduction", "max"),
]


@pytest.mark.parametrize("subject, name, value", cases(lambda: ASSIGNMENT))
def test_bad_assignment_is_refused_and_changes_nothing(subject, name, value):
    module, _ = BY_NAME[subject].build()
    assert_assignment_refused(module, name, value)


# ----------------------------------------------------------------------------- issue 49: forward
def _valid_and_padded(batch: TensorDictBase, steps: int, seed: int) -> TensorDictBase:
    """``batch`` ``[B, T]`` with ``steps`` padded time steps appended (random content, the
    first valid step's values left out on purpose) and ``("collector", "mask")`` marking them."""
    generator = torch.Generator().manual_seed(seed)
    padding = batch[:, :steps].apply(
        lambda x: (
            (torch.randn(x.shape, generator=generator) * 50).to(x.dtype)
            if x.is_floating_point()
            else x
        )
    )
    padded = torch.cat([batch, padding], dim=1)
    valid = torch.ones(padded.shape, dtype=torch.bool)
    valid[:, batch.shape[1] :] = False
    padded.set(MASK, valid)
    return padded


@pytest.mark.parametrize("kind", ["popart", "running"])
def test_mappo_value_norm_learns_from_valid_steps_only(kind):
    """``value_norm`` with a padded batch: the same valid steps give the same ``loss_critic``
    and the same norm statistics whatever the padding (TorchRL folds the padding in)."""
    from torchrl.modules.value_norm import PopArtValueNorm, RunningValueNorm

    torch.manual_seed(0)
    actor, critic = test_mappo.actor(), test_mappo.critic()
    batch = test_mappo.batch_with_advantage(actor)  # [4, 6]
    results = []
    for padded in (batch, _valid_and_padded(batch, 2, 1), _valid_and_padded(batch, 5, 2)):
        norm = PopArtValueNorm(beta=0.9) if kind == "popart" else RunningValueNorm()
        loss = rlloss.MAPPOLoss(actor, critic, value_norm=norm, clip_value=0.2)
        loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
        for _ in range(2):  # the second call normalises with the first call's statistics
            out = loss(padded.clone())
        results.append((out, norm.state_dict()))
    (expected, statistics), *others = results
    for out, state in others:
        for key in ("loss_critic", "loss_objective", "value_clip_fraction"):
            torch.testing.assert_close(out[key], expected[key], msg=key)
        torch.testing.assert_close(state, statistics)


def test_mappo_value_norm_without_padding_matches_torchrl():
    """No mask: the norm's update is TorchRL's call, same statistics and loss."""
    import torchrl.objectives as torchrl_objectives
    from torchrl.modules.value_norm import PopArtValueNorm

    torch.manual_seed(0)
    actor, critic = test_mappo.actor(), test_mappo.critic()
    batch = test_mappo.batch_with_advantage(actor)
    outs, norms = [], []
    for library in (rlloss, torchrl_objectives):
        norm = PopArtValueNorm(beta=0.9)
        loss = library.MAPPOLoss(actor, critic, value_norm=norm)
        loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
        outs.append([loss(batch.clone())["loss_critic"].detach() for _ in range(2)])
        norms.append(norm.state_dict())
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(norms[0], norms[1])


@pytest.mark.parametrize("name", ["MAPPOLoss", "IPPOLoss"])
def test_mappo_critic_writing_another_value_key_is_named(name):
    """A critic writing ``("agents", "state_value")`` without ``set_keys(value=...)``: the
    error names the critic, what it writes and the ``set_keys`` call (not a bare KeyError)."""
    actor = test_mappo.actor()
    loss = getattr(rlloss, name)(actor, test_mappo.critic(centralized=name == "MAPPOLoss"))
    loss.set_keys(action=("agents", "action"))
    pattern = (
        r"critic_network wrote no entry 'state_value' \(tensor_keys.value\); it writes "
        r"\[\('agents', 'state_value'\)\].*set_keys\(value=\('agents', 'state_value'\)\)"
    )
    batch = test_mappo.batch_with_advantage(actor)
    expect_error(rlloss.MissingKeyError, pattern, lambda: loss(batch))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"gamma": 0.9}, TypeError),
        ({"entropy_coef": 0.1}, TypeError),
        ({"critic_coef": 1.0}, TypeError),
        ({"value_key": "v"}, RuntimeError),
        ({"lmbda": 0.9}, TypeError),
    ],
    ids=[
        "MAPPO-gamma",
        "MAPPO-entropy_coef",
        "MAPPO-critic_coef",
        "MAPPO-value_key",
        "MAPPO-unknown",
    ],
)
def test_mappo_refuses_torchrls_removed_keywords_as_torchrl_does(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        rlloss.MAPPOLoss(test_mappo.actor(), test_mappo.critic(), **kwargs)


def test_world_model_loss_names_the_missing_true_done():
    """``losses=["done"]`` on a batch without ``("next", "done")``: the batch entry is named,
    not the model's prediction or ``tensor_keys.true_done``."""
    loss = rlloss.WorldModelLoss(test_world_model.world_model(), losses=["reward", "done"])
    batch = test_world_model.transitions().exclude(("next", "done"))
    pattern = r"has no entry \('next', 'done'\) \(tensor_keys.done\).*set_keys\(done="
    expect_error(KeyError, pattern, lambda: loss(batch))


@pytest.mark.parametrize("index", [test_bc.ACT, test_bc.ACT + 3, -1], ids=["n", "n+3", "neg"])
@pytest.mark.parametrize("checks", [False, True], ids=["BC-cpu-check", "BC-set_checks"])
def test_bc_index_action_out_of_range_is_explained(index, checks):
    """Integer actions outside ``[0, n)`` for an actor of ``n`` logits: a ValueError naming the
    entry, the range and the number of actions (by the CPU's own range check, or with
    ``set_checks`` before the cross-entropy runs)."""
    actor = TensorDictModule(test_bc.mlp(test_bc.ACT), ["observation"], ["action"])
    loss = rlloss.BCLoss(actor)
    batch = test_bc.demonstrations(discrete=True)
    batch["action"][2] = index
    n = test_bc.ACT
    pattern = rf"'action' holds action indices from .* gives {n} actions.*\[0, {n}\)"
    with rlloss.set_checks(checks):
        expect_error(ValueError, pattern, lambda: loss(batch))


def test_rnd_observation_of_another_size_is_named():
    loss = rlloss.RNDLoss(*test_rnd.networks())
    batch = test_rnd.visited((8,))
    batch["next", "observation"] = torch.randn(8, test_rnd.OBS + 1)
    pattern = rf"\('next', 'observation'\).*takes {test_rnd.OBS} input features.*\(8, 5\)"
    expect_error(ValueError, pattern, lambda: loss(batch))
    expect_error(ValueError, pattern, lambda: loss.intrinsic_reward(batch))


def test_dreamer_v3_lambda_continue_without_a_continuation_head_is_named():
    """``lambda_continue > 0`` on a model that writes no ``continue_pred``: TorchRL drops the
    continuation loss silently; ours names the entry and both fixes."""
    model = test_dreamer_v3.TinyWorldModel(two_hot=False, continuation=False)
    loss = rlloss.DreamerV3ModelLoss(model, lambda_continue=1.0, reward_two_hot=False)
    loss.set_keys(pixels="observation", reco_pixels="reco_observation")
    pattern = r"lambda_continue=1.0.*no \('next', 'continue_pred'\).*lambda_continue=0"
    expect_error(KeyError, pattern, lambda: loss(test_dreamer_v3.sequences()))
    loss.lambda_continue = 0.0  # the documented fix
    assert "loss_model_continue" not in loss(test_dreamer_v3.sequences())[0].keys()


def test_pilco_state_covariance_not_positive_semidefinite():
    """Data, not a hyperparameter: refused with ``set_checks`` (a host read); a covariance that
    linalg cannot factorise is named without it."""
    loss = rlloss.ExponentialQuadraticCost()
    batch, _, covariance = test_pilco.gaussian_states((6,))
    batch = batch.detach()
    eye = torch.eye(covariance.shape[-1]).expand_as(covariance)
    batch["observation", "var"] = -0.01 * eye  # I + S W still factorises: a number comes back
    with rlloss.set_checks(True):
        pattern = r"state covariance \('observation', 'var'\).*smallest eigenvalue is -0.01"
        expect_error(ValueError, pattern, lambda: loss(batch))
    batch["observation", "var"] = -2.0 * eye
    pattern = r"state covariance \('observation', 'var'\) must be symmetric positive semi"
    expect_error(ValueError, pattern, lambda: loss(batch))


def test_pilco_valid_weights_assignment_is_taken():
    loss = rlloss.ExponentialQuadraticCost()
    loss.weights = 2.0 * torch.eye(4)
    assert torch.equal(loss.weights, 2.0 * torch.eye(4))
    loss.weights = None
    assert loss.weights is None


@pytest.mark.parametrize(
    "name, value",
    [("rate", 1.5), ("min_scale", 0.0)],
    ids=["DreamerV3Actor-rate", "DreamerV3Actor-min_scale"],
)
def test_dreamer_v3_return_normalization_assignment_is_refused(name, value):
    module, _ = BY_NAME["DreamerV3ActorLoss"].build()
    assert_assignment_refused(module.retnorm, name, value)


@pytest.mark.parametrize(
    "subject, name, value, expected",
    [
        ("RNDLoss", "obs_clip", 3, 3.0),
        ("DreamerV3ActorLoss", "imagination_horizon", 2, 2),
        ("OnlineDTLoss", "target_entropy", -3.0, -3.0),
        ("DreamerV3ModelLoss", "kl_alpha", 0.5, 0.5),
        ("DreamerV3Loss", "lmbda", 0.9, 0.9),
    ],
    ids=[
        "RND-obs_clip",
        "DreamerV3Actor-horizon",
        "OnlineDT-target_entropy",
        "DreamerV3Model-kl",
        "DreamerV3-lmbda",
    ],
)
def test_valid_assignment_of_a_newly_checked_attribute_is_taken(subject, name, value, expected):
    module, _ = BY_NAME[subject].build()
    setattr(module, name, value)
    stored = getattr(module, name)
    assert float(stored) == expected and type(float(stored)) is float
    if name == "imagination_horizon":
        assert isinstance(stored, int)
    if name == "target_entropy":  # a buffer, written in place
        assert "target_entropy" in module.state_dict()
