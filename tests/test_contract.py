"""The contract every rlloss loss keeps (DESIGN.md, "Tests"): one table of losses run through
the same checks. A new loss joins by adding a row to LOSSES."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch._dynamo
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode
from torchrl.modules import IndependentNormal

import rlloss
from tests import (
    test_act,
    test_agent_shapes,
    test_bc,
    test_crossq,
    test_diffusion_bc,
    test_distributional_dqn,
    test_dqn,
    test_dt,
    test_gail,
    test_iql,
    test_mappo,
    test_mpo,
    test_multiagent_networks,
    test_qmixer,
    test_rnd,
    test_sac,
    test_td3,
    test_tqc,
)
from tests.llm_nets import TokenActor, token_batch
from tests.nets import make_actor, make_critic, perturbed, rollout


@dataclass
class Row:
    build: Callable[[], rlloss.LossModule]
    batch: Callable[[], TensorDict]
    # loss key -> the networks its gradient may reach (the others must get none)
    routes: dict[str, tuple[str, ...]]
    # tensor_keys names remapped by the set_keys round trip
    renamable: tuple = ("advantage", "value_target", "sample_log_prob")
    # entries the loss writes into the caller's batch (prioritized replay's td_error)
    writes: tuple[str, ...] = ()
    # a coefficient buffer changed in place between compiled calls
    coefficient: str | None = "entropy_coeff"
    # why the loss cannot compile yet (the test is skipped with this reason), or None
    no_compile: str | None = None
    # why a forward reads tensors on the host (the host-read check, and the CUDA one in
    # tests/test_cuda.py, are skipped with this reason), or None
    host_reads: str | None = None


ACTOR = make_actor()


def ppo_row(name: str, **kwargs) -> Row:
    return Row(
        build=lambda: getattr(rlloss, name)(perturbed(ACTOR), make_critic(), **kwargs),
        batch=lambda: rollout(ACTOR),
        routes={
            "loss_objective": ("actor_network",),
            "loss_entropy": ("actor_network",),
            "loss_critic": ("critic_network",),
        },
    )


MULTI_AGENT_ACTOR = test_mappo.actor()
MULTI_AGENT_NO_COMPILE = (
    "TorchRL's MultiAgentMLP swaps its TensorDictParams into an empty network in each forward: "
    "dynamo guards on that network's weights and recompiles"
)


def mappo_row(name: str, **kwargs) -> Row:
    def build():
        loss = getattr(rlloss, name)(
            perturbed(MULTI_AGENT_ACTOR), test_mappo.critic(name == "MAPPOLoss"), **kwargs
        )
        loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
        return loss

    return Row(
        build=build,
        batch=lambda: test_mappo.batch_with_advantage(MULTI_AGENT_ACTOR),
        # set_keys(name=None) restores the class default ("action_log_prob"), not the actor's
        # nested ("agents", "action_log_prob"), in TorchRL too
        renamable=("advantage", "value_target"),
        no_compile=MULTI_AGENT_NO_COMPILE,
        routes={
            "loss_objective": ("actor_network",),
            "loss_entropy": ("actor_network",),
            "loss_critic": ("critic_network",),
        },
    )


def dqn_row(name="DQNLoss", **kwargs) -> Row:
    losses = ("loss_qvalue", "loss_cql") if name == "DiscreteCQLLoss" else ("loss",)
    return Row(
        build=lambda: getattr(rlloss, name)(test_dqn.q_actor(), **kwargs),
        batch=lambda: test_dqn.transitions(),
        routes={loss: ("value_network",) for loss in losses},
        renamable=("action",),
        writes=("td_error",),
        coefficient=None,
    )


def td3_row(name="TD3Loss", **kwargs) -> Row:
    return Row(
        build=lambda: getattr(rlloss, name)(
            test_td3.actor(), test_td3.qvalue(), bounds=(-1.0, 1.0), **kwargs
        ),
        batch=lambda: test_td3.transitions(),
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=(("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="policy_noise",
    )


def ddpg_row(**kwargs) -> Row:
    return Row(
        build=lambda: rlloss.DDPGLoss(test_td3.actor(), test_td3.qvalue(), **kwargs),
        batch=lambda: test_td3.transitions(),
        routes={"loss_actor": ("actor_network",), "loss_value": ("value_network",)},
        renamable=(("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient=None,
    )


SAC_ROUTES = {"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)}
DDPG_ROUTES = {"loss_actor": ("actor_network",), "loss_value": ("value_network",)}


def multi_agent_row(name: str, routes: dict, coefficient: str | None = None) -> Row:
    """An off-policy loss of a multi-agent pipeline (BenchMARL's MASAC, MADDPG, IQL, QMIX...) on
    TorchRL's ``MultiAgentMLP`` networks, per-agent rewards and flags
    (``tests/test_multiagent_networks.py``; the discrete SAC of ``tests/test_agent_shapes.py``).
    Nothing is renamed: ``set_keys(name=None)`` restores the class default (``"reward"``), not
    the group's nested key, in TorchRL too."""
    make = {**test_multiagent_networks.LOSSES, **test_agent_shapes.LOSSES}[name]
    return Row(
        build=lambda: make()[0],
        batch=lambda: make()[1],
        routes=routes,
        renamable=(),
        writes=("td_error",),
        coefficient=coefficient,
        no_compile=MULTI_AGENT_NO_COMPILE,
    )


def sac_row(discrete=False, **kwargs) -> Row:
    if discrete:

        def build():
            return rlloss.DiscreteSACLoss(
                test_sac.discrete_actor(False),
                test_sac.discrete_qvalue(),
                num_actions=test_sac.NUM_ACTIONS,
                **kwargs,
            )

        def batch():
            return test_sac.discrete_transitions(False)
    else:

        def build():
            return rlloss.SACLoss(test_sac.actor(), test_sac.qvalue(), **kwargs)

        batch = test_sac.transitions
    return Row(
        build=build,
        batch=batch,
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    )


def iql_row(discrete=False, **kwargs) -> Row:
    def build():
        if discrete:
            actor, critic = test_sac.discrete_actor(False), test_iql.discrete_qvalue()
            value = test_iql.value_network()
            return rlloss.DiscreteIQLLoss(
                actor, critic, value, action_space="categorical", **kwargs
            )
        return rlloss.IQLLoss(
            test_sac.actor(), test_sac.qvalue(), test_iql.value_network(), **kwargs
        )

    return Row(
        build=build,
        batch=(lambda: test_sac.discrete_transitions(False)) if discrete else test_sac.transitions,
        routes={
            "loss_actor": ("actor_network",),
            "loss_qvalue": ("qvalue_network_params",),
            "loss_value": ("value_network",),
        },
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient=None,
    )


def cql_row(**kwargs) -> Row:
    return Row(
        build=lambda: rlloss.CQLLoss(test_sac.actor(), test_sac.qvalue(), **kwargs),
        batch=test_sac.transitions,
        routes={
            "loss_actor": ("actor_network",),
            "loss_actor_bc": ("actor_network",),
            "loss_qvalue": ("qvalue_network_params",),
            "loss_cql": ("qvalue_network_params",),
            "loss_alpha": (),
            **({"loss_alpha_prime": ()} if kwargs.get("with_lagrange") else {}),
        },
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    )


def mpo_row(discrete=False, **kwargs) -> Row:
    if discrete:

        def build():
            return test_mpo.discrete_loss(**kwargs)[0]

        def batch():
            return test_sac.discrete_transitions(False)
    else:

        def build():
            return test_mpo.continuous_loss(**kwargs)[0]

        batch = test_mpo.transitions
    return Row(
        build=build,
        batch=batch,
        routes={
            "loss_actor": ("actor_network",),
            "loss_qvalue": ("qvalue_network",),
            "loss_temperature": (),
            "loss_alpha": (),
        },
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient=None,
    )


def addons(prior) -> Callable[[], dict]:
    """``policy_loss_addons`` of both kinds, the prior built afresh at each construction."""
    return lambda: {
        "policy_loss_addons": [rlloss.BehaviorCloning(0.5), rlloss.AttractionKL(prior(), 0.2)]
    }


def with_addons(make_row: Callable[..., Row], prior, *args, **kwargs) -> Row:
    """The row of ``make_row(*args, **kwargs)`` whose loss also has both add-ons."""
    row = make_row(*args, **kwargs)
    row.build = lambda: make_row(*args, **kwargs, **addons(prior)()).build()
    return row


LLM_KL = dict(kl_to_ref_coeff=0.1, kl_to_inference_coeff=0.05, kl_mask_threshold=1.0)


def llm_row(name: str, **kwargs) -> Row:
    """A GRPO-family loss on the transformers-free stand-in actor (tests/llm_nets.py), every
    term on: the clipped objective, the entropy bonus, both k3 KLs, the KL trust mask."""
    return Row(
        build=lambda: getattr(rlloss, name)(TokenActor(), **{**LLM_KL, **kwargs}),
        batch=lambda: token_batch(seed=int(torch.randint(100, ()))),
        routes={
            key: ("actor_network",)
            for key in ("loss_objective", "loss_entropy", "loss_kl_to_ref", "loss_kl_to_inference")
        },
        renamable=("advantage", "sample_log_prob"),
        coefficient="clip_epsilon_high",
    )


def preference_row(name: str, loss_key: str, renamable: tuple, **kwargs) -> Row:
    """A preference loss on the causal bigram stand-in (tests/preference_nets.py), float32;
    a ``reference_network`` keyword gets a second bigram, which no gradient may reach."""
    from tests.preference_nets import CausalBigram, kto_batch, pair_batch

    def build():
        if "reference_network" in kwargs:
            kwargs["reference_network"] = CausalBigram(seed=1, dtype=torch.float32)
        return getattr(rlloss, name)(CausalBigram(dtype=torch.float32), **kwargs)

    make_batch = kto_batch if name == "KTOLoss" else pair_batch

    def batch():  # the padding's NaN reference log-probs zeroed: batch == batch must hold
        td = make_batch(seed=int(torch.randint(100, ())), dtype=torch.float32)
        return td.apply(lambda t: t.nan_to_num() if t.is_floating_point() else t)

    return Row(
        build=build,
        batch=batch,
        routes={loss_key: ("actor_network",)},
        renamable=renamable,
        coefficient="beta",
    )


def chat_setup():
    """A tiny Qwen2 (tests/llm_nets.py), its tokenizer and two chats with a perturbed copy's
    log-probs as the reference's and the teacher's; built once."""
    global _CHAT
    if _CHAT is None:
        from tests.llm_nets import chat_batch, tiny_model, tiny_tokenizer, with_ref_log_probs

        tokenizer, model = tiny_tokenizer(), tiny_model()
        batch = with_ref_log_probs(chat_batch(tokenizer), model, tokenizer)
        batch = with_ref_log_probs(batch, model, tokenizer, "teacher_log_probs")
        _CHAT = model, tokenizer, batch
    return _CHAT


_CHAT = None
CHAT_NO_COMPILE = (
    "the chat-history losses call TorchRL's TransformersWrapper on History entries "
    "(tokenisation with the chat template, Python strings): no single graph"
)
CHAT_HOST_READS = (
    "TorchRL's TransformersWrapper tokenises the History on the host and reads its masks; the "
    "loss's own empty-sequence checks read the masks when they are on the CPU only"
)


def chat_row(name: str, loss_key: str, renamable: tuple, **kwargs) -> Row:
    def build():
        from tests.llm_nets import history_actor

        model, tokenizer, _ = chat_setup()
        return getattr(rlloss, name)(
            history_actor(model, tokenizer),
            tokenizer_kwargs={"chat_template_name": "qwen"},
            **kwargs,
        )

    return Row(
        build=build,
        batch=lambda: chat_setup()[2].clone(),
        routes={loss_key: ("actor_network",)},
        renamable=renamable,
        coefficient=None,
        no_compile=CHAT_NO_COMPILE,
        host_reads=CHAT_HOST_READS,
    )


LOSSES = {
    "MPOLoss": mpo_row(),
    "MPOLoss-normal-penalized-one-dual": mpo_row(
        distribution=IndependentNormal, action_penalization=True, per_dim_constraining=False
    ),
    "DiscreteMPOLoss": mpo_row(discrete=True),
    "SACLoss": sac_row(),
    "SACLoss-3-nets-bounded-alpha": sac_row(num_qvalue_nets=3, min_alpha=0.1, max_alpha=2.0),
    "DiscreteSACLoss": sac_row(discrete=True),
    "REDQLoss": Row(
        build=lambda: rlloss.REDQLoss(test_sac.actor(), test_sac.qvalue(), num_qvalue_nets=4),
        batch=test_sac.transitions,
        routes={
            "loss_actor": ("actor_network",),
            "loss_qvalue": ("qvalue_network_params",),
            "loss_alpha": (),
        },
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    ),
    "CrossQLoss": Row(
        build=lambda: rlloss.CrossQLoss(test_sac.actor(), test_sac.qvalue()),
        batch=test_sac.transitions,
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    ),
    # batch-normalised critics in eval mode (train mode updates the running statistics at
    # each call, so two calls differ by design: test_crossq.py covers it)
    "CrossQLoss-batchnorm-eval": Row(
        build=lambda: rlloss.CrossQLoss(
            test_sac.actor(), [test_crossq.critic(), test_crossq.critic()]
        ).eval(),
        batch=test_sac.transitions,
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    ),
    "TQCLoss": Row(
        build=lambda: rlloss.TQCLoss(
            test_sac.actor(), test_tqc.quantile_critic(), top_quantiles_to_drop_per_net=1
        ),
        batch=test_sac.transitions,
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    ),
    "IQLLoss": iql_row(),
    "DiscreteIQLLoss": iql_row(discrete=True),
    "CQLLoss": cql_row(),
    "CQLLoss-lagrange-max-backup": cql_row(with_lagrange=True, max_q_backup=True, num_random=3),
    "DDPGLoss": ddpg_row(),
    "DDPGLoss-delayed-actor": ddpg_row(delay_actor=True),
    "TD3Loss": td3_row(),
    "TD3Loss-3-nets": td3_row(num_qvalue_nets=3, loss_function="l2"),
    "TD3BCLoss": td3_row(name="TD3BCLoss", alpha=2.0),
    "DQNLoss": dqn_row(),
    "DDQNLoss": dqn_row(double_dqn=True, loss_function="smooth_l1"),
    "DiscreteCQLLoss": dqn_row(name="DiscreteCQLLoss"),
    "DistributionalDQNLoss": Row(
        build=lambda: rlloss.DistributionalDQNLoss(test_distributional_dqn.c51_actor()),
        batch=lambda: test_distributional_dqn.transitions(),
        routes={"loss": ("value_network",)},
        renamable=("action",),
        writes=("td_error",),
        coefficient=None,
    ),
    "QMixerLoss": Row(
        build=lambda: rlloss.QMixerLoss(
            test_qmixer.local_q("categorical"), test_qmixer.mixer("qmix")
        ),
        batch=lambda: test_qmixer.team_batch("categorical"),
        routes={"loss": ("local_value_network", "mixer_network")},
        renamable=("action", ("next", "reward")),
        writes=("td_error",),
        coefficient=None,
    ),
    "PPOLoss": ppo_row("PPOLoss", clip_value=0.2),
    "ClipPPOLoss-delay-actor": ppo_row("ClipPPOLoss", delay_actor=True, max_importance_ratio=10.0),
    "MAPPOLoss": mappo_row("MAPPOLoss", clip_value=0.2),
    **{
        f"{name}-multiagent": multi_agent_row(name, routes, coefficient)
        for name, routes, coefficient in (
            ("SACLoss", SAC_ROUTES, "target_entropy"),
            ("DiscreteSACLoss", SAC_ROUTES, "target_entropy"),
            ("TD3Loss", SAC_ROUTES, "policy_noise"),
            ("DDPGLoss", DDPG_ROUTES, None),
            ("DQNLoss", {"loss": ("value_network",)}, None),
            ("QMixerLoss", {"loss": ("local_value_network", "mixer_network")}, None),
        )
    },
    "IPPOLoss": mappo_row("IPPOLoss"),
    "ClipPPOLoss": ppo_row("ClipPPOLoss", dual_clip=3.0, normalize_advantage=True),
    "KLPENPPOLoss": ppo_row("KLPENPPOLoss", beta_max=10.0),
    "RPOLoss": ppo_row("RPOLoss", rpo_alpha=0.3),
    "A2CLoss": ppo_row("A2CLoss", clip_value=0.2),
    "ReinforceLoss": Row(
        build=lambda: rlloss.ReinforceLoss(perturbed(ACTOR), make_critic()),
        batch=lambda: rollout(ACTOR),
        routes={"loss_actor": ("actor_network",), "loss_value": ("critic_network",)},
        coefficient=None,
    ),
    "ClipPPOLoss-value-normalizer": Row(
        build=lambda: rlloss.ClipPPOLoss(
            perturbed(ACTOR), make_critic(), value_normalizer=rlloss.ValueNormalizer()
        ),
        batch=lambda: rollout(ACTOR),
        routes={
            "loss_objective": ("actor_network",),
            "loss_entropy": ("actor_network",),
            # the estimator the loss builds at construction holds the critic too
            "loss_critic": ("critic_network", "_value_estimator"),
        },
    ),
    # policy-loss add-ons (rlloss.addons) on every kind of actor
    "ClipPPOLoss-addons": with_addons(ppo_row, lambda: perturbed(ACTOR), "ClipPPOLoss"),
    "A2CLoss-addons": with_addons(ppo_row, lambda: perturbed(ACTOR), "A2CLoss"),
    "SACLoss-addons": with_addons(sac_row, test_sac.actor),
    "DiscreteSACLoss-addons": with_addons(
        sac_row, lambda: test_sac.discrete_actor(False), discrete=True
    ),
    "CQLLoss-addons": with_addons(cql_row, test_sac.actor),
    "IQLLoss-addons": with_addons(iql_row, test_sac.actor),
    "MPOLoss-addons": with_addons(mpo_row, test_sac.actor),
    "DiscreteMPOLoss-addons": with_addons(
        mpo_row, lambda: test_sac.discrete_actor(False), discrete=True
    ),
    "DDPGLoss-addons": with_addons(ddpg_row, test_td3.actor),
    "TD3Loss-addons": with_addons(td3_row, test_td3.actor),
    "TD3BCLoss-addons": with_addons(td3_row, test_td3.actor, name="TD3BCLoss", alpha=2.0),
    "REDQLoss-addons": Row(
        build=lambda: rlloss.REDQLoss(
            test_sac.actor(), test_sac.qvalue(), num_qvalue_nets=4, **addons(test_sac.actor)()
        ),
        batch=test_sac.transitions,
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    ),
    "TQCLoss-addons": Row(
        build=lambda: rlloss.TQCLoss(
            test_sac.actor(), test_tqc.quantile_critic(), **addons(test_sac.actor)()
        ),
        batch=test_sac.transitions,
        routes={"loss_actor": ("actor_network",), "loss_qvalue": ("qvalue_network_params",)},
        renamable=("action", ("next", "reward"), ("next", "terminated")),
        writes=("td_error",),
        coefficient="target_entropy",
    ),
    "ReinforceLoss-addons": Row(
        build=lambda: rlloss.ReinforceLoss(
            perturbed(ACTOR), make_critic(), **addons(lambda: perturbed(ACTOR))()
        ),
        batch=lambda: rollout(ACTOR),
        routes={"loss_actor": ("actor_network",), "loss_value": ("critic_network",)},
        coefficient=None,
    ),
    "BCLoss": Row(
        build=lambda: rlloss.BCLoss(perturbed(ACTOR)),
        batch=lambda: test_bc.demonstrations(),
        routes={"loss_bc": ("actor_network",)},
        renamable=("action",),
        coefficient=None,
    ),
    "BCLoss-chunk-padding": Row(
        build=lambda: test_bc.chunk_loss(),
        batch=lambda: test_bc.chunks(),
        routes={"loss_bc": ("actor_network",)},
        renamable=(),  # set_keys(name=None) restores the default: no padding mask
        coefficient=None,
    ),
    "RNDLoss": Row(
        build=lambda: rlloss.RNDLoss(*test_rnd.networks()),
        batch=lambda: test_rnd.visited(),
        routes={"loss_predictor": ("predictor_network",)},
        renamable=("observation",),
        coefficient=None,  # update_fraction is a number: a new value recompiles
    ),
    "GAILLoss": Row(
        build=lambda: rlloss.GAILLoss(test_gail.discriminator()),
        batch=lambda: test_gail.pairs(),
        routes={"loss": ("discriminator_network",)},
        renamable=("collector_observation", "collector_action"),
        coefficient=None,
    ),
    "GAILLoss-grad-penalty": Row(
        build=lambda: rlloss.GAILLoss(test_gail.discriminator(), use_grad_penalty=True),
        batch=lambda: test_gail.pairs(),
        routes={"loss": ("discriminator_network",)},
        renamable=("collector_observation", "collector_action"),
        coefficient=None,
        no_compile="the loss differentiates inside its forward (torch.autograd.grad)",
    ),
    "DTLoss": Row(
        build=lambda: rlloss.DTLoss(test_dt.regression_actor()),
        batch=lambda: test_dt.trajectories(),
        routes={"loss": ("actor_network",)},
        renamable=("action_target",),
        coefficient=None,
    ),
    "OnlineDTLoss": Row(
        build=lambda: rlloss.OnlineDTLoss(test_dt.stochastic_actor(), min_alpha=0.1, max_alpha=5),
        batch=lambda: test_dt.trajectories(),
        routes={
            "loss_log_likelihood": ("actor_network",),
            "loss_entropy": ("actor_network",),
            "loss_alpha": (),
        },
        renamable=("action_target",),
        coefficient="target_entropy",
    ),
    "DiffusionBCLoss": Row(
        build=lambda: rlloss.DiffusionBCLoss(test_diffusion_bc.actor()),
        batch=lambda: test_diffusion_bc.demonstrations(),
        routes={"loss_diffusion_bc": ("actor_network",)},
        renamable=("action", "observation"),
        coefficient=None,
    ),
    "ACTLoss": Row(
        build=lambda: rlloss.ACTLoss(test_act.policy()),
        batch=lambda: test_act.chunks(),
        routes={"loss_act": ("actor_network",)},
        renamable=("observation", "action_chunk"),
        coefficient="kl_weight",
    ),
    "GRPOLoss": llm_row("GRPOLoss"),
    "GRPOLoss-prompt-mean-generic": llm_row(
        "GRPOLoss", aggregation="prompt_mean", masking_strategy="generic"
    ),
    "DAPO": llm_row("DAPO"),
    "CISPOLoss": llm_row("CISPOLoss"),
    "DrGRPOLoss": llm_row("DrGRPOLoss"),
    "GSPOLoss": llm_row("GSPOLoss"),
    "SFTLoss": chat_row("SFTLoss", "loss_sft", ("ref_log_prob",), kl_to_ref_coeff=0.1),
    "DistillationLoss": chat_row("DistillationLoss", "loss_distill", ("teacher_log_prob",)),
    "DPOLoss": preference_row("DPOLoss", "loss_dpo", ("chosen", "rejected")),
    "DPOLoss-ipo-reference-network": preference_row(
        "DPOLoss", "loss_dpo", ("chosen",), loss_type="ipo", reference_network=True
    ),
    "DPOLoss-robust": preference_row(
        "DPOLoss", "loss_dpo", ("rejected",), loss_type="robust", label_smoothing=0.1
    ),
    "SimPOLoss": preference_row("SimPOLoss", "loss_simpo", ("chosen", "rejected")),
    "KTOLoss": preference_row("KTOLoss", "loss_kto", ("response", "label", "kl_response")),
}


def is_loss(key: str) -> bool:
    """A loss entry: TorchRL's ``loss_*`` names, and DQN's single ``loss``."""
    return key == "loss" or key.startswith("loss_")


def seeded(loss, batch, seed=0):
    torch.manual_seed(seed)
    return loss(batch)


def assert_same_outputs(first: TensorDict, second: TensorDict) -> None:
    assert set(first.keys()) == set(second.keys())
    for key in first.keys():
        torch.testing.assert_close(first.get(key), second.get(key), msg=key)


@pytest.fixture(params=list(LOSSES))
def row(request) -> Row:
    return LOSSES[request.param]


def test_declared_out_keys_are_produced(row):
    loss = row.build()
    assert sorted(loss(row.batch()).keys()) == sorted(loss.out_keys)
    assert all(not v.requires_grad for k, v in loss(row.batch()).items() if not is_loss(k))


def test_two_forwards_agree_and_leave_the_batch_alone(row):
    loss, batch = row.build(), row.batch()
    before = batch.clone()
    if hasattr(loss, "adaptive_beta"):
        loss.adaptive_beta = False
    assert_same_outputs(seeded(loss, batch), seeded(loss, batch))
    for key in row.writes:
        assert key in batch.keys()
        del batch[key]
    assert set(batch.keys(True, True)) == set(before.keys(True, True)) and (batch == before).all()


def test_set_keys_round_trip(row):
    loss, batch = row.build(), row.batch()
    if hasattr(loss, "adaptive_beta"):
        loss.adaptive_beta = False
    expected = seeded(loss, batch)
    renamed = batch.clone()
    remap = {}
    for entry in row.renamable:  # a tensor_keys name, or ("next", name) for keys read there
        nested = isinstance(entry, tuple)
        name = entry[-1] if nested else entry
        key = getattr(loss.tensor_keys, name)
        renamed.rename_key_(
            ("next", key) if nested else key,
            ("next", f"new_{name}") if nested else ("renamed", name),
        )
        remap[name] = f"new_{name}" if nested else ("renamed", name)
    loss.set_keys(**remap)
    assert_same_outputs(seeded(loss, renamed), expected)
    loss.set_keys(**{name: None for name in remap})
    assert_same_outputs(seeded(loss, batch), expected)


def test_gradients_reach_only_their_networks(row):
    loss, batch = row.build(), row.batch()
    out = loss(batch)
    for key, allowed in row.routes.items():
        loss.zero_grad(set_to_none=True)
        out.get(key).backward(retain_graph=True)
        for name, module in loss.named_children():
            if name.startswith("target_") or not list(module.parameters()):
                continue
            reached = any(
                p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters()
            )
            assert reached == (name in allowed), f"{key} -> {name}"


def test_state_dict_round_trip(row):
    loss = row.build()
    batch = row.batch()
    loss(batch)  # changes adaptive state (beta) where there is some
    other = row.build()
    other.load_state_dict(loss.state_dict())
    for name in ("adaptive_beta",):
        if hasattr(loss, name):
            loss.adaptive_beta = other.adaptive_beta = False
    assert_same_outputs(seeded(other, batch), seeded(loss, batch))


# One row per loss class in the default run; its variants (add-ons, larger ensembles, other
# options) compile in the slow run (each 1-10 s of tracing, several times that on a busy machine).
@pytest.mark.parametrize(
    "row",
    [
        pytest.param(row, id=name, marks=[pytest.mark.slow] if "-" in name else [])
        for name, row in LOSSES.items()
    ],
)
def test_compiles_as_one_graph_without_recompiling(row):
    if row.no_compile:
        pytest.skip(row.no_compile)
    torch._dynamo.reset()
    loss = row.build()
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=False):
        compiled(row.batch())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            for module in (loss, twin):
                if row.coefficient:  # an in-place buffer change
                    setattr(module, row.coefficient, 0.01 * (step + 1))
            batch = row.batch()
            out = seeded(compiled, batch)
            sum(v for k, v in out.items() if is_loss(k)).backward()
            if not hasattr(loss, "adaptive_beta"):
                assert_same_outputs(out, seeded(loss, batch))
    torch._dynamo.reset()


def test_no_forward_after_the_first_runs_tanh_normals_constructor(row, monkeypatch):
    """TorchRL's ``TanhNormal.__init__`` synchronises with the host on a GPU (it checks the
    bounds with ``.all()``/``.any()`` and copies Python-number bounds to the device): after a
    loss's first forward, no forward runs it (the GPU check itself: tests/test_cuda.py)."""
    from torchrl.modules import TanhNormal

    loss = row.build()
    seeded(loss, row.batch())
    constructed = []
    init = TanhNormal.__init__
    monkeypatch.setattr(
        TanhNormal, "__init__", lambda self, *a, **k: constructed.append(1) or init(self, *a, **k)
    )
    for seed in range(2):
        out = seeded(loss, row.batch(), seed)
        sum(v for k, v in out.items() if is_loss(k)).backward()
    assert not constructed


# aten operations that read a tensor's value on the host (a synchronisation on a GPU): scalar
# reads (.item(), bool(), if tensor), data-dependent shapes, and torch.normal's std >= 0 check.
HOST_READS = {
    "aten._local_scalar_dense",
    "aten.is_nonzero",
    "aten.equal",
    "aten.nonzero",
    "aten.masked_select",
    "aten._unique2",
    "aten.unique_consecutive",
    "aten.normal",
}


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket._qualified_op_name.replace("::", ".") in HOST_READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_forward_and_backward_read_no_tensor_on_the_host(row):
    """The CPU side of the GPU check in tests/test_cuda.py: after a loss's first forward, no
    forward or backward runs an operation that needs a tensor's value on the host."""
    if row.host_reads:
        pytest.skip(row.host_reads)
    loss = row.build()
    seeded(loss, row.batch())
    batch = row.batch()
    with HostReads() as reads:
        out = seeded(loss, batch)
        sum(v for k, v in out.items() if is_loss(k)).backward()
    assert not reads.seen


def test_a_whole_loss_pickles_and_gives_the_same_outputs(row):
    """``torch.save(loss)`` / ``torch.load`` (and so spawn-started processes): every attribute
    of a loss pickles, and the loaded one computes what the original does."""
    loss = row.build()
    batch = row.batch()
    seeded(loss, batch.clone())  # lazy state (templates, caches) made before saving
    buffer = io.BytesIO()
    torch.save(loss, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    expected = seeded(loss, batch.clone())  # KLPEN's adaptive beta moved by the first call
    assert_same_outputs(seeded(loaded, batch.clone()), expected)
