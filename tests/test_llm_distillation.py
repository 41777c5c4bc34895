"""DistillationLoss (drop-in for torchrl.objectives.llm.DistillationLoss) on a tiny Qwen2
student and a perturbed copy as teacher: parity with TorchRL's class (values and gradients),
the k3 KL written out, and the errors."""

from __future__ import annotations

import itertools
import math

import pytest
import tensordict
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

pytest.importorskip("transformers")

import torchrl.objectives.llm as torchrl_llm  # noqa: E402

import rlloss.llm as rl_llm  # noqa: E402
from tests.llm_nets import (  # noqa: E402
    chat_batch,
    history_actor,
    tiny_model,
    tiny_tokenizer,
    with_ref_log_probs,
)

GRID = list(itertools.product(["reverse", "forward"], ["mean", "sum", "none"], [True, False]))
KWARGS = {"tokenizer_kwargs": {"chat_template_name": "qwen"}}


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


@pytest.fixture(scope="module")
def setup():
    with tensordict.set_list_to_stack(True):
        tokenizer, model = tiny_tokenizer(), tiny_model()
        batch = chat_batch(tokenizer)
        batch = with_ref_log_probs(batch, model, tokenizer, "teacher_log_probs")
        batch = with_ref_log_probs(batch, model, tokenizer, "teacher_all", assistant_only=False)
        return history_actor(model, tokenizer), batch


def run(loss, batch, model):
    model.zero_grad()
    out = loss(batch)
    out.loss_distill.sum().backward()
    return out, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(("direction", "reduction", "normalize"), GRID)
@pytest.mark.parametrize("assistant_only", [True, False])
def test_parity_with_torchrl(setup, direction, reduction, normalize, assistant_only):
    actor, batch = setup
    keywords = dict(
        kl_direction=direction,
        reduction=reduction,
        normalize_by_seq_length=normalize,
        assistant_only=assistant_only,
        **KWARGS,
    )
    losses = [
        torchrl_llm.DistillationLoss(actor, **keywords),
        rl_llm.DistillationLoss(actor, **keywords),
    ]
    if not assistant_only:
        for loss in losses:
            loss.set_keys(teacher_log_prob=("next", "teacher_all", "full"))
    (theirs, their_grad), (ours, our_grad) = (run(loss, batch, actor.model) for loss in losses)
    assert type(ours) is type(theirs)
    torch.testing.assert_close(ours.loss_distill, theirs.loss_distill)
    torch.testing.assert_close(ours.kl_to_teacher, theirs.kl_to_teacher)
    for mine, reference in zip(our_grad, their_grad, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-7)


def test_reverse_kl_is_k3_of_the_teacher_log_ratio():
    """``(1/|y|) sum_t (exp(d_t) - 1 - d_t)``, ``d_t = log p_T - log p_S`` on the masked tokens
    (Schulman's k3), with a student whose log-probs are the history entry itself."""
    student = torch.tensor([[-1.0, -2.0, -0.3, -1.5]])
    teacher = torch.tensor([[-0.5, -2.5, -0.1, -9.0]])
    mask = torch.tensor([[True, True, True, False]])
    data = TensorDict(
        {
            ("history", "full"): student,
            ("masks", "all_attention_mask"): mask,
            ("masks", "all_assistant_mask"): mask,
            ("next", "teacher_log_probs", "full"): teacher,
        },
        batch_size=(1,),
    )
    actor = TensorDictModule(
        torch.nn.Identity(), in_keys=[("history", "full")], out_keys=[("log_probs", "full")]
    )
    out = rl_llm.DistillationLoss(actor)(data)
    pairs = zip(teacher[0].tolist(), student[0].tolist(), mask[0].tolist(), strict=True)
    d = [t - s for t, s, m in pairs if m]
    expected = sum(math.exp(x) - 1 - x for x in d) / len(d)
    assert out.loss_distill.item() == pytest.approx(expected, rel=1e-6)


def test_errors(setup):
    actor, batch = setup
    with pytest.raises(ValueError, match="kl_direction"):
        rl_llm.DistillationLoss(actor_network=None, kl_direction="sideways")
    with pytest.raises(ValueError, match="reduction"):
        rl_llm.DistillationLoss(actor_network=None, reduction="average")
    with pytest.raises(KeyError, match="Teacher log-probs"):
        rl_llm.DistillationLoss(actor, **KWARGS)(batch.exclude(("next", "teacher_log_probs")))
    loss = rl_llm.DistillationLoss(actor, assistant_only=False, **KWARGS)
    with pytest.raises(RuntimeError, match="assistant_only"):
        loss(batch)  # the teacher's log-probs were written for the assistant tokens only
    assert loss.in_keys == [("history", "full"), ("next", "teacher_log_probs", "full")]
