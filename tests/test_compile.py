"""torch.compile(fullgraph=True): compiled losses and estimators give the eager numbers and do
not recompile across fresh batches of the same structure (nor after in-place coefficient
changes). Each cold compile costs 10-30 s on a small CPU, so this file compiles few graphs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import rlloss
from tests.nets import ACTOR_KINDS, make_actor, make_critic, perturbed, rollout


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def loss_and_grads(call, module, batch):
    module.zero_grad(set_to_none=True)
    out = call(batch)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    return out, [p.grad.clone() for p in module.parameters()]


def assert_same(compiled, eager):
    (compiled_out, compiled_grads), (eager_out, eager_grads) = compiled, eager
    assert set(compiled_out.keys()) == set(eager_out.keys())
    for key in eager_out.keys():
        torch.testing.assert_close(compiled_out[key], eager_out[key], rtol=1e-4, atol=1e-5, msg=key)
    for compiled_grad, eager_grad in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-4, atol=1e-5)


def test_clip_ppo_compiles_fullgraph_and_matches_eager():
    actor = make_actor("normal")
    eager = rlloss.ClipPPOLoss(
        perturbed(actor), make_critic(), clip_value=0.2, normalize_advantage=True, dual_clip=3.0
    )
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True)
    batches = [rollout(actor) for _ in range(3)]
    assert_same(
        loss_and_grads(compiled, twin, batches[0]), loss_and_grads(eager, eager, batches[0])
    )
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step, batch in enumerate(batches[1:]):
            if step == 1:  # coefficients are buffers changed in place: no recompilation
                for loss in (eager, twin):
                    loss.entropy_coeff = 0.05
                    loss.clip_epsilon = 0.1
            assert_same(loss_and_grads(compiled, twin, batch), loss_and_grads(eager, eager, batch))


def test_gae_compiles_fullgraph_and_matches_eager():
    critic = make_critic()
    gae = rlloss.GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    compiled = torch.compile(gae, fullgraph=True)
    batches = [rollout(make_actor(), batch_size=(4, 33)) for _ in range(3)]
    out = compiled(batches[0].clone())
    torch.testing.assert_close(out["advantage"], gae(batches[0].clone())["advantage"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in batches[1:]:
            out = compiled(batch.clone())
            expected = gae(batch.clone())
            torch.testing.assert_close(
                out["advantage"], expected["advantage"], rtol=1e-5, atol=1e-5
            )
            torch.testing.assert_close(
                out["value_target"], expected["value_target"], rtol=1e-5, atol=1e-5
            )


@pytest.mark.parametrize("kind", ACTOR_KINDS)
def test_every_actor_kind_traces_as_one_graph(kind):
    """Dynamo's trace alone (backend="eager": no inductor cost) proves there is no graph break,
    hence no data-dependent Python branch or host read, in the forward and backward."""
    actor = make_actor(kind)
    eager = rlloss.ClipPPOLoss(perturbed(actor), make_critic(), clip_value=0.1, entropy_bonus=False)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    batches = [rollout(actor) for _ in range(3)]
    assert_same(
        loss_and_grads(compiled, twin, batches[0]), loss_and_grads(eager, eager, batches[0])
    )
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in batches[1:]:
            assert_same(loss_and_grads(compiled, twin, batch), loss_and_grads(eager, eager, batch))


def test_two_normal_draws_of_one_tensor_stay_two_draws_under_aot_autograd():
    """AOTAutograd's common-subexpression pass treats ``aten.randn_like`` as pure (torch 2.13):
    two draws of one tensor became one. The functional core draws with ``aten.randn``."""
    from rlloss.functional.distributions import standard_normal_like

    def two_draws(x):
        return standard_normal_like(x) - standard_normal_like(x)

    compiled = torch.compile(two_draws, fullgraph=True, backend="aot_eager")
    x = torch.zeros(64, requires_grad=True)
    assert compiled(x).abs().min() > 0
    torch.manual_seed(0)
    first = standard_normal_like(x)
    torch.manual_seed(0)
    assert torch.equal(first, torch.randn_like(x))  # randn_like's values, so parity holds


def test_cql_loss_under_aot_autograd_matches_eager():
    """CQL samples from one actor output twice (``loss_actor``, ``loss_actor_bc``): under
    AOTAutograd the two draws once merged into one and the actor's gradients were wrong."""
    from tests import test_sac

    eager = rlloss.CQLLoss(
        test_sac.actor(), test_sac.qvalue(), with_lagrange=True, max_q_backup=True, num_random=3
    )
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    batch = test_sac.transitions()

    def seeded(call, module):
        torch.manual_seed(0)
        return loss_and_grads(call, module, batch.clone())

    assert_same(seeded(compiled, twin), seeded(eager, eager))


class _RecordedTorchCalls(torch.overrides.TorchFunctionMode):
    """The torch functions an eager call issues."""

    def __init__(self):
        super().__init__()
        self.calls = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.add(func)
        return func(*args, **(kwargs or {}))


def test_compiled_mlp_ensemble_adds_its_bias_after_the_batched_product():
    """A stacked MLP ensemble runs ``baddbmm`` eagerly (one operation a layer) and, compiled,
    ``bmm`` then the bias add, which inductor fuses into the next pointwise kernel (a compiled
    ``baddbmm`` first copies the broadcast bias into its output: one more kernel a layer on a
    GPU). Both give the same values and gradients."""
    from tensordict import TensorDict
    from torchrl.modules import MLP

    from tests.test_common import _ensemble_loss

    torch.manual_seed(0)
    net = MLP(in_features=5, out_features=1, num_cells=[8, 8], activation_class=torch.nn.Tanh)
    eager = _ensemble_loss(net, 2)
    twin = copy.deepcopy(eager)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(twin, fullgraph=True, backend=capture)
    batch = TensorDict({"observation": torch.randn(6, 3), "action": torch.randn(6, 2)}, [6])
    with _RecordedTorchCalls() as recorded:
        eager_values = eager(batch)
    compiled_values = compiled(batch)
    traced = {n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.baddbmm in recorded.calls and torch.bmm not in recorded.calls
    assert torch.bmm in traced and torch.baddbmm not in traced
    torch.testing.assert_close(compiled_values, eager_values)
    compiled_values.sum().backward()
    eager_values.sum().backward()
    for p_compiled, p_eager in zip(twin.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad)
