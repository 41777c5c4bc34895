"""rlloss._compat: one test per wrapper of a private tensordict / torchrl / torch name.

Each test pins what rlloss relies on; when an upstream release changes the private name, the
failure shows up here, next to the one function to fix.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import RandomSampler as TorchRLRandomSampler
from torchrl.data import SamplerWithoutReplacement
from torchrl.modules import MLP
from torchrl.objectives import LossModule as TorchRLLossModule

import rlloss
from rlloss import _compat
from rlloss.onpolicy import OnPolicyLoss
from tests.nets import make_critic


def test_output_tensordict_holds_the_entries_as_given():
    loss, entropy = torch.tensor(1.5), torch.tensor(0.25)
    out = _compat.output_tensordict({"loss": loss, "entropy": entropy})
    assert type(out) is TensorDict and out.batch_size == torch.Size([])
    assert out["loss"] is loss and out["entropy"] is entropy
    assert set(out.keys()) == {"loss", "entropy"}


def test_output_tensorclass_wraps_the_entries_in_the_given_tensorclass():
    from torchrl.objectives.llm.grpo import GRPOLossOutput

    loss = torch.tensor(0.5)
    out = _compat.output_tensorclass(GRPOLossOutput, {"loss_objective": loss})
    assert type(out) is GRPOLossOutput and out.batch_size == torch.Size([])
    assert out.loss_objective is loss and out.clip_fraction is None


@pytest.mark.parametrize(
    "key, path",
    [("a", ("a",)), (("a", "b"), ("a", "b")), (("a", ("b", "c")), ("a", "b", "c"))],
)
def test_unravel_key_flattens_nested_keys(key, path):
    assert _compat.unravel_key(key) == path


def test_get_path_reads_nested_entries_and_defaults():
    value = torch.randn(4, 1)
    batch = TensorDict({"next": {"reward": value}}, [4])
    assert _compat.get_path(batch, ("next", "reward")) is value
    assert _compat.get_path(batch, ("next", "missing")) is None
    assert _compat.get_path(batch, ("missing",), "default") == "default"


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
    got = _compat.get_path(batch, path)
    if isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected)
    else:  # None, or the same non-tensor entry
        assert got is expected


def test_get_path_through_a_leaf_is_an_error_as_in_get():
    batch = TensorDict({"obs": torch.randn(4, 3)}, [4])
    with pytest.raises(ValueError, match="Expected a TensorDictBase"):
        batch.get(("obs", "x"), None)
    with pytest.raises(ValueError, match="Expected a TensorDictBase"):
        _compat.get_path(batch, ("obs", "x"))


def test_set_computed_writes_into_plain_and_other_tensordicts():
    batch = TensorDict({"observation": torch.randn(4, 3), "next": {}}, [4])
    value = torch.randn(4)
    _compat.set_computed(batch, ("stats", "td_error"), value)
    assert batch["stats", "td_error"] is value
    stacked = LazyStackedTensorDict.lazy_stack([TensorDict({"x": torch.ones(2)}, [2])] * 2)
    _compat.set_computed(stacked, ("td_error",), torch.zeros(2, 2))
    torch.testing.assert_close(stacked["td_error"], torch.zeros(2, 2))


def test_is_plain_tensordict_module_recognises_a_plain_call_only():
    plain = TensorDictModule(nn.Linear(3, 1), in_keys=["x"], out_keys=["y"])
    assert _compat.is_plain_tensordict_module(plain)
    with_kwargs = TensorDictModule(
        lambda x: x, in_keys={"x": "x"}, out_keys=["y"]
    )  # keyword inputs
    assert not _compat.is_plain_tensordict_module(with_kwargs)
    hooked = TensorDictModule(nn.Linear(3, 1), in_keys=["x"], out_keys=["y"])
    hooked.register_forward_hook(lambda module, args, out: out)
    assert not _compat.is_plain_tensordict_module(hooked)
    assert not _compat.is_plain_tensordict_module(nn.Linear(3, 1))


def test_selects_out_keys_detects_a_narrowed_sequence():
    first = TensorDictModule(nn.Linear(3, 4), in_keys=["x"], out_keys=["h"])
    second = TensorDictModule(nn.Linear(4, 1), in_keys=["h"], out_keys=["y"])
    sequence = TensorDictSequential(first, second)
    assert not _compat.selects_out_keys(sequence)
    assert _compat.selects_out_keys(sequence.select_out_keys("y"))


def test_has_call_hooks_sees_forward_hooks_and_pre_hooks():
    module = TensorDictModule(nn.Linear(3, 1), in_keys=["x"], out_keys=["y"])
    assert not _compat.has_call_hooks(module)
    assert _compat.has_call_hooks(module.select_out_keys("y"))  # tensordict: a forward hook
    module = nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda module, args: None)
    assert _compat.has_call_hooks(module)


def test_mlp_reshapes_output_reads_the_mlp_flag():
    assert not _compat.mlp_reshapes_output(MLP(in_features=3, out_features=2, num_cells=[4]))
    assert _compat.mlp_reshapes_output(MLP(in_features=3, out_features=(2, 2), num_cells=[4]))


def test_loss_meta_keeps_schedulable_buffers_and_default_keys_without_wrapping():
    assert isinstance(rlloss.LossModule, type(TorchRLLossModule))
    loss = rlloss.ClipPPOLoss(rlloss_actor(), make_critic())
    assert "entropy_coeff" in type(loss)._all_schedulable_buffers
    assert "clip_epsilon" in type(loss)._all_schedulable_buffers
    buffer = loss.entropy_coeff
    loss.entropy_coeff = 0.5  # TorchRL's __setattr__ updates the listed buffer in place
    assert loss.entropy_coeff is buffer and float(buffer) == 0.5
    assert rlloss.ClipPPOLoss.default_keys is rlloss.ClipPPOLoss._AcceptedKeys
    # TorchRL's metaclass wraps forward; rlloss's keeps the function as written
    assert OnPolicyLoss.forward is OnPolicyLoss.__dict__["forward"]


def rlloss_actor():
    from tests.nets import make_actor

    return make_actor()


def test_updater_bookkeeping_and_warning():
    loss = rlloss.DQNLoss(_q_actor())
    assert not _compat.every_target_has_updater(loss)
    with pytest.warns(UserWarning, match="target network"):
        _compat.warn_without_updater(loss, ())
    rlloss.SoftUpdate(loss, tau=0.1)
    assert _compat.every_target_has_updater(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compat.warn_without_updater(loss, ())
    other = rlloss.DQNLoss(_q_actor(), delay_value=False)
    _compat.expect_updater(other, "value_network")
    assert not _compat.every_target_has_updater(other)


def _q_actor():
    from torchrl.data import OneHot
    from torchrl.modules import QValueActor

    return QValueActor(nn.Linear(5, 3), in_keys=["observation"], spec=OneHot(3))


def test_value_estimator_slot_is_torchrls():
    loss = rlloss.ClipPPOLoss(rlloss_actor(), make_critic())
    assert _compat.stored_value_estimator(loss) is None
    estimator = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=make_critic())
    _compat.store_value_estimator(loss, estimator)
    assert TorchRLLossModule.value_estimator.fget(loss) is estimator


def test_updater_pairs_name_every_target_tensor():
    loss = rlloss.DQNLoss(_q_actor())
    updater = rlloss.SoftUpdate(loss, tau=0.1)
    pairs = list(_compat.updater_pairs(updater))
    targets = loss.target_value_network_params.flatten_keys(".")
    assert len(pairs) == len(list(targets.keys())) > 0
    for name, key in pairs:
        assert name == "target_value_network_params"
        assert getattr(loss, name)[key].shape == loss.value_network_params[key].shape


def test_forward_pre_hook_helpers():
    module = nn.Linear(2, 2)

    def hook(module, args):
        return None

    module.register_forward_pre_hook(hook)
    assert _compat.has_forward_pre_hook(module, hook)
    _compat.remove_forward_pre_hook(module, hook)
    assert not _compat.has_forward_pre_hook(module, hook)
    module.register_forward_pre_hook(hook)
    _compat.clear_forward_pre_hooks(module)
    assert not _compat.has_forward_pre_hook(module, hook)


def test_fused_lerp_and_copy_update_every_pair_in_place():
    targets = [torch.zeros(3), torch.ones(2, 2)]
    sources = [torch.ones(3), torch.zeros(2, 2)]
    storage = [t.data_ptr() for t in targets]
    _compat.lerp_(targets, sources, 0.25)
    torch.testing.assert_close(targets[0], torch.full((3,), 0.25))
    torch.testing.assert_close(targets[1], torch.full((2, 2), 0.75))
    _compat.copy_(targets, sources)
    torch.testing.assert_close(targets[0], sources[0])
    torch.testing.assert_close(targets[1], sources[1])
    assert [t.data_ptr() for t in targets] == storage


def test_assert_all_raises_with_the_message():
    _compat.assert_all(torch.tensor(True), "never raised")
    with pytest.raises(RuntimeError, match="a bad value"):
        _compat.assert_all(torch.tensor([1.0, -1.0]).ge(0).all(), "a bad value")


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
            _compat.get_path(batch, path)
    finally:
        sys.settrace(None)
    assert raised == []


def test_whole_storage_lets_a_gather_reach_past_the_written_items_and_restores_the_length():
    """What a CUDA graph records for a sample of a storage that is not yet full: TorchRL gathers
    from ``storage[:len]``, so an index written later is out of bounds (on a GPU, a device-side
    assert at a replay); recorded inside ``whole_storage`` the gather spans the capacity."""
    from torchrl.data import LazyTensorStorage, ListStorage

    storage = LazyTensorStorage(8)
    storage.set(torch.arange(3), TensorDict(x=torch.arange(3.0), batch_size=[3]))
    later = torch.tensor([1, 5])
    with pytest.raises(IndexError):
        storage.get(later)
    with _compat.whole_storage(storage):
        assert len(storage) == 8
        torch.testing.assert_close(storage.get(torch.tensor([2, 1]))["x"], torch.tensor([2.0, 1.0]))
        assert storage.get(later).shape == (2,)
    assert len(storage) == 3
    storage.set(torch.arange(3, 6), TensorDict(x=torch.arange(3.0, 6.0), batch_size=[3]))
    assert len(storage) == 6  # writes after the context count from the true length
    with pytest.raises(RuntimeError), _compat.whole_storage(storage):
        raise RuntimeError("an error inside still restores the length")
    assert len(storage) == 6
    listed = ListStorage(4)
    with _compat.whole_storage(listed):  # no TorchRL tensor length: left as it is
        assert len(listed) == 0


def replay_buffer(sampler, storage=None, written: int = 8, **kwargs):
    """A TensorDict replay buffer of ``written`` of 12 slots written (``x``,
    ``("next", "y")``)."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(12) if storage is None else storage,
        sampler=sampler,
        batch_size=5,
        **kwargs,
    )
    if written:
        buffer.extend(
            TensorDict(
                x=torch.arange(float(written)).unsqueeze(-1).expand(written, 3),
                next=TensorDict(y=-torch.arange(written), batch_size=[written]),
                batch_size=[written],
            )
        )
    return buffer


def test_sample_is_a_gather_only_where_sample_does_nothing_else():
    """A capturable sampler with ``draw`` over a one-dim tensor storage, and nothing around the
    draw; any transform, another sampler or storage, prefetch or generation tracking refuses."""
    from torchrl.data import (
        LazyMemmapStorage,
        LazyTensorStorage,
        ListStorage,
        RandomSampler,
        ReplayBuffer,
    )
    from torchrl.envs import Compose, RewardScaling

    from rlloss.data import PrioritizedSampler
    from rlloss.data import RandomSampler as DeviceRandomSampler

    assert _compat.sample_is_a_gather(replay_buffer(DeviceRandomSampler()))
    assert _compat.sample_is_a_gather(replay_buffer(PrioritizedSampler(12, 0.6, 0.4)))
    refused = [
        replay_buffer(RandomSampler()),
        replay_buffer(DeviceRandomSampler(), LazyMemmapStorage(12)),
        replay_buffer(DeviceRandomSampler(), LazyTensorStorage(12, ndim=2), written=0),
        replay_buffer(DeviceRandomSampler(), transform=Compose(RewardScaling(0.0, 2.0))),
        replay_buffer(DeviceRandomSampler(), prefetch=2),
        ReplayBuffer(storage=ListStorage(12), sampler=DeviceRandomSampler(), batch_size=5),
        None,
    ]
    assert [_compat.sample_is_a_gather(buffer) for buffer in refused] == [False] * len(refused)


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_drawn_batch_is_what_sample_returns(prioritized):
    """``rlloss.training.update.draw_batch`` (the sampler's draw and ``stored_items``, traced in a
    compiled update) gives what ``buffer.sample()`` gives under the same seed: the same keys in
    the same order, the same values, ``index`` and the sampler's info; only written items."""
    from rlloss.training.update import draw_batch

    from rlloss.data import PrioritizedSampler, RandomSampler

    sampler = PrioritizedSampler(12, 0.6, 0.4) if prioritized else RandomSampler()
    buffer = replay_buffer(sampler)
    if prioritized:
        buffer.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
    for seed in range(3):
        torch.manual_seed(seed)
        expected = buffer.sample()
        torch.manual_seed(seed)
        drawn = draw_batch(buffer)
        assert list(drawn.keys(True, True)) == list(expected.keys(True, True))
        assert (drawn == expected).all()
        assert ((drawn["index"] >= 0) & (drawn["index"] < 8)).all()
        torch.testing.assert_close(drawn["x"][:, 0], drawn["index"].float())


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
    build = _compat.distribution_builder(head, {"loc": "loc", "scale": "scale"})
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
    assert _compat.distribution_builder(make_critic(), {"loc": "loc", "scale": "scale"}) is None
    assert _compat.distribution_builder(head, {"loc": "loc"}) is None


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

    build = _compat.distribution_builder(normal_head(**kwargs), {"loc": "loc", "scale": "scale"})
    assert isinstance(build, _compat.IndependentNormalBuilder)
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
    build = _compat.distribution_builder(normal_head(**kwargs), {"loc": "loc", "scale": "scale"})
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


def test_dispatch_without_replacement_registers_a_subclass_as_torchrls_classes_are():
    class Uniform(TorchRLRandomSampler):
        pass

    with pytest.raises(TypeError, match="replacement=False"):  # unregistered: refused
        Uniform(replacement=False)
    _compat.dispatch_without_replacement(Uniform, SamplerWithoutReplacement)
    sampler = Uniform(replacement=False, drop_last=True)
    assert type(sampler) is SamplerWithoutReplacement and sampler.drop_last
    assert type(Uniform(replacement=True)) is Uniform


# ----------------------------------------------------------------------------- parameter swap
@pytest.mark.parametrize("multi_agent", [False, True], ids=["plain", "TensorDictParams"])
def test_tensor_slots_use_the_given_tensors_and_restore_the_module(multi_agent):
    """``_compat.TensorSlots`` (the ensembles' per-member call) writes into ``nn.Module``'s
    private ``_parameters`` / ``_buffers`` tables (a ``TensorDictParams`` through ``to_module``):
    the call sees the given tensors, the module is restored after, even when the call raises;
    the slots, found once, still hold after ``.to(float64)`` and ``load_state_dict``."""
    from torchrl.modules import MultiAgentMLP

    from rlloss import _compat

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
    slots = _compat.TensorSlots(module, tensors)
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
    ours = _compat.mse_loss(prediction, target, reduction)
    (grad_ours,) = torch.autograd.grad(ours.sum(), prediction)
    theirs = nn.functional.mse_loss(prediction, target, reduction=reduction)
    (grad_theirs,) = torch.autograd.grad(theirs.sum(), prediction)
    assert torch.equal(ours, theirs) and torch.equal(grad_ours, grad_theirs)
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        _compat.mse_loss(prediction, target, "average")


def test_set_grad_mode_switches_recording_as_no_grad_does():
    x = torch.ones(3, requires_grad=True)
    assert torch.is_grad_enabled()
    _compat.set_grad_mode(False)
    try:
        assert not torch.is_grad_enabled() and not (2 * x).requires_grad
    finally:
        _compat.set_grad_mode(True)
    assert torch.is_grad_enabled() and (2 * x).requires_grad
