"""Data-parallel training on ``torch.distributed``: two processes on this machine (gloo over
127.0.0.1) take one step on the two halves of a batch, and what they end with equals one process
on the whole batch: the gradients of ``DistributedDataParallel(loss)`` for KLPEN-PPO, SAC and
TD3, KLPEN's beta, the learning rate of ``KLAdaptiveLR``, the decision of ``KLEarlyStopping``,
the statistics of ``RewardNormalizer`` and ``ValueNormalizer``; then 20 steps on different data
per rank leave both ranks with the very same parameters and adaptive state.

The halves have equal sizes: the ranks' mean KL (a mean of means) and DDP's averaged gradients of
mean losses equal the whole batch's only then. The moment merges are exact for any sizes and are
checked on unequal ones.

Tolerances: decisions (beta, learning rate, early stop) and rank-to-rank comparisons are exact
(``torch.equal``: gloo hands every rank the same reduced bytes); gradients against the one
process are float32 sums taken in another order, ``rtol=1e-5, atol=1e-6``; float64 moments
merged in another order, ``rtol=1e-10, atol=1e-12``.

One spawned pair of processes runs every two-process check (``_rank_checks``), about 10 s of the
file's time; the join is bounded (``JOIN_TIMEOUT_S``).
"""

from __future__ import annotations

import copy
import os
import socket
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import rlloss
from rlloss import functional as rlf
from rlloss.training.distributed import all_mean, all_moments, all_sum, global_standardize
from tests import test_sac, test_td3
from tests.nets import make_actor, make_critic, perturbed, rollout

WORLD = 2
JOIN_TIMEOUT_S = 120
HALF = 32  # samples per rank; the whole batch holds WORLD * HALF
GRADS = {"rtol": 1e-5, "atol": 1e-6}
MOMENTS = {"rtol": 1e-10, "atol": 1e-12}


def _my_part(batch, rank: int | None):
    """Rank ``rank``'s half of ``batch`` (the whole batch for ``None``: the one process)."""
    if rank is None:
        return batch
    return batch[rank * HALF : (rank + 1) * HALF]


def _wrapped(loss):
    """``DistributedDataParallel(loss)`` in a process group, the loss itself without one. Keep
    the wrapper alive until the backward pass is over: a wrapper collected after its forward
    (``DistributedDataParallel(loss)(batch)`` in one expression) takes its gradient hooks with
    it, and the gradients stay this rank's."""
    return DistributedDataParallel(loss) if dist.is_initialized() else loss


def _total(out) -> torch.Tensor:
    return sum(value for key, value in out.items() if key.startswith("loss_"))


def _grads(module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- the cases
def _klpen_case() -> SimpleNamespace:
    """A KLPEN-PPO loss and a 64-sample batch whose first half was collected by a policy close
    to the loss's actor and the second half by a farther one (so the halves' KLs differ), with
    the thresholds of beta, the KL-adaptive lr and early stopping placed so that each decision
    on the whole batch differs from the one on the first half alone: a rank that decided alone
    would disagree."""
    torch.manual_seed(0)
    actor, critic = make_actor("normal"), make_critic()
    first = rollout(perturbed(actor, 0.02), (HALF,))
    batch = torch.cat([first, rollout(perturbed(actor, 0.1), (HALF,))])
    probe = rlloss.KLPENPPOLoss(actor, critic, adaptive_beta=False, normalize_advantage=True)
    with torch.no_grad():
        whole, alone = probe(batch), probe(_my_part(batch, 0))
    assert alone["kl"] < whole["kl"] / 2 and alone["kl_k3"] < whole["kl_k3"] / 2
    return SimpleNamespace(
        batch=batch,
        loss=rlloss.KLPENPPOLoss(
            actor,
            critic,
            dtarg=float(whole["kl"]) / 1.6,  # whole: KL > 1.5 dtarg; first half: not
            normalize_advantage=True,
            normalize_advantage_global=True,
        ),
        target_kl=float(whole["kl_k3"]) / 1.6,  # whole: stop; first half: go on
        kl_threshold=float(whole["kl_k3"]) / 2.2,  # whole: lr down; first half: not
    )


def _klpen_step(rank: int | None) -> dict:
    """One KLPEN-PPO step: forward through DDP, early-stopping test, backward, KL-adaptive lr."""
    case = _klpen_case()
    optimizer = torch.optim.Adam(case.loss.parameters(), lr=torch.tensor(1e-3))
    scheduler = rlloss.KLAdaptiveLR(optimizer, kl_threshold=case.kl_threshold)
    stopping = rlloss.KLEarlyStopping(case.target_kl)
    model = _wrapped(case.loss)
    out = model(_my_part(case.batch, rank))
    stop = stopping.should_stop(out["kl_k3"])
    _total(out).backward()
    scheduler.step(out["kl_k3"])
    return {
        "grads": _grads(case.loss),
        "beta": case.loss.beta.clone(),
        "lr": optimizer.param_groups[0]["lr"].clone(),
        "stop": stop,
    }


def _sac_step(rank: int) -> dict:
    """One SAC step on half ``rank`` (through DDP in a process group); its actions are drawn from
    seed ``100 + rank``. A SAC loss samples actions: one process on the whole batch draws other
    noise than two on halves, so the one-process reference is the mean of the halves' gradients
    with the same draws (the whole batch's gradient, by linearity of the mean loss)."""
    torch.manual_seed(0)
    loss = rlloss.SACLoss(test_sac.actor(), test_sac.qvalue())
    test_sac.shift_targets(loss)
    batch = test_sac.transitions(WORLD * HALF)
    torch.manual_seed(100 + rank)
    model = _wrapped(loss)
    _total(model(_my_part(batch, rank))).backward()
    return {"grads": _grads(loss)}


def _td3_step(rank: int | None) -> dict:
    """One TD3 step through DDP, without target smoothing noise (a deterministic target)."""
    torch.manual_seed(0)
    loss = rlloss.TD3Loss(test_td3.actor(), test_td3.qvalue(), bounds=(-1.0, 1.0), policy_noise=0.0)
    test_td3.shift_targets(loss)
    batch = test_td3.transitions(WORLD * HALF)
    model = _wrapped(loss)
    _total(model(_my_part(batch, rank))).backward()
    return {"grads": _grads(loss)}


def _normalizer_step(rank: int | None) -> dict:
    """Two batches of rewards of 8 environments through ``RewardNormalizer`` (running and buffer
    modes; rank ``r`` steps environments ``4r .. 4r + 3``) and value targets through
    ``ValueNormalizer`` (rank 0 holds 3 of the 8 rows, rank 1 the other 5: the merge is exact for
    unequal sizes)."""
    torch.manual_seed(1)
    num_envs, steps = 8, 10
    rewards = torch.randn(2, num_envs, steps, 1, dtype=torch.float64) * 3 + 1
    dones = torch.rand(2, num_envs, steps, 1) < 0.15
    targets = torch.randn(num_envs, steps, 1) * 5 - 2
    envs = slice(None) if rank is None else slice(4 * rank, 4 * rank + 4)
    rows = slice(None) if rank is None else (slice(0, 3), slice(3, 8))[rank]
    results = {}
    for mode in ("running", "buffer"):
        normalizer = rlloss.RewardNormalizer(num_envs=len(range(num_envs)[envs]), mode=mode)
        scaled = [normalizer(r[envs], d[envs]) for r, d in zip(rewards, dones, strict=True)]
        results[mode] = {"scaled": torch.cat(scaled, dim=1), **normalizer.state_dict()}
    value_normalizer = rlloss.ValueNormalizer()
    value_normalizer.update(targets[rows])
    results["value"] = value_normalizer.state_dict()
    return results


def _reduction_values() -> tuple[torch.Tensor, torch.Tensor]:
    """20 values ``[20, 1]`` and a padding mask ``[20]``; rank 0 holds the first 7, rank 1 the
    other 13."""
    torch.manual_seed(2)
    return torch.randn(20, 1, dtype=torch.float64) * 4 + 3, torch.rand(20) < 0.7


def _reductions(rank: int) -> dict:
    """``all_moments``, ``all_sum``, ``all_mean`` and ``global_standardize`` of rank ``rank``'s
    part of :func:`_reduction_values`."""
    values, mask = _reduction_values()
    part = (slice(0, 7), slice(7, 20))[rank]
    mine = values[part]
    var, mean = torch.var_mean(mine, correction=0)
    count = torch.tensor(float(mine.numel()), dtype=torch.float64)
    alone = [dist.new_group([r]) for r in range(WORLD)]  # every rank creates every group
    return {
        "moments": torch.stack(all_moments(count, mean, var * count)),
        "standardized": global_standardize(mine, mask[part]),
        "sum": all_sum(mine.sum()),
        "mean": all_mean(mine.mean()),
        "sum_in_world": all_sum(mine.sum(), dist.group.WORLD),  # the group given explicitly
        "sum_alone": all_sum(mine.sum(), alone[rank]),  # a group of one rank: a no-op
        "mine": mine,
    }


def _flat_state(*modules, extra=()) -> torch.Tensor:
    """Every parameter and buffer of ``modules`` and the ``extra`` tensors, flattened into one
    float64 vector."""
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())] + list(extra)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def _twenty_steps(rank: int | None) -> dict:
    """20 training steps on data that differs between ranks: KLPEN-PPO (two minibatches a step,
    early stopping, KL-adaptive lr, global advantage normalisation, a reward normaliser) and SAC
    with soft target updates. The state after each step is recorded."""
    case = _klpen_case()
    loss = case.loss
    optimizer = torch.optim.Adam(loss.parameters(), lr=torch.tensor(1e-3))
    scheduler = rlloss.KLAdaptiveLR(optimizer, kl_threshold=case.kl_threshold)
    stopping = rlloss.KLEarlyStopping(3e-4)  # stops some steps, not all
    rewards = rlloss.RewardNormalizer(num_envs=4)
    torch.manual_seed(0)
    sac = rlloss.SACLoss(test_sac.actor(), test_sac.qvalue())
    sac_optimizer = torch.optim.Adam(sac.parameters(), lr=3e-3)
    updater = rlloss.SoftUpdate(sac, tau=0.1)
    model, sac_model = _wrapped(loss), _wrapped(sac)
    states, stops = [], []
    for step in range(20):
        torch.manual_seed(1000 + 10 * step + (rank or 0))  # each rank its own data and noise
        batch = rollout(loss.actor_network, (2 * HALF,))  # on-policy: the current actor
        batch["next", "reward"] = rewards(
            batch["next", "reward"].reshape(4, 16, 1), batch["next", "done"].reshape(4, 16, 1)
        ).reshape(-1, 1)
        stopping.reset()
        for minibatch in batch.split(HALF):
            out = model(minibatch)
            if stopping.should_stop(out["kl_k3"]):
                break
            optimizer.zero_grad()
            _total(out).backward()
            optimizer.step()
        scheduler.step(out["kl_k3"])
        stops.append(stopping.stopped)
        sac_optimizer.zero_grad()
        _total(sac_model(test_sac.transitions(HALF))).backward()
        sac_optimizer.step()
        updater.step()
        moments = (rewards.count, rewards.mean, rewards.m2)  # not returns: each rank its own
        states.append(_flat_state(loss, sac, extra=moments))
    return {"states": torch.stack(states), "stops": stops, "lr": optimizer.param_groups[0]["lr"]}


CHECKS = {
    "klpen": _klpen_step,
    "sac": _sac_step,
    "td3": _td3_step,
    "normalizers": _normalizer_step,
    "reductions": _reductions,
    "twenty_steps": _twenty_steps,
}


def _rank_checks(rank: int, port: int, out_dir) -> None:
    """Every two-process check on rank ``rank``; the results go to
    ``out_dir/<check>_rank<rank>.pt``."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=JOIN_TIMEOUT_S),
    )
    try:
        for name, check in CHECKS.items():  # saved one by one: a hang later loses nothing
            torch.save(check(rank), os.path.join(out_dir, f"{name}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> SimpleNamespace:
    """Runs :func:`_rank_checks` on two spawned processes, joined within ``JOIN_TIMEOUT_S``;
    ``problem`` says what went wrong, if anything (a rank's exception, a timeout)."""
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this build of torch")
    out_dir = tmp_path_factory.mktemp("distributed")
    context = mp.start_processes(
        _rank_checks,
        args=(_free_port(), str(out_dir)),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    deadline, problem = time.monotonic() + JOIN_TIMEOUT_S, None
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                problem = f"the two processes did not finish within {JOIN_TIMEOUT_S} s (a hang)"
                break
    except mp.ProcessRaisedException as error:
        problem = str(error)
    for process in context.processes:
        if process.is_alive():
            process.kill()
    return SimpleNamespace(out_dir=out_dir, problem=problem)


def _results(ranks: SimpleNamespace, check: str) -> list[dict]:
    """Each rank's results of ``check``; a failure naming the problem when a rank has none."""
    paths = [ranks.out_dir / f"{check}_rank{rank}.pt" for rank in range(WORLD)]
    if not all(path.exists() for path in paths):
        pytest.fail(f"no results of {check!r} from both ranks: {ranks.problem}")
    return [torch.load(path) for path in paths]


def _assert_close_all(actual, expected, **tolerance) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **tolerance)


@pytest.mark.slow  # two processes
def test_klpen_step_on_two_halves_equals_one_process_on_the_whole_batch(ranks):
    """Gradients (DDP average, global advantage normalisation), beta, learning rate and the
    early-stop decision of two ranks equal one process's on the whole batch; the first half
    alone decides all three differently, so a rank deciding alone would be caught."""
    whole, alone = _klpen_step(None), _klpen_step(0)
    assert whole["stop"] and not alone["stop"]
    assert not torch.equal(whole["beta"], alone["beta"])
    assert not torch.equal(whole["lr"], alone["lr"])
    for ours in _results(ranks, "klpen"):
        _assert_close_all(ours["grads"], whole["grads"], **GRADS)
        assert torch.equal(ours["beta"], whole["beta"]), (ours["beta"], whole["beta"])
        assert torch.equal(ours["lr"], whole["lr"]), (ours["lr"], whole["lr"])
        assert ours["stop"] == whole["stop"]


@pytest.mark.slow  # two processes
def test_sac_and_td3_steps_equal_one_process(ranks):
    """DDP(SACLoss) and DDP(TD3Loss): the averaged gradients equal one process's (TD3 without
    smoothing noise on the whole batch; SAC as the mean of the halves with the ranks' draws)."""
    td3_whole = _td3_step(None)["grads"]
    sac_halves = [_sac_step(rank)["grads"] for rank in range(WORLD)]
    sac_mean = [sum(grads) / WORLD for grads in zip(*sac_halves, strict=True)]
    for ours in _results(ranks, "td3"):
        _assert_close_all(ours["grads"], td3_whole, **GRADS)
    for ours in _results(ranks, "sac"):
        _assert_close_all(ours["grads"], sac_mean, **GRADS)


@pytest.mark.slow  # two processes
def test_normalizer_statistics_equal_one_process(ranks):
    """Reward normalisers on 4 environments each (running and buffer modes) scale like one
    normaliser on all 8 and end with its moments; value normalisers on 3 and 5 rows of targets
    end with the moments of all 8 rows."""
    whole = _normalizer_step(None)
    for rank, ours in enumerate(_results(ranks, "normalizers")):
        for mode in ("running", "buffer"):
            envs = slice(4 * rank, 4 * rank + 4)
            torch.testing.assert_close(ours[mode]["scaled"], whole[mode]["scaled"][envs], **MOMENTS)
            torch.testing.assert_close(ours[mode]["returns"], whole[mode]["returns"][envs])
            for name in ("count", "mean", "m2"):
                torch.testing.assert_close(ours[mode][name], whole[mode][name], **MOMENTS)
        for name in ("count", "mean", "m2"):
            torch.testing.assert_close(ours["value"][name], whole["value"][name], **MOMENTS)


@pytest.mark.slow  # two processes
def test_reductions_equal_the_concatenated_values(ranks):
    """Over ranks of 7 and 13 values: ``all_moments`` equals the naive moments of the 20 values,
    ``global_standardize`` equals one process's masked ``standardize`` of them (TorchRL's rule),
    ``all_sum`` the sum and ``all_mean`` the mean of the ranks' means; the world group passed
    explicitly gives the default group's sum, a group of one rank leaves the value alone."""
    values, mask = _reduction_values()
    var, mean = torch.var_mean(values, correction=0)
    naive = torch.stack([torch.tensor(20.0, dtype=torch.float64), mean, var * 20])
    mean_of_means = (values[:7].mean() + values[7:].mean()) / 2
    results = _results(ranks, "reductions")
    for ours in results:
        torch.testing.assert_close(ours["moments"], naive, **MOMENTS)
        torch.testing.assert_close(ours["sum"], values.sum(), **MOMENTS)
        assert torch.equal(ours["sum_in_world"], ours["sum"])
        assert torch.equal(ours["sum_alone"], ours["mine"].sum())
        torch.testing.assert_close(ours["mean"], mean_of_means, **MOMENTS)
    standardized = torch.cat([ours["standardized"] for ours in results])
    torch.testing.assert_close(standardized, rlf.standardize(values, mask), **MOMENTS)


@pytest.mark.slow  # two processes
def test_ranks_never_diverge_over_twenty_steps(ranks):
    """After each of 20 steps on different data per rank, every parameter and buffer (networks,
    beta, target networks, SAC's temperature, reward-normaliser moments) is bitwise equal on both
    ranks, and so are the learning rate and the early-stop decisions (which stop some steps and
    not others)."""
    first, second = _results(ranks, "twenty_steps")
    assert torch.equal(first["lr"], second["lr"])
    assert first["stops"] == second["stops"]
    assert 0 < sum(first["stops"]) < 20, first["stops"]
    for step, (a, b) in enumerate(zip(first["states"], second["states"], strict=True)):
        assert torch.equal(a, b), f"the ranks differ after step {step}: {(a - b).abs().max()}"
    assert not torch.equal(first["states"][0], first["states"][-1])  # they did learn


# ----------------------------------------------------------------------------- one process
@pytest.fixture
def no_collectives(monkeypatch):
    """Any collective call fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a collective was called without a process group")

    for name in ("all_reduce", "broadcast", "all_gather", "barrier"):
        monkeypatch.setattr(dist, name, refuse)


def test_without_a_process_group_everything_is_the_single_process_rule(no_collectives):
    """No group: the reductions return their inputs (the same objects), ``global_standardize``
    equals ``standardize``, and the synchronised pieces run without a collective."""
    assert not dist.is_initialized()
    x = torch.randn(10, 1)
    mask = torch.rand(10) < 0.6
    assert all_sum(x) is x and all_mean(x) is x
    count, mean, m2 = torch.tensor(3.0), torch.tensor(1.0), torch.tensor(2.0)
    assert all(a is b for a, b in zip(all_moments(count, mean, m2), (count, mean, m2), strict=True))
    torch.testing.assert_close(global_standardize(x), rlf.standardize(x))
    torch.testing.assert_close(global_standardize(x, mask), rlf.standardize(x, mask))
    _klpen_step(None)  # DDP-free KLPEN with global advantages, KLAdaptiveLR, early stopping
    _normalizer_step(None)


def test_global_advantage_normalization_is_the_local_one_on_one_process():
    """``normalize_advantage_global=True`` gives the numbers and gradients of
    ``normalize_advantage=True`` on one process."""
    actor, critic = make_actor("normal"), make_critic()
    batch = rollout(actor, (16,))
    losses = [
        rlloss.ClipPPOLoss(perturbed(actor), critic, normalize_advantage=True, **kwargs)
        for kwargs in ({}, {"normalize_advantage_global": True})
    ]
    losses[1].load_state_dict(losses[0].state_dict())
    outs = [loss(batch) for loss in losses]
    for out in outs:
        _total(out).backward()
    for key in outs[0].keys():
        torch.testing.assert_close(outs[1][key], outs[0][key], msg=key)
    _assert_close_all(_grads(losses[1]), _grads(losses[0]), **GRADS)


def test_compiles_fullgraph_without_a_process_group():
    """The distributed branches are traced away: KLPEN with global advantage normalisation and
    a value normaliser compiles with ``fullgraph=True`` (dynamo only, the eager backend) and
    gives the eager numbers."""
    torch._dynamo.reset()
    actor, critic = make_actor("normal"), make_critic()
    batch = rollout(actor, (16,))
    loss = rlloss.KLPENPPOLoss(
        perturbed(actor),
        critic,
        normalize_advantage=True,
        normalize_advantage_global=True,
        value_normalizer=rlloss.ValueNormalizer(),
    )
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    expected, got = loss(batch), compiled(batch)
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], msg=key)
    torch.testing.assert_close(twin.beta, loss.beta)
    torch._dynamo.reset()


def test_global_normalization_needs_normalize_advantage():
    with pytest.raises(ValueError, match="normalize_advantage=True"):
        rlloss.ClipPPOLoss(make_actor(), make_critic(), normalize_advantage_global=True)


def test_scheduler_state_dict_leaves_the_process_group_out():
    """A scheduler given a process group saves and loads without it (a run's handle, not
    state)."""
    optimizer = torch.optim.Adam(make_critic().parameters(), lr=1e-3)
    group = dist.ProcessGroup(dist.HashStore(), 0, 1)  # never used: step() is not called
    scheduler = rlloss.KLAdaptiveLR(optimizer, process_group=group)
    state = scheduler.state_dict()
    assert "process_group" not in state
    scheduler.load_state_dict(state)
    assert scheduler.process_group is group
