"""On a CUDA device (skipped elsewhere): every contract row's loss and every value estimator run
forward and backward on the GPU without a host-device synchronisation (DESIGN.md: a loss forward
never synchronises), checked with ``torch.cuda.set_sync_debug_mode("error")``, which raises at
the first synchronising call (``.item()``, ``nonzero``, a copy to the host, a pageable
host-to-device copy). On a CPU the same property is checked indirectly, by
``torch.compile(fullgraph=True)`` in ``test_contract.py``."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import rlloss
from tests.nets import make_actor, make_critic, rollout
from tests.test_contract import LOSSES, is_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@contextlib.contextmanager
def syncs_raise():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_loss_forward_and_backward_never_sync_on_cuda(name):
    row = LOSSES[name]
    if row.host_reads:
        pytest.skip(row.host_reads)
    loss = row.build().to(CUDA)
    loss(row.batch().to(CUDA))  # first call: lazy state, cuBLAS handles, allocator
    batch = row.batch().to(CUDA)
    with syncs_raise():
        out = loss(batch)
        total = sum(v for k, v in out.items() if is_loss(k))
        total.backward()
    for key, value in out.items():
        assert value.device.type == CUDA.type, key
        assert torch.isfinite(value).all(), key
    grads = [p.grad for p in loss.parameters() if p.grad is not None]
    assert grads and all(g.device.type == CUDA.type for g in grads)


@pytest.mark.parametrize(
    "make",
    [
        lambda critic: rlloss.GAE(gamma=0.99, lmbda=0.95, value_network=critic),
        lambda critic: rlloss.TD0Estimator(gamma=0.99, value_network=critic),
        lambda critic: rlloss.TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=critic),
    ],
    ids=["GAE", "TD0", "TDLambda"],
)
def test_value_estimators_never_sync_on_cuda(make):
    critic = make_critic()
    cpu, estimator = make(critic), make(copy.deepcopy(critic).to(CUDA))
    batch = rollout(make_actor(), batch_size=(4, 16))
    expected = cpu(batch.clone())
    estimator(batch.to(CUDA))  # warm-up
    on_gpu = batch.to(CUDA)
    with syncs_raise():
        got = estimator(on_gpu)
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(got[key].cpu(), expected[key], rtol=1e-4, atol=1e-5)
