"""rlloss._fast: each speed path gives what the plain code it replaces gives.

The plain code is the specification (named in each path's docstring): each test compares a
path with it, or pins the private name the path relies on.
"""

from __future__ import annotations

import sys

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torch import nn

from rlloss import _fast
from tests.nets import make_critic


def test_get_path_reads_nested_entries_and_defaults():
    value = torch.randn(4, 1)
    batch = TensorDict({"next": {"reward": value}}, [4])
    assert _fast.get_path(batch, ("next", "reward")) is value
    assert _fast.get_path(batch, ("next", "missing")) is None
    assert _fast.get_path(batch, ("missing",), "default") == "default"


@pytest.mark.parametrize(
    "path",
    [
        ("obs",),
        ("next", "reward"),
        ("next", "missing"),
        ("missing",),
        ("missing", "mask"),
        ("stacked", "x"),
        ("stacked", "missing"),
        ("label",),
    ],
)
def test_get_path_reads_what_get_reads(path):
    """The plain-TensorDict fast path (the entries' dict, no KeyError raised on a miss) and the
    fallback (``_get_tuple``, for a lazy stack inside) give what ``get(path, None)`` gives."""
    stacked = LazyStackedTensorDict(
        TensorDict({"x": torch.zeros(4)}, [4]), TensorDict({"x": torch.ones(4)}, [4]), stack_dim=1
    )
    batch = TensorDict(
        {"obs": torch.randn(4, 3), "next": {"reward": torch.randn(4, 1)}, "stacked": stacked},
        [4],
    )
    batch.set_non_tensor("label", "episode")
    expected = batch.get(path, None)
    got = _fast.get_path(batch, path)
    if isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected)
    else:  # None, or the same non-tensor entry
        assert got is expected


def test_get_path_through_a_leaf_is_an_error_as_in_get():
    batch = TensorDict({"obs": torch.randn(4, 3)}, [4])
    with pytest.raises(ValueError, match="Expected a TensorDictBase"):
        batch.get(("obs", "x"), None)
    with pytest.raises(ValueError, match="Expected a TensorDictBase"):
        _fast.get_path(batch, ("obs", "x"))


def test_set_computed_writes_into_plain_and_other_tensordicts():
    batch = TensorDict({"observation": torch.randn(4, 3), "next": {}}, [4])
    value = torch.randn(4)
    _fast.set_computed(batch, ("stats", "td_error"), value)
    assert batch["stats", "td_error"] is value
    stacked = LazyStackedTensorDict.lazy_stack([TensorDict({"x": torch.ones(2)}, [2])] * 2)
    _fast.set_computed(stacked, ("td_error",), torch.zeros(2, 2))
    torch.testing.assert_close(stacked["td_error"], torch.zeros(2, 2))


def test_get_path_misses_without_raising_inside():
    """A missing optional entry (a mask, replay weights) is found missing without a KeyError
    raised and caught inside tensordict (about 1 us each, several a forward)."""
    batch = TensorDict({"next": {"reward": torch.randn(4, 1)}}, [4])
    raised = []

    def tracer(frame, event, arg):
        if event == "exception":
            raised.append(arg[0])
        return tracer

    sys.settrace(tracer)
    try:
        for path in [("collector", "mask"), ("priority_weight",), ("next", "reward")]:
            _fast.get_path(batch, path)
    finally:
        sys.settrace(None)
    assert raised == []


def assert_same_distribution(built, expected, loc: torch.Tensor) -> None:
    """``built`` has ``expected``'s shapes, log-probabilities and samples under one seed, and
    its log-probability's gradient reaches ``loc`` (a leaf)."""
    assert (built.batch_shape, built.event_shape) == (expected.batch_shape, expected.event_shape)
    action = expected.sample()
    torch.testing.assert_close(built.log_prob(action), expected.log_prob(action))
    torch.manual_seed(1)
    drawn = expected.rsample()
    torch.manual_seed(1)
    torch.testing.assert_close(built.rsample(), drawn)
    built.log_prob(action).sum().backward()
    assert loc.grad is not None and loc.grad.abs().sum() > 0


def count_constructions(monkeypatch, cls) -> list:
    """A list that grows by one at each ``cls(...)`` from now on."""
    constructed, init = [], cls.__init__
    monkeypatch.setattr(
        cls, "__init__", lambda self, *a, **k: constructed.append(1) or init(self, *a, **k)
    )
    return constructed


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"low": -2.0, "high": 1.0, "tanh_loc": True},
        {"low": torch.tensor([-1.0, -2.0, -3.0]), "high": torch.tensor([1.0, 0.5, 3.0])},
        {"safe_tanh": False, "event_dims": 2, "upscale": 3.0},
    ],
    ids=["unit", "tanh_loc", "tensor-bounds", "event-dims"],
)
def test_tanh_normal_builder_gives_torchrls_distribution_constructing_once(kwargs, monkeypatch):
    """The builder's TanhNormal is TorchRL's: the same log-probabilities, samples under the same
    seed, mode and shapes, gradients to its parameters; TanhNormal's constructor (where the host
    syncs are) runs once, for the template, not at every build; two builds share nothing."""
    from tensordict.nn import ProbabilisticTensorDictModule
    from torchrl.modules import TanhNormal

    head = ProbabilisticTensorDictModule(
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=TanhNormal,
        distribution_kwargs=kwargs,
    )
    build = _fast.distribution_builder(head, {"loc": "loc", "scale": "scale"})
    constructed = count_constructions(monkeypatch, TanhNormal)
    loc = torch.randn(5, 4, 3, requires_grad=True)
    scale = torch.rand(5, 4, 3) + 0.1
    first = build({"loc": loc, "scale": scale})
    second = build({"loc": 2 * loc, "scale": scale})
    assert len(constructed) == 1
    expected = TanhNormal(loc, scale, **kwargs)
    assert type(first) is TanhNormal
    assert_same_distribution(first, expected, loc)
    torch.testing.assert_close(first.deterministic_sample, expected.deterministic_sample)
    assert not torch.equal(second.root_dist.loc, first.root_dist.loc)
    assert _fast.distribution_builder(make_critic(), {"loc": "loc", "scale": "scale"}) is None
    assert _fast.distribution_builder(head, {"loc": "loc"}) is None


def normal_head(**kwargs):
    from tensordict.nn import ProbabilisticTensorDictModule
    from torchrl.modules import IndependentNormal

    return ProbabilisticTensorDictModule(
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=IndependentNormal,
        distribution_kwargs=kwargs,
    )


@pytest.mark.parametrize("kwargs", [{}, {"event_dim": 2}], ids=["event-dim-1", "event-dim-2"])
def test_independent_normal_builder_gives_torchrls_distribution_constructing_once(
    kwargs, monkeypatch
):
    """The builder's IndependentNormal is TorchRL's: its class, shapes, log-probabilities,
    entropy, samples under the same seed, mode, gradients; the constructor runs at the first
    build only; two builds share nothing."""
    from torchrl.modules import IndependentNormal

    build = _fast.distribution_builder(normal_head(**kwargs), {"loc": "loc", "scale": "scale"})
    assert isinstance(build, _fast.IndependentNormalBuilder)
    constructed = count_constructions(monkeypatch, IndependentNormal)
    loc = torch.randn(5, 4, 3, requires_grad=True)
    scale = torch.rand(5, 4, 3) + 0.1
    build({"loc": loc.detach(), "scale": scale})
    first = build({"loc": loc, "scale": scale})
    second = build({"loc": 2 * loc, "scale": scale})
    assert len(constructed) == 1
    expected = IndependentNormal(loc, scale, **kwargs)  # counted after the asserts above
    assert type(first) is IndependentNormal and type(first.base_dist) is torch.distributions.Normal
    assert first.reinterpreted_batch_ndims == expected.reinterpreted_batch_ndims
    torch.testing.assert_close(first.entropy(), expected.entropy())
    torch.testing.assert_close(first.mode, expected.mode)
    assert not torch.equal(second.base_dist.loc, first.base_dist.loc)
    assert_same_distribution(first, expected, loc)


@pytest.mark.parametrize("case", ["broadcast-scale", "tanh_loc", "validate_args", "too-few-dims"])
def test_independent_normal_builder_constructs_what_it_cannot_copy(case, monkeypatch):
    """A broadcast scale, a squashed location, argument validation, or fewer dims than the
    event go through TorchRL's constructor (its broadcasting, its checks and errors)."""
    from torch import distributions as D
    from torchrl.modules import IndependentNormal

    kwargs = {"tanh_loc": True} if case == "tanh_loc" else {}
    build = _fast.distribution_builder(normal_head(**kwargs), {"loc": "loc", "scale": "scale"})
    loc, scale = torch.randn(4, 3), torch.rand(4, 3) + 0.1
    build({"loc": loc, "scale": scale})  # the first build: TorchRL's constructor
    constructed = count_constructions(monkeypatch, IndependentNormal)
    if case == "broadcast-scale":
        scale = scale[:1]
    if case == "validate_args":
        monkeypatch.setattr(D.Distribution, "_validate_args", True)
    if case == "too-few-dims":
        with pytest.raises(ValueError):
            build({"loc": loc[0, 0], "scale": scale[0, 0]})
        return
    dist = build({"loc": loc, "scale": scale})
    assert constructed == [1]  # TorchRL's constructor for this build
    expected = IndependentNormal(loc, scale, **kwargs)
    torch.testing.assert_close(dist.log_prob(loc), expected.log_prob(loc))
    assert dist.batch_shape == expected.batch_shape == (4,)


@pytest.mark.parametrize("multi_agent", [False, True], ids=["plain", "TensorDictParams"])
def test_tensor_slots_use_the_given_tensors_and_restore_the_module(multi_agent):
    """``_fast.TensorSlots`` (the ensembles' per-member call) writes into ``nn.Module``'s
    private ``_parameters`` / ``_buffers`` tables (a ``TensorDictParams`` through ``to_module``):
    the call sees the given tensors, the module is restored after, even when the call raises;
    the slots, found once, still hold after ``.to(float64)`` and ``load_state_dict``."""
    from torchrl.modules import MultiAgentMLP

    module = (
        MultiAgentMLP(
            n_agent_inputs=4,
            n_agent_outputs=2,
            n_agents=3,
            centralized=False,
            share_params=False,
            depth=1,
            num_cells=8,
        )
        if multi_agent
        else torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
        ).eval()
    )
    x = torch.randn(5, 3, 4) if multi_agent else torch.randn(5, 4)
    before = module(x).detach().clone()
    tensors = dict(module.named_parameters())
    if not multi_agent:
        tensors.update(module.named_buffers())  # a buffer swapped too (running statistics)
    slots = _fast.TensorSlots(module, tensors)
    zeros = [torch.zeros_like(t) for t in tensors.values()]
    assert slots.call(zeros, module, x).abs().sum() == 0
    torch.testing.assert_close(module(x), before)

    def raising(_):
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        slots.call(zeros, raising, x)
    torch.testing.assert_close(module(x), before)
    module.double().load_state_dict({k: v.double() + 1 for k, v in module.state_dict().items()})
    zeros = [torch.zeros_like(t) for t in zeros]
    assert slots.call([z.double() for z in zeros], module, x.double()).abs().sum() == 0
    assert module(x.double()).abs().sum() > 0  # the module's own (loaded) tensors back
    if not multi_agent:  # the private tables the fast path relies on
        assert module[0]._parameters["weight"] is module[0].weight
        assert module[1]._buffers["running_mean"] is module[1].running_mean


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_mse_loss_is_f_mse_loss_bit_for_bit_with_its_gradient(reduction):
    prediction = torch.randn(64, 1, requires_grad=True)
    target = torch.randn(64, 1)
    ours = _fast.mse_loss(prediction, target, reduction)
    (grad_ours,) = torch.autograd.grad(ours.sum(), prediction)
    theirs = nn.functional.mse_loss(prediction, target, reduction=reduction)
    (grad_theirs,) = torch.autograd.grad(theirs.sum(), prediction)
    assert torch.equal(ours, theirs) and torch.equal(grad_ours, grad_theirs)
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        _fast.mse_loss(prediction, target, "average")
