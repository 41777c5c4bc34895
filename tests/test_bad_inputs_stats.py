"""Bad inputs to the training helpers: KL early stopping, the KL-adaptive learning rate, the
piecewise schedule, the reward normaliser and the target-network updaters.

Wrong arguments get an error naming the argument and the accepted values; non-finite data
(NaN, inf) is rejected (early stopping stops) or ignored (the learning rate and the reward
statistics stay as they were) and counted, without a host sync on tensor paths.
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from torch import nn
from torchrl.modules import MLP, QValueActor

import rlloss
from rlloss import KLAdaptiveLR, KLEarlyStopping, PiecewiseSchedule, RewardNormalizer, kl_exceeds

NON_FINITE = [math.nan, math.inf, -math.inf]


def expect_error(error, pattern, call):
    with pytest.raises(error) as info:
        call()
    assert re.search(pattern, str(info.value)), f"{info.value} does not match {pattern!r}"


def optimizer(groups=1, lr=1e-3):
    params = [{"params": [nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return torch.optim.Adam(params, lr=lr)


def dqn():
    actor = QValueActor(
        MLP(in_features=3, out_features=2, num_cells=[4]),
        in_keys=["observation"],
        spec=None,
        action_space="one-hot",
    )
    return rlloss.DQNLoss(actor, action_space="one-hot")


# ----------------------------------------------------------------------------- constructors
CONSTRUCTORS = [
    ("early-target_kl-0", lambda: KLEarlyStopping(target_kl=0.0), ValueError, "target_kl"),
    ("early-target_kl-neg", lambda: KLEarlyStopping(target_kl=-0.01), ValueError, "target_kl"),
    ("early-target_kl-nan", lambda: KLEarlyStopping(target_kl=math.nan), ValueError, "nan"),
    ("early-target_kl-str", lambda: KLEarlyStopping(target_kl="0.01"), TypeError, "number"),
    ("early-factor-0", lambda: KLEarlyStopping(0.01, factor=0.0), ValueError, "factor"),
    (
        "lr-kl_threshold-0",
        lambda: KLAdaptiveLR(optimizer(), kl_threshold=0.0),
        ValueError,
        "kl_threshold",
    ),
    ("lr-min_lr-neg", lambda: KLAdaptiveLR(optimizer(), min_lr=-1e-6), ValueError, "min_lr"),
    (
        "lr-max-below-min",
        lambda: KLAdaptiveLR(optimizer(), min_lr=1e-3, max_lr=1e-4),
        ValueError,
        "max_lr",
    ),
    ("lr-kl_factor-1", lambda: KLAdaptiveLR(optimizer(), kl_factor=1.0), ValueError, "kl_factor"),
    ("lr-lr_factor-0.5", lambda: KLAdaptiveLR(optimizer(), lr_factor=0.5), ValueError, "lr_factor"),
    (
        "lr-torchrl-target_kl-0",
        lambda: KLAdaptiveLR(optimizer(), target_kl=0.0),
        ValueError,
        "target_kl",
    ),
    (
        "lr-torchrl-factor-1",
        lambda: KLAdaptiveLR(optimizer(), target_kl=0.01, factor=1.0),
        ValueError,
        r"^factor",
    ),
    ("schedule-empty", lambda: PiecewiseSchedule([]), ValueError, "at least one"),
    ("schedule-triple", lambda: PiecewiseSchedule([(0, 1.0, 2.0)]), ValueError, "pair"),
    (
        "schedule-unsorted",
        lambda: PiecewiseSchedule([(10, 1.0), (5, 0.0)]),
        ValueError,
        "increasing",
    ),
    ("schedule-kind", lambda: PiecewiseSchedule([(0, 1.0)], kind="linear"), ValueError, "kind"),
    (
        "schedule-nan-value",
        lambda: PiecewiseSchedule([(0, math.nan)]),
        ValueError,
        "must be a number, got nan",
    ),
    (
        "schedule-inf-step",
        lambda: PiecewiseSchedule([(0, 1.0), (math.inf, 0.0)]),
        ValueError,
        "finite",
    ),
    ("normalizer-num_envs-0", lambda: RewardNormalizer(num_envs=0), ValueError, "num_envs"),
    ("normalizer-num_envs-2.5", lambda: RewardNormalizer(num_envs=2.5), ValueError, "integer"),
    ("normalizer-gamma-1.5", lambda: RewardNormalizer(num_envs=2, gamma=1.5), ValueError, "gamma"),
    ("normalizer-eps-neg", lambda: RewardNormalizer(num_envs=2, eps=-1e-8), ValueError, "eps"),
    (
        "soft-tau-0",
        lambda: rlloss.SoftUpdate(dqn(), tau=0.0),
        ValueError,
        r"tau must be in \(0.0, 1.0\]",
    ),
    (
        "soft-tau-1.5",
        lambda: rlloss.SoftUpdate(dqn(), tau=1.5),
        ValueError,
        r"tau must be in \(0.0, 1.0\], got 1.5",
    ),
    ("soft-tau-neg", lambda: rlloss.SoftUpdate(dqn(), tau=-0.1), ValueError, "tau"),
    (
        "soft-eps-1",
        lambda: rlloss.SoftUpdate(dqn(), eps=1.0),
        ValueError,
        r"eps must be in \[0.0, 1.0\)",
    ),
    ("soft-eps-neg", lambda: rlloss.SoftUpdate(dqn(), eps=-0.5), ValueError, "eps"),
    (
        "soft-both",
        lambda: rlloss.SoftUpdate(dqn(), eps=0.9, tau=0.1),
        ValueError,
        "One and only one",
    ),
    (
        "hard-interval-0",
        lambda: rlloss.HardUpdate(dqn(), value_network_update_interval=0),
        ValueError,
        "value_network_update_interval",
    ),
    (
        "hard-interval-neg",
        lambda: rlloss.HardUpdate(dqn(), value_network_update_interval=-5),
        ValueError,
        "value_network_update_interval",
    ),
    (
        "hard-interval-2.5",
        lambda: rlloss.HardUpdate(dqn(), value_network_update_interval=2.5),
        ValueError,
        "integer",
    ),
]


CONSTRUCTORS += [
    ("early-target_kl-inf", lambda: KLEarlyStopping(target_kl=math.inf), ValueError, "target_kl"),
    (
        "lr-kl_threshold-inf",
        lambda: KLAdaptiveLR(optimizer(), kl_threshold=math.inf),
        ValueError,
        "kl_threshold",
    ),
    (
        "lr-lr_factor-inf",
        lambda: KLAdaptiveLR(optimizer(), lr_factor=math.inf),
        ValueError,
        "lr_factor",
    ),
    ("schedule-none", lambda: PiecewiseSchedule(None), TypeError, "list of"),
    ("schedule-not-pairs", lambda: PiecewiseSchedule([5]), ValueError, "pair"),
    ("schedule-string-value", lambda: PiecewiseSchedule([(0, "a")]), TypeError, "number"),
    (
        "hard-interval-int-shown",
        lambda: rlloss.HardUpdate(dqn(), value_network_update_interval=0),
        ValueError,
        r"got 0\.$",
    ),
    (
        "lr-load-none",
        lambda: KLAdaptiveLR(optimizer()).load_state_dict(None),
        TypeError,
        "expects a dict",
    ),
    (
        "early-load-list",
        lambda: KLEarlyStopping(0.01).load_state_dict([1]),
        TypeError,
        "expects a dict",
    ),
]


@pytest.mark.parametrize(
    "build, error, pattern", [pytest.param(*case[1:], id=case[0]) for case in CONSTRUCTORS]
)
def test_bad_argument_is_named(build, error, pattern):
    expect_error(error, pattern, build)


def test_schedule_cannot_drive_a_coefficient_out_of_its_range():
    from tests import nets

    loss = rlloss.ClipPPOLoss(nets.make_actor(), nets.make_critic())
    schedule = PiecewiseSchedule([(0, 0.2), (100, -0.2)])
    schedule.apply(10, (loss, "clip_epsilon"))
    expect_error(
        ValueError,
        r"clip_epsilon must be in \(0.0, 1.0\)",
        lambda: schedule.apply(90, (loss, "clip_epsilon")),
    )
    assert float(loss.clip_epsilon) == pytest.approx(0.16)  # the last valid value stays


# ----------------------------------------------------------------------------- KL early stopping
@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize("kl", NON_FINITE)
def test_early_stopping_rejects_a_non_finite_kl(kl, as_tensor):
    stopping = KLEarlyStopping(target_kl=0.01)
    assert not stopping.should_stop(torch.tensor(0.001) if as_tensor else 0.001)
    assert stopping.should_stop(torch.tensor(kl) if as_tensor else kl)
    assert stopping.num_nonfinite == 1
    assert stopping.stop_kl is not None and not math.isfinite(stopping.stop_kl)
    stopping.reset()
    assert not stopping.should_stop(0.001) and stopping.num_nonfinite == 1  # a lifetime count


@pytest.mark.parametrize("kl", NON_FINITE)
def test_kl_exceeds_is_true_for_non_finite_kls_without_a_sync(kl):
    assert kl_exceeds(kl, 0.01) is True
    flags = kl_exceeds(torch.tensor([0.001, kl, 0.1]), 0.01)
    assert isinstance(flags, torch.Tensor)
    assert flags.tolist() == [False, True, True]


def test_early_stopping_state_dict_round_trip():
    stopping = KLEarlyStopping(target_kl=0.02, factor=2.0)
    stopping.should_stop(math.nan)
    restored = KLEarlyStopping(target_kl=0.5)
    restored.load_state_dict(stopping.state_dict())
    assert restored.state_dict() == {
        "target_kl": 0.02,
        "factor": 2.0,
        "stopped": True,
        "stop_kl": restored.stop_kl,
        "num_nonfinite": 1,
    }
    assert restored.should_stop(0.0)


@pytest.mark.parametrize(
    "state, pattern",
    [
        ({"target_kl": 0.01}, r"missing entries \['factor'"),
        (
            {
                "target_kl": 0.01,
                "factor": 1.5,
                "stopped": False,
                "stop_kl": None,
                "num_nonfinite": 0,
                "lr": 1,
            },
            r"unexpected entries \['lr'\]",
        ),
        (
            {
                "target_kl": -1.0,
                "factor": 1.5,
                "stopped": False,
                "stop_kl": None,
                "num_nonfinite": 0,
            },
            "target_kl",
        ),
    ],
    ids=["missing", "unexpected", "bad-value"],
)
def test_early_stopping_refuses_a_foreign_state(state, pattern):
    stopping = KLEarlyStopping(target_kl=0.01)
    expect_error(ValueError, pattern, lambda: stopping.load_state_dict(state))
    assert stopping.target_kl == 0.01


# ----------------------------------------------------------------------------- KL-adaptive lr
@pytest.mark.parametrize("torchrl_rule", [False, True])
@pytest.mark.parametrize("tensor_lr", [False, True])
@pytest.mark.parametrize("kl", NON_FINITE)
def test_adaptive_lr_ignores_a_non_finite_kl(kl, tensor_lr, torchrl_rule):
    opt = optimizer(lr=torch.tensor(1e-3) if tensor_lr else 1e-3)
    keywords = {"target_kl": 0.01} if torchrl_rule else {"kl_threshold": 0.01}
    scheduler = KLAdaptiveLR(opt, **keywords)
    scheduler.step(torch.tensor(kl) if tensor_lr else kl)
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(1e-3)
    assert isinstance(scheduler.num_nonfinite, torch.Tensor)
    assert int(scheduler.num_nonfinite) == 1
    scheduler.step(1.0)  # a finite, large KL still lowers the lr
    assert float(opt.param_groups[0]["lr"]) < 1e-3
    assert int(scheduler.num_nonfinite) == 1


def test_adaptive_lr_refuses_a_state_of_another_optimizer():
    source = KLAdaptiveLR(optimizer(groups=1))
    target = KLAdaptiveLR(optimizer(groups=2))
    expect_error(
        ValueError,
        r"1 param group\(s\), the optimizer has 2",
        lambda: target.load_state_dict(source.state_dict()),
    )


def test_adaptive_lr_refuses_a_state_without_hyperparameters():
    scheduler = KLAdaptiveLR(optimizer())
    state = scheduler.state_dict()
    del state["kl_threshold"], state["lr_factor"]
    expect_error(
        ValueError, r"no \['kl_threshold', 'lr_factor'\]", lambda: scheduler.load_state_dict(state)
    )


def test_adaptive_lr_state_keeps_the_count():
    scheduler = KLAdaptiveLR(optimizer())
    scheduler.step(math.nan)
    restored = KLAdaptiveLR(optimizer())
    restored.load_state_dict(scheduler.state_dict())
    assert int(restored.num_nonfinite) == 1


# ----------------------------------------------------------------------------- reward normaliser
def reference_statistics(rewards: list[list[float]], dones: list[list[bool]], gamma: float):
    """Mean and population variance of the returns of finite steps, a non-finite reward counting
    as 0 in its environment's running return (a plain loop)."""
    kept = []
    for env_rewards, env_dones in zip(rewards, dones, strict=True):
        running = 0.0
        for reward, done in zip(env_rewards, env_dones, strict=True):
            finite = math.isfinite(reward)
            running = gamma * running + (reward if finite else 0.0)
            if finite:
                kept.append(running)
            if done:
                running = 0.0
    mean = sum(kept) / len(kept)
    return len(kept), mean, sum((r - mean) ** 2 for r in kept) / len(kept)


@pytest.mark.parametrize("mode", ["step", "batch"])
@pytest.mark.parametrize("bad", NON_FINITE)
def test_normalizer_statistics_ignore_non_finite_rewards(bad, mode):
    torch.manual_seed(0)
    rewards = torch.randn(3, 5, 1, dtype=torch.float64)
    rewards[1, 2, 0] = bad
    rewards[2, 0, 0] = bad
    dones = torch.rand(3, 5, 1) < 0.2
    normalizer = RewardNormalizer(num_envs=3, gamma=0.9)
    if mode == "batch":
        out = normalizer(rewards, dones)
    else:
        out = torch.stack([normalizer(rewards[:, t], dones[:, t]) for t in range(5)], 1)
    count, mean, var = reference_statistics(
        rewards.squeeze(-1).tolist(), dones.squeeze(-1).tolist(), 0.9
    )
    assert int(normalizer.num_nonfinite) == 2
    assert float(normalizer.count) == count
    assert float(normalizer.mean) == pytest.approx(mean)
    assert float(normalizer.var) == pytest.approx(var)
    finite = torch.isfinite(rewards)
    assert torch.isfinite(out[finite]).all()
    assert torch.equal(torch.isnan(out), torch.isnan(rewards))  # NaN in, NaN out
    # and the scaling goes on: a later batch is divided by the std of the returns
    later = normalizer(torch.ones(3, 1, dtype=torch.float64), torch.zeros(3, 1, dtype=torch.bool))
    assert torch.isfinite(later).all() and not torch.equal(later, torch.ones(3, 1))


def test_normalizer_with_only_non_finite_rewards_keeps_its_statistics():
    normalizer = RewardNormalizer(num_envs=2)
    normalizer(torch.tensor([1.0, 2.0]), torch.tensor([False, False]))
    before = {k: v.clone() for k, v in normalizer.state_dict().items() if k != "num_nonfinite"}
    normalizer(torch.tensor([math.nan, math.inf]), torch.tensor([False, False]))
    for key, value in before.items():
        if key != "returns":
            torch.testing.assert_close(normalizer.state_dict()[key], value)
    assert int(normalizer.num_nonfinite) == 2


def test_normalizer_loads_a_state_saved_before_the_count_existed():
    normalizer = RewardNormalizer(num_envs=2)
    normalizer(torch.tensor([1.0, 2.0]), torch.tensor([False, True]))
    state = normalizer.state_dict()
    del state["num_nonfinite"]
    restored = RewardNormalizer(num_envs=2)
    restored.load_state_dict(state)
    torch.testing.assert_close(restored.mean, normalizer.mean)


def test_normalizer_refuses_a_state_of_another_size():
    source = RewardNormalizer(num_envs=3)
    expect_error(
        RuntimeError,
        r"does not fit this module.*'returns': saved \(3,\), here \(2,\)",
        lambda: RewardNormalizer(num_envs=2).load_state_dict(source.state_dict()),
    )


@pytest.mark.parametrize(
    "reward, done, pattern",
    [
        (torch.zeros(4), torch.zeros(4, dtype=torch.bool), "num_envs=3"),
        (torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool), r"\[num_envs, T, 1\]"),
        (torch.zeros(3), torch.zeros(3, 1, dtype=torch.bool), "shape mismatch"),
    ],
    ids=["envs", "2d", "mismatch"],
)
def test_normalizer_refuses_wrong_shapes(reward, done, pattern):
    expect_error(ValueError, pattern, lambda: RewardNormalizer(num_envs=3)(reward, done))


@pytest.mark.parametrize(
    "name, value", [("gamma", 1.5), ("gamma", math.nan), ("eps", -1e-8)], ids=str
)
def test_normalizer_checks_gamma_and_eps_on_assignment_as_at_construction(name, value):
    """Issue 49's sweep: the constructor's ranges hold for a later assignment too."""
    from tests.test_bad_inputs import assert_assignment_refused

    normalizer = RewardNormalizer(num_envs=2, gamma=0.9)
    assert_assignment_refused(normalizer, name, value)
    normalizer.gamma = 0.5
    assert normalizer.gamma == 0.5


@pytest.mark.parametrize(
    "build, name, value",
    [
        (lambda: rlloss.SoftUpdate(dqn(), tau=0.01), "eps", 1.5),
        (lambda: rlloss.SoftUpdate(dqn(), tau=0.01), "eps", -0.1),
        (
            lambda: rlloss.HardUpdate(dqn(), value_network_update_interval=10),
            "value_network_update_interval",
            0,
        ),
        (
            lambda: rlloss.HardUpdate(dqn(), value_network_update_interval=10),
            "value_network_update_interval",
            2.5,
        ),
        (lambda: KLEarlyStopping(0.01), "target_kl", 0.0),
        (lambda: KLEarlyStopping(0.01), "factor", -1.0),
    ],
    ids=[
        "soft-eps-1.5",
        "soft-eps-neg",
        "hard-interval-0",
        "hard-interval-2.5",
        "early-target_kl-0",
        "early-factor-neg",
    ],
)
def test_updater_and_early_stopping_settings_are_checked_on_assignment(build, name, value):
    """Issue 49's sweep: the constructor's ranges hold for a later assignment too."""
    from tests.test_bad_inputs import assert_assignment_refused

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        owner = build()
    assert_assignment_refused(owner, name, value)
