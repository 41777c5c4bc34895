"""rlloss.training.normalizers: RewardNormalizer against a naive per-step loop over Python
floats."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from rlloss.functional import discounted_returns
from rlloss.training.moments import merged_moments
from rlloss.training.normalizers import RewardNormalizer

EPS = 1e-8


def naive_reward_scaling(rewards, dones, gamma, eps=EPS):
    """The reward-scaling trick step by step: per-env returns (restarted after done), every return
    appended to one list, each step's rewards divided by the population std of the list so far
    (unscaled while that std is 0). ``rewards``, ``dones``: ``[N][T]`` lists.

    Returns ``(scaled [N][T], returns seen in order, final per-env returns)``.
    """
    n, steps = len(rewards), len(rewards[0])
    running = [0.0] * n
    seen: list[float] = []
    scaled = [[0.0] * steps for _ in range(n)]
    for t in range(steps):
        for i in range(n):
            running[i] = gamma * running[i] + rewards[i][t]
            seen.append(running[i])
        std = float(np.std(seen))
        for i in range(n):
            scaled[i][t] = rewards[i][t] / (std + eps) if std > 0 else rewards[i][t]
            if dones[i][t]:
                running[i] = 0.0
    return scaled, seen, running


def random_batch(n=3, steps=11, done_prob=0.2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    reward = torch.randn(n, steps, 1, generator=generator) * 2.0 + 0.5
    done = torch.rand(n, steps, 1, generator=generator) < done_prob
    return reward, done


def run_steps(normalizer, reward, done, step_shape):
    """Feed a ``[N, T, 1]`` batch one step at a time; the outputs stacked back to ``[N, T, 1]``."""
    outputs = [
        normalizer(reward[:, t].reshape(step_shape), done[:, t].reshape(step_shape))
        for t in range(reward.shape[1])
    ]
    return torch.stack([out.reshape(-1) for out in outputs], dim=1).unsqueeze(-1)


def assert_statistics(normalizer, seen):
    assert normalizer.count.item() == len(seen)
    torch.testing.assert_close(normalizer.mean.item(), float(np.mean(seen)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(normalizer.var.item(), float(np.var(seen)), rtol=1e-10, atol=1e-12)
    std = torch.tensor(seen, dtype=torch.float64).std(correction=0)
    torch.testing.assert_close(normalizer.var.sqrt(), std.reshape(1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("step_shape", [(3,), (3, 1)])
def test_step_by_step_matches_naive_loop(gamma, step_shape):
    reward, done = random_batch()
    normalizer = RewardNormalizer(num_envs=3, gamma=gamma)
    out = run_steps(normalizer, reward, done, step_shape)
    scaled, seen, running = naive_reward_scaling(
        reward.squeeze(-1).tolist(), done.squeeze(-1).tolist(), gamma
    )
    torch.testing.assert_close(out, torch.tensor(scaled).unsqueeze(-1), rtol=1e-5, atol=1e-6)
    assert_statistics(normalizer, seen)
    torch.testing.assert_close(normalizer.returns, torch.tensor(running, dtype=torch.float64))


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
def test_batch_mode_matches_naive_loop_and_step_by_step_state(gamma):
    reward, done = random_batch(n=4, steps=9, seed=1)
    batch_normalizer = RewardNormalizer(num_envs=4, gamma=gamma)
    out = batch_normalizer(reward, done)
    _, seen, running = naive_reward_scaling(
        reward.squeeze(-1).tolist(), done.squeeze(-1).tolist(), gamma
    )
    assert_statistics(batch_normalizer, seen)
    torch.testing.assert_close(out, reward / (float(np.std(seen)) + EPS))
    assert out.shape == reward.shape and out.dtype == reward.dtype

    step_normalizer = RewardNormalizer(num_envs=4, gamma=gamma)
    step_out = run_steps(step_normalizer, reward, done, (4, 1))
    for name, buffer in batch_normalizer.state_dict().items():
        torch.testing.assert_close(
            step_normalizer.state_dict()[name], buffer, rtol=1e-12, atol=1e-12
        )
    # Batch mode divides every reward by the std after the whole batch, as the last step does.
    torch.testing.assert_close(step_out[:, -1], out[:, -1])


def test_consecutive_batches_continue_episodes():
    reward, done = random_batch(n=2, steps=12, seed=2)
    whole = RewardNormalizer(num_envs=2, gamma=0.9)
    whole(reward, done)
    split = RewardNormalizer(num_envs=2, gamma=0.9)
    split(reward[:, :5], done[:, :5])
    split(reward[:, 5:], done[:, 5:])
    for name, buffer in whole.state_dict().items():
        torch.testing.assert_close(split.state_dict()[name], buffer, rtol=1e-12, atol=1e-12)


def test_returns_restart_after_done():
    reward = torch.ones(1, 4, 1)
    done = torch.tensor([0, 1, 0, 0], dtype=torch.bool).reshape(1, 4, 1)
    returns = discounted_returns(reward, done, torch.zeros(1, 1, 1, dtype=torch.float64), 0.5)
    assert returns.flatten().tolist() == [1.0, 1.5, 1.0, 1.5]

    normalizer = RewardNormalizer(num_envs=2, gamma=0.5)
    normalizer(torch.tensor([1.0, 1.0]), torch.tensor([False, False]))
    normalizer(torch.tensor([1.0, 1.0]), torch.tensor([True, False]))
    assert normalizer.returns.tolist() == [0.0, 1.5]  # env 0 restarts from 0


@pytest.mark.parametrize("steps", [1, 2, 7, 16])
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_discounted_returns_matches_loop(steps, gamma):
    reward, done = random_batch(n=3, steps=steps, done_prob=0.3, seed=steps)
    initial = torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64).reshape(3, 1, 1)
    out = discounted_returns(reward, done.float(), initial, gamma)
    assert out.dtype == torch.float64 and out.shape == reward.shape
    expected = torch.zeros(3, steps, 1, dtype=torch.float64)
    for i in range(3):
        running = initial[i].item()
        for t in range(steps):
            running = gamma * running + reward[i, t].item()
            expected[i, t] = running
            if done[i, t]:
                running = 0.0
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_merged_moments_matches_numpy():
    generator = torch.Generator().manual_seed(3)
    chunks = [
        torch.randn(size, dtype=torch.float64, generator=generator) * 3 + 1 for size in (1, 4, 9)
    ]
    count, mean, m2 = (torch.zeros((), dtype=torch.float64) for _ in range(3))
    for chunk in chunks:
        count, mean, m2 = merged_moments(count, mean, m2, chunk)
    values = torch.cat(chunks).numpy()
    assert count.item() == values.size
    torch.testing.assert_close(mean.item(), float(values.mean()), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((m2 / count).item(), float(values.var()), rtol=1e-12, atol=1e-12)


def test_statistics_match_gymnasium_running_mean_std():
    utils = pytest.importorskip("gymnasium.wrappers.utils")
    reward, done = random_batch(n=4, steps=20, seed=4)
    normalizer = RewardNormalizer(num_envs=4, gamma=0.99)
    rms = utils.RunningMeanStd(shape=())
    rms.count = 0  # gymnasium starts from a prior count of 1e-4; rlloss from no data
    running = np.zeros(4)
    for t in range(20):
        normalizer(reward[:, t, 0], done[:, t, 0])
        running = 0.99 * running + reward[:, t, 0].double().numpy()
        rms.update(running)
        running = running * (1 - done[:, t, 0].double().numpy())
        torch.testing.assert_close(normalizer.mean.item(), float(rms.mean), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(normalizer.var.item(), float(rms.var), rtol=1e-10, atol=1e-12)


def test_equal_returns_pass_through_unscaled():
    normalizer = RewardNormalizer(num_envs=8, gamma=0.99)
    out = normalizer(torch.ones(8, 1), torch.zeros(8, 1))  # first step of identical envs: std 0
    assert out.tolist() == [[1.0]] * 8
    out = normalizer(torch.ones(8, 1), torch.zeros(8, 1))  # returns 1 and 1.99: std 0.495
    torch.testing.assert_close(out, torch.full((8, 1), 1.0 / (0.495 + EPS)))


def test_state_dict_round_trip():
    reward, done = random_batch(n=3, steps=6, seed=5)
    normalizer = RewardNormalizer(num_envs=3, gamma=0.95)
    normalizer(reward, done)
    assert set(normalizer.state_dict()) == {"returns", "count", "mean", "m2", "num_nonfinite"}
    restored = RewardNormalizer(num_envs=3, gamma=0.95)
    restored.load_state_dict(copy.deepcopy(normalizer.state_dict()))
    next_reward, next_done = random_batch(n=3, steps=4, seed=6)
    torch.testing.assert_close(restored(next_reward, next_done), normalizer(next_reward, next_done))
    for name, buffer in normalizer.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[name], buffer)


def test_eval_mode_freezes_the_state():
    reward, done = random_batch(n=3, steps=6, seed=7)
    normalizer = RewardNormalizer(num_envs=3)
    normalizer(reward, done)
    state = copy.deepcopy(normalizer.state_dict())
    normalizer.eval()
    out = normalizer(reward, done)
    torch.testing.assert_close(out, reward / (normalizer.var.sqrt().float() + EPS))
    for name, buffer in state.items():
        assert torch.equal(normalizer.state_dict()[name], buffer)


def test_step_path_reads_nothing_on_the_host(monkeypatch):
    normalizer = RewardNormalizer(num_envs=2)
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
    normalizer(torch.tensor([1.0, 2.0]), torch.tensor([False, True]))
    normalizer(torch.ones(2, 5, 1), torch.zeros(2, 5, 1, dtype=torch.bool))
    monkeypatch.undo()
    assert normalizer.count.item() == 12


def _forbidden(name):
    def method(*args, **kwargs):
        raise AssertionError(f"host read: Tensor.{name}")

    return method


@pytest.mark.parametrize(
    "reward_shape, done_shape, match",
    [
        ((4,), (4,), r"reward has shape \(4,\).*num_envs=3"),
        ((3, 2), (3, 2), r"reward has shape \(3, 2\)"),
        ((3, 5), (3, 5), r"reward has shape \(3, 5\)"),
        ((3, 5, 1), (3, 5), r"shape mismatch: reward has shape \(3, 5, 1\) but done"),
        ((3,), (3, 1), r"shape mismatch"),
    ],
)
def test_bad_shapes_raise(reward_shape, done_shape, match):
    normalizer = RewardNormalizer(num_envs=3)
    with pytest.raises(ValueError, match=match):
        normalizer(torch.zeros(reward_shape), torch.zeros(done_shape))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"gamma": -0.1}, "gamma"),
        ({"gamma": 1.5}, "gamma"),
        ({"eps": -1.0}, "eps"),
        ({"num_envs": 0}, "num_envs"),
    ],
)
def test_validates_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be in"):
        RewardNormalizer(**{"num_envs": 2, **kwargs})


def test_repr_and_dtype():
    normalizer = RewardNormalizer(num_envs=2, gamma=0.9)
    assert "num_envs=2, gamma=0.9, eps=1e-08" in repr(normalizer)
    out = normalizer(torch.tensor([1.0, 3.0], dtype=torch.float32), torch.zeros(2))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([1.0, 3.0]) / (1.0 + EPS))
    assert math.isclose(normalizer.scale.item(), 1.0 + EPS)


def rl8_buffer_scaled(batches, gamma, eps=1e-8):
    """rl8's rule written out: per environment ``R_t = gamma R_{t-1} + r_t`` (0 after a done,
    carried from one buffer to the next), each buffer's rewards divided by the population std
    of that buffer's ``R_t`` plus ``eps``."""
    carried = [0.0] * batches[0][0].shape[0]
    outputs = []
    for reward, done in batches:
        returns = []
        for env in range(reward.shape[0]):
            running = carried[env]
            for t in range(reward.shape[1]):
                running = gamma * running + reward[env, t, 0].item()
                returns.append(running)
                if done[env, t, 0]:
                    running = 0.0
            carried[env] = running
        mean = sum(returns) / len(returns)
        std = (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5
        outputs.append(reward / (std + eps))
    return outputs


def test_buffer_mode_is_rl8s_rule_and_keeps_no_running_statistics():
    batches = [random_batch(n=3, steps=6, seed=seed) for seed in (11, 12)]
    normalizer = RewardNormalizer(num_envs=3, gamma=0.9, mode="buffer")
    expected = rl8_buffer_scaled(batches, 0.9)
    for (reward, done), reference in zip(batches, expected, strict=True):
        torch.testing.assert_close(normalizer(reward, done), reference)
    assert float(normalizer.count) == 0.0  # no running statistics in this mode
    normalizer.eval()  # evaluation: the same scaling, the carried returns stay
    carried = normalizer.returns.clone()
    normalizer(*batches[0])
    torch.testing.assert_close(normalizer.returns, carried)
    with pytest.raises(ValueError, match="mode must be one of"):
        RewardNormalizer(num_envs=3, mode="window")


def test_zero_dim_states_of_earlier_versions_load_alone_and_as_a_submodule():
    reward, done = random_batch(n=3, steps=6, seed=5)
    normalizer = RewardNormalizer(num_envs=3, gamma=0.95)
    normalizer(reward, done)
    old = {k: v.reshape(()) if k != "returns" else v for k, v in normalizer.state_dict().items()}
    del old["num_nonfinite"]  # saved before the count existed, too
    restored = RewardNormalizer(num_envs=3, gamma=0.95)
    restored.load_state_dict(old)
    parent = torch.nn.ModuleDict({"reward": RewardNormalizer(num_envs=3, gamma=0.95)})
    parent.load_state_dict({f"reward.{k}": v for k, v in old.items()})
    for module in (restored, parent["reward"]):
        for name, buffer in normalizer.state_dict().items():
            torch.testing.assert_close(module.state_dict()[name], buffer)


@pytest.mark.slow  # compiled with inductor: tens of seconds with a cold cache
def test_compiled_normaliser_updates_its_state_in_place_as_eager():
    """Inductor (torch 2.13, CPU) dropped in-place writes to the 0-dim float64 moments."""
    batches = [random_batch(n=3, steps=5, seed=seed) for seed in (21, 22, 23)]
    eager, twin = RewardNormalizer(num_envs=3), RewardNormalizer(num_envs=3)
    compiled = torch.compile(twin, fullgraph=True)
    for reward, done in batches:
        torch.testing.assert_close(compiled(reward, done), eager(reward, done))
    for name, buffer in eager.state_dict().items():
        torch.testing.assert_close(twin.state_dict()[name], buffer, msg=name)
    assert eager.count.item() == 45
