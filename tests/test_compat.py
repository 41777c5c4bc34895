"""rlloss._compat: one test per wrapper of a private tensordict / torchrl / torch name.

Each test pins what rlloss relies on; when an upstream release changes the private name, the
failure shows up here, next to the one function to fix.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict
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


@pytest.mark.parametrize(
    "key, path",
    [("a", ("a",)), (("a", "b"), ("a", "b")), (("a", ("b", "c")), ("a", "b", "c"))],
)
def test_unravel_key_flattens_nested_keys(key, path):
    assert _compat.unravel_key(key) == path


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
    from rlloss.data import PrioritizedSampler, RandomSampler
    from rlloss.training.update import draw_batch

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


def test_dispatch_without_replacement_registers_a_subclass_as_torchrls_classes_are():
    class Uniform(TorchRLRandomSampler):
        pass

    with pytest.raises(TypeError, match="replacement=False"):  # unregistered: refused
        Uniform(replacement=False)
    _compat.dispatch_without_replacement(Uniform, SamplerWithoutReplacement)
    sampler = Uniform(replacement=False, drop_last=True)
    assert type(sampler) is SamplerWithoutReplacement and sampler.drop_last
    assert type(Uniform(replacement=True)) is Uniform
