"""rlloss.data.PrioritizedSampler: sampling frequencies against P(i) (a chi-square test), importance
weights against the paper (Schaul et al., arXiv:1511.05952) and TorchRL's formula, priority
updates, wrap-around, state round trips, TorchRL's replay buffers, bad inputs and compilation.
The segment trees against naive loops."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler
from torchrl.data.replay_buffers.scheduler import LinearScheduler, SchedulerList, StepScheduler

from rlloss.data import PrioritizedSampler
from rlloss.data.segment_tree import (
    MAX,
    MIN,
    SUM,
    empty_trees,
    last_write_wins,
    prefix_search,
    rebuild,
    write_leaves,
)


def leaves(sampler: PrioritizedSampler) -> torch.Tensor:
    """The ``[3, max_capacity]`` leaf rows: masses (sum and min rows) and raw priorities."""
    trees = sampler._trees
    capacity = trees.shape[-1] // 2
    return trees[:, capacity : capacity + sampler.max_size]


def filled_sampler(priority: torch.Tensor, **kwargs) -> PrioritizedSampler:
    sampler = PrioritizedSampler(priority.numel(), **kwargs)
    sampler.update_priority(torch.arange(priority.numel()), priority)
    return sampler


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic and its p-value (``len(counts) - 1`` degrees of freedom)."""
    statistic = ((counts - expected) ** 2 / expected).sum().double()
    dof = torch.tensor(counts.numel() - 1, dtype=torch.float64)
    p_value = torch.special.gammaincc(dof / 2, statistic / 2)
    return float(statistic), float(p_value)


# ---- the segment trees ----


@pytest.mark.parametrize("size", [1, 2, 5, 16, 37])
def test_prefix_search_matches_the_running_sum(size):
    masses = torch.rand(size, dtype=torch.float64) * (torch.rand(size) < 0.7)
    masses[0] = 0.5  # at least one positive mass
    trees = empty_trees(size)
    write_leaves(trees, torch.arange(size), torch.stack((masses, masses, masses)))
    running = masses.cumsum(0)
    mass = torch.rand(1000, dtype=torch.float64) * running[-1]
    expected = torch.searchsorted(running, mass, right=True)  # first i with S_i > mass
    torch.testing.assert_close(prefix_search(trees[SUM], mass), expected)
    # a mass at the very end of the total lands on the last non-empty leaf, never an empty one
    last = prefix_search(trees[SUM], running[-1:].nextafter(torch.zeros(1, dtype=torch.float64)))
    assert masses[last] > 0 and last == masses.nonzero().max()


def test_batched_writes_equal_sequential_writes_last_one_wins():
    size = 13
    trees = empty_trees(size)
    reference = torch.tensor([0.0, float("inf"), float("-inf")], dtype=torch.float64)
    reference = reference[:, None].repeat(1, size)
    for _ in range(5):
        leaf = torch.randint(0, size, (20,))  # many repeats
        keep = torch.rand(20) < 0.8
        values = torch.rand(3, 20, dtype=torch.float64)
        winner = last_write_wins(leaf, keep)
        current = trees[:, leaf + trees.shape[-1] // 2]
        write_leaves(trees, leaf, torch.where(winner >= 0, values[:, winner.clamp_min(0)], current))
        for i in range(20):  # the loop a sequential implementation runs
            if keep[i]:
                reference[:, leaf[i]] = values[:, i]
    capacity = trees.shape[-1] // 2
    torch.testing.assert_close(trees[:, capacity : capacity + size], reference)
    stored = reference[MAX] > float("-inf")
    torch.testing.assert_close(trees[SUM, 1], reference[SUM].sum())
    torch.testing.assert_close(trees[MIN, 1], reference[MIN][stored].min())
    torch.testing.assert_close(trees[MAX, 1], reference[MAX][stored].max())
    rebuilt = trees.clone()
    rebuilt[:, 1:capacity] = torch.nan
    rebuild(rebuilt)
    torch.testing.assert_close(rebuilt[:, 1:], trees[:, 1:])


# ---- sampling and weights ----


def test_sampling_frequencies_are_proportional_to_priority_to_the_alpha(capsys):
    """200,000 draws over 16 items against P(i) = (p_i + eps)^alpha / sum_j (p_j + eps)^alpha:
    Pearson's chi-square with 15 degrees of freedom (seeded)."""
    torch.manual_seed(16)
    priority = torch.rand(16) * 10
    priority[3] = 0.0  # only eps: (1e-8)^0.7, drawn about never
    alpha, draws = 0.7, 200_000
    sampler = filled_sampler(priority, alpha=alpha, beta=0.5)
    sampler._rng = torch.Generator().manual_seed(1)  # as a buffer's generator= sets it
    index, _ = sampler.sample_index_and_weight(draws)
    counts = torch.bincount(index, minlength=16).double()
    probability = (priority.double() + 1e-8) ** alpha
    probability = probability / probability.sum()
    seen = probability * draws > 5  # the chi-square approximation needs expected counts > 5
    assert counts[~seen].sum() <= 1
    statistic, p_value = chi_square(counts[seen], probability[seen] * counts[seen].sum())
    with capsys.disabled():
        print(
            f"\nchi-square over {int(seen.sum())} items, {draws} draws: "
            f"statistic={statistic:.2f}, p={p_value:.3f}"
        )
    assert p_value > 0.01, (statistic, p_value)
    # and a wrong alpha is rejected by the same test
    wrong = (priority.double() + 1e-8) ** 0.6
    wrong = wrong / wrong.sum() * counts[seen].sum()
    assert chi_square(counts[seen], wrong[seen])[1] < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha, beta", [(0.6, 0.4), (1.0, 1.0), (0.0, 0.7), (0.3, 0.0)])
def test_importance_weights_match_the_paper_and_torchrl(dtype, alpha, beta):
    stored = 11  # of a capacity of 20: N counts the stored items only
    priority = torch.rand(stored) * 3
    sampler = PrioritizedSampler(20, alpha=alpha, beta=beta, dtype=dtype)
    sampler.update_priority(torch.arange(stored), priority)
    index, weight = sampler.sample_index_and_weight(500)
    assert weight.dtype == dtype and index.dtype == torch.long and index.max() < stored
    # the paper: w_i = (N P(i))^-beta / max_j (N P(j))^-beta
    mass = (priority.double() + 1e-8) ** alpha
    probability = mass / mass.sum()
    paper = (stored * probability) ** -beta
    paper = paper / paper.max()
    tolerance = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {}
    torch.testing.assert_close(weight, paper[index].to(dtype), **tolerance)
    # TorchRL's formula: (m_i / min_j m_j)^-beta, with the masses m stored in dtype
    mass = (priority.to(dtype) + 1e-8) ** alpha
    torch.testing.assert_close(weight, (mass[index] / mass.min()) ** -beta, **tolerance)


def test_priority_updates_change_the_frequencies():
    sampler = filled_sampler(torch.ones(8), alpha=1.0, beta=1.0)
    sampler.update_priority(torch.tensor([2, 5, 2, -1]), torch.tensor([9.0, 3.0, 21.0, 50.0]))
    # the repeated index takes its last priority; the -1 (MaxValueWriter's "skip") is skipped
    torch.testing.assert_close(
        leaves(sampler)[MAX], torch.tensor([1, 1, 21, 1, 1, 3, 1, 1], dtype=torch.float64)
    )
    assert sampler.default_priority == 21.0  # the largest priority given (skipped ones aside)
    index, _ = sampler.sample_index_and_weight(100_000)
    frequency = torch.bincount(index, minlength=8) / 100_000
    expected = torch.tensor([1, 1, 21, 1, 1, 3, 1, 1]) / 30
    torch.testing.assert_close(frequency, expected, atol=0.01, rtol=0)
    sampler.update_priority(2, 0.0)  # a scalar index and priority
    frequency = torch.bincount(sampler.sample_index_and_weight(10_000)[0], minlength=8)
    assert frequency[2] == 0


def test_alpha_change_reweights_the_stored_items():
    priority = torch.rand(10) + 0.1
    sampler = filled_sampler(priority, alpha=0.0, beta=1.0)
    assert (leaves(sampler)[SUM] == 1).all()  # uniform
    sampler.alpha = 0.5
    expected = (priority.double() + 1e-8) ** 0.5
    torch.testing.assert_close(leaves(sampler)[SUM], expected.float().double())
    torch.testing.assert_close(sampler._trees[SUM, 1], expected.float().double().sum())
    torch.testing.assert_close(sampler._trees[MIN, 1], expected.float().double().min())


def test_max_priority_within_buffer():
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0, max_priority_within_buffer=True)
    assert sampler.default_priority == 1.0  # before any priority
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 7.0, 2.0, 3.0]))
    assert sampler.default_priority == 7.0
    sampler.update_priority(1, 0.5)  # the largest item lowered: the largest stored is now 3
    assert sampler.default_priority == 3.0
    ever = filled_sampler(torch.tensor([1.0, 7.0, 2.0, 3.0]), alpha=1.0, beta=1.0)
    ever.update_priority(1, 0.5)
    assert ever.default_priority == 7.0  # the largest ever given


@pytest.mark.parametrize("within_buffer", [False, True])
def test_max_priority_is_torchrls_value_and_index(within_buffer):
    """The ``_max_priority`` TorchRL's class exposes (and this one inherits): the raw priority
    new items get and the index holding it, ``(None, None)`` before any priority."""
    sampler = PrioritizedSampler(4, alpha=0.5, beta=1.0, max_priority_within_buffer=within_buffer)
    assert sampler._max_priority == (None, None)
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 7.0, 2.0, 3.0]))
    assert sampler._max_priority == (7.0, 1)  # raw, not (7 + eps) ** alpha
    sampler.update_priority(1, 0.5)
    assert sampler._max_priority == ((3.0, 3) if within_buffer else (7.0, None))
    assert sampler._max_priority[0] == float(sampler.default_priority)


# ---- inside TorchRL's replay buffers ----


def transitions(n: int, start: int = 0) -> TensorDict:
    return TensorDict(observation=torch.arange(start, start + n).float()[:, None], batch_size=[n])


def prioritized_buffer(capacity: int, **kwargs) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=PrioritizedSampler(capacity, alpha=0.6, beta=0.4, **kwargs),
        priority_key="td_error",
        batch_size=32,
    )


def test_tensordict_replay_buffer_round_trip():
    buffer = prioritized_buffer(64)
    assert isinstance(buffer.sampler, TorchRLPrioritizedSampler)
    buffer.extend(transitions(50))
    torch.testing.assert_close(
        leaves(buffer.sampler)[MAX][:50], torch.ones(50, dtype=torch.float64)
    )
    batch = buffer.sample()
    assert {"index", "priority_weight"} <= set(batch.keys())
    assert (batch["observation"].squeeze(-1) == batch["index"]).all()  # the index is the storage's
    batch["td_error"] = torch.rand(32, 1) * 5  # as a loss writes it: [B, 1]
    buffer.update_tensordict_priority(batch)
    last = last_write_wins(batch["index"], torch.ones(32, dtype=torch.bool))
    expected = batch["td_error"].squeeze(-1).double()[last]
    torch.testing.assert_close(leaves(buffer.sampler)[MAX][batch["index"]], expected)
    mass = ((expected + 1e-8) ** 0.6).float().double()
    torch.testing.assert_close(leaves(buffer.sampler)[SUM][batch["index"]], mass)
    # extend with the priority key: those priorities, not the default
    data = transitions(4, start=50)
    data["td_error"] = torch.tensor([0.5, 2.0, 3.0, 4.0])
    buffer.extend(data)
    torch.testing.assert_close(leaves(buffer.sampler)[MAX][50:54], data["td_error"].double())


def test_wrap_around_overwrites_the_oldest_items_with_the_default_priority():
    buffer = prioritized_buffer(8)
    buffer.extend(transitions(6))
    buffer.update_priority(torch.arange(6), torch.tensor([1.0, 2.0, 9.0, 4.0, 5.0, 6.0]))
    buffer.extend(transitions(5, start=6))  # writes 6, 7, then wraps to 0, 1, 2
    assert len(buffer) == 8
    expected = torch.tensor([9.0, 9.0, 9.0, 4.0, 5.0, 6.0, 9.0, 9.0], dtype=torch.float64)
    torch.testing.assert_close(leaves(buffer.sampler)[MAX], expected)
    batch = buffer.sample(4096)
    stored = buffer.storage.get(batch["index"])["observation"].squeeze(-1)
    torch.testing.assert_close(batch["observation"].squeeze(-1), stored)
    assert set(batch["observation"].squeeze(-1).long().tolist()) <= set(range(3, 11))


def test_multidimensional_storage():
    sampler = PrioritizedSampler(12, alpha=1.0, beta=1.0)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(3, ndim=2),
        sampler=sampler,
        batch_size=16,  # 3 x 4 items
    )
    data = TensorDict(observation=torch.arange(12.0).reshape(3, 4, 1), batch_size=[3, 4])
    buffer.extend(data)
    batch = buffer.sample()
    assert batch["index"].shape == (16, 2)
    batch["td_error"] = (batch["index"][:, 0] * 4 + batch["index"][:, 1]).float() + 1
    buffer.update_tensordict_priority(batch)
    flat = batch["index"][:, 0] * 4 + batch["index"][:, 1]
    torch.testing.assert_close(leaves(sampler)[MAX][flat], flat.double() + 1)


def test_state_dict_round_trip(tmp_path):
    buffer = prioritized_buffer(64)
    buffer.extend(transitions(40))
    batch = buffer.sample()
    batch["td_error"] = torch.rand(32)
    buffer.update_tensordict_priority(batch)
    buffer.sampler.beta = 0.9
    for restore in ("state_dict", "dumps"):
        other = prioritized_buffer(64)
        if restore == "state_dict":
            other.load_state_dict(buffer.state_dict())
        else:
            buffer.dumps(tmp_path / "buffer")
            other.loads(tmp_path / "buffer")
        assert other.sampler.beta == 0.9 and other.sampler._beta_tensor == 0.9
        torch.testing.assert_close(other.sampler._trees, buffer.sampler._trees)
        torch.testing.assert_close(other.sampler.default_priority, buffer.sampler.default_priority)
        torch.manual_seed(3)
        expected = buffer.sampler.sample_index_and_weight(100)
        torch.manual_seed(3)
        torch.testing.assert_close(other.sampler.sample_index_and_weight(100), expected)
    with pytest.raises(ValueError, match="same max_capacity"):
        PrioritizedSampler(1000, alpha=0.6, beta=0.4).load_state_dict(buffer.sampler.state_dict())
    buffer.empty()
    assert buffer.sampler._trees[SUM, 1] == 0 and buffer.sampler.default_priority == 1.0


# ---- bad inputs ----


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": -0.1}, "alpha must be greater or equal than 0"),  # TorchRL's words
        ({"alpha": float("nan")}, "alpha must be a finite number"),
        ({"alpha": torch.ones(2)}, "alpha must be a finite number"),
        ({"alpha": True}, "alpha must be a finite number"),
        ({"beta": -1.0}, "beta must be greater or equal than 0"),
        ({"beta": torch.tensor(float("inf"))}, "beta must be a finite number"),
        ({"eps": -1e-3}, "eps must be a finite number >= 0"),
        ({"max_capacity": 0}, "max_capacity must be a positive int"),
        ({"dtype": torch.int64}, "dtype must be torch.float32 or torch.float64"),
        ({"reduction": "sum"}, "reduction must be one of"),
    ],
)
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrioritizedSampler(**{"max_capacity": 8, "alpha": 0.6, "beta": 0.4, **kwargs})


def test_bad_priorities_and_indices():
    sampler = filled_sampler(torch.ones(8), alpha=0.6, beta=0.4)
    before = sampler._trees.clone()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="every priority must be finite and >= 0"):
            sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, bad]))
    with pytest.raises(RuntimeError, match=r"an index is >= max_capacity \(8\). Build the sampler"):
        sampler.update_priority(torch.tensor([3, 8]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="one priority per index"):
        sampler.update_priority(torch.arange(4), torch.ones(3))
    torch.testing.assert_close(sampler._trees, before)  # the asserts run before any write
    with pytest.raises(ValueError, match="beta must be greater or equal than 0"):
        sampler.beta = -0.5
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        prioritized_buffer(8).sample()


# ---- compilation ----


@pytest.mark.slow  # compiled with inductor: tens of seconds with a cold cache
def test_compiles_without_graph_breaks():
    """``sample_index_and_weight`` and ``set_priority`` under ``torch.compile(fullgraph=True)``
    give the eager results (with inductor drawing its random numbers as eager does), and
    changing beta or alpha recompiles nothing."""
    sampler = filled_sampler(torch.rand(100) + 0.1, alpha=0.6, beta=0.4)
    eager = filled_sampler(torch.zeros(100), alpha=0.6, beta=0.4)
    eager.load_state_dict(sampler.state_dict())
    torch._dynamo.reset()
    sample = torch.compile(sampler.sample_index_and_weight, fullgraph=True)
    update = torch.compile(sampler.set_priority, fullgraph=True)
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        torch._inductor.config.patch(fallback_random=True),
    ):
        for step in range(3):
            torch.manual_seed(step)
            index, weight = sample(64)
            torch.manual_seed(step)
            expected_index, expected_weight = eager.sample_index_and_weight(64)
            torch.testing.assert_close(index, expected_index)
            torch.testing.assert_close(weight, expected_weight)
            priority = torch.rand(64) * 4
            update(index, priority)
            eager.set_priority(index, priority)
            torch.testing.assert_close(sampler._trees, eager._trees)
            sampler.beta = eager.beta = 0.4 + 0.2 * step
        sampler.alpha = eager.alpha = 0.8
        update(index, priority)
        eager.set_priority(index, priority)
        torch.testing.assert_close(sampler._trees, eager._trees)


# ---- other devices and TorchRL's own sampler ----


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trees_follow_a_cuda_storage():
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64, device="cuda"),
        sampler=PrioritizedSampler(64, alpha=0.6, beta=0.4),
        batch_size=16,
    )
    buffer.extend(transitions(40))
    batch = buffer.sample()
    assert buffer.sampler.device.type == "cuda" and batch["priority_weight"].is_cuda
    batch["td_error"] = torch.rand(16, device="cuda")
    buffer.update_tensordict_priority(batch)
    torch.testing.assert_close(
        leaves(buffer.sampler)[MAX][batch["index"][-1]], batch["td_error"][-1].double()
    )


def _torchrl_trees_load() -> bool:
    try:
        TorchRLPrioritizedSampler(4, alpha=0.6, beta=0.4)
    except RuntimeError:  # torchrl's C++ extension does not load with this torch build
        return False
    return True


@pytest.mark.skipif(not _torchrl_trees_load(), reason="torchrl's C++ segment trees do not load")
def test_same_trees_and_weights_as_torchrl():
    ours = prioritized_buffer(64)
    theirs = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64),
        sampler=TorchRLPrioritizedSampler(64, alpha=0.6, beta=0.4),
        priority_key="td_error",
        batch_size=32,
    )
    for buffer in (ours, theirs):
        buffer.extend(transitions(50))
    index = torch.randint(0, 50, (32,))
    priority = torch.rand(32) * 3
    for buffer in (ours, theirs):
        buffer.update_priority(index, priority)
    mass = torch.as_tensor(theirs.sampler._sum_tree[torch.arange(50)], dtype=torch.float64)
    torch.testing.assert_close(leaves(ours.sampler)[SUM][:50], mass)
    torch.testing.assert_close(
        ours.sampler.default_priority.float(), theirs.sampler.default_priority
    )
    batch = theirs.sample()
    p_min = theirs.sampler._min_tree.query(0, 50)
    torch.testing.assert_close(
        batch["priority_weight"], ((mass[batch["index"]] / p_min) ** -0.4).float()
    )
    ours_weight = (leaves(ours.sampler)[SUM][batch["index"]] / ours.sampler._trees[MIN, 1]) ** -0.4
    torch.testing.assert_close(batch["priority_weight"], ours_weight.float())


def test_torchrl_parameter_scheduler_anneals_beta():
    buffer = prioritized_buffer(16)
    scheduler = LinearScheduler(buffer, param_name="beta", final_value=1.0, num_steps=4)
    for _ in range(4):
        scheduler.step()
    assert buffer.sampler.beta == pytest.approx(1.0) and buffer.sampler._beta_tensor == 1.0


def test_exponents_given_as_tensors_anneal_like_numbers():
    """alpha and beta as one-element tensors (TorchRL's scheduler tests build buffers so): the
    same sampler as with the numbers, and TorchRL's schedulers anneal both."""
    priority = torch.rand(16) + 0.1
    given = {"alpha": torch.tensor(1.0), "beta": torch.tensor(0.1)}
    as_tensors = filled_sampler(priority, **given)
    as_numbers = filled_sampler(priority, alpha=1.0, beta=0.1)
    assert (as_tensors.alpha, as_tensors.beta) == (1.0, pytest.approx(0.1))
    torch.testing.assert_close(as_tensors._trees, as_numbers._trees)
    buffer = prioritized_buffer(16)
    buffer.extend(transitions(16))
    schedulers = SchedulerList(
        (
            LinearScheduler(buffer, param_name="alpha", final_value=0.2, num_steps=4),
            StepScheduler(buffer, "beta", gamma=0.1, n_steps=2, max_value=1.0, mode="additive"),
        )
    )
    for _ in range(4):
        schedulers.step()
    assert buffer.sampler.alpha == pytest.approx(0.2)
    assert buffer.sampler.beta == pytest.approx(0.6)
    buffer.sampler.alpha = torch.tensor(0.3)  # a tensor set directly
    assert buffer.sampler.alpha == pytest.approx(0.3)
    assert buffer.sampler._alpha_tensor == pytest.approx(0.3)


@pytest.mark.slow  # compiled with inductor: tens of seconds with a cold cache
def test_compiled_sampler_gives_the_eager_trees_and_draws():
    """``compile=True``: the same trees after the same priority updates, and, with inductor
    drawing through eager's generator (``fallback_random``), the same indices and weights."""
    torch._dynamo.reset()
    eager, compiled = (
        PrioritizedSampler(50, 0.7, 0.5),
        PrioritizedSampler(50, 0.7, 0.5, compile=True),
    )
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        index = torch.randint(0, 50, (20,), generator=g)
        priority = torch.rand(20, generator=g) * 3
        eager.update_priority(index, priority)
        compiled.update_priority(index, priority)
        torch.testing.assert_close(compiled._trees, eager._trees, rtol=1e-12, atol=1e-12)
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(1)
        expected = eager.sample_index_and_weight(64)
        torch.manual_seed(1)
        got = compiled._sample_op(64)
    torch.testing.assert_close(got, expected)
    torch._dynamo.reset()
