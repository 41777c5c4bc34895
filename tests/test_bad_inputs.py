"""Bad inputs, catalogued: every public loss and estimator, given what a user gets wrong.

Each case builds a module and a valid batch, breaks one thing, and asserts either the error
(its type *and* a message that names the problem) or, for valid-but-awkward inputs (padding
holding NaN, masked actions, one-element batches), finite outputs and finite gradients. The
schedulers, normaliser and updaters have their own catalogue in ``test_bad_inputs_stats.py``.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, DistributionalQValueActor, QValueActor, ValueOperator

import rlloss
from rlloss import functional as rlf
from tests import nets, test_crossq, test_iql, test_sac, test_td3, test_tqc

OBS = 5  # every network here reads 5 observation features
CONTINUOUS_ACT, DISCRETE_ACT, B = test_sac.ACT, test_sac.NUM_ACTIONS, 6
assert nets.OBS == test_sac.OBS == test_td3.OBS == OBS


# ----------------------------------------------------------------------------- subjects
@dataclass
class Subject:
    """A module of one public class with a valid batch, and what its batch holds."""

    name: str
    build: Callable[[], tuple[nn.Module, TensorDict]]
    inputs: list  # entries the module reads (each one's absence must be named)
    action: object = "action"  # the action entry, or None
    action_size: int | None = None  # trailing size of a continuous / one-hot action
    estimator: bool = False
    kwargs: dict = field(default_factory=dict)
    onpolicy: bool = False  # reads advantages and a padding mask, no replay entries
    discrete: bool = False  # a one-hot or index action


def _ppo(cls, kind="normal", **kwargs):
    def build():
        actor, critic = nets.make_actor(kind), nets.make_critic()
        loss = cls(actor, critic, **kwargs)
        return loss, nets.rollout(actor, (B,), critic)

    return build


def _transitions(action):
    batch = test_sac.transitions(B, action)
    return batch


def _sac():
    return rlloss.SACLoss(test_sac.actor(), test_sac.qvalue()), _transitions(None)


def _discrete_sac(one_hot=True):
    def build():
        loss = rlloss.DiscreteSACLoss(
            test_sac.discrete_actor(one_hot), test_sac.discrete_qvalue(), num_actions=DISCRETE_ACT
        )
        return loss, test_sac.discrete_transitions(one_hot, B)

    return build


def _td3():
    loss = rlloss.TD3Loss(test_td3.actor(), test_td3.qvalue(), bounds=(-1.0, 1.0))
    return loss, _transitions(None)


def _td3_bc():
    loss = rlloss.TD3BCLoss(test_td3.actor(), test_td3.qvalue(), bounds=(-1.0, 1.0))
    return loss, _transitions(None)


def _iql():
    loss = rlloss.IQLLoss(test_sac.actor(), test_sac.qvalue(), test_iql.value_network())
    return loss, _transitions(None)


def _cql():
    loss = rlloss.CQLLoss(test_sac.actor(), test_sac.qvalue(), num_random=3, with_lagrange=True)
    return loss, _transitions(None)


def _discrete_iql():
    actor, critic = test_sac.discrete_actor(False), test_iql.discrete_qvalue()
    loss = rlloss.DiscreteIQLLoss(
        actor, critic, test_iql.value_network(), action_space="categorical"
    )
    return loss, test_sac.discrete_transitions(False, B)


def _ddpg():
    return rlloss.DDPGLoss(test_td3.actor(), test_td3.qvalue()), _transitions(None)


def _mpo():
    spec = Bounded(-1.0, 1.0, shape=(CONTINUOUS_ACT,))
    loss = rlloss.MPOLoss(test_sac.actor(), test_sac.qvalue(), num_samples=4, action_spec=spec)
    return loss, _transitions(None)


def _discrete_mpo():
    loss = rlloss.DiscreteMPOLoss(test_sac.discrete_actor(True), test_sac.discrete_qvalue())
    return loss, test_sac.discrete_transitions(True, B)


def _q_actor(action_space):
    net = MLP(in_features=OBS, out_features=DISCRETE_ACT, num_cells=[8])
    return QValueActor(net, in_keys=["observation"], action_space=action_space)


def _dqn(cls=rlloss.DQNLoss, one_hot=False):
    def build():
        space = "one-hot" if one_hot else "categorical"
        loss = cls(_q_actor(space), action_space=space)
        return loss, test_sac.discrete_transitions(one_hot, B)

    return build


def _c51():
    net = MLP(in_features=OBS, out_features=(5, DISCRETE_ACT), num_cells=[8])
    support = torch.linspace(-1.0, 1.0, 5)
    actor = DistributionalQValueActor(
        net, in_keys=["observation"], support=support, action_space="categorical"
    )
    return rlloss.DistributionalDQNLoss(actor), test_sac.discrete_transitions(False, B)


def _tqc():
    loss = rlloss.TQCLoss(test_sac.actor(), test_tqc.quantile_critic(), num_qvalue_nets=2)
    return loss, _transitions(None)


def _redq():
    loss = rlloss.REDQLoss(test_sac.actor(), test_sac.qvalue(), num_qvalue_nets=3)
    return loss, _transitions(None)


def _crossq():
    critics = [test_crossq.critic(), test_crossq.critic()]  # BatchNorm1d critics
    return rlloss.CrossQLoss(test_sac.actor(), critics), _transitions(None)


def _sequences():
    """A ``[2, B]`` rollout of the PPO networks: time is the last batch dim."""
    actor, critic = nets.make_actor(), nets.make_critic()
    return actor, critic, nets.rollout(actor, (2, B), critic)


def _estimator(cls, **kwargs):
    def build():
        actor, critic, batch = _sequences()
        extra = {"actor_network": actor} if cls is rlloss.VTrace else {}
        return cls(gamma=0.9, value_network=critic, **extra, **kwargs), batch

    return build


def _multi_agent_gae():
    actor, critic, batch = _sequences()
    return rlloss.MultiAgentGAE(gamma=0.9, lmbda=0.9, value_network=critic), batch


NEXT = [("next", "observation"), ("next", "reward"), ("next", "terminated")]
PPO_INPUTS = ["observation", "action", "action_log_prob", "value_target"]  # advantage: GAE runs
REPLAY_INPUTS = ["observation", "action", *NEXT]
ESTIMATOR_INPUTS = ["observation", ("next", "observation"), ("next", "reward"), ("next", "done")]

ON, DISCRETE = {"onpolicy": True}, {"discrete": True}
PG_INPUTS = ["observation", "action", "value_target"]  # A2C / REINFORCE: no old log-prob

SUBJECTS = [
    Subject("PPOLoss", _ppo(rlloss.PPOLoss), PPO_INPUTS, action_size=nets.ACT, **ON),
    Subject("ClipPPOLoss", _ppo(rlloss.ClipPPOLoss), PPO_INPUTS, action_size=nets.ACT, **ON),
    Subject("KLPENPPOLoss", _ppo(rlloss.KLPENPPOLoss), PPO_INPUTS, action_size=nets.ACT, **ON),
    Subject("RPOLoss", _ppo(rlloss.RPOLoss), PPO_INPUTS, action_size=nets.ACT, **ON),
    Subject("ClipPPOLoss-categorical", _ppo(rlloss.ClipPPOLoss, "categorical"), PPO_INPUTS, **ON),
    Subject("A2CLoss", _ppo(rlloss.A2CLoss), PG_INPUTS, action_size=nets.ACT, **ON),
    Subject("ReinforceLoss", _ppo(rlloss.ReinforceLoss), PG_INPUTS, action_size=nets.ACT, **ON),
    Subject("DQNLoss", _dqn(), REPLAY_INPUTS, **DISCRETE),
    Subject(
        "DDQNLoss-one-hot", _dqn(rlloss.DDQNLoss, True), REPLAY_INPUTS, action_size=4, **DISCRETE
    ),
    Subject("DiscreteCQLLoss", _dqn(rlloss.DiscreteCQLLoss), REPLAY_INPUTS, **DISCRETE),
    Subject("DistributionalDQNLoss", _c51, REPLAY_INPUTS, **DISCRETE),
    Subject("DDPGLoss", _ddpg, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("TD3Loss", _td3, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("TD3BCLoss", _td3_bc, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("SACLoss", _sac, ["observation", *NEXT], action_size=CONTINUOUS_ACT),
    Subject(
        "DiscreteSACLoss", _discrete_sac(), REPLAY_INPUTS, action_size=DISCRETE_ACT, **DISCRETE
    ),
    Subject("DiscreteSACLoss-index", _discrete_sac(False), REPLAY_INPUTS, **DISCRETE),
    Subject("MPOLoss", _mpo, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("DiscreteMPOLoss", _discrete_mpo, REPLAY_INPUTS, action_size=DISCRETE_ACT, **DISCRETE),
    Subject("IQLLoss", _iql, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("DiscreteIQLLoss", _discrete_iql, REPLAY_INPUTS, **DISCRETE),
    Subject("CQLLoss", _cql, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("TQCLoss", _tqc, ["observation", *NEXT], action_size=CONTINUOUS_ACT),
    Subject("REDQLoss", _redq, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("CrossQLoss", _crossq, REPLAY_INPUTS, action_size=CONTINUOUS_ACT),
    Subject("GAE", _estimator(rlloss.GAE, lmbda=0.9), ESTIMATOR_INPUTS, None, estimator=True),
    Subject(
        "TD0Estimator", _estimator(rlloss.TD0Estimator), ESTIMATOR_INPUTS, None, estimator=True
    ),
    Subject(
        "TD1Estimator", _estimator(rlloss.TD1Estimator), ESTIMATOR_INPUTS, None, estimator=True
    ),
    Subject(
        "TDLambdaEstimator",
        _estimator(rlloss.TDLambdaEstimator, lmbda=0.9),
        ESTIMATOR_INPUTS,
        None,
        estimator=True,
    ),
    Subject("VTrace", _estimator(rlloss.VTrace), ESTIMATOR_INPUTS, None, estimator=True),
    Subject("MultiAgentGAE", _multi_agent_gae, ESTIMATOR_INPUTS, None, estimator=True),
]
LOSSES = [s for s in SUBJECTS if not s.estimator]
BY_NAME = {s.name: s for s in SUBJECTS}


# ----------------------------------------------------------------------------- running
def _losses_of(out) -> torch.Tensor:
    names = [k for k in out.keys() if k.startswith("loss")]
    return sum(out[k].sum() for k in names)


def run(module, batch):
    """The module's outputs on ``batch`` (a loss's summed ``loss*`` entries backpropagated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = module(batch)
        if not isinstance(module, rlloss.LossModule):
            return out
        module.zero_grad()
        _losses_of(out).backward()
    return out


def assert_finite(module, out) -> None:
    """Every floating output and every gradient of the module's parameters is finite."""
    for key, value in out.items(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert torch.isfinite(value).all(), f"output {key!r} is not finite: {value}"
    for name, parameter in module.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad).all(), f"gradient of {name} is not finite"


def expect_error(error: type, pattern: str, call: Callable) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as info:
            call()
    message = str(info.value)
    assert re.search(pattern, message, re.S), f"{message!r} does not match {pattern!r}"
    assert len(message) < 2000, f"the message is {len(message)} characters long"


def _key_pattern(key) -> str:
    return re.escape(repr(key if isinstance(key, str) else key[-1]))


def _cases(fn):
    return [pytest.param(*args, id=ident) for ident, *args in fn()]


# ----------------------------------------------------------------------------- missing keys
def missing_key_cases():
    for subject in SUBJECTS:
        for key in subject.inputs:
            yield f"{subject.name}-{key}", subject, key


@pytest.mark.parametrize("subject, key", _cases(missing_key_cases))
def test_missing_entry_is_named(subject, key):
    module, batch = subject.build()
    del batch[key]
    if key == ("next", "terminated"):
        del batch["next", "done"]  # without either flag (done alone falls back, with a warning)
    expect_error(KeyError, _key_pattern(key), lambda: module(batch))


# ----------------------------------------------------------------------------- wrong shapes / dtypes
def shape_cases():
    for subject in LOSSES:
        if subject.action_size is not None:
            yield f"{subject.name}-action-size", subject, "action_size"
        yield f"{subject.name}-observation-size", subject, "observation_size"
        yield f"{subject.name}-float64-batch", subject, "float64"
        yield f"{subject.name}-mask-B-3", subject, "mask"
        if subject.onpolicy:
            yield f"{subject.name}-float-mask", subject, "float_mask"
        else:
            yield f"{subject.name}-priority-weight-B-3", subject, "priority_weight"
            yield f"{subject.name}-steps-to-next-obs-B-2", subject, "steps"


SHAPE_ERRORS = {
    "action_size": (ValueError, None),  # the action's wrong size, 2 * action_size, is named
    "observation_size": (
        ValueError,
        r"takes 5 input features.*'observation'.*gives? 7|observation",
    ),
    "float64": (TypeError, r"'observation' has dtype torch.float64.*torch.float32"),
    "mask": (ValueError, r"mask.*shape \(6, 3\)"),
    "float_mask": (TypeError, r"mask.*dtype torch.float32.*boolean"),
    "priority_weight": (ValueError, r"'priority_weight' has shape \(6, 3\)"),
    "steps": (ValueError, r"'steps_to_next_obs' has shape \(6, 2\)"),
}


@pytest.mark.parametrize("subject, problem", _cases(shape_cases))
def test_wrong_shape_or_dtype_is_explained(subject, problem):
    module, batch = subject.build()
    if problem == "action_size":
        batch["action"] = torch.zeros(B, 2 * subject.action_size)
    elif problem == "observation_size":
        batch["observation"] = torch.randn(B, 7)
        batch["next", "observation"] = torch.randn(B, 7)
    elif problem == "float64":
        batch = batch.apply(lambda x: x.double() if x.is_floating_point() else x)
    elif problem == "mask":
        batch["collector", "mask"] = torch.ones(B, 3, dtype=torch.bool)
    elif problem == "float_mask":
        batch["collector", "mask"] = torch.ones(B)
    elif problem == "priority_weight":
        batch["priority_weight"] = torch.ones(B, 3)
    elif problem == "steps":
        batch["steps_to_next_obs"] = torch.ones(B, 2, dtype=torch.long)
    error, pattern = SHAPE_ERRORS[problem]
    if problem == "action_size":
        pattern = rf"action.*\b{2 * subject.action_size}\b"
    expect_error(error, pattern, lambda: module(batch))


@pytest.mark.parametrize("subject", [BY_NAME["DQNLoss"], BY_NAME["DiscreteSACLoss-index"]])
def test_index_action_out_of_range_is_explained(subject):
    module, batch = subject.build()
    batch["action"] = torch.full((B,), DISCRETE_ACT + 3)
    expect_error(ValueError, rf"\[0, {DISCRETE_ACT}\)", lambda: module(batch))


def test_categorical_ppo_action_out_of_range_is_explained():
    module, batch = BY_NAME["ClipPPOLoss-categorical"].build()
    batch["action"] = torch.full((B,), nets.ACT + 1)
    expect_error(ValueError, rf"'action'.*\[0, {nets.ACT}\)", lambda: module(batch))


# ----------------------------------------------------------------------------- batch sizes
@pytest.mark.parametrize("subject", [pytest.param(s, id=s.name) for s in SUBJECTS])
def test_empty_batch_is_refused(subject):
    module, batch = subject.build()
    expect_error(ValueError, r"batch is empty", lambda: module(batch[..., :0]))


@pytest.mark.parametrize("subject", [pytest.param(s, id=s.name) for s in SUBJECTS])
def test_one_element_batch_is_finite(subject):
    module, batch = subject.build()
    one = batch[..., :1]
    assert_finite(module, run(module, one))


@pytest.mark.parametrize("subject", [pytest.param(s, id=s.name) for s in LOSSES])
def test_tensor_call_with_an_empty_batch_is_refused(subject):
    module, batch = subject.build()
    values = {
        "_".join((k,) if isinstance(k, str) else k): batch.get(k)[:0]
        for k in module.in_keys
        if batch.get(k, None) is not None
    }
    expect_error(ValueError, r"batch is empty", lambda: module(**values))


# ----------------------------------------------------------------------------- padding
def _padded_keys(subject):
    keys = ["observation", ("next", "observation"), ("next", "reward")]
    if subject.onpolicy:
        keys += ["advantage", "action_log_prob", "value_target"]
    if subject.action_size is not None and not subject.discrete:
        keys += ["action"]
    return keys


def padding_cases():
    for subject in LOSSES:
        for key in _padded_keys(subject):
            for value in (math.nan, math.inf):
                yield f"{subject.name}-{key}-{value}", subject, key, value


def _pad(batch, key, value):
    mask = torch.ones(batch.shape, dtype=torch.bool)
    mask[..., -2:] = False
    batch["collector", "mask"] = mask
    entry = batch.get(key).clone()
    entry[~mask] = value
    batch.set(key, entry)
    return mask


@pytest.mark.parametrize("subject, key, value", _cases(padding_cases))
def test_non_finite_padding_reaches_no_value_and_no_gradient(subject, key, value):
    module, batch = subject.build()
    _pad(batch, key, value)
    assert_finite(module, run(module, batch))


@pytest.mark.parametrize("subject", [pytest.param(s, id=s.name) for s in LOSSES])
def test_padding_content_changes_nothing(subject):
    """Two batches that differ only in their padded steps give the same losses and gradients."""
    module, batch = subject.build()
    torch.manual_seed(0)
    clean = batch.clone()
    mask = _pad(clean, "observation", 0.0)
    noisy = clean.clone()
    noisy["observation"][~mask] = 1e30
    noisy["next", "reward"][~mask] = -1e30
    results = []
    twin = copy.deepcopy(module)  # a call changes running statistics (CrossQ's critics)
    for version, loss in ((clean, module), (noisy, twin)):
        torch.manual_seed(1)
        out = run(loss, version)
        grads = [p.grad.clone() for p in loss.parameters() if p.grad is not None]
        results.append((_losses_of(out).detach(), grads))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- checks mode
@pytest.fixture
def checks():
    previous = rlloss.set_checks(True)
    yield
    rlloss.set_checks(previous)


def non_finite_cases():
    for subject in SUBJECTS:
        for key in ("observation", ("next", "reward")):
            yield f"{subject.name}-{key}", subject, key


@pytest.mark.parametrize("subject, key", _cases(non_finite_cases))
def test_checks_name_the_first_non_finite_entry(checks, subject, key):
    module, batch = subject.build()
    entry = batch.get(key).clone()
    entry[(..., 3, 0) if entry.ndim > 1 else 3] = math.nan
    batch.set(key, entry)
    pattern = rf"{_key_pattern(key)}.*nan at index \(.*3, 0\)"
    expect_error(ValueError, pattern, lambda: module(batch))


@pytest.mark.parametrize("subject", [pytest.param(s, id=s.name) for s in LOSSES])
def test_checks_ignore_padding(checks, subject):
    module, batch = subject.build()
    _pad(batch, "observation", math.nan)
    assert_finite(module, run(module, batch))


def test_checks_are_off_by_default():
    assert rlloss.set_checks(False).previous is False
    module, batch = BY_NAME["ClipPPOLoss"].build()
    batch["next", "reward"][0] = math.nan  # read by nothing: the batch holds advantages
    module(batch)


def test_set_checks_returns_the_previous_setting():
    previous = rlloss.set_checks(True)
    assert not previous and previous == False and previous.previous is False  # noqa: E712
    restored = rlloss.set_checks(previous)  # a setting is accepted as a new value
    assert restored and restored == True and restored.previous is True  # noqa: E712
    assert repr(rlloss.set_checks(False)) == "ChecksSetting(previous=False)"


def test_set_checks_as_a_context_manager_restores_the_previous_setting():
    module, batch = BY_NAME["ClipPPOLoss"].build()
    batch["advantage"][0] = math.nan
    with rlloss.set_checks(True) as previous:
        assert previous.previous is False
        expect_error(ValueError, "advantage", lambda: module(batch))
        with rlloss.set_checks(False):
            module(batch)  # off inside the inner block
        expect_error(ValueError, "advantage", lambda: module(batch))  # on again
    module(batch)  # off again after the block
    with pytest.raises(RuntimeError, match="inside"):
        with rlloss.set_checks(True):
            raise RuntimeError("inside")
    assert rlloss.set_checks(False).previous is False  # restored on an exception too


# ----------------------------------------------------------------------------- masked logits
def _masking_actor(one_hot, distribution=None):
    """A categorical actor whose last action is forbidden everywhere (logit -inf)."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = MLP(in_features=OBS, out_features=DISCRETE_ACT, num_cells=[16])

        def forward(self, observation):
            logits = self.net(observation)
            forbidden = torch.zeros(DISCRETE_ACT, dtype=torch.bool)
            forbidden[-1] = True
            return logits.masked_fill(forbidden, -math.inf)

    actor = test_sac.discrete_actor(one_hot)
    actor.module[0].module = Masked()
    return actor


def _allowed_actions(one_hot):
    index = torch.randint(DISCRETE_ACT - 1, (B,))
    return nn.functional.one_hot(index, DISCRETE_ACT) if one_hot else index


def masked_logit_cases():
    yield "DiscreteSACLoss-one-hot", "dsac", True
    yield "DiscreteSACLoss-index", "dsac", False
    yield "DiscreteMPOLoss", "dmpo", True
    yield "ClipPPOLoss", "ppo", False
    yield "KLPENPPOLoss", "klpen", False
    yield "PPOLoss", "plain", True


@pytest.mark.parametrize("kind, one_hot", _cases(masked_logit_cases))
@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_masked_logits_give_finite_losses_and_gradients(kind, one_hot, alpha):
    actor, critic = _masking_actor(one_hot), test_sac.discrete_qvalue()
    batch = test_sac.transitions(B, _allowed_actions(one_hot))
    if kind == "dsac":
        loss = rlloss.DiscreteSACLoss(actor, critic, num_actions=DISCRETE_ACT, alpha_init=alpha)
    elif kind == "dmpo":
        loss = rlloss.DiscreteMPOLoss(actor, critic, init_log_alpha=alpha)
    else:
        cls = {"ppo": rlloss.ClipPPOLoss, "klpen": rlloss.KLPENPPOLoss, "plain": rlloss.PPOLoss}
        value = ValueOperator(MLP(in_features=OBS, out_features=1, num_cells=[8]), ["observation"])
        loss = cls[kind](actor, value, entropy_coeff=alpha)
        with torch.no_grad():
            distribution = actor.get_dist(batch.clone())
            batch["logits"] = distribution.logits
            batch["action_log_prob"] = distribution.log_prob(batch["action"])
        batch["advantage"] = torch.randn(B, 1)
        batch["value_target"] = torch.randn(B, 1)
    out = run(loss, batch)
    assert_finite(loss, out)
    optimizer = torch.optim.SGD(loss.parameters(), lr=0.1)
    optimizer.step()
    assert_finite(loss, run(loss, batch))  # and after an update


# ----------------------------------------------------------------------------- hyperparameters
def _actor_critic():
    return nets.make_actor(), nets.make_critic()


def _ppo_with(cls, **kwargs):
    return lambda: cls(*_actor_critic(), **kwargs)


def _sac_with(**kwargs):
    return lambda: rlloss.SACLoss(test_sac.actor(), test_sac.qvalue(), **kwargs)


def _td3_with(**kwargs):
    return lambda: rlloss.TD3Loss(test_td3.actor(), test_td3.qvalue(), bounds=(-1, 1), **kwargs)


def _mpo_with(**kwargs):
    spec = Bounded(-1.0, 1.0, shape=(CONTINUOUS_ACT,))
    return lambda: rlloss.MPOLoss(test_sac.actor(), test_sac.qvalue(), action_spec=spec, **kwargs)


def _dmpo_with(**kwargs):
    actor, critic = test_sac.discrete_actor(True), test_sac.discrete_qvalue()
    return lambda: rlloss.DiscreteMPOLoss(actor, critic, **kwargs)


def _dqn_with(**kwargs):
    return lambda: rlloss.DQNLoss(_q_actor("one-hot"), **kwargs)


def _ddpg_with(**kwargs):
    return lambda: rlloss.DDPGLoss(test_td3.actor(), test_td3.qvalue(), **kwargs)


def _dsac_with(**kwargs):
    actor, critic = test_sac.discrete_actor(True), test_sac.discrete_qvalue()
    return lambda: rlloss.DiscreteSACLoss(actor, critic, **kwargs)


def _td3_bc_with(**kwargs):
    return lambda: rlloss.TD3BCLoss(test_td3.actor(), test_td3.qvalue(), bounds=(-1, 1), **kwargs)


def _iql_with(**kwargs):
    return lambda: rlloss.IQLLoss(
        test_sac.actor(), test_sac.qvalue(), test_iql.value_network(), **kwargs
    )


def _cql_with(**kwargs):
    return lambda: rlloss.DiscreteCQLLoss(_q_actor("one-hot"), **kwargs)


def _critic():
    return nets.make_critic()


CONSTRUCTION = [
    ("PPO-entropy_coeff", _ppo_with(rlloss.PPOLoss, entropy_coeff=-0.1), "entropy_coeff"),
    ("PPO-critic_coeff", _ppo_with(rlloss.PPOLoss, critic_coeff=-1.0), "critic_coeff"),
    ("PPO-clip_value-0", _ppo_with(rlloss.PPOLoss, clip_value=0.0), "clip_value"),
    ("PPO-clip_value-bool", _ppo_with(rlloss.PPOLoss, clip_value=True), "clip_value"),
    ("PPO-samples-0", _ppo_with(rlloss.PPOLoss, samples_mc_entropy=0), "samples_mc_entropy"),
    ("PPO-samples-1.5", _ppo_with(rlloss.PPOLoss, samples_mc_entropy=1.5), "integer"),
    ("PPO-loss_critic_type", _ppo_with(rlloss.PPOLoss, loss_critic_type="l3"), "loss_critic_type"),
    ("PPO-reduction", _ppo_with(rlloss.PPOLoss, reduction="avg"), "reduction"),
    ("PPO-entropy_coeff-nan", _ppo_with(rlloss.PPOLoss, entropy_coeff=math.nan), "nan"),
    ("PPO-entropy_coeff-str", _ppo_with(rlloss.PPOLoss, entropy_coeff="0.1"), "number"),
    (
        "PPO-critic-without-network",
        lambda: rlloss.PPOLoss(nets.make_actor(), critic_coeff=1.0),
        "critic_network",
    ),
    (
        "PPO-actor-not-a-module",
        lambda: rlloss.PPOLoss(nn.Linear(5, 3), _critic()),
        "TensorDict module",
    ),
    ("PPO-critic-list", lambda: rlloss.PPOLoss(nets.make_actor(), [_critic()]), "one network"),
    ("ClipPPO-clip_epsilon-0", _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=0.0), "clip_epsilon"),
    ("ClipPPO-clip_epsilon-1", _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=1.0), "clip_epsilon"),
    ("ClipPPO-clip_epsilon-neg", _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=-0.2), "clip_epsilon"),
    (
        "ClipPPO-clip_epsilon-triple",
        _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=(0.1, 0.2, 0.3)),
        "pair",
    ),
    (
        "ClipPPO-clip_epsilon-low-1",
        _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=(1.0, 0.2)),
        r"clip_epsilon\[0\]",
    ),
    (
        "ClipPPO-clip_epsilon-high-0",
        _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=(0.1, 0.0)),
        r"clip_epsilon\[1\]",
    ),
    ("ClipPPO-dual_clip-1", _ppo_with(rlloss.ClipPPOLoss, dual_clip=1.0), "dual_clip"),
    ("ClipPPO-dual_clip-0.5", _ppo_with(rlloss.ClipPPOLoss, dual_clip=0.5), "dual_clip"),
    (
        "ClipPPO-clip_value-asymmetric",
        _ppo_with(rlloss.ClipPPOLoss, clip_epsilon=(0.1, 0.2), clip_value=True),
        "asymmetric",
    ),
    ("KLPEN-dtarg-0", _ppo_with(rlloss.KLPENPPOLoss, dtarg=0.0), "dtarg"),
    ("KLPEN-beta-neg", _ppo_with(rlloss.KLPENPPOLoss, beta=-1.0), "beta"),
    ("KLPEN-increment-0.5", _ppo_with(rlloss.KLPENPPOLoss, increment=0.5), "increment"),
    ("KLPEN-decrement-2", _ppo_with(rlloss.KLPENPPOLoss, decrement=2.0), "decrement"),
    ("KLPEN-decrement-0", _ppo_with(rlloss.KLPENPPOLoss, decrement=0.0), "decrement"),
    ("KLPEN-samples_mc_kl-0", _ppo_with(rlloss.KLPENPPOLoss, samples_mc_kl=0), "samples_mc_kl"),
    ("KLPEN-samples_mc_kl-2.5", _ppo_with(rlloss.KLPENPPOLoss, samples_mc_kl=2.5), "integer"),
    ("KLPEN-beta_min-neg", _ppo_with(rlloss.KLPENPPOLoss, beta_min=-1.0), r"beta_min must be in"),
    ("RPO-rpo_alpha-neg", _ppo_with(rlloss.RPOLoss, rpo_alpha=-0.5), "rpo_alpha"),
    ("DQN-gamma-1.5", _dqn_with(gamma=1.5), "gamma"),
    ("DQN-gamma-neg", _dqn_with(gamma=-0.1), "gamma"),
    ("DQN-loss_function", _dqn_with(loss_function="huber"), "loss_function"),
    ("DQN-action_space", _dqn_with(action_space="continuous"), "action_space"),
    ("DQN-double-without-target", _dqn_with(double_dqn=True, delay_value=False), "double_dqn"),
    ("DQN-priority_weighting", _dqn_with(priority_weighting="max"), "priority_weighting"),
    (
        "DQN-use_prioritized_weights",
        _dqn_with(use_prioritized_weights="yes"),
        "use_prioritized_weights",
    ),
    ("DQN-network-list", lambda: rlloss.DQNLoss([_q_actor("one-hot")]), "one network"),
    ("DQN-not-a-module", lambda: rlloss.DQNLoss(lambda x: x), "TensorDict module"),
    ("DDPG-gamma", _ddpg_with(gamma=2.0), "gamma"),
    ("DDPG-reduction", _ddpg_with(reduction="max"), "reduction"),
    (
        "DDPG-value-list",
        lambda: rlloss.DDPGLoss(test_td3.actor(), [test_td3.qvalue()]),
        "one network",
    ),
    ("TD3-num_qvalue_nets-0", _td3_with(num_qvalue_nets=0), "num_qvalue_nets"),
    ("TD3-num_qvalue_nets-2.5", _td3_with(num_qvalue_nets=2.5), "integer"),
    ("TD3-policy_noise-neg", _td3_with(policy_noise=-0.1), "policy_noise"),
    ("TD3-noise_clip-neg", _td3_with(noise_clip=-0.1), "noise_clip"),
    (
        "TD3-no-bounds",
        lambda: rlloss.TD3Loss(test_td3.actor(), test_td3.qvalue()),
        "bounds|action_spec",
    ),
    (
        "TD3-wrong-list-length",
        lambda: rlloss.TD3Loss(
            test_td3.actor(), [test_td3.qvalue()] * 3, num_qvalue_nets=2, bounds=(-1, 1)
        ),
        "num_qvalue_nets",
    ),
    ("SAC-num_qvalue_nets-0", _sac_with(num_qvalue_nets=0), "num_qvalue_nets"),
    ("SAC-num_qvalue_nets-2.5", _sac_with(num_qvalue_nets=2.5), "integer"),
    ("SAC-alpha_init-0", _sac_with(alpha_init=0.0), "alpha_init"),
    ("SAC-min_alpha-neg", _sac_with(min_alpha=-1.0), "min_alpha"),
    ("SAC-max-below-min", _sac_with(min_alpha=1.0, max_alpha=0.5), "max_alpha"),
    ("SAC-scalar_output_mode", _sac_with(scalar_output_mode="all"), "scalar_output_mode"),
    ("SAC-priority_key", _sac_with(priority_key="td"), "priority_key|set_keys"),
    (
        "SAC-actor-list",
        lambda: rlloss.SACLoss([test_sac.actor()], test_sac.qvalue()),
        "one network",
    ),
    ("DiscreteSAC-num_actions-0", _dsac_with(num_actions=0), "num_actions"),
    ("DiscreteSAC-num_actions-2.5", _dsac_with(num_actions=2.5), "integer"),
    ("MPO-num_samples-0", _mpo_with(num_samples=0), "num_samples"),
    ("MPO-num_samples-float", _mpo_with(num_samples=2.0), "num_samples"),
    ("MPO-epsilon-0", _mpo_with(epsilon=0.0), "epsilon"),
    ("MPO-epsilon_mean-neg", _mpo_with(epsilon_mean=-1.0), "epsilon_mean"),
    ("MPO-epsilon_stddev-0", _mpo_with(epsilon_stddev=0.0), "epsilon_stddev"),
    ("MPO-epsilon_penalty-0", _mpo_with(epsilon_penalty=0.0), "epsilon_penalty"),
    (
        "MPO-qvalue-list",
        lambda: rlloss.MPOLoss(test_sac.actor(), [test_sac.qvalue()] * 2),
        "one network",
    ),
    ("DiscreteMPO-epsilon-0", _dmpo_with(epsilon=0.0), "epsilon"),
    ("DiscreteMPO-epsilon_policy-neg", _dmpo_with(epsilon_policy=-1.0), "epsilon_policy"),
    (
        "DiscreteMPO-qvalue-list",
        lambda: rlloss.DiscreteMPOLoss(test_sac.discrete_actor(True), [test_sac.discrete_qvalue()]),
        "one network",
    ),
    ("A2C-entropy_coeff", _ppo_with(rlloss.A2CLoss, entropy_coeff=-0.1), "entropy_coeff"),
    ("A2C-critic_coeff", _ppo_with(rlloss.A2CLoss, critic_coeff=-1.0), "critic_coeff"),
    ("A2C-gamma", _ppo_with(rlloss.A2CLoss, gamma=0.9), "make_value_estimator"),
    ("A2C-advantage_norm", _ppo_with(rlloss.A2CLoss, advantage_norm=object()), "advantage_norm"),
    ("A2C-no-critic", lambda: rlloss.A2CLoss(nets.make_actor()), "Missing positional"),
    (
        "Reinforce-value_target_key",
        _ppo_with(rlloss.ReinforceLoss, value_target_key="y"),
        "set_keys",
    ),
    (
        "Reinforce-delay-not-functional",
        _ppo_with(rlloss.ReinforceLoss, delay_value=True, functional=False),
        "delay_value and ~functional",
    ),
    (
        "Reinforce-loss_critic_type",
        _ppo_with(rlloss.ReinforceLoss, loss_critic_type="l3"),
        "loss_critic_type",
    ),
    ("TD3BC-alpha-0", _td3_bc_with(alpha=0.0), "alpha"),
    ("TD3BC-noise_clip-neg", _td3_bc_with(noise_clip=-1.0), "noise_clip"),
    ("IQL-expectile", _iql_with(expectile=1.5), "expectile"),
    ("IQL-temperature", _iql_with(temperature=-1.0), "temperature"),
    ("IQL-num_qvalue_nets-0", _iql_with(num_qvalue_nets=0), "num_qvalue_nets"),
    (
        "IQL-value-list",
        lambda: rlloss.IQLLoss(test_sac.actor(), test_sac.qvalue(), [_critic()]),
        "one network",
    ),
    ("DiscreteCQL-loss_function", _cql_with(loss_function="huber"), "loss_function"),
    (
        "CQL-temperature-0",
        lambda: rlloss.CQLLoss(test_sac.actor(), test_sac.qvalue(), temperature=0.0),
        "temperature",
    ),
    (
        "CQL-min_q_weight-neg",
        lambda: rlloss.CQLLoss(test_sac.actor(), test_sac.qvalue(), min_q_weight=-1.0),
        "min_q_weight",
    ),
    (
        "CQL-num_random-0",
        lambda: rlloss.CQLLoss(test_sac.actor(), test_sac.qvalue(), num_random=0),
        "num_random",
    ),
    ("DiscreteCQL-gamma", _cql_with(gamma=1.5), "gamma"),
    (
        "CrossQ-delay_qvalue",
        lambda: rlloss.CrossQLoss(test_sac.actor(), test_crossq.critic(), delay_qvalue=True),
        "delay_qvalue",
    ),
    (
        "CrossQ-num_qvalue_nets-0",
        lambda: rlloss.CrossQLoss(test_sac.actor(), test_crossq.critic(), num_qvalue_nets=0),
        "num_qvalue_nets",
    ),
    ("GAE-gamma", lambda: rlloss.GAE(gamma=1.2, lmbda=0.9, value_network=_critic()), "gamma"),
    ("GAE-lmbda", lambda: rlloss.GAE(gamma=0.9, lmbda=-0.1, value_network=_critic()), "lmbda"),
    (
        "TDLambda-lmbda",
        lambda: rlloss.TDLambdaEstimator(gamma=0.9, lmbda=1.5, value_network=_critic()),
        "lmbda",
    ),
    ("TD0-gamma", lambda: rlloss.TD0Estimator(gamma=-0.5, value_network=_critic()), "gamma"),
    ("TD1-gamma-nan", lambda: rlloss.TD1Estimator(gamma=math.nan, value_network=_critic()), "nan"),
    (
        "VTrace-rho_thresh",
        lambda: rlloss.VTrace(
            gamma=0.9, actor_network=nets.make_actor(), value_network=_critic(), rho_thresh=0.0
        ),
        "rho_thresh",
    ),
    (
        "VTrace-c_thresh",
        lambda: rlloss.VTrace(
            gamma=0.9, actor_network=nets.make_actor(), value_network=_critic(), c_thresh=-1.0
        ),
        "c_thresh",
    ),
    ("MAGAE-lmbda", lambda: rlloss.MultiAgentGAE(gamma=0.9, lmbda=2.0), "lmbda"),
]


@pytest.mark.parametrize("build, pattern", _cases(lambda: CONSTRUCTION))
def test_bad_hyperparameter_at_construction(build, pattern):
    expect_error((ValueError, TypeError, RuntimeError), pattern, build)


def test_dqn_wraps_a_plain_network_as_torchrl_does():
    """TorchRL's DQNLoss turns a plain module of the observation into a QValueActor."""
    loss = rlloss.DQNLoss(
        MLP(in_features=OBS, out_features=DISCRETE_ACT), action_space="categorical"
    )
    assert loss.value_network.in_keys == ["observation"]
    assert_finite(loss, run(loss, test_sac.discrete_transitions(False, B)))


ASSIGNMENT = [
    ("ClipPPO-clip_epsilon-1.5", "ClipPPOLoss", "clip_epsilon", 1.5),
    ("ClipPPO-clip_epsilon-0", "ClipPPOLoss", "clip_epsilon", 0.0),
    ("ClipPPO-clip_epsilon-tensor", "ClipPPOLoss", "clip_epsilon", torch.tensor(2.0)),
    ("ClipPPO-entropy_coeff-neg", "ClipPPOLoss", "entropy_coeff", -1.0),
    ("ClipPPO-entropy_coeff-nan", "ClipPPOLoss", "entropy_coeff", math.nan),
    ("ClipPPO-critic_coeff-neg", "ClipPPOLoss", "critic_coeff", -0.5),
    ("PPO-entropy_coeff-inf-ok-but-neg-inf", "PPOLoss", "entropy_coeff", -math.inf),
    ("PPO-samples_mc_entropy-0", "PPOLoss", "samples_mc_entropy", 0),
    ("KLPEN-beta-neg", "KLPENPPOLoss", "beta", -0.1),
    ("KLPEN-dtarg-0", "KLPENPPOLoss", "dtarg", 0.0),
    ("KLPEN-increment-0.9", "KLPENPPOLoss", "increment", 0.9),
    ("RPO-rpo_alpha-neg", "RPOLoss", "rpo_alpha", -1.0),
    ("DQN-gamma-1.1", "DQNLoss", "gamma", 1.1),
    ("DDPG-gamma-neg", "DDPGLoss", "gamma", -0.1),
    ("TD3-policy_noise-neg", "TD3Loss", "policy_noise", -0.2),
    ("TD3-noise_clip-neg", "TD3Loss", "noise_clip", -0.5),
    ("SAC-gamma-2", "SACLoss", "gamma", 2.0),
    ("MPO-epsilon-0", "MPOLoss", "epsilon", 0.0),
    ("DiscreteMPO-epsilon_policy-neg", "DiscreteMPOLoss", "epsilon_policy", -1e-3),
    ("A2C-entropy_coeff-neg", "A2CLoss", "entropy_coeff", -0.5),
    ("TD3BC-alpha-neg", "TD3BCLoss", "alpha", -1.0),
    ("IQL-expectile-2", "IQLLoss", "expectile", 2.0),
    ("IQL-temperature-neg", "IQLLoss", "temperature", -3.0),
    ("DiscreteCQL-gamma-neg", "DiscreteCQLLoss", "gamma", -0.5),
    ("CQL-temperature-neg", "CQLLoss", "temperature", -1.0),
    ("CQL-min_q_weight-neg", "CQLLoss", "min_q_weight", -0.5),
    # checked at construction, and (issue 49's sweep) on assignment too
    ("MPO-num_samples-0", "MPOLoss", "num_samples", 0),
    ("CQL-num_random-0", "CQLLoss", "num_random", 0),
    ("CQL-num_random-2.5", "CQLLoss", "num_random", 2.5),
    ("TQC-top_quantiles_to_drop_per_net-neg", "TQCLoss", "top_quantiles_to_drop_per_net", -1),
    ("REDQ-sub_sample_len-0", "REDQLoss", "sub_sample_len", 0),
    ("KLPEN-beta_min-neg", "KLPENPPOLoss", "beta_min", -0.1),
    ("KLPEN-beta_max-neg", "KLPENPPOLoss", "beta_max", -1.0),
    # string settings: the constructor's choices hold for a later assignment too
    ("PPO-reduction-avg", "PPOLoss", "reduction", "avg"),
    ("ClipPPO-loss_critic_type-huber", "ClipPPOLoss", "loss_critic_type", "huber"),
    ("A2C-loss_critic_type-l3", "A2CLoss", "loss_critic_type", "l3"),
    ("DQN-loss_function-huber", "DQNLoss", "loss_function", "huber"),
    ("DQN-reduction-max", "DQNLoss", "reduction", "max"),
    ("TD3-loss_function-l3", "TD3Loss", "loss_function", "l3"),
    ("SAC-scalar_output_mode-tensor", "SACLoss", "scalar_output_mode", "tensor"),
    ("IQL-scalar_output_mode-tensor", "IQLLoss", "scalar_output_mode", "tensor"),
    ("CQL-reduction-avg", "CQLLoss", "reduction", "avg"),
    ("DiscreteCQL-priority_weighting", "DiscreteCQLLoss", "priority_weighting", "median"),
]


def assert_assignment_refused(module, name: str, value) -> None:
    """``module.<name> = value`` raises a ``ValueError`` naming the attribute, and leaves the
    attribute as it was (a number, a tensor or ``None``)."""
    before = getattr(module, name)
    before = before.clone() if isinstance(before, torch.Tensor) else before
    expect_error(ValueError, rf"{name} must be", lambda: setattr(module, name, value))
    after = getattr(module, name)
    if before is None or isinstance(before, str):  # a choice: the same string
        assert after == before
    else:
        assert torch.equal(torch.as_tensor(after), torch.as_tensor(before))


@pytest.mark.parametrize("subject, name, value", _cases(lambda: ASSIGNMENT))
def test_bad_coefficient_assignment_is_refused_and_changes_nothing(subject, name, value):
    module, batch = BY_NAME[subject].build()
    assert_assignment_refused(module, name, value)


@pytest.mark.parametrize(
    "subject, name, value",
    [
        ("ClipPPOLoss", "clip_epsilon", 0.1),
        ("ClipPPOLoss", "entropy_coeff", 0.0),
        ("TD3Loss", "policy_noise", 0.3),
        ("DQNLoss", "gamma", 0.5),
        ("KLPENPPOLoss", "beta", 3.0),
    ],
)
def test_valid_coefficient_assignment_is_in_place(subject, name, value):
    module, batch = BY_NAME[subject].build()
    buffer = module._buffers.get(name)
    setattr(module, name, value)
    assert float(getattr(module, name)) == pytest.approx(value)
    if buffer is not None:
        assert module._buffers[name] is buffer  # the same tensor: compiled graphs stay valid


# ----------------------------------------------------------------------------- state dicts
STATE_DICTS = [
    ("SAC-from-TD3", "SACLoss", "TD3Loss"),
    ("TD3-from-SAC", "TD3Loss", "SACLoss"),
    ("DQN-from-DDPG", "DQNLoss", "DDPGLoss"),
    ("ClipPPO-from-DQN", "ClipPPOLoss", "DQNLoss"),
    ("MPO-from-SAC", "MPOLoss", "SACLoss"),
    ("DiscreteSAC-from-DiscreteMPO", "DiscreteSACLoss", "DiscreteMPOLoss"),
]


@pytest.mark.parametrize("target, source", _cases(lambda: STATE_DICTS))
def test_state_dict_of_another_loss_is_refused_briefly(target, source):
    module, _ = BY_NAME[target].build()
    other, _ = BY_NAME[source].build()
    expect_error(
        RuntimeError,
        r"does not fit this module",
        lambda: module.load_state_dict(other.state_dict()),
    )


def _wider_sac():
    wide = ValueOperator(
        MLP(in_features=OBS + CONTINUOUS_ACT, out_features=1, num_cells=[32]),
        in_keys=["observation", "action"],
    )
    return rlloss.SACLoss(test_sac.actor(), wide)


@pytest.mark.parametrize("strict", [True, False])
def test_state_dict_of_other_network_sizes_names_the_shapes(strict):
    module, _ = BY_NAME["SACLoss"].build()
    state = _wider_sac().state_dict()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    pattern = r"qvalue_network_params.*saved \(2, 32, 7\), here \(2, 16, 7\)"
    expect_error(RuntimeError, pattern, lambda: module.load_state_dict(state, strict=strict))
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, equal_nan=True)


# ----------------------------------------------------------------------------- estimators
def test_time_dim_outside_the_batch_is_refused():
    module, batch = BY_NAME["GAE"].build()
    expect_error(ValueError, r"time_dim=5 .*2 dims", lambda: module(batch, time_dim=5))
    module.time_dim = -3
    expect_error(ValueError, r"time_dim=-3", lambda: module(batch))


@pytest.mark.parametrize("subject", [pytest.param(s, id=s.name) for s in SUBJECTS if s.estimator])
def test_estimator_on_a_batch_without_time_dim_is_refused(subject):
    module, batch = subject.build()
    flat = batch[0, 0]
    expect_error(ValueError, r"time dimension|batch_size", lambda: module(flat))


# ----------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(
    padding=st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(1e38)),
        min_size=4,
        max_size=4,
    ),
    reduction=st.sampled_from(["mean", "sum", "none"]),
)
def test_masked_reduction_ignores_padding_in_value_and_gradient(padding, reduction):
    valid = torch.tensor([0.5, -1.0, 2.0, 3.0])
    mask = torch.tensor([True] * 4 + [False] * 4)
    x = torch.cat([valid, torch.tensor(padding, dtype=torch.float32)]).requires_grad_()
    filled = torch.where(mask, x, 0.0)  # what the losses do before the arithmetic
    out = rlf.reduce((filled.exp() * 2.0).square(), reduction, mask)
    out.sum().backward()
    reference = (valid.exp() * 2.0).square()
    expected = {"mean": reference.mean(), "sum": reference.sum()}.get(reduction)
    if expected is not None:
        torch.testing.assert_close(out, expected)
    assert torch.isfinite(x.grad).all()
    assert (x.grad[4:] == 0).all()


@settings(max_examples=25, deadline=None)
@given(
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.just(-1e30)),
    key=st.sampled_from(["advantage", "action_log_prob", "value_target", "observation"]),
)
def test_ppo_padding_content_never_changes_the_loss_or_a_gradient(value, key):
    torch.manual_seed(0)
    actor, critic = nets.make_actor(), nets.make_critic()
    loss = rlloss.ClipPPOLoss(actor, critic, normalize_advantage=True)
    batch = nets.rollout(actor, (2, 4), critic)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    batch["collector", "mask"] = mask
    results = []
    for content in (0.0, value):
        padded = batch.clone()
        entry = padded.get(key).clone()
        entry[~mask] = content
        padded.set(key, entry)
        out = run(loss, padded)
        grads = [p.grad.clone() for p in loss.parameters()]
        results.append(
            ([out[k].detach() for k in sorted(out.keys()) if k.startswith("loss")], grads)
        )
    for a, b in zip(results[0][0] + results[0][1], results[1][0] + results[1][1], strict=True):
        torch.testing.assert_close(a, b)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=5, max_size=5).filter(any))
def test_categorical_terms_are_finite_for_any_set_of_masked_actions(allowed):
    allowed = torch.tensor(allowed)
    logits = torch.randn(3, 5).masked_fill(~allowed, -math.inf).requires_grad_()
    target = torch.randn(3, 5).masked_fill(~allowed, -math.inf).log_softmax(-1)
    terms = [
        rlf.categorical_cross_entropy(target, logits),
        rlf.categorical_kl(target, logits),
        rlf.categorical_entropy(logits.log_softmax(-1)),
        rlf.discrete_soft_value(torch.randn(3, 5), logits.log_softmax(-1), 0.3),
    ]
    total = sum(t.sum() for t in terms)
    total.backward()
    assert torch.isfinite(total)
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("name", ["ClipPPOLoss", "DQNLoss", "SACLoss"])
def test_padded_batches_compile_as_one_graph(name):
    """Filling the padding reads no value on the host: the loss still traces as one graph
    (``fullgraph=True`` fails on a host sync) and gives the eager numbers."""
    torch._dynamo.reset()
    module, batch = BY_NAME[name].build()
    _pad(batch, "observation", math.nan)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.manual_seed(0)
    expected = run(module, batch.clone())
    torch.manual_seed(0)
    out = run(compiled, batch.clone())
    for key in expected.keys():
        torch.testing.assert_close(out[key], expected[key], msg=key)
    assert_finite(module, out)
    torch._dynamo.reset()
