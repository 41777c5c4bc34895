"""rlloss.data.RandomSampler: uniform over the items written (a chi-square test with a fixed
seed), the count follows the writes (growth, wrap-around, empty), N-d storages, a drop-in in a
TensorDictReplayBuffer, state round trip, one compiled graph for every count, and a CUDA graph
that keeps sampling what is written after it was recorded (on a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torchrl.data
from tensordict import TensorDict
from torch._dynamo.testing import CompileCounter
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

import rlloss
from rlloss.data import PrioritizedSampler, RandomSampler
from rlloss.training.update import samples_on_device

# the 0.999 quantile of the chi-square distribution with 49 degrees of freedom
CHI2_49_999 = 85.35


def buffer_of(n: int, capacity: int, device: str = "cpu", **kwargs) -> TensorDictReplayBuffer:
    """A buffer of ``capacity`` with ``n`` items whose ``x`` is their position."""
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity, device=device), sampler=RandomSampler(), **kwargs
    )
    if n:
        buffer.extend(TensorDict(x=torch.arange(n, device=device), batch_size=[n]))
    return buffer


def test_draws_are_uniform_over_the_items_written():
    """50 items of a 1,000-item storage, 100,000 draws (fixed seed): only the 50 are drawn,
    with frequencies a chi-square test does not tell from uniform (statistic under the 0.999
    quantile; ~49 expected)."""
    torch.manual_seed(0)
    buffer = buffer_of(50, 1000, batch_size=100_000)
    index = buffer.sample()["index"]
    assert 0 <= int(index.min()) and int(index.max()) < 50
    counts = torch.bincount(index, minlength=50).double()
    expected = index.numel() / 50
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < CHI2_49_999, statistic


def test_the_count_follows_growth_wrap_around_and_empty():
    sampler = RandomSampler()
    buffer = buffer_of(7, 20, batch_size=4000)
    buffer._sampler = sampler  # a fresh sampler sees the writes from now on
    with pytest.raises(RuntimeError, match="empty storage"):
        ReplayBuffer(storage=LazyTensorStorage(5), sampler=RandomSampler()).sample(3)
    buffer.extend(TensorDict(x=torch.arange(7, 12), batch_size=[5]))  # positions 7-11
    assert int(sampler._count) == 12
    assert set(buffer.sample()["index"].tolist()) == set(range(12))
    buffer.add(TensorDict(x=torch.tensor(12), batch_size=[]))  # position 12, through add()
    assert set(buffer.sample()["index"].tolist()) == set(range(13))
    buffer.extend(TensorDict(x=torch.arange(30), batch_size=[30]))  # wraps: every slot written
    assert int(sampler._count) == 20
    assert set(buffer.sample()["index"].tolist()) == set(range(20))
    buffer.empty()
    assert int(sampler._count) == 0


def test_a_drop_in_for_torchrl_random_sampler():
    """An instance of TorchRL's class; the buffer returns the stored items at the drawn
    indices, with ``index``, and no weights."""
    buffer = buffer_of(30, 100, batch_size=64)
    assert isinstance(buffer._sampler, torchrl.data.RandomSampler)
    sample = buffer.sample()
    torch.testing.assert_close(sample["x"], sample["index"])
    assert "priority_weight" not in sample.keys()


def test_replacement_false_builds_torchrls_sampler_without_replacement():
    """As TorchRL's ``RandomSampler``: ``replacement=False`` builds a
    ``SamplerWithoutReplacement`` with the other keywords (which exhausts the storage before
    repeating an item), ``True`` this sampler."""
    sampler = RandomSampler(replacement=False, drop_last=True, shuffle=False)
    assert type(sampler) is torchrl.data.SamplerWithoutReplacement
    assert sampler.drop_last and not sampler.shuffle
    assert type(RandomSampler(replacement=True)) is RandomSampler
    assert type(torchrl.data.RandomSampler(replacement=False)) is type(
        RandomSampler(replacement=False)
    )  # TorchRL's own class still dispatches as before
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(11), sampler=RandomSampler(replacement=False), batch_size=3
    )
    buffer.extend(torch.arange(11))
    seen = torch.cat([buffer.sample() for _ in range(4)])
    assert set(seen.tolist()) == set(range(11))


def test_storages_with_several_dims_sample_their_whole_shape_as_torchrl_does():
    """A storage with two dims: one coordinate tensor per dim, every entry of the storage's
    shape drawn (TorchRL's rule for such storages)."""
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(30, ndim=2), sampler=RandomSampler(), batch_size=3000
    )
    buffer.extend(TensorDict(x=torch.arange(12).reshape(4, 3), batch_size=[4, 3]))
    index = buffer.sampler.sample(buffer.storage, 3000)[0]
    shape = tuple(buffer.storage.shape)
    assert len(index) == 2
    drawn = set(zip(*(i.tolist() for i in index), strict=True))
    assert drawn == {(r, c) for r in range(shape[0]) for c in range(shape[1])}


def test_state_round_trip(tmp_path):
    buffer = buffer_of(9, 50, batch_size=8)
    state = buffer._sampler.state_dict()
    fresh = RandomSampler()
    fresh.load_state_dict(state)
    assert int(fresh._count) == 9
    buffer._sampler.dumps(tmp_path)
    loaded = RandomSampler()
    loaded.loads(tmp_path)
    assert int(loaded._count) == 9


def test_one_compiled_graph_draws_among_every_count():
    """``sample_index`` compiles without graph breaks (``fullgraph=True``), once: the count is
    a tensor, so draws after more writes use the new count without recompiling."""
    counter = CompileCounter()
    sampler = RandomSampler()
    draw = torch.compile(sampler.sample_index, backend=counter, fullgraph=True)
    for n in (3, 10, 40):
        sampler.extend(torch.arange(n))
        index = draw(5000)
        assert set(index.tolist()) == set(range(n))
    assert counter.frame_count == 1


def test_capturable_and_recorded_on_a_cuda_storage():
    """``compile_update`` records the sampling of a buffer with this sampler over a CUDA
    storage, and not over a CPU one (what it checks: a stand-in buffer, no GPU here)."""
    assert RandomSampler.capturable
    on_cuda = SimpleNamespace(
        sampler=RandomSampler(), storage=SimpleNamespace(device="cuda:0"), transform=None
    )
    assert samples_on_device(on_cuda)
    assert not samples_on_device(buffer_of(0, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_recorded_update_samples_what_is_written_after_recording(prioritized):
    """A TD3 update recorded as a CUDA graph with its sampling, from a buffer not yet full:
    items written after the recording (rewards of 1,000, where the first ones have rewards
    ~N(0, 1)) are drawn by later replays, which their critic loss shows (a sampler that kept the
    length it had when the graph was recorded would never draw them, and a gather recorded over
    the storage's written part only would be out of bounds: a device-side assert)."""
    from tests.test_updaters import td3_loss

    torch.manual_seed(0)
    loss = td3_loss().cuda()
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3, capturable=True, foreach=True)
    n, capacity = 16, 64
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity, device="cuda"),
        sampler=PrioritizedSampler(capacity, alpha=0.6, beta=0.4)
        if prioritized
        else RandomSampler(),
        batch_size=n,
    )
    buffer.extend(transitions(n, reward=0.0).cuda())
    update = rlloss.compile_update(
        loss, optimizer, replay_buffer=buffer, compile=False, cuda_graph=True, warmup=1
    )
    before = [float(update()["loss_qvalue"]) for _ in range(3)]  # warm-up, record, replay
    assert update.sampling_graph is not None and update.sampling_graph.graph is not None
    buffer.extend(transitions(capacity - n, reward=1000.0).cuda())
    after = [float(update()["loss_qvalue"]) for _ in range(5)]
    assert max(before) < 10 < min(after), (before, after)


def transitions(n: int, reward: float) -> TensorDict:
    """TD3 transitions whose rewards are ``reward`` plus standard normal noise."""
    from tests.test_updaters import ACT, OBS

    return TensorDict(
        observation=torch.randn(n, OBS),
        action=torch.rand(n, ACT) * 2 - 1,
        next=TensorDict(
            observation=torch.randn(n, OBS),
            reward=reward + torch.randn(n, 1),
            done=torch.zeros(n, 1, dtype=torch.bool),
            terminated=torch.zeros(n, 1, dtype=torch.bool),
        ),
        batch_size=[n],
    )
