"""The LLM losses on two processes (gloo over 127.0.0.1, CPU), against one process on the whole
batch:

- **data parallel with gradient accumulation**: each rank takes half of the sequences in two
  micro-batches of different sizes and widths, calls the loss with the global count
  (``num_items_in_batch``) through ``DistributedDataParallel``; the averaged gradients equal
  one process's on the whole batch (GRPO on a bigram stand-in, SFT and distillation on a tiny
  Qwen2);
- **sharded parameters** (FSDP2, ``torch.distributed.fsdp.fully_shard`` on each decoder layer
  and on the model: DTensor parameters): GRPO and SFT on a tiny Qwen2; the mean of the ranks'
  losses and the full gradients (``grad.full_tensor()``) equal one process's.

Tolerance as in ``test_distributed.py``: float32 sums in another order, ``rtol=1e-5,
atol=1e-6``. One spawned pair runs every check, joined within ``JOIN_TIMEOUT_S``.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import tensordict
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("transformers")

import rlloss.llm as rl_llm  # noqa: E402
from tests.llm_nets import (  # noqa: E402
    ResponseTokenActor,
    chat_batch,
    history_actor,
    left_padded,
    ragged_token_batch,
    tiny_actor,
    tiny_model,
    tiny_tokenizer,
    token_batch,
    varied_chats,
    with_ref_log_probs,
)
from tests.test_distributed import GRADS, JOIN_TIMEOUT_S, WORLD, _free_port  # noqa: E402
from tests.test_llm_global_normalization import CHAT_SHAPES, SHAPES  # noqa: E402

# each rank's micro-batch sizes (rank r holds sequences 4r .. 4r + 3)
RANK_SPLITS = [[1, 3], [2, 2]]
TEMPLATE = {"chat_template_name": "qwen"}


def _split(items, rank: int | None) -> list:
    """Rank ``rank``'s micro-batches of ``items`` (the whole list for ``None``)."""
    if rank is None:
        return [items]
    mine, start = items[4 * rank : 4 * rank + 4], 0
    parts = []
    for size in RANK_SPLITS[rank]:
        parts.append(mine[start : start + size])
        start += size
    return parts


def _accumulate(loss, model, module, parts, keys, **call) -> dict:
    """Forward and backward of each micro-batch through ``model`` (DDP, FSDP or the loss),
    the gradient of ``module``'s parameters (full tensors), the summed loss."""
    total = torch.zeros(())
    for part in parts:
        out = model(part, **call)
        value = sum(out.get(k) for k in keys if out.get(k) is not None)
        value.backward()
        total += value.detach()
    grads = [p.grad for p in module.parameters()]
    grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]
    return {"loss": total, "grads": [g.clone() for g in grads]}


def _ddp(loss):
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(loss) if dist.is_initialized() else loss


def _grpo_ddp(rank: int | None) -> dict:
    """GRPO (token mean) with both KL terms: rank halves in micro-batches, global count."""
    actor = ResponseTokenActor()
    sequences = ragged_token_batch(actor, SHAPES)
    count = int(left_padded(sequences)["masks", "all_assistant_mask"].sum())
    loss = rl_llm.GRPOLoss(actor, kl_to_ref_coeff=0.3, kl_to_inference_coeff=0.2)
    parts = [left_padded(part) for part in _split(sequences, rank)]
    keys = ("loss_objective", "loss_entropy", "loss_kl_to_ref", "loss_kl_to_inference")
    model = _ddp(loss)
    return _accumulate(loss, model, actor, parts, keys, num_items_in_batch=count)


def _chat_setup():
    tokenizer, model = tiny_tokenizer(), tiny_model()
    batch = chat_batch(tokenizer, varied_chats(CHAT_SHAPES))
    batch = with_ref_log_probs(batch, model, tokenizer, key="teacher_log_probs")
    return tokenizer, model, batch


def _chat_ddp(rank: int | None) -> dict:
    """SFT (token-level: normalize_by_seq_length=False, the count of assistant tokens) and
    distillation (per sequence, the count of sequences)."""
    results = {}
    for name, keywords in (
        ("SFTLoss", {"normalize_by_seq_length": False}),
        ("DistillationLoss", {}),
    ):
        tokenizer, model, batch = _chat_setup()
        loss = getattr(rl_llm, name)(
            history_actor(model, tokenizer),
            tokenizer=tokenizer,
            tokenizer_kwargs=TEMPLATE,
            **keywords,
        )
        if name == "SFTLoss":
            from rlloss.llm.base import chat_masks

            assistant, attention = chat_masks("test", loss, batch)
            count = sum(int((a & m).sum()) for a, m in zip(assistant, attention, strict=True))
        else:
            count = len(CHAT_SHAPES)
        parts = [batch[part[0] : part[-1] + 1] for part in _split(list(range(8)), rank)]
        keys = ("loss_sft", "loss_distill")
        results[name] = _accumulate(loss, _ddp(loss), model, parts, keys, num_items_in_batch=count)
    return results


def _shard(model) -> None:
    """FSDP2 on each decoder layer and on the whole model (every parameter a DTensor)."""
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        return
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def _grpo_fsdp(rank: int | None) -> dict:
    """GRPO on a tiny Qwen2 in tokens mode, rank r holding rows 2r, 2r + 1 of a 4-row batch
    (the same padded width); the global count of response tokens."""
    actor = tiny_actor()
    _shard(actor.model)
    batch = token_batch(batch=4, length=10)
    count = int(actor._get_sft_dist(batch.clone()).mask.sum())
    loss = rl_llm.GRPOLoss(actor, kl_to_ref_coeff=0.1)
    rows = batch if rank is None else batch[2 * rank : 2 * rank + 2]
    keys = ("loss_objective", "loss_entropy", "loss_kl_to_ref")
    return _accumulate(loss, loss, actor.model, [rows], keys, num_items_in_batch=count)


def _sft_fsdp(rank: int | None) -> dict:
    """SFT (per-sequence mean) on a tiny Qwen2 in history mode, 4 chats a rank."""
    tokenizer, model, batch = _chat_setup()
    _shard(model)
    loss = rl_llm.SFTLoss(
        history_actor(model, tokenizer), tokenizer=tokenizer, tokenizer_kwargs=TEMPLATE
    )
    rows = batch if rank is None else batch[4 * rank : 4 * rank + 4]
    return _accumulate(loss, loss, model, [rows], ("loss_sft",), num_items_in_batch=8)


CHECKS = {
    "grpo_ddp": _grpo_ddp,
    "chat_ddp": _chat_ddp,
    "grpo_fsdp": _grpo_fsdp,
    "sft_fsdp": _sft_fsdp,
}


def _rank_checks(rank: int, port: int, out_dir) -> None:
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
        with tensordict.set_list_to_stack(True):
            for name, check in CHECKS.items():
                try:
                    result = check(rank)
                except Exception as error:  # recorded: the test names it
                    result = {"error": f"{type(error).__name__}: {error}"}
                torch.save(result, os.path.join(out_dir, f"{name}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> SimpleNamespace:
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this build of torch")
    out_dir = tmp_path_factory.mktemp("llm_distributed")
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


def _results(ranks, check: str) -> list[dict]:
    paths = [ranks.out_dir / f"{check}_rank{rank}.pt" for rank in range(WORLD)]
    if not all(path.exists() for path in paths):
        pytest.fail(f"no results of {check!r} from both ranks: {ranks.problem}")
    results = [torch.load(path) for path in paths]
    for result in results:
        if "error" in result:
            pytest.fail(f"{check}: {result['error']}")
    return results


def _report(name, ours: dict, whole: dict) -> None:
    grads = list(zip(ours["grads"], whole["grads"], strict=True))
    absolute = max(float((a - b).abs().max()) for a, b in grads)
    relative = absolute / max(float(b.abs().max()) for _, b in grads)
    print(f"{name}: gradient max abs {absolute:.2e}, relative to the largest entry {relative:.2e}")
    for a, b in grads:
        torch.testing.assert_close(a, b, **GRADS)


@pytest.fixture
def one_process():
    with tensordict.set_list_to_stack(True):
        yield lambda check: check(None)


@pytest.mark.slow  # two processes
def test_grpo_ddp_micro_batches_equal_one_process(ranks, one_process):
    whole = one_process(_grpo_ddp)
    for rank, ours in enumerate(_results(ranks, "grpo_ddp")):
        _report(f"GRPO DDP rank {rank}", ours, whole)
    losses = [ours["loss"] for ours in _results(ranks, "grpo_ddp")]
    torch.testing.assert_close(sum(losses) / WORLD, whole["loss"], **GRADS)


@pytest.mark.slow  # two processes
def test_sft_and_distillation_ddp_micro_batches_equal_one_process(ranks, one_process):
    whole = one_process(_chat_ddp)
    results = _results(ranks, "chat_ddp")
    for name in ("SFTLoss", "DistillationLoss"):
        for rank, ours in enumerate(results):
            _report(f"{name} DDP rank {rank}", ours[name], whole[name])
        mean = sum(ours[name]["loss"] for ours in results) / WORLD
        torch.testing.assert_close(mean, whole[name]["loss"], **GRADS)


@pytest.mark.slow  # two processes
@pytest.mark.parametrize("check", ["grpo_fsdp", "sft_fsdp"])
def test_fsdp2_sharded_qwen2_equals_one_process(ranks, one_process, check):
    whole = one_process(CHECKS[check])
    results = _results(ranks, check)
    for rank, ours in enumerate(results):
        _report(f"{check} rank {rank}", ours, whole)
    mean = sum(ours["loss"] for ours in results) / WORLD
    torch.testing.assert_close(mean, whole["loss"], **GRADS)


@pytest.mark.slow  # two processes under torchrun
@pytest.mark.parametrize("shard", ["fsdp", "ddp"])
def test_guide_script_runs_under_torchrun(shard):
    """``docs/guides/grpo_several_processes.py`` under ``torchrun --standalone
    --nproc-per-node 2`` (gloo, loopback) trains two steps end to end."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(root / "docs/guides/grpo_several_processes.py")]
    command += ["--shard", shard, "--steps", "2", "--prompts", "2"]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=JOIN_TIMEOUT_S * 3, cwd=root
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert f"processes=2 shard={shard}" in lines, result.stdout[-2000:]
    assert any(line.startswith("final_reward=") for line in lines)
