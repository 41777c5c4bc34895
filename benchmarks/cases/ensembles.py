"""The ensembles on SAC's networks (TanhNormal actor, many critics over [observation, action]):
REDQLoss (10 critics, a random pair of target critics per update) and TQCLoss (5 quantile
critics, the top atoms of their pooled target dropped), and their hand-written plain-torch
baselines (a loop over the critics, as the authors write them)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.cases.common import (
    ACT_DIM,
    CUSTOM_SUFFIX,
    GAMMA,
    HIDDEN_TEXT,
    OBS_DIM,
    CustomCritic,
    detached_call,
    frozen_copies,
    mlp,
    on_device,
    policy_net,
    q_module,
    random_replay,
    tanh_normal_sample,
)
from benchmarks.cases.handwritten import hand_redq_loss, hand_tqc_loss
from benchmarks.cases.sac import actor_of, soft_actor_critic_factories, soft_actor_critic_method
from benchmarks.harness import CaseSetup, Method

# With 5 to 10 critics a sample costs several times SAC's: the overhead-bound and the
# compute-bound regimes start at smaller batches than SAC's (256, 4096).
BATCH_SIZES = (64, 1024)


REDQ_SUBSET = 2  # REDQ's M, target critics drawn per update
TQC_QUANTILES, TQC_DROP = 25, 2  # TQC's atoms per critic and top atoms dropped per critic
LOG_ALPHA_BOUNDS = (math.log(0.1), math.log(10.0))  # REDQ's default (min_alpha, max_alpha)


def redq_subset_size(num_critics: int) -> int:
    """REDQ's target critics per update as both libraries cap ``sub_sample_len``: at most
    ``N - 1``, at least 1."""
    return max(1, min(REDQ_SUBSET, num_critics - 1))


def plain_redq_loss(nets: dict, target_critics: list, batch) -> Callable[[], torch.Tensor]:
    """REDQ written by hand (the authors' structure: one module per critic, a loop): a random
    subset of ``REDQ_SUBSET`` target critics for the target, the mean over every critic for the
    actor, TorchRL's temperature loss over the log-probs at ``s`` and ``s'``; ``a~`` and ``a'``
    drawn together after the subset, as the libraries draw them."""
    actor_net, critics, log_alpha = nets["actor_net"], nets["critics"], nets["log_alpha"]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    low, high = LOG_ALPHA_BOUNDS
    subset_size = redq_subset_size(len(critics))

    def loss() -> torch.Tensor:
        subset = torch.randperm(len(critics), device=obs.device)[:subset_size].tolist()
        loc, scale = actor_net(obs)
        with torch.no_grad():
            next_loc, next_scale = actor_net(next_obs)
        params = (torch.stack([loc, next_loc]), torch.stack([scale, next_scale]))
        actions, log_probs = tanh_normal_sample(actor_net, obs, params)  # [2, B, D], [2, B]
        alpha = log_alpha.detach().clamp(low, high).exp()
        with torch.no_grad():
            inputs = torch.cat([next_obs, actions[1]], -1)
            next_q = torch.stack([target_critics[j](inputs) for j in subset]).min(0).values
            next_value = next_q - alpha * log_probs[1].unsqueeze(-1)
            target = reward + GAMMA * not_terminated * next_value
        inputs = torch.cat([obs, action], -1)
        values = torch.stack([c(inputs) for c in critics])  # [N, B, 1]
        critic_loss = F.smooth_l1_loss(values, target.expand_as(values))  # mean over N and B
        td_error = (values - target).detach().square().max(0)  # noqa: F841
        inputs = torch.cat([obs, actions[0]], -1)
        q = torch.stack([detached_call(c, inputs) for c in critics]).squeeze(-1)  # [N, B]
        actor_loss = (alpha * log_probs[0] - q).mean()
        # exp(clamp(log_alpha)) with the clamp's gradient taken as the identity (TorchRL's)
        clamped = log_alpha - log_alpha.detach() + log_alpha.detach().clamp(low, high)
        alpha_loss = -(clamped.exp() * (log_probs.detach() - float(ACT_DIM))).mean()
        entropy = -log_probs.detach().mean()  # noqa: F841 - reported by the libraries
        return actor_loss + critic_loss + alpha_loss

    return loss


def plain_tqc_loss(nets: dict, target_critics: list, batch) -> Callable[[], torch.Tensor]:
    """TQC written by hand (the authors' structure): the pooled target atoms of every target
    critic, sorted, the top ``TQC_DROP`` per critic dropped, each critic's quantile Huber loss
    against them; the actor against the mixture's mean; SAC's temperature loss."""
    actor_net, critics, log_alpha = nets["actor_net"], nets["critics"], nets["log_alpha"]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    keep = TQC_QUANTILES * len(critics) - TQC_DROP * len(critics)
    tau = (torch.arange(TQC_QUANTILES, device=obs.device) + 0.5) / TQC_QUANTILES

    def loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = tanh_normal_sample(actor_net, next_obs)
            inputs = torch.cat([next_obs, next_action], -1)
            atoms = torch.cat([c(inputs) for c in target_critics], -1).sort(-1).values
            next_value = atoms[:, :keep] - alpha * next_log_prob.unsqueeze(-1)
            target = reward + GAMMA * not_terminated * next_value  # [B, keep]
        inputs = torch.cat([obs, action], -1)
        quantiles = torch.stack([c(inputs) for c in critics])  # [N, B, M]
        delta = target[:, None, :] - quantiles.unsqueeze(-1)  # [N, B, M, keep]
        magnitude = delta.abs()  # the authors' quantile Huber loss, kappa = 1
        huber = torch.where(magnitude > 1, magnitude - 0.5, 0.5 * delta.square())
        weight = (tau[:, None] - (delta.detach() < 0).to(delta.dtype)).abs()
        critic_loss = (weight * huber).mean((-1, -2)).sum(0).mean()
        td_error = magnitude.detach().mean((-1, -2)).max(0).values  # noqa: F841
        new_action, log_prob = tanh_normal_sample(actor_net, obs)
        inputs = torch.cat([obs, new_action], -1)
        q = torch.stack([detached_call(c, inputs) for c in critics]).mean((0, -1))  # [B]
        actor_loss = (alpha * log_prob - q).mean()
        alpha_loss = -(log_alpha * (log_prob.detach() - float(ACT_DIM))).mean()
        entropy = -log_prob.detach().mean()  # noqa: F841 - reported by the libraries
        return actor_loss + critic_loss + alpha_loss

    return loss


HAND_LOSSES = {"REDQLoss": hand_redq_loss, "TQCLoss": hand_tqc_loss}


def hand_options(name: str, num_critics: int) -> dict:
    """The hand-written REDQ's or TQC's settings, the libraries' in this family."""
    if name == "REDQLoss":
        return {"subset_size": redq_subset_size(num_critics), "log_alpha_bounds": LOG_ALPHA_BOUNDS}
    return {"quantiles": TQC_QUANTILES, "drop": TQC_DROP}


def subset_text(num_critics: int) -> str:
    """REDQ's subset size, for the description."""
    size = redq_subset_size(num_critics)
    return f", {size} target critic{'s' if size > 1 else ''} drawn per update"


ENSEMBLES = {  # name: (plain loss, default critics, critic outputs, library keywords)
    "REDQLoss": (plain_redq_loss, 10, 1, {"sub_sample_len": REDQ_SUBSET}),
    "TQCLoss": (plain_tqc_loss, 5, TQC_QUANTILES, {"top_quantiles_to_drop_per_net": TQC_DROP}),
}


def build_ensemble(
    name: str, num_critics: int, batch_size: int, seed: int, custom: bool = False
) -> CaseSetup:
    """REDQ or TQC (``name``) with ``num_critics`` critics at ``batch_size`` (``custom``:
    :class:`CustomCritic` critics)."""
    plain_loss, _, outputs, options = ENSEMBLES[name]
    torch.manual_seed(seed)
    actor_net = policy_net(False, ACT_DIM)
    critic = CustomCritic if custom else mlp
    critics = [critic(OBS_DIM + ACT_DIM, outputs) for _ in range(num_critics)]
    batch = random_replay(batch_size, seed + 1)
    on_device(actor_net, *critics)
    template = {"actor_net": actor_net, "critics": critics}
    kwargs = {"num_qvalue_nets": num_critics, **options, "target_entropy": -float(ACT_DIM)}

    def library_loss(library, nets: dict) -> nn.Module:
        actor = actor_of(nets["actor_net"], False)
        qs = [q_module(c, False) for c in nets["critics"]]
        loss = getattr(library, name)(actor, qs, **kwargs)
        loss.make_value_estimator(gamma=GAMMA)
        return loss

    def plain_method(nets: dict, batch, params: dict) -> Method:
        target_critics = frozen_copies(nets["critics"])
        loss = plain_loss(nets, target_critics, batch)
        return soft_actor_critic_method(nets, loss, target_critics, params)

    hand_loss = None
    if custom:
        hand_loss = partial(HAND_LOSSES[name], options=hand_options(name, num_critics))
    return CaseSetup(
        batches={"replay": batch},
        factories=soft_actor_critic_factories(
            template, library_loss, plain_method, hand_loss=hand_loss
        ),
        description=(
            f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}); TanhNormal actor, "
            f"{num_critics} {'custom ' if custom else ''}critics ({outputs} "
            f"output{'s' if outputs > 1 else ''}), MLPs "
            f"{HIDDEN_TEXT} relu, obs {OBS_DIM}, action dim {ACT_DIM}, target critics"
            + (subset_text(num_critics) if name == "REDQLoss" else "")
        ),
    )


CASES = {name: partial(build_ensemble, name, spec[1]) for name, spec in ENSEMBLES.items()}
CASES.update(
    {
        name + CUSTOM_SUFFIX: partial(build_ensemble, name, spec[1], custom=True)
        for name, spec in ENSEMBLES.items()
    }
)


def with_critics(case: str, critics: int) -> Callable[[int, int], CaseSetup]:
    """The builder of the ensemble ``case`` (REDQ or TQC, with or without the custom-critic
    suffix) with ``critics`` critics instead of its default (``overhead.py --critics``)."""
    name = case.removesuffix(CUSTOM_SUFFIX)
    if name not in ENSEMBLES:
        raise ValueError(
            f"--critics applies to the ensemble cases {sorted(ENSEMBLES)} (and their "
            f"{CUSTOM_SUFFIX} cases), not {case}: choose those with --cases"
        )
    return partial(build_ensemble, name, critics, custom=case.endswith(CUSTOM_SUFFIX))
