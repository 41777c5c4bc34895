"""MCAdvantage and MCAdvantageSelector against TorchRL's on identical streams of trajectories:
what each write returns (nothing, or the group with its advantage), the counters, the
queues; the selector's choices over random pools; and the errors on bad input."""

from __future__ import annotations

import random

import pytest
import tensordict
import torch
from tensordict import TensorDict, lazy_stack
from torchrl.data import LazyStackStorage, ReplayBuffer
from torchrl.objectives.llm import MCAdvantage as TorchRLMCAdvantage
from torchrl.objectives.llm import MCAdvantageSelector as TorchRLSelector

from rlloss.llm import MCAdvantage, MCAdvantageSelector
from rlloss.llm.advantage import STATS


def _traj(group, rewards, key="group_id"):
    n = len(rewards)
    return TensorDict(
        {
            key: torch.full((n,), group),
            ("next", "reward"): torch.tensor(rewards, dtype=torch.float32).reshape(n, 1),
            ("next", "done"): torch.tensor([False] * (n - 1) + [True]).reshape(n, 1),
        },
        [n],
    )


def _stream(seed, n=60, groups=3, binary=True):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(1, 4)
        rewards = [float(rng.random() < 0.3) if binary else rng.gauss(0, 1) for _ in range(length)]
        out.append(_traj(rng.randrange(groups), rewards))
    return out


def _assert_same_write(ours, theirs):
    assert (ours is None) == (theirs is None)
    if ours is None:
        return
    assert ours.shape == theirs.shape
    for key in ("advantage", ("next", "reward"), "group_id"):
        torch.testing.assert_close(ours[key], theirs[key])


def _assert_same_state(ours, theirs):
    for name in STATS:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_stats() == theirs.get_stats()


CONFIGS = [
    dict(grpo_size=3),
    dict(grpo_size=2, trajectory_return="sum"),
    dict(grpo_size=3, trajectory_return="max"),
    dict(grpo_size=3, trajectory_return="mean"),
    dict(grpo_size=2, trajectory_return="sum", keep_return_bounds=(0.1, 0.9)),
    dict(
        grpo_size=2, trajectory_return="max", keep_return_bounds=(0.1, 0.9), candidate_group_size=4
    ),
    dict(
        grpo_size=3,
        trajectory_return="sum",
        keep_return_bounds=(0.2, 1.5),
        candidate_group_size=6,
        candidate_selection_min_size=4,
    ),
]
SELECTORS = [("first", {}), ("uniform", {}), ("balanced", {"max_combinations": 1})]
# the default selector everywhere, each strategy where a group is oversampled
CASES = [(c, None) for c in CONFIGS] + [
    (c, s) for c in CONFIGS if c.get("candidate_group_size") for s in SELECTORS
]


@pytest.mark.parametrize(("config", "selector"), CASES, ids=str)
@pytest.mark.parametrize("binary", [True, False])
def test_parity_on_a_stream(config, selector, binary):
    kwargs = dict(prompt_key="group_id", **config)
    ours, theirs = MCAdvantage(**kwargs), TorchRLMCAdvantage(**kwargs)
    if selector is not None:
        ours.candidate_selector = MCAdvantageSelector(selector[0], **selector[1])
        theirs.candidate_selector = TorchRLSelector(selector[0], **selector[1])
    for traj in _stream(seed=len(str(config)) + 7 * binary, binary=binary):
        _assert_same_write(ours.inv(traj.clone()), theirs.inv(traj.clone()))
        _assert_same_state(ours, theirs)
    assert ours.completed_groups > 0


def test_parity_on_ragged_per_step_rewards():
    """Per-step normalisation over a group whose steps carry different numbers of token
    rewards (a nested reward): the same values as TorchRL's, step by step."""
    torch.manual_seed(0)
    tensordict.set_list_to_stack(True).set()

    def traj(n_steps):
        steps = [
            TensorDict(
                query="prompt",
                next=TensorDict(
                    reward=[torch.randn(int(torch.randint(1, 6, ())), 1)],
                    done=torch.tensor([i == n_steps - 1]),
                ),
            )
            for i in range(n_steps)
        ]
        return lazy_stack(steps)

    ours, theirs = MCAdvantage(grpo_size=3), TorchRLMCAdvantage(grpo_size=3)
    for n_steps in (2, 4, 3):
        t = traj(n_steps)
        out, ref = ours.inv(t), theirs.inv(t.clone())
    assert out.shape == ref.shape == (9,)
    for a, b in zip(out.unbind(0), ref.unbind(0), strict=True):
        torch.testing.assert_close(a["advantage"], b["advantage"])
    values = torch.cat([s["next", "reward"].reshape(-1) for s in out.unbind(0)])
    adv = torch.cat([s["advantage"].reshape(-1) for s in out.unbind(0)])
    # naive: (r - mean) / std over every token reward of the group (Bessel's std)
    mean = sum(values.tolist()) / len(values)
    std = (sum((v - mean) ** 2 for v in values.tolist()) / (len(values) - 1)) ** 0.5
    torch.testing.assert_close(adv, (values - mean) / std)


def test_trajectory_return_matches_the_paper_formula():
    """``(R_i - mean R) / std R`` over the group's returns, broadcast to each trajectory's
    steps (GRPO's outcome advantage, arXiv:2402.03300 sec. 4.1.2), by hand."""
    adv = MCAdvantage(grpo_size=3, prompt_key="group_id", trajectory_return="sum")
    rewards = [[0.0, 2.0], [1.0], [0.5, 0.5, 0.5]]
    outs = [adv.inv(_traj(5, r)) for r in rewards]
    assert outs[:2] == [None, None]
    returns = [sum(r) for r in rewards]
    mean = sum(returns) / 3
    std = (sum((x - mean) ** 2 for x in returns) / 2) ** 0.5
    expected = [(x - mean) / std for x, r in zip(returns, rewards, strict=True) for _ in r]
    torch.testing.assert_close(outs[2]["advantage"].reshape(-1), torch.tensor(expected))


def test_replay_buffer_and_multi_trajectory_writes_match_torchrl():
    stream = _stream(seed=3, n=24)
    flat = [torch.cat(stream[i : i + 3], 0) for i in range(0, len(stream), 3)]
    buffers = []
    for cls in (MCAdvantage, TorchRLMCAdvantage):
        rb = ReplayBuffer(storage=LazyStackStorage(1000))
        rb.append_transform(cls(grpo_size=2, prompt_key="group_id", trajectory_return="sum"))
        for chunk in flat:
            rb.extend(chunk.clone())
        buffers.append(rb)
    assert len(buffers[0]) == len(buffers[1]) > 0
    ours, theirs = (rb[: len(rb)] for rb in buffers)
    torch.testing.assert_close(ours["advantage"], theirs["advantage"])


def test_batched_trajectories_are_split_like_torchrl():
    batch = torch.stack([_traj(i % 2, [float(i), 0.0, 1.0]) for i in range(4)], 0)
    ours = MCAdvantage(grpo_size=2, prompt_key="group_id", trajectory_return="mean")
    theirs = TorchRLMCAdvantage(grpo_size=2, prompt_key="group_id", trajectory_return="mean")
    _assert_same_write(ours.inv(batch.clone()), theirs.inv(batch.clone()))
    deeper = batch.reshape(2, 2, 3)
    _assert_same_write(ours.inv(deeper.clone()), theirs.inv(deeper.clone()))


@pytest.mark.parametrize("seed", range(40))
def test_selector_parity_on_random_pools(seed):
    rng = random.Random(seed)
    values = [float(rng.choice([0.0, 0.25, 0.5, 1.0])) for _ in range(rng.randint(2, 9))]
    group_size = rng.randint(1, len(values))
    bounds = rng.choice([None, (0.1, 0.9), (0.3, 0.6), (-1.0, 0.05)])
    candidates = TensorDict({"return": torch.tensor(values)}, [len(values)])
    for strategy in ("first", "uniform", "balanced"):
        for max_combinations in (1, 100_000):
            ours = MCAdvantageSelector(strategy, max_combinations=max_combinations)
            theirs = TorchRLSelector(strategy, max_combinations=max_combinations)
            kw = dict(group_size=group_size, keep_return_bounds=bounds)
            assert ours.select(candidates, **kw) == theirs.select(candidates, **kw)


def test_shared_queues_complete_one_group():
    adv = MCAdvantage(grpo_size=2, prompt_key="group_id", trajectory_return="sum")
    assert adv.inv(_traj(0, [0.0])) is None
    assert adv.share_memory_() is adv and adv.is_shared
    assert adv.queued_trajectories == 1
    out = adv.inv(_traj(0, [1.0]))
    torch.testing.assert_close(out["advantage"].abs(), torch.full((2, 1), 2.0**-0.5))
    assert (adv.completed_groups, adv.written_groups, adv.queued_groups) == (1, 1, 0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(trajectory_return="prod"), "trajectory_return must be one of"),
        (dict(grpo_size=1, trajectory_return="sum"), "grpo_size >= 2"),
        (dict(keep_return_bounds=(0.1, 0.9)), "dynamic sampling"),
        (dict(trajectory_return="sum", keep_return_bounds=(0.9, 0.1)), "increasing"),
        (dict(trajectory_return="sum", candidate_group_size=1), "candidate_group_size must be"),
        (dict(candidate_group_size=4), "requires trajectory_return"),
        (
            dict(trajectory_return="sum", candidate_group_size=4, candidate_selection_min_size=5),
            "candidate_selection_min_size must lie between",
        ),
    ],
)
def test_bad_keywords_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MCAdvantage(**{"grpo_size": 2, **kwargs})


def test_bad_writes_are_named():
    adv = MCAdvantage(grpo_size=2, prompt_key="group_id")
    unfinished = _traj(0, [0.0, 1.0])
    unfinished["next", "done"][:] = False
    with pytest.raises(RuntimeError, match="complete trajectories"):
        adv.inv(unfinished)
    bad_group = _traj(0, [1.0]).exclude("group_id").set("group_id", TensorDict({}, [1]))
    with pytest.raises(TypeError, match="string or a tensor under prompt_key"):
        adv.inv(bad_group)
    with pytest.raises(ValueError, match="strategy must be one of"):
        MCAdvantageSelector("best")
    with pytest.raises(ValueError, match="one scalar per candidate"):
        MCAdvantageSelector().select(TensorDict({"return": torch.zeros(3, 2)}, [3]), group_size=2)


@pytest.mark.parametrize("trajectory_return", [None, "sum"])
def test_scale_false_centres_without_dividing_by_the_std(trajectory_return):
    """``MCAdvantage(..., scale=False)``: Dr. GRPO's advantage, ``R_i - mean_g R`` (TRL's
    ``scale_rewards="none"``), equal to ``group_relative_advantage(..., scale=False)``;
    ``scale=True`` (default) is TorchRL's. Per-step rewards: every step of the group centred
    on the mean of all the group's steps."""
    from rlloss.functional import group_relative_advantage

    rewards = [[0.0, 1.0], [3.0], [2.0, 0.5, 1.0]]
    trajs = [_traj(7, r) for r in rewards]
    keywords = dict(grpo_size=3, prompt_key="group_id", trajectory_return=trajectory_return)
    unscaled = MCAdvantage(**keywords, scale=False)
    transforms = (unscaled, MCAdvantage(**keywords), TorchRLMCAdvantage(**keywords))
    outs = [[t.inv(traj.clone()) for traj in trajs][-1] for t in transforms]
    if trajectory_return is None:
        flat = torch.tensor([v for r in rewards for v in r])
        expected = flat - flat.mean()
        got = outs[0]["advantage"].reshape(-1)
    else:
        returns = torch.tensor([sum(r) for r in rewards])
        expected = returns - returns.mean()
        ends = torch.tensor([len(r) for r in rewards]).cumsum(0) - 1
        got = outs[0]["advantage"].reshape(-1)[ends]
        torch.testing.assert_close(got, group_relative_advantage(returns, scale=False, dim=0))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(outs[1]["advantage"], outs[2]["advantage"])  # TorchRL's default
    assert not torch.allclose(outs[0]["advantage"], outs[1]["advantage"])
    with pytest.raises(TypeError, match="scale must be True"):
        MCAdvantage(grpo_size=3, scale="none")
