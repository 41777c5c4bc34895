"""rlloss.functional.returns against the loop references, identities, TorchRL parity,
gradients, compile."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrl.objectives.value import functional as torchrl_functional

from rlloss.functional import (
    bootstrap_discount,
    gae_advantage,
    reverse_discounted_sum,
    td0_error,
    td0_return,
    td_lambda_return,
    vtrace,
)
from tests import reference

GRID_SHAPES = [(1, 1), (7, 1), (100, 1)]
GRID_SHAPES += [(3, steps, 1) for steps in (1, 2, 7, 64, 100)]
GRID_SHAPES += [(2, 3, 2, 1), (2, 3, 64, 1)]
TIMES = [1, 2, 7, 64, 100]
FLAGS = ["none", "terminated", "truncated", "mixed"]
DTYPES = [torch.float32, torch.float64]
GAMMA_LAMBDA = [(0.0, 0.95), (0.9, 0.0), (0.99, 0.95), (1.0, 1.0), (1.0, 0.7), (0.9, 1.0)]
GAMMAS = [0.0, 0.9, 1.0]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-4},
    torch.float64: {"rtol": 1e-10, "atol": 1e-10},
}


def make_batch(shape, flags="mixed", dtype=torch.float64, consistent=False, seed=0):
    """reward, value, next_value, done, terminated of shape ``[*B, T, 1]``.

    ``flags``: ``"none"`` (no episode ends), ``"terminated"`` (every end is a termination),
    ``"truncated"`` (every end is a truncation), ``"mixed"`` (both). ``consistent``: within
    episodes ``next_value[t] == value[t + 1]``, as in a real rollout.
    """
    generator = torch.Generator().manual_seed(seed)

    def randn():
        return torch.randn(shape, generator=generator, dtype=torch.float64)

    def flip(p):
        return torch.rand(shape, generator=generator) < p

    reward, value, next_value = randn(), randn(), randn()
    no_flag = torch.zeros(shape, dtype=torch.bool)
    if flags == "none":
        done, terminated = no_flag, no_flag
    elif flags == "terminated":
        done = terminated = flip(0.2)
    elif flags == "truncated":
        done, terminated = flip(0.2), no_flag
    elif flags == "mixed":
        done = flip(0.25)
        terminated = done & flip(0.5)
    else:
        raise ValueError(flags)
    if consistent:
        continuing = ~done[..., :-1, :]
        next_value[..., :-1, :] = torch.where(
            continuing, value[..., 1:, :], next_value[..., :-1, :]
        )
    return reward.to(dtype), value.to(dtype), next_value.to(dtype), done, terminated


def shape_id(shape):
    return "x".join(map(str, shape))


def assert_matches(actual, expected, dtype, **context):
    """``actual`` (in ``dtype``) against a float64 ``expected``; ``context`` names the case."""
    assert actual.dtype == dtype
    torch.testing.assert_close(
        actual.to(torch.float64), expected, **TOLERANCE[dtype], msg=lambda m: f"{context}: {m}"
    )


# --------------------------------------------------------------------------- against references


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", GRID_SHAPES, ids=shape_id)
def test_gae_matches_reference(shape, flags, dtype):
    reward, value, next_value, done, terminated = make_batch(shape, flags, dtype)
    for gamma, lmbda in GAMMA_LAMBDA:
        actual = gae_advantage(reward, value, next_value, done, terminated, gamma, lmbda)
        expected = reference.per_sequence(
            partial(reference.gae, gamma=gamma, lmbda=lmbda),
            reward,
            value,
            next_value,
            done,
            terminated,
        )
        assert_matches(actual, expected, dtype, gamma=gamma, lmbda=lmbda)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", GRID_SHAPES, ids=shape_id)
def test_td_lambda_matches_reference(shape, flags, dtype):
    reward, _, next_value, done, terminated = make_batch(shape, flags, dtype)
    for gamma, lmbda in GAMMA_LAMBDA:
        actual = td_lambda_return(reward, next_value, done, terminated, gamma, lmbda)
        expected = reference.per_sequence(
            partial(reference.td_lambda, gamma=gamma, lmbda=lmbda),
            reward,
            next_value,
            done,
            terminated,
        )
        assert_matches(actual, expected, dtype, gamma=gamma, lmbda=lmbda)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", [(1,), (5, 1), (2, 3, 7, 1)], ids=shape_id)
def test_td0_return_and_error_match_reference(shape, flags, dtype):
    reward, value, next_value, _, terminated = make_batch(shape, flags, dtype)
    for gamma in [0.0, 0.5, 0.99, 1.0]:
        target = reference.elementwise(
            partial(reference.td0_target, gamma=gamma),
            reward,
            next_value,
            terminated,
        )
        actual = td0_return(reward, next_value, terminated, gamma)
        assert_matches(actual, target, dtype, gamma=gamma)
        actual = td0_error(reward, value, next_value, terminated, gamma)
        assert_matches(actual, target - value.double(), dtype, gamma=gamma)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_td0_return_with_n_step_discount(dtype):
    reward, _, next_value, _, terminated = make_batch((2, 9, 1), "mixed", dtype)
    steps = torch.randint(1, 4, (2, 9, 1))  # int64, as TorchRL's MultiStep writes it
    discount = bootstrap_discount(0.9, steps)
    assert bootstrap_discount(0.9, None) == 0.9
    torch.testing.assert_close(discount.double(), 0.9 ** steps.double(), **TOLERANCE[torch.float32])
    expected = reference.elementwise(
        reference.td0_target, reward, next_value, terminated, 0.9 ** steps.double()
    )
    # float32 tolerance: the discount of an integer step count is float32, see below.
    actual = td0_return(reward, next_value, terminated, discount)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected, **TOLERANCE[torch.float32])


def test_td0_return_ignores_non_finite_values_of_terminal_states():
    # A terminal state's next value never enters the target, even when it is inf or NaN (a
    # target network evaluated on a garbage terminal observation): no 0 * inf = NaN.
    reward = torch.tensor([[1.0], [2.0], [3.0]])
    next_value = torch.tensor([[float("inf")], [float("nan")], [4.0]])
    terminated = torch.tensor([[True], [True], [False]])
    expected = torch.tensor([[1.0], [2.0], [3.0 + 0.5 * 4.0]])
    torch.testing.assert_close(td0_return(reward, next_value, terminated, 0.5), expected)
    # float flags keep the arithmetic form, 1 - terminated
    torch.testing.assert_close(
        td0_return(reward, next_value[2:].expand(3, 1), terminated.float(), 0.5),
        reward + 0.5 * (1 - terminated.float()) * 4.0,
    )


def test_bootstrap_discount_keeps_float64_precision():
    reward, _, next_value, _, terminated = make_batch((2, 9, 1), "mixed", torch.float64)
    steps = torch.randint(1, 4, (2, 9, 1))
    discount = bootstrap_discount(0.9, steps, torch.float64)
    actual = td0_return(reward, next_value, terminated, discount)
    expected = reference.elementwise(
        reference.td0_target, reward, next_value, terminated, 0.9 ** steps.double()
    )
    assert_matches(actual, expected, torch.float64)


# Layouts for reverse_discounted_sum: (shape with T as a placeholder, time_dim).
SUM_LAYOUTS = [
    (("T", 1), -2),
    ((3, "T", 1), -2),
    ((3, "T"), -1),
    ((3, "T"), 1),
    (("T", 2, 1), 0),
    (("T", 2, 1), -3),
    ((2, "T", 4), 1),
    (("T",), 0),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("steps", TIMES)
@pytest.mark.parametrize("layout,time_dim", SUM_LAYOUTS, ids=lambda v: str(v).replace(" ", ""))
def test_reverse_discounted_sum_matches_reference(layout, time_dim, steps, dtype):
    shape = tuple(steps if size == "T" else size for size in layout)
    x = torch.randn(shape, dtype=dtype)
    # One discount per time step, broadcast over the other dims.
    per_step = [steps if i == time_dim % len(shape) else 1 for i in range(len(shape))]
    discounts = {
        "0": 0.0,
        "0.5": 0.5,
        "0.99": 0.99,
        "1": 1.0,
        "tensor": torch.rand(shape, dtype=dtype),
        "per-step": torch.rand(per_step, dtype=dtype),
        "0-d tensor": torch.tensor(0.9, dtype=dtype),
    }
    for name, discount in discounts.items():
        full = torch.broadcast_to(torch.as_tensor(discount, dtype=dtype), shape)
        expected = reference.per_sequence(
            reference.reverse_discounted_sum, x, full, time_dim=time_dim
        )
        actual = reverse_discounted_sum(x, discount, time_dim=time_dim)
        assert_matches(actual, expected, dtype, discount=name)


_EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_unit = st.floats(0.0, 1.0, allow_nan=False)


@_EXAMPLES
@given(data=st.data(), steps=st.integers(1, 150), batch=st.integers(1, 3))
def test_reverse_discounted_sum_property(data, steps, batch):
    """Random lengths (any, not just powers of two) and discounts anywhere in [0, 1]."""
    x = data.draw(st.lists(st.floats(-100, 100), min_size=batch * steps, max_size=batch * steps))
    c = data.draw(st.lists(_unit, min_size=batch * steps, max_size=batch * steps))
    x = torch.tensor(x, dtype=torch.float64).reshape(batch, steps, 1)
    c = torch.tensor(c, dtype=torch.float64).reshape(batch, steps, 1)
    expected = reference.per_sequence(reference.reverse_discounted_sum, x, c)
    torch.testing.assert_close(reverse_discounted_sum(x, c), expected, rtol=1e-9, atol=1e-8)


@_EXAMPLES
@given(
    ends=st.lists(st.sampled_from(["-", "trunc", "term"]), min_size=1, max_size=40),
    gamma=_unit,
    lmbda=_unit,
    seed=st.integers(0, 2**31),
)
def test_gae_and_td_lambda_property(ends, gamma, lmbda, seed):
    """Any pattern of truncations and terminations, any gamma and lambda in [0, 1]."""
    steps = len(ends)
    done = torch.tensor([end != "-" for end in ends]).reshape(steps, 1)
    terminated = torch.tensor([end == "term" for end in ends]).reshape(steps, 1)
    generator = torch.Generator().manual_seed(seed)
    reward, value, next_value = torch.randn(
        3, steps, 1, dtype=torch.float64, generator=generator
    ).unbind(0)

    advantage = gae_advantage(reward, value, next_value, done, terminated, gamma, lmbda)
    expected = reference.per_sequence(
        partial(reference.gae, gamma=gamma, lmbda=lmbda),
        reward,
        value,
        next_value,
        done,
        terminated,
    )
    torch.testing.assert_close(advantage, expected, rtol=1e-10, atol=1e-10)

    ret = td_lambda_return(reward, next_value, done, terminated, gamma, lmbda)
    expected = reference.per_sequence(
        partial(reference.td_lambda, gamma=gamma, lmbda=lmbda),
        reward,
        next_value,
        done,
        terminated,
    )
    torch.testing.assert_close(ret, expected, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- identities

IDENTITY_SHAPES = [(1, 1), (7, 1), (2, 3, 64, 1), (3, 100, 1)]


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", IDENTITY_SHAPES, ids=shape_id)
def test_references_agree_with_each_other(shape, flags):
    """The recursive lambda-return at lambda=1 equals the forward Monte-Carlo sum: two
    independent formulations, so a mistake in either reference shows here."""
    reward, _, next_value, done, terminated = make_batch(shape, flags)
    for gamma in GAMMAS:
        td1 = reference.per_sequence(
            partial(reference.td_lambda, gamma=gamma, lmbda=1.0),
            reward,
            next_value,
            done,
            terminated,
        )
        monte_carlo = reference.per_sequence(
            partial(reference.monte_carlo_return, gamma=gamma),
            reward,
            next_value,
            done,
            terminated,
        )
        torch.testing.assert_close(td1, monte_carlo, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", IDENTITY_SHAPES, ids=shape_id)
def test_lambda_one_is_monte_carlo_return(shape, flags, dtype):
    """GAE(lambda=1) = discounted return (bootstrapped at cuts) - V, given consistent values;
    TD(lambda=1) = that return, whatever the values."""
    reward, value, next_value, done, terminated = make_batch(shape, flags, dtype, consistent=True)
    for gamma in GAMMAS:
        monte_carlo = reference.per_sequence(
            partial(reference.monte_carlo_return, gamma=gamma),
            reward,
            next_value,
            done,
            terminated,
        )
        advantage = gae_advantage(reward, value, next_value, done, terminated, gamma, 1.0)
        assert_matches(advantage, monte_carlo - value.double(), dtype, gamma=gamma)
        ret = td_lambda_return(reward, next_value, done, terminated, gamma, 1.0)
        assert_matches(ret, monte_carlo, dtype, gamma=gamma)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", IDENTITY_SHAPES, ids=shape_id)
def test_lambda_zero_is_td0(shape, flags, dtype):
    """GAE(lambda=0) is the TD error and TD(lambda=0) the TD(0) target, whatever the values."""
    reward, value, next_value, done, terminated = make_batch(shape, flags, dtype)
    for gamma in GAMMAS:
        torch.testing.assert_close(
            gae_advantage(reward, value, next_value, done, terminated, gamma, 0.0),
            td0_error(reward, value, next_value, terminated, gamma),
            **TOLERANCE[dtype],
        )
        torch.testing.assert_close(
            td_lambda_return(reward, next_value, done, terminated, gamma, 0.0),
            td0_return(reward, next_value, terminated, gamma),
            **TOLERANCE[dtype],
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", IDENTITY_SHAPES, ids=shape_id)
def test_td_lambda_return_is_gae_plus_value(shape, flags, dtype):
    """With ``next_value[t] == value[t + 1]`` inside episodes, ``G^lambda = A^GAE + V``."""
    reward, value, next_value, done, terminated = make_batch(shape, flags, dtype, consistent=True)
    for gamma, lmbda in GAMMA_LAMBDA:
        advantage = gae_advantage(reward, value, next_value, done, terminated, gamma, lmbda)
        ret = td_lambda_return(reward, next_value, done, terminated, gamma, lmbda)
        torch.testing.assert_close(
            ret,
            advantage + value,
            **TOLERANCE[dtype],
            msg=lambda m, g=gamma, lm=lmbda: f"gamma={g}, lmbda={lm}: {m}",
        )


def test_identity_needs_consistent_values():
    """Guards the identity test above: with inconsistent values it would fail."""
    reward, value, next_value, done, terminated = make_batch((3, 7, 1), "none")
    advantage = gae_advantage(reward, value, next_value, done, terminated, 0.9, 0.5)
    ret = td_lambda_return(reward, next_value, done, terminated, 0.9, 0.5)
    assert not torch.allclose(ret, advantage + value)


# --------------------------------------------------------------------------- truncation vs termination


def test_truncation_bootstraps_and_termination_does_not_worked_example():
    """One trajectory of 4 steps that ends at t = 1; gamma = 0.5, lambda = 1, V = 0,
    V' = [10, 20, 30, 40], r = [1, 2, 3, 4]. Numbers by hand."""
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(4, 1)
    value = torch.zeros(4, 1)
    next_value = torch.tensor([10.0, 20.0, 30.0, 40.0]).reshape(4, 1)
    done = torch.tensor([False, True, False, False]).reshape(4, 1)
    never = torch.zeros(4, 1, dtype=torch.bool)

    # Truncated at t=1: delta = [6, 12, 18, 24]; A_1 = 12 (trace cut), A_0 = 6 + 0.5 * 12.
    truncated = gae_advantage(reward, value, next_value, done, never, 0.5, 1.0)
    assert truncated.flatten().tolist() == [12.0, 12.0, 30.0, 24.0]
    # Terminated at t=1: delta_1 = 2 (no bootstrap), A_0 = 6 + 0.5 * 2.
    terminated = gae_advantage(reward, value, next_value, done, done, 0.5, 1.0)
    assert terminated.flatten().tolist() == [7.0, 2.0, 30.0, 24.0]

    # TD(1): truncated G_1 = 2 + 0.5 * 20, G_0 = 1 + 0.5 * 12; terminated G_1 = 2, G_0 = 2.
    truncated = td_lambda_return(reward, next_value, done, never, 0.5, 1.0)
    assert truncated.flatten().tolist() == [7.0, 12.0, 15.0, 24.0]
    terminated = td_lambda_return(reward, next_value, done, done, 0.5, 1.0)
    assert terminated.flatten().tolist() == [2.0, 2.0, 15.0, 24.0]


@pytest.mark.parametrize("lmbda", [0.0, 0.5, 1.0])
def test_truncation_bootstraps_from_next_value_termination_does_not(lmbda):
    """Perturb ``next_value`` at an episode end and the rewards after it."""
    reward, value, next_value, _, _ = make_batch((4, 12, 1))
    done = torch.zeros(4, 12, 1, dtype=torch.bool)
    done[:, 5] = True
    never = torch.zeros_like(done)
    bumped_value = next_value.clone()
    bumped_value[:, 5] += 1.0
    later_reward = reward.clone()
    later_reward[:, 6:] += 1.0

    def estimates(r, nv, terminated):
        return (
            gae_advantage(r, value, nv, done, terminated, 0.9, lmbda),
            td_lambda_return(r, nv, done, terminated, 0.9, lmbda),
        )

    for terminated in (never, done):
        base = estimates(reward, next_value, terminated)
        bumped = estimates(reward, bumped_value, terminated)
        later = estimates(later_reward, next_value, terminated)
        for b, n, lt in zip(base, bumped, later, strict=True):
            # Nothing after the cut reaches steps up to the cut.
            torch.testing.assert_close(lt[:, :6], b[:, :6])
            # Steps after the cut never see the bootstrap value of step 5.
            torch.testing.assert_close(n[:, 6:], b[:, 6:])
            change = (n - b)[:, 5]
            if terminated is never:  # truncation: d/dV'_5 = gamma
                torch.testing.assert_close(change, torch.full_like(change, 0.9))
            else:  # termination: no bootstrap at all
                torch.testing.assert_close(change, torch.zeros_like(change))


# --------------------------------------------------------------------------- TorchRL parity

PARITY_SHAPES = [((7, 1), -2), ((3, 64, 1), -2), ((2, 3, 100, 1), -2), ((33, 4, 1), 0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape,time_dim", PARITY_SHAPES, ids=lambda v: str(v).replace(" ", ""))
def test_parity_with_torchrl(shape, time_dim, flags, dtype):
    reward, value, next_value, done, terminated = make_batch(shape, flags, dtype)
    if time_dim == 0:  # make_batch puts time at -2; make it the leading dim
        reward, value, next_value, done, terminated = (
            t.movedim(-2, 0).contiguous() for t in (reward, value, next_value, done, terminated)
        )
    tolerance = TOLERANCE[dtype]
    for gamma, lmbda in [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.0, 0.5)]:
        advantage = gae_advantage(
            reward, value, next_value, done, terminated, gamma, lmbda, time_dim=time_dim
        )
        # TorchRL multiplies a Python-float gamma by an integer flag tensor, which rounds it to
        # float32 even for float64 inputs; a 0-d tensor of the inputs' dtype keeps its precision.
        their_gamma = torch.tensor(gamma, dtype=dtype)
        their_advantage, their_target = torchrl_functional.generalized_advantage_estimate(
            their_gamma, lmbda, value, next_value, reward, done, terminated, time_dim=time_dim
        )
        torch.testing.assert_close(advantage, their_advantage, **tolerance)
        torch.testing.assert_close(advantage + value, their_target, **tolerance)

        ret = td_lambda_return(
            reward, next_value, done, terminated, gamma, lmbda, time_dim=time_dim
        )
        theirs = torchrl_functional.td_lambda_return_estimate(
            gamma, lmbda, next_value, reward, done, terminated, time_dim=time_dim
        )
        torch.testing.assert_close(ret, theirs, **tolerance)


# --------------------------------------------------------------------------- hyperparameters as tensors, purity


def test_tensor_hyperparameters_equal_float_ones():
    reward, value, next_value, done, terminated = make_batch((2, 7, 1))
    gamma, lmbda = torch.tensor(0.9, dtype=torch.float64), torch.tensor(0.8, dtype=torch.float64)
    torch.testing.assert_close(
        gae_advantage(reward, value, next_value, done, terminated, gamma, lmbda),
        gae_advantage(reward, value, next_value, done, terminated, 0.9, 0.8),
    )
    torch.testing.assert_close(
        td_lambda_return(reward, next_value, done, terminated, gamma, lmbda),
        td_lambda_return(reward, next_value, done, terminated, 0.9, 0.8),
    )


def test_inputs_are_not_modified():
    """Float flags (same dtype as the values) would be written in place by a careless cast."""
    tensors = make_batch((2, 7, 1), "mixed")
    reward, value, next_value, done, terminated = (t.double() for t in tensors)
    originals = [t.clone() for t in (reward, value, next_value, done, terminated)]
    gae_advantage(reward, value, next_value, done, terminated, 0.9, 0.8)
    td_lambda_return(reward, next_value, done, terminated, 0.9, 0.8)
    td0_error(reward, value, next_value, terminated, 0.9)
    reverse_discounted_sum(reward, done)
    for after, before in zip((reward, value, next_value, done, terminated), originals, strict=True):
        assert torch.equal(after, before)


# --------------------------------------------------------------------------- gradients, extreme inputs


def test_gae_gradcheck():
    reward, value, next_value, done, terminated = make_batch((2, 5, 1), "mixed")
    reward, value, next_value = (t.requires_grad_() for t in (reward, value, next_value))

    def advantage(r, v, nv):
        return gae_advantage(r, v, nv, done, terminated, 0.9, 0.8)

    assert torch.autograd.gradcheck(advantage, (reward, value, next_value))
    advantage(reward, value, next_value).sum().backward()
    # dA/dV_t = -1 on the diagonal: every value gets a gradient.
    assert (value.grad != 0).all()


def test_td_lambda_and_reverse_sum_gradcheck():
    reward, _, next_value, done, terminated = make_batch((2, 6, 1), "mixed")
    reward, next_value = reward.requires_grad_(), next_value.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda r, nv: td_lambda_return(r, nv, done, terminated, 0.9, 0.7), (reward, next_value)
    )
    x = torch.randn(2, 7, 1, dtype=torch.float64, requires_grad=True)
    discount = torch.rand(2, 7, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(reverse_discounted_sum, (x, discount))


@pytest.mark.parametrize("steps", [1, 7, 64])
def test_bfloat16_gives_finite_close_outputs(steps):
    reward, value, next_value, done, terminated = make_batch((4, steps, 1), "mixed")
    expected = gae_advantage(reward, value, next_value, done, terminated, 0.99, 0.95)
    low = [t.bfloat16() for t in (reward, value, next_value)]
    advantage = gae_advantage(*low, done, terminated, 0.99, 0.95)
    assert advantage.dtype == torch.bfloat16
    assert torch.isfinite(advantage).all()
    scale = expected.abs().max()
    assert ((advantage.double() - expected).abs() <= 0.03 * scale + 0.03).all()
    ret = td_lambda_return(low[0], low[2], done, terminated, 0.99, 0.95)
    assert torch.isfinite(ret).all()


# --------------------------------------------------------------------------- shape errors


def _returns_calls():
    def gae(r, v, nv, d, t):
        return gae_advantage(r, v, nv, d, t, 0.9, 0.9)

    def td_lambda(r, v, nv, d, t):
        return td_lambda_return(r, nv, d, t, 0.9, 0.9)

    def td0(r, v, nv, d, t):
        return td0_return(r, nv, t, 0.9)

    def error(r, v, nv, d, t):
        return td0_error(r, v, nv, t, 0.9)

    names = ("reward", "value", "next_value", "done", "terminated")
    used = {
        "gae_advantage": (gae, names),
        "td_lambda_return": (td_lambda, ("reward", "next_value", "done", "terminated")),
        "td0_return": (td0, ("reward", "next_value", "terminated")),
        "td0_error": (error, ("reward", "value", "next_value", "terminated")),
    }
    return [
        pytest.param(fn, names.index(arg), id=f"{function}-{arg}")
        for function, (fn, args) in used.items()
        for arg in args
    ]


@pytest.mark.parametrize("fn,position", _returns_calls())
@pytest.mark.parametrize("odd", [(5,), (5, 1, 1)], ids=["[B]", "[B,1,1]"])
def test_shape_mismatch_raises_naming_both_shapes(fn, position, odd):
    """One argument ``[B]`` (or ``[B, 1, 1]``), the others ``[B, 1]``: never broadcast."""
    args = list(make_batch((5, 1)))
    args[position] = args[position].reshape(odd)
    with pytest.raises(ValueError) as error:
        fn(*args)
    assert "(5, 1)" in str(error.value)
    assert str(odd) in str(error.value)


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.slow  # inductor, 25 s with a cold cache (test_compile.py keeps a GAE compile)
def test_gae_compiles_fullgraph_without_recompiling():
    """Inductor, fullgraph; three fresh batches of one shape give eager numbers and one graph."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def counting_inductor(graph_module, example_inputs):
        graphs.append(graph_module)
        return compile_fx(graph_module, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(gae_advantage, backend=counting_inductor, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in range(3):
            batch = make_batch((4, 37, 1), "mixed", torch.float32, seed=seed)
            torch.testing.assert_close(
                compiled(*batch, 0.99, 0.95), gae_advantage(*batch, 0.99, 0.95)
            )
    assert len(graphs) == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("shape", GRID_SHAPES, ids=shape_id)
def test_vtrace_matches_reference(shape, flags, dtype):
    reward, value, next_value, done, terminated = make_batch(shape, flags, dtype)
    log_rho = torch.randn(reward.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    for gamma, (rho_bar, c_bar) in ((0.99, (1.0, 1.0)), (0.9, (2.0, 0.5))):
        actual, _ = vtrace(
            reward, value, next_value, done, terminated, log_rho, gamma, rho_bar, c_bar
        )
        expected = reference.per_sequence(
            partial(reference.vtrace_advantage, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar),
            reward,
            value,
            next_value,
            done,
            terminated,
            log_rho,
        )
        assert_matches(actual, expected, dtype, gamma=gamma, rho_bar=rho_bar)


def test_vtrace_matches_torchrl_functional():
    """Given the same log-ratio, TorchRL's loop (vtrace_advantage_estimate) gives our numbers."""
    from torchrl.objectives.value.functional import vtrace_advantage_estimate

    reward, value, next_value, done, terminated = make_batch((3, 7, 1), "mixed", torch.float64)
    log_pi, log_mu = torch.randn(2, 3, 7, 1, dtype=torch.float64)
    ours = vtrace(reward, value, next_value, done, terminated, log_pi - log_mu, 0.9, 1.5, 0.8)
    theirs = vtrace_advantage_estimate(
        0.9,
        log_pi,
        log_mu,
        value,
        next_value,
        reward,
        done,
        terminated,
        rho_thresh=1.5,
        c_thresh=0.8,
    )
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
