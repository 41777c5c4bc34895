"""rlloss.compile_update: one update (sample, loss, backward, optimiser step, priority write-back,
target update) equals the same steps written by hand, eager and compiled, and refuses bad
arguments clearly."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data import RandomSampler as TorchRLRandomSampler

import rlloss
from rlloss.data import PrioritizedSampler, RandomSampler
from tests.test_updaters import ACT, OBS, dqn_loss, sac_loss, td3_loss

CAPACITY, BATCH = 64, 16


def transitions(n: int, generator: torch.Generator) -> TensorDict:
    """Replay-like DQN transitions over 3 one-hot actions."""
    index = torch.randint(0, 3, (n,), generator=generator)
    return TensorDict(
        observation=torch.randn(n, OBS, generator=generator),
        action=torch.nn.functional.one_hot(index, 3),
        next=TensorDict(
            observation=torch.randn(n, OBS, generator=generator),
            reward=torch.randn(n, 1, generator=generator),
            done=torch.zeros(n, 1, dtype=torch.bool),
            terminated=torch.rand(n, 1, generator=generator) < 0.1,
        ),
        batch_size=[n],
    )


SAMPLERS = {
    "prioritized": lambda device: PrioritizedSampler(CAPACITY, alpha=0.6, beta=0.4, device=device),
    "uniform": lambda device: RandomSampler(device),
    "torchrl-uniform": lambda device: TorchRLRandomSampler(),  # draws on the host: sample()
}


def agent(seed: int = 0, device: str = "cpu", sampler: str = "prioritized") -> dict:
    """A double DQN with target network, Adam, a soft updater and a buffer (prioritized by
    default, or one of ``SAMPLERS``)."""
    torch.manual_seed(seed)
    loss = dqn_loss().to(device)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(CAPACITY, device=device),
        sampler=SAMPLERS[sampler](device),
        priority_key="td_error",
        batch_size=BATCH,
    )
    buffer.extend(transitions(CAPACITY, torch.Generator().manual_seed(seed)).to(device))
    capturable = {"capturable": True, "foreach": True} if device == "cuda" else {}
    return {
        "loss": loss,
        "optimizer": torch.optim.Adam(loss.parameters(), lr=1e-2, **capturable),
        "updater": rlloss.SoftUpdate(loss, tau=0.1),
        "buffer": buffer,
    }


def packaged_update(a: dict, **options) -> rlloss.Update:
    """``compile_update`` over an agent's loss, optimiser, target updater and buffer."""
    return rlloss.compile_update(
        a["loss"], a["optimizer"], target_updater=a["updater"], replay_buffer=a["buffer"], **options
    )


def by_hand(a: dict) -> TensorDict:
    """The update as a user writes it."""
    batch = a["buffer"].sample()
    a["optimizer"].zero_grad()
    out = a["loss"](batch)
    out["loss"].backward()
    a["optimizer"].step()
    a["buffer"].update_tensordict_priority(batch)
    a["updater"].step()
    return out


def assert_same_agents(a: dict, b: dict, rtol: float | None = None) -> None:
    """Same weights, target weights and priorities (``rtol``: AOTAutograd's decompositions
    round differently, ~1e-6 relative)."""
    tol = {} if rtol is None else {"rtol": rtol, "atol": rtol}
    for (name, x), y in zip(
        a["loss"].state_dict().items(), b["loss"].state_dict().values(), strict=True
    ):
        torch.testing.assert_close(x, y, msg=name, **tol)
    if isinstance(a["buffer"].sampler, PrioritizedSampler):
        torch.testing.assert_close(a["buffer"].sampler._trees, b["buffer"].sampler._trees, **tol)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize(
    "compile",
    # compiled: 10-25 s a sampler with a cold cache (test_the_draw_is_traced_with_the_loss
    # compiles an update in the default run)
    [False, pytest.param({"backend": "aot_eager"}, marks=pytest.mark.slow, id="compile1")],
)
def test_update_equals_the_steps_written_by_hand(compile, sampler):
    """Three double-DQN updates: the same losses, weights, target weights and priorities as
    the hand-written loop (sampling seeded alike), with rlloss's samplers (whose draw the update
    traces with the step) and TorchRL's (sampled by ``buffer.sample()``); compiled, without any
    recompilation, the first call's included (the target updater gathers its tensor lists before
    the trace: inside it, each parameter's lookup recompiled tensordict's ``__getitem__``)."""
    torch._dynamo.reset()
    manual, packaged = agent(sampler=sampler), agent(sampler=sampler)
    assert_same_agents(manual, packaged)
    update = packaged_update(packaged, compile=compile)
    assert update.draws_in_step == (sampler != "torchrl-uniform")
    assert update.loss_keys == ["loss"]
    before = copy.deepcopy(packaged["loss"].state_dict())
    for step in range(3):
        torch.manual_seed(100 + step)
        expected = by_hand(manual)
        torch.manual_seed(100 + step)
        with torch._dynamo.config.patch(error_on_recompile=True):
            out = update()
        rtol = 1e-5 if compile else None
        torch.testing.assert_close(out["loss"], expected["loss"].detach(), rtol=rtol, atol=rtol)
        assert not out["loss"].requires_grad
        assert_same_agents(manual, packaged, rtol)
    if compile:  # the loss, the backward's graph, the optimiser step and the target update
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 3
    changed = [k for k, v in packaged["loss"].state_dict().items() if not torch.equal(v, before[k])]
    assert any("target" in k for k in changed) and any("target" not in k for k in changed)
    torch._dynamo.reset()


def test_the_draw_is_traced_with_the_loss():
    """With rlloss's sampler, the compiled update's first graph draws the batch, gathers it from
    the storage and runs the loss (inductor can fuse the gathers into the loss's kernels): no
    graph of its own for sampling, no graph break before the backward; and no graph zeroes the
    gradients."""
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    update = packaged_update(agent(), compile={"backend": record})
    update()
    reads_storage = [
        gm
        for gm, inputs in graphs
        if any(isinstance(x, torch.Tensor) and x.shape[:1] == (CAPACITY,) for x in inputs)
    ]
    assert len(reads_storage) == 1 and reads_storage[0] is graphs[0][0]
    called = {str(node.target) for node in graphs[0][0].graph.nodes}
    assert any("linear" in name for name in called)  # the Q-network, in the same graph
    # no gradient zeroing traced (functionalised, it copies every gradient twice): the update
    # clears the gradients to None outside the compiled code
    traced = {str(node.target) for gm, _ in graphs for node in gm.graph.nodes}
    assert not any("zero" in name for name in traced), sorted(traced)
    torch._dynamo.reset()


def test_an_empty_buffer_is_refused_before_drawing():
    """A batch drawn in the trace is still checked first: an empty buffer raises the sampler's
    error, not an index error from the gather."""
    a = agent()
    a["buffer"].empty()
    with pytest.raises(RuntimeError, match="empty storage"):
        packaged_update(a, compile=False)()


def test_update_takes_a_batch_and_sums_every_loss_entry():
    """SAC without a buffer: ``update(batch)`` sums loss_actor, loss_qvalue and loss_alpha; each
    update's gradients are that step's alone (cleared before it, as ``zero_grad()`` does), also
    when the caller left gradients behind."""
    torch.manual_seed(0)
    loss = sac_loss()
    twin = copy.deepcopy(loss)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-2)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
    update = rlloss.compile_update(loss, optimizer, compile=False)
    assert update.loss_keys == ["loss_actor", "loss_qvalue", "loss_alpha"]
    for p in loss.parameters():  # a caller's stale gradients: not added to the first step's
        p.grad = torch.ones_like(p)
    g = torch.Generator().manual_seed(1)
    batch = TensorDict(
        observation=torch.randn(8, OBS, generator=g),
        action=torch.rand(8, ACT, generator=g) * 2 - 1,
        next=TensorDict(
            observation=torch.randn(8, OBS, generator=g),
            reward=torch.randn(8, 1, generator=g),
            done=torch.zeros(8, 1, dtype=torch.bool),
            terminated=torch.zeros(8, 1, dtype=torch.bool),
        ),
        batch_size=[8],
    )
    for step in range(2):
        torch.manual_seed(step)
        out = update(batch.clone())
        torch.manual_seed(step)
        twin_optimizer.zero_grad()
        expected = twin(batch.clone())
        (expected["loss_actor"] + expected["loss_qvalue"] + expected["loss_alpha"]).backward()
        twin_optimizer.step()
        torch.testing.assert_close(out["loss_qvalue"], expected["loss_qvalue"].detach())
        for x, y in zip(loss.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(x.grad, y.grad)
    for x, y in zip(loss.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(x, y)


def test_the_recorded_update_is_the_whole_update():
    """What a CUDA graph records for ``update()`` (sample, step, priority write-back), run
    eagerly: the hand-written loop's losses, weights and priorities."""
    manual, packaged = agent(), agent()
    update = packaged_update(packaged, compile=False)
    for step in range(3):
        torch.manual_seed(100 + step)
        expected = by_hand(manual)
        torch.manual_seed(100 + step)
        torch.testing.assert_close(update._sampled_batch()["loss"], expected["loss"].detach())
        assert_same_agents(manual, packaged)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile", [False, {"backend": "aot_eager"}])
@pytest.mark.parametrize("sampled", [True, False], ids=["update()", "update(batch)"])
def test_cuda_graph_update_equals_the_steps_written_by_hand(compile, sampled):
    """Six prioritized double-DQN updates on a GPU, recorded as a CUDA graph after two warm-up
    updates and replayed: the losses, weights, target weights and priorities of the hand-written
    loop at every step. ``update()`` records the sampling and the priority write-back too (the
    sampler is sync-free); ``update(batch)`` only the step."""
    torch._dynamo.reset()
    manual, packaged = agent(device="cuda"), agent(device="cuda")
    update = packaged_update(packaged, compile=compile, cuda_graph=True, warmup=2)
    assert (update.sampling_graph is not None) and update.graph is not None
    for step in range(6):
        torch.manual_seed(100 + step)
        expected = by_hand(manual)
        torch.manual_seed(100 + step)
        out = update() if sampled else update(packaged["buffer"].sample())
        torch.testing.assert_close(out["loss"], expected["loss"].detach(), rtol=1e-5, atol=1e-5)
        assert_same_agents(manual, packaged, 1e-5)
    recorded = update.sampling_graph if sampled else update.graph
    assert recorded.graph is not None  # recorded at the third update, replayed since
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"optimizer": "adam"}, TypeError, "torch.optim.Optimizer"),
        ({"target_updater": object()}, TypeError, "step()"),
        ({"replay_buffer": [1, 2]}, TypeError, "sample()"),
        ({"compile": "yes"}, TypeError, "compile must be"),
        ({"loss_keys": ["loss_critic"]}, ValueError, "must name entries"),
        ({"optimizer": None}, ValueError, "none of the loss module's parameters"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    loss = td3_loss()
    arguments = {"optimizer": torch.optim.Adam(loss.parameters()), **kwargs}
    if kwargs.get("optimizer", 0) is None:
        arguments["optimizer"] = torch.optim.Adam(td3_loss().parameters())  # another module's
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        rlloss.compile_update(loss, **arguments)


def test_update_without_batch_or_buffer_says_what_to_pass():
    loss = td3_loss()
    update = rlloss.compile_update(loss, torch.optim.Adam(loss.parameters()), compile=False)
    with pytest.raises(TypeError, match="replay_buffer=rb"):
        update()
    with pytest.raises(TypeError, match="must be a TensorDict"):
        update({"observation": torch.zeros(2, OBS)})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"warmup": 0}, "warmup must be an int >= 1"),
        ({"capturable": False}, "capturable=True"),
        ({}, "must all be on a CUDA device"),
    ],
)
def test_cuda_graph_needs_what_it_says(kwargs, message):
    loss = td3_loss()
    optimizer = torch.optim.Adam(loss.parameters(), capturable=kwargs.pop("capturable", True))
    with pytest.raises(ValueError, match=message):
        rlloss.compile_update(loss, optimizer, compile=False, cuda_graph=True, **kwargs)
