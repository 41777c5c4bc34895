"""Trajectory tests (:mod:`tests.trajectory`) for the losses whose outputs are not one TensorDict
of ``loss*`` entries: the LLM losses of ``torchrl.objectives.llm`` (GRPOLoss, DAPO, CISPOLoss,
SFTLoss, DistillationLoss, on the tiny 2-layer Qwen2 of ``tests/llm_nets.py``), the Dreamer
losses (V1's actor, model and value losses, V3's three and their composition) and
WorldModelLoss. rlloss's class and TorchRL's, on copies of the same networks in float64, trained
side by side with Adam on identical batches, end with the same parameters within 1e-8: 200 steps,
100 for the LLM losses and the imagination-based actor losses, 50 for the composed DreamerV3Loss
(slow steps: the figures by the constants below), DreamerV3Loss in float32 within
1e-5 (TorchRL's RSSM computes in float32 whatever the dtype: ``dreamer_v3_composed``).

Each loss is wrapped in :class:`Objective`, whose output is a dict with one ``"loss"`` entry:
the quantity the library's users minimise (the sum of the loss fields of an LLM loss's output
class; the sum of the first TensorDict of a Dreamer loss's ``(losses, output)`` pair), so the
harness trains exactly that. The networks and batches are those of each class's parity tests.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import tensordict
import torch
import torchrl.objectives as torchrl_objectives
from tensordict.nn import TensorDictModule
from torch import nn

import rlloss
from tests import test_dreamer, test_dreamer_v3, test_world_model
from tests.trajectory import assert_same_trajectory, soft_update

transformers = pytest.importorskip("transformers")

import torchrl.objectives.llm as torchrl_llm  # noqa: E402

import rlloss.llm as rl_llm  # noqa: E402
from tests import llm_nets  # noqa: E402

LLM_LOSS_FIELDS = (
    "loss_objective",
    "loss_entropy",
    "loss_kl_to_ref",
    "loss_kl_to_inference",
    "loss_sft",
    "loss_distill",
)


# Fewer steps where a step is slow. Measured on the project's 2-core machine under a load of
# about 30, both libraries' trajectories together: a tiny-Qwen2 step (forward and backward
# through two transformer layers and TorchRL's wrapper's tokenisation and masks) 100 to 450 ms,
# so 100 steps are 20 to 45 s; an imagined rollout (a TorchRL environment step per time step)
# 100 to 170 ms, 100 steps; the composed DreamerV3Loss (world-model rollout, imagination, two
# value losses) about 300 ms, 50 steps (30 s).
LLM_OPTIONS = {"steps": 100}
IMAGINATION_STEPS = 100
COMPOSED_STEPS = 50


def llm_total(out) -> torch.Tensor:
    """The sum of an LLM loss output's loss fields (those it has and that are set)."""
    values = [getattr(out, name, None) for name in LLM_LOSS_FIELDS]
    return sum(value.sum() for value in values if value is not None)


def first_total(out) -> torch.Tensor:
    """The sum of the entries of a Dreamer loss's losses TensorDict (the first of its pair)."""
    losses = out[0] if isinstance(out, tuple) else out
    return sum(value.sum() for value in losses.values())


class Objective(nn.Module):
    """``loss`` (registered as ``loss``: its parameters in its own order) whose forward returns
    ``{"loss": total(loss(batch))}``, the quantity the harness minimises."""

    def __init__(self, loss: nn.Module, total):
        super().__init__()
        self.loss = loss
        self.total = total

    def forward(self, batch):
        return {"loss": self.total(self.loss(batch))}


def inner_soft_update(objective: Objective):
    """TorchRL's Polyak update of the wrapped loss's targets (tau = 0.05)."""
    return soft_update(objective.loss)


def wrapped(ours, theirs, total):
    return Objective(ours, total), Objective(theirs, total)


def batches(make, count: int = 4) -> list:
    return [make(seed) for seed in range(count)]


# ----------------------------------------------------------------------------------- LLM


def grpo_family(name: str, **keywords):
    """One tiny Qwen2 actor (TransformersWrapper on tokens) copied into each library's loss;
    four left-padded token batches (sampling and reference log-probs, per-token advantages)."""
    actor = llm_nets.tiny_actor()
    ours = getattr(rl_llm, name)(copy.deepcopy(actor), **keywords)
    theirs = getattr(torchrl_llm, name)(copy.deepcopy(actor), **keywords)
    data = batches(lambda seed: llm_nets.token_batch(seed=seed))
    return *wrapped(ours, theirs, llm_total), data, LLM_OPTIONS


def chat_setup(*references):
    """A tiny tokenizer and Qwen2, the two chats of ``llm_nets.CHATS`` with log-probs of a
    perturbed copy of the model under each ``(key, assistant_only)`` of ``references``."""
    tokenizer, model = llm_nets.tiny_tokenizer(), llm_nets.tiny_model()
    batch = llm_nets.chat_batch(tokenizer)
    for key, assistant_only in references:
        batch = llm_nets.with_ref_log_probs(
            batch, model, tokenizer, key, assistant_only=assistant_only
        )
    return tokenizer, llm_nets.history_actor(model, tokenizer), batch


def sft(loss_function: str):
    tokenizer, actor, batch = chat_setup(("ref_log_probs", True))
    keywords = dict(
        tokenizer=tokenizer,
        loss_function=loss_function,
        kl_to_ref_coeff=0.1 if loss_function == "sft" else None,
        beta=0.1,
        tokenizer_kwargs={"chat_template_name": "qwen"},
    )
    ours = rl_llm.SFTLoss(copy.deepcopy(actor), **keywords)
    theirs = torchrl_llm.SFTLoss(copy.deepcopy(actor), **keywords)
    return *wrapped(ours, theirs, llm_total), [batch], LLM_OPTIONS


def distillation(direction: str):
    _, actor, batch = chat_setup(("teacher_log_probs", True))
    keywords = dict(kl_direction=direction, tokenizer_kwargs={"chat_template_name": "qwen"})
    ours = rl_llm.DistillationLoss(copy.deepcopy(actor), **keywords)
    theirs = torchrl_llm.DistillationLoss(copy.deepcopy(actor), **keywords)
    return *wrapped(ours, theirs, llm_total), [batch], LLM_OPTIONS


# -------------------------------------------------------------------------------- Dreamer


def dreamer_model():
    model = test_dreamer.world_model()
    settings = {"free_nats": 0.1, "lambda_kl": 0.5}
    ours = rlloss.DreamerModelLoss(copy.deepcopy(model), **settings)
    theirs = torchrl_objectives.DreamerModelLoss(copy.deepcopy(model), **settings)
    return *wrapped(ours, theirs, first_total), batches(test_dreamer.sequences), {}


class Transition(nn.Module):
    """A deterministic latent transition ``(state, belief, action) -> (next state, next
    belief)``, in place of TorchRL's RSSM priors in the imagination environment: those run their
    GRU cell in float32 whatever the parameters' dtype (a guard against bfloat16 autocast), so a
    float64 trajectory through them would compare float32 rounding. Its first output is unused
    (the ``"_"`` of ``test_dreamer_v3.imagination_env``)."""

    def __init__(self, state: int, belief: int, action: int):
        super().__init__()
        self.state_size = state
        self.linear = nn.Linear(state + belief + action, state + belief)

    def forward(self, state, belief, action):
        following = torch.tanh(self.linear(torch.cat([state, belief, action], -1)))
        return following, following[..., : self.state_size], following[..., self.state_size :]


def dreamer_v1_networks():
    sizes = (test_dreamer.STATE, test_dreamer.BELIEF, test_dreamer.ACTION)
    env = test_dreamer_v3.imagination_env(Transition(*sizes), sizes=sizes)
    return test_dreamer.actor(), test_dreamer.value_network(), env


def dreamer_actor():
    """TD(0) targets: TorchRL's DreamerActorLoss computes TD(0) whatever the estimator
    (docs/differences.md). The imagined rollouts sample actions: seeded steps."""
    from torchrl.objectives.utils import ValueEstimators

    networks = dreamer_v1_networks()
    ours = rlloss.DreamerActorLoss(*copy.deepcopy(networks), imagination_horizon=4)
    theirs = torchrl_objectives.DreamerActorLoss(*copy.deepcopy(networks), imagination_horizon=4)
    for loss in (ours, theirs):
        loss.make_value_estimator(ValueEstimators.TD0, gamma=0.9)
    data = batches(lambda seed: test_dreamer.starts(seed=seed))
    return *wrapped(ours, theirs, first_total), data, {"seeded": True, "steps": IMAGINATION_STEPS}


def dreamer_value():
    """Imagined rollouts (states, beliefs, lambda-targets) of TorchRL's actor loss, detached."""
    from torchrl.objectives.utils import ValueEstimators

    imagine = torchrl_objectives.DreamerActorLoss(*dreamer_v1_networks(), imagination_horizon=4)
    imagine.make_value_estimator(ValueEstimators.TD0, gamma=0.9)
    torch.manual_seed(0)
    data = [imagine(test_dreamer.starts(seed=seed))[1].detach() for seed in range(4)]
    critic = test_dreamer.value_network()
    keywords = {"gamma": 0.9, "value_loss": "smooth_l1"}
    ours = rlloss.DreamerValueLoss(copy.deepcopy(critic), **keywords)
    theirs = torchrl_objectives.DreamerValueLoss(copy.deepcopy(critic), **keywords)
    return *wrapped(ours, theirs, first_total), data, {}


def dreamer_v3_model():
    ours, theirs = test_dreamer_v3.model_pair(
        continuation=True, kl_mode="separate", lambda_continue=1.0, free_bits=0.1
    )
    return *wrapped(ours, theirs, first_total), batches(test_dreamer_v3.sequences), {}


def dreamer_v3_actor():
    """``test_dreamer_v3.actor_pair``'s networks and settings on a :class:`Transition`
    environment, with a continuation model (TorchRL's lambda-returns need one,
    docs/differences.md), the return normalisation's percentiles moving along the trajectory;
    seeded imagination."""
    v3 = test_dreamer_v3
    sizes = (v3.STATE, v3.BELIEF, v3.ACTION)
    env = v3.imagination_env(Transition(*sizes), sizes=sizes)
    networks = (v3.tanh_normal_actor(True), v3.value_network(), env)
    continuation = TensorDictModule(v3.HalfContinuation(), ["state", "belief"], ["continuation"])
    ours, theirs = (
        cls(
            *copy.deepcopy(networks),
            continuation_model=copy.deepcopy(continuation),
            imagination_horizon=v3.HORIZON,
            entropy_bonus=0.01,
        )
        for cls in (rlloss.DreamerV3ActorLoss, torchrl_objectives.DreamerV3ActorLoss)
    )
    for loss in (ours, theirs):
        loss.make_value_estimator(None)
    data = batches(lambda seed: v3.starts(seed=seed))
    return *wrapped(ours, theirs, first_total), data, {"seeded": True, "steps": IMAGINATION_STEPS}


def dreamer_v3_value():
    """Two-hot critic with slow-critic regularisation (its target moved by SoftUpdate)."""
    ours, theirs = test_dreamer_v3.value_pair(test_dreamer_v3.BINS, slow_critic_regularization=1.0)
    data = batches(lambda seed: test_dreamer_v3.imagined(weights=True, seed=seed))
    return *wrapped(ours, theirs, first_total), data, {"updater": inner_soft_update}


def dreamer_v3_composed():
    """DreamerV3Loss over the model, actor and value losses of ``test_dreamer_v3.learner``, with
    the replay value loss; seeded imagination, the slow critic moved by SoftUpdate. Its world
    model is TorchRL's RSSM rollout, whose GRU cells compute in float32 whatever the dtype
    (:class:`Transition`): compared in float32, within 1e-5, as the float32 losses of
    ``tests/test_trajectories.py``."""
    networks = test_dreamer_v3.learner()
    extra = {"replay_value_loss_weight": 0.3}
    ours = test_dreamer_v3.composed(rlloss, networks, **extra)
    theirs = test_dreamer_v3.composed(torchrl_objectives, networks, **extra)
    data = batches(lambda seed: test_dreamer_v3.real_sequences(seed=seed + 4))
    options = {
        "seeded": True,
        "updater": lambda o: soft_update(o.loss.value_loss),
        "steps": COMPOSED_STEPS,
        **FLOAT32,
    }
    return (
        *wrapped(
            ours,
            theirs,
            lambda out: sum(value.sum() for key, value in out.items() if key.startswith("loss_")),
        ),
        data,
        options,
    )


def world_model_loss():
    model = test_world_model.world_model()
    settings = {"losses": ["reward", "done", "reconstruction", "latent"], "latent_weight": 0.5}
    ours = rlloss.WorldModelLoss(copy.deepcopy(model), **settings)
    theirs = torchrl_objectives.WorldModelLoss(copy.deepcopy(model), **settings)
    return *wrapped(ours, theirs, first_total), batches(test_world_model.transitions), {}


CASES = {
    "GRPOLoss": lambda: grpo_family("GRPOLoss", kl_to_ref_coeff=0.1),
    "DAPO": lambda: grpo_family("DAPO"),
    # ratio bounds [0.001, 1001] that training never reaches: TorchRL's clamp drops a clipped
    # token's gradient, rlloss keeps it as the paper does (docs/differences.md)
    "CISPOLoss": lambda: grpo_family("CISPOLoss", clip_epsilon=(0.999, 1000.0)),
    "SFTLoss": lambda: sft("sft"),
    "SFTLoss-minor_sft": lambda: sft("minor_sft"),
    "DistillationLoss": lambda: distillation("reverse"),
    "DistillationLoss-forward": lambda: distillation("forward"),
    "DreamerModelLoss": dreamer_model,
    "DreamerActorLoss": dreamer_actor,
    "DreamerValueLoss": dreamer_value,
    "DreamerV3ModelLoss": dreamer_v3_model,
    "DreamerV3ActorLoss": dreamer_v3_actor,
    "DreamerV3ValueLoss": dreamer_v3_value,
    "DreamerV3Loss": dreamer_v3_composed,
    "WorldModelLoss": world_model_loss,
}


FLOAT32 = {"float32": True, "tolerance": 1e-5}
FLOAT32_CASES = {"DreamerV3Loss"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_trajectory_matches_torchrl(name, float64_default):
    if name in FLOAT32_CASES:
        torch.set_default_dtype(torch.float32)
    with tensordict.set_list_to_stack(True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's notes on updaters and estimators
        ours, theirs, data, options = CASES[name]()
        assert_same_trajectory(ours, theirs, data, **options)
