"""The hand-written family: each loss as a user writes it in one file, CleanRL-style (the
harness's ``hand`` and ``hand-min`` methods).

The anchor users compare with (CleanRL's ``ppo_continuous_action.py``, ``dqn.py``,
``td3_continuous_action.py``, ``sac_continuous_action.py``): the networks called directly on
tensors, the Gaussian log-probability and entropy written as their formulas, no
``torch.distributions`` object, no TensorDict, only the loss terms. ``hand`` also computes,
detached, the diagnostics the rlloss loss returns beside its losses (kept in a dict, as a user
logs them): it is the counterpart of ``rlloss`` (``diagnostics=True``); ``hand-min`` computes the
losses only, the counterpart of ``rlloss-min`` (``diagnostics=False``). The off-policy losses and
DQN have no switch: rlloss always returns their TD errors and values, so ``rlloss`` is held to
``hand`` and ``rlloss / hand-min`` shows what those diagnostics cost.

Differences from ``plain``: the PPO family's ``plain`` evaluates the actor's own distribution
class (``IndependentNormal``); off-policy, ``plain`` concatenates the critic's inputs itself and
keeps the actor's gradient out of the critic with ``torch.func.functional_call`` on detached
parameters. Here the critic is the user's ``nn.Module`` called as ``critic(obs, action)`` and
its parameters are frozen around the actor's evaluation (``requires_grad_(False)``, Spinning
Up's idiom). DQN's ``plain`` is already this step (see :mod:`benchmarks.cases.dqn`).

Each builder reads the batch's tensors once (a user's replay buffer hands over tensors) and
returns the loss closure of one step: ``total = sum of the loss terms``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.cases.common import ACT_DIM, GAMMA, tanh_normal_sample

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
POLICY_NOISE, NOISE_CLIP = 0.0, 0.5  # TD3's target smoothing as the cases configure it


# --------------------------------------------------------------------------- #
# The PPO family
# --------------------------------------------------------------------------- #
def gaussian_log_prob(x: torch.Tensor, loc, scale, log_scale) -> torch.Tensor:
    """``sum_d -(x - mu)^2 / (2 sigma^2) - log sigma - log sqrt(2 pi)``, ``[B]``."""
    return (-(x - loc).square() / (2 * scale.square()) - log_scale - LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_scale: torch.Tensor) -> torch.Tensor:
    """``sum_d 1/2 + log sqrt(2 pi) + log sigma``, ``[B]``."""
    return (0.5 + LOG_SQRT_2PI + log_scale).sum(-1)


def gaussian_kl(loc0, scale0, loc1, scale1, log_scale1) -> torch.Tensor:
    """``KL(N(mu0, sigma0) || N(mu1, sigma1))`` summed over the action dims, ``[B]``."""
    spread = (scale0.square() + (loc0 - loc1).square()) / (2 * scale1.square())
    return (log_scale1 - scale0.log() + spread - 0.5).sum(-1)


def ppo_diagnostics(log_ratio, ratio, entropy, value, value_target, clip_epsilon) -> dict:
    """What rlloss's PPO losses return beside the losses (``clip_epsilon``: ClipPPO's four more),
    computed as CleanRL logs them."""
    out = {
        "kl_approx": (-log_ratio).mean(),
        "kl_k3": ((ratio - 1) - log_ratio).mean(),
        "entropy": entropy,
        "explained_variance": 1
        - (value_target - value).var(correction=0) / (value_target.var(correction=0) + 1e-7),
    }
    if clip_epsilon is not None:
        weight = (log_ratio - log_ratio.max()).exp()
        out["clip_fraction"] = ((ratio - 1).abs() > clip_epsilon).float().mean()
        out["ESS"] = weight.sum().square() / (weight.square().sum() * len(log_ratio))
        out["max_ratio"], out["mean_ratio"] = ratio.max(), ratio.mean()
    return out


def hand_ppo_loss(
    name: str, nets: dict, batch, keys: tuple, kwargs: dict, diagnostics: bool
) -> Callable[[], torch.Tensor]:
    """``PPOLoss``, ``ClipPPOLoss``, ``KLPENPPOLoss`` or ``A2CLoss`` (``name``, configured by
    ``kwargs``) as CleanRL writes PPO: the policy loss, the critic's smooth L1 and the entropy
    bonus. KLPEN's beta is a Python float updated from ``mean KL`` (one ``.item()``)."""
    actor_net, critic_net = nets["actor_net"], nets["critic_net"]
    obs, action, logp_old = batch["observation"], batch[keys[0]], batch[keys[1]]
    adv, value_target = batch["advantage"].squeeze(-1), batch["value_target"]
    old_loc, old_scale = batch["loc"], batch["scale"]
    clip_epsilon = kwargs.get("clip_epsilon") if name == "ClipPPOLoss" else None
    ent_coef, vf_coef = kwargs["entropy_coeff"], kwargs["critic_coeff"]
    state, logged = {"beta": kwargs.get("beta")}, {}

    def loss() -> torch.Tensor:
        loc, scale = actor_net(obs)
        log_scale = scale.log()
        logp = gaussian_log_prob(action, loc, scale, log_scale)
        entropy = gaussian_entropy(log_scale).mean()
        value = critic_net(obs)
        v_loss = F.smooth_l1_loss(value, value_target)
        if name == "A2CLoss":
            if diagnostics:
                logged["entropy"] = entropy.detach()
            return -(logp * adv).mean() + vf_coef * v_loss - ent_coef * entropy
        log_ratio = logp - logp_old
        ratio = log_ratio.exp()
        pg_loss = -adv * ratio
        if clip_epsilon is not None:
            clipped = -adv * ratio.clamp(1 - clip_epsilon, 1 + clip_epsilon)
            pg_loss = torch.max(pg_loss, clipped)
        if name == "KLPENPPOLoss":
            kl = gaussian_kl(old_loc, old_scale, loc, scale, log_scale)
            pg_loss, beta = pg_loss + state["beta"] * kl, state["beta"]
            mean_kl = kl.detach().mean()
            observed = mean_kl.item()
            if observed > 1.5 * kwargs["dtarg"]:
                state["beta"] *= kwargs["increment"]
            elif observed < kwargs["dtarg"] / 1.5:
                state["beta"] *= kwargs["decrement"]
            if diagnostics:
                logged.update(kl=mean_kl, beta=beta)
        if diagnostics:
            with torch.no_grad():
                logged.update(
                    ppo_diagnostics(log_ratio, ratio, entropy, value, value_target, clip_epsilon)
                )
        return pg_loss.mean() + vf_coef * v_loss - ent_coef * entropy

    return loss


# --------------------------------------------------------------------------- #
# Off-policy, the user's own critic module
# --------------------------------------------------------------------------- #
def set_requires_grad(params: list[torch.Tensor], flag: bool) -> None:
    """Freeze (``False``) or unfreeze the critic's parameters: the actor's loss goes through the
    critic without training it (Spinning Up's idiom)."""
    for p in params:
        p.requires_grad_(flag)


def frozen_call(critic: nn.Module, params: list[torch.Tensor], *inputs: torch.Tensor):
    """``critic(*inputs)`` with ``params`` (the critic's) frozen for the call."""
    set_requires_grad(params, False)
    out = critic(*inputs)
    set_requires_grad(params, True)
    return out


def transitions(batch) -> tuple[torch.Tensor, ...]:
    """``(obs, action, next_obs, reward, terminated)`` of a replay batch."""
    nxt = batch["next"]
    return (
        batch["observation"],
        batch["action"],
        nxt["observation"],
        nxt["reward"],
        nxt["terminated"],
    )


def hand_deterministic_loss(
    name: str, nets: dict, targets: dict, batch, diagnostics: bool
) -> Callable[[], torch.Tensor]:
    """``DDPGLoss`` (online actor for ``a'``, MSE) or ``TD3Loss`` (target actor, smoothed
    ``a'``, clipped double Q, smooth L1: the libraries' defaults) as CleanRL writes them."""
    actor, critics = nets["actor"], nets["critics"]
    target_actor = targets.get("actor", actor)
    target_critics = targets["critics"]
    obs, action, next_obs, reward, terminated = transitions(batch)
    distance = F.mse_loss if name == "DDPGLoss" else F.smooth_l1_loss
    first_params, logged = list(critics[0].parameters()), {}

    def loss() -> torch.Tensor:
        with torch.no_grad():
            next_action = target_actor(next_obs)
            if name == "TD3Loss":
                noise = (torch.randn_like(next_action) * POLICY_NOISE).clamp(
                    -NOISE_CLIP, NOISE_CLIP
                )
                next_action = (next_action + noise).clamp(-1.0, 1.0)
            next_q = target_critics[0](next_obs, next_action)
            for target_critic in target_critics[1:]:
                next_q = torch.min(next_q, target_critic(next_obs, next_action))
            target = reward + GAMMA * ~terminated * next_q
        values = [critic(obs, action) for critic in critics]
        critic_loss = sum(distance(value, target) for value in values)
        q = frozen_call(critics[0], first_params, obs, actor(obs))
        if diagnostics:
            with torch.no_grad():
                logged.update(target_value=target.squeeze(-1))
                if name == "DDPGLoss":
                    pred = values[0].squeeze(-1)
                    logged.update(
                        td_error=(pred - logged["target_value"]).square(),
                        pred_value=pred,
                        pred_value_max=pred.max(),
                        target_value_max=target.max(),
                    )
                else:
                    pred = torch.stack(values).squeeze(-1)
                    logged.update(
                        td_error=(pred - logged["target_value"]).square().amax(0),
                        pred_value=pred,
                        state_action_value_actor=q.detach().T,
                        next_state_value=next_q.squeeze(-1),
                    )
        return -q.mean() + critic_loss

    return loss


def soft_actor_critic_diagnostics(alpha, log_prob, values, target, kind: str) -> dict:
    """What rlloss's SAC-family losses return beside the losses: ``alpha``, ``entropy`` and the
    priority ``td_error``, ``max_i`` over the critics of ``|Q_i - y|`` or ``(Q_i - y)^2``."""
    error = (torch.stack(values) - target).squeeze(-1)
    error = error.abs() if kind == "absolute" else error.square()
    return {"alpha": alpha, "entropy": -log_prob.mean(), "td_error": error.amax(0)}


def hand_sac_loss(nets: dict, targets: dict, batch, diagnostics: bool) -> Callable:
    """SAC v2 as CleanRL writes it (TorchRL's temperature loss on ``log_alpha``), the tanh-Gaussian
    sample and its log-probability by formula (:func:`tanh_normal_sample`)."""
    actor_net, critics, log_alpha = nets["actor_net"], nets["critics"], nets["log_alpha"]
    target_critics = targets["critics"]
    obs, action, next_obs, reward, terminated = transitions(batch)
    params, logged = [p for c in critics for p in c.parameters()], {}

    def loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = tanh_normal_sample(actor_net, next_obs)
            q1, q2 = (critic(next_obs, next_action) for critic in target_critics)
            next_value = torch.min(q1, q2) - alpha * next_log_prob.unsqueeze(-1)
            target = reward + GAMMA * ~terminated * next_value
        values = [critic(obs, action) for critic in critics]
        critic_loss = sum(F.mse_loss(value, target) for value in values)
        pi, log_pi = tanh_normal_sample(actor_net, obs)
        set_requires_grad(params, False)
        q_pi = torch.min(critics[0](obs, pi), critics[1](obs, pi)).squeeze(-1)
        set_requires_grad(params, True)
        actor_loss = (alpha * log_pi - q_pi).mean()
        alpha_loss = -(log_alpha * (log_pi.detach() - ACT_DIM)).mean()
        if diagnostics:
            with torch.no_grad():
                logged.update(
                    soft_actor_critic_diagnostics(alpha, log_pi, values, target, "absolute")
                )
        return actor_loss + critic_loss + alpha_loss

    return loss


def hand_redq_loss(nets: dict, targets: dict, batch, diagnostics: bool, options: dict) -> Callable:
    """REDQ as its authors write it (a loop over the critics): ``options["subset_size"]`` target
    critics drawn per update, the actor against every critic's mean, ``log_alpha`` clamped to
    ``options["log_alpha_bounds"]`` (straight through); ``a~`` and ``a'`` drawn together after
    the subset, as the libraries draw them."""
    actor_net, critics, log_alpha = nets["actor_net"], nets["critics"], nets["log_alpha"]
    target_critics = targets["critics"]
    obs, action, next_obs, reward, terminated = transitions(batch)
    low, high = options["log_alpha_bounds"]
    params, logged = [p for c in critics for p in c.parameters()], {}

    def loss() -> torch.Tensor:
        subset = torch.randperm(len(critics), device=obs.device)[: options["subset_size"]].tolist()
        loc, scale = actor_net(obs)
        with torch.no_grad():
            next_loc, next_scale = actor_net(next_obs)
        params_both = (torch.stack([loc, next_loc]), torch.stack([scale, next_scale]))
        actions, log_probs = tanh_normal_sample(actor_net, obs, params_both)
        alpha = log_alpha.detach().clamp(low, high).exp()
        with torch.no_grad():
            next_q = torch.stack([target_critics[j](next_obs, actions[1]) for j in subset])
            next_value = next_q.min(0).values - alpha * log_probs[1].unsqueeze(-1)
            target = reward + GAMMA * ~terminated * next_value
        values = [critic(obs, action) for critic in critics]
        critic_loss = F.smooth_l1_loss(torch.stack(values), target.expand(len(critics), -1, -1))
        set_requires_grad(params, False)
        q = torch.stack([critic(obs, actions[0]) for critic in critics]).squeeze(-1)
        set_requires_grad(params, True)
        actor_loss = (alpha * log_probs[0] - q).mean()
        clamped = log_alpha - log_alpha.detach() + log_alpha.detach().clamp(low, high)
        alpha_loss = -(clamped.exp() * (log_probs.detach() - ACT_DIM)).mean()
        if diagnostics:
            with torch.no_grad():
                logged.update(
                    soft_actor_critic_diagnostics(alpha, log_probs, values, target, "squared"),
                    state_action_value_actor=q.detach(),
                    action_log_prob_actor=log_probs[0].detach(),
                    next_state_value=next_value.squeeze(-1),
                    target_value=target.squeeze(-1),
                )
        return actor_loss + critic_loss + alpha_loss

    return loss


def hand_tqc_loss(nets: dict, targets: dict, batch, diagnostics: bool, options: dict) -> Callable:
    """TQC as its authors write it: the target critics' atoms pooled and sorted, the top
    ``options["drop"]`` per critic dropped, each critic's quantile Huber loss against the rest;
    the actor against the mixture's mean; SAC's temperature loss."""
    actor_net, critics, log_alpha = nets["actor_net"], nets["critics"], nets["log_alpha"]
    target_critics = targets["critics"]
    obs, action, next_obs, reward, terminated = transitions(batch)
    quantiles = options["quantiles"]
    keep = (quantiles - options["drop"]) * len(critics)
    tau = (torch.arange(quantiles, device=obs.device) + 0.5) / quantiles
    params, logged = [p for c in critics for p in c.parameters()], {}

    def loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = tanh_normal_sample(actor_net, next_obs)
            atoms = torch.cat([c(next_obs, next_action) for c in target_critics], -1)
            next_value = atoms.sort(-1).values[:, :keep] - alpha * next_log_prob.unsqueeze(-1)
            target = reward + GAMMA * ~terminated * next_value  # [B, keep]
        theta = torch.stack([critic(obs, action) for critic in critics])  # [N, B, M]
        delta = target[:, None, :] - theta.unsqueeze(-1)  # [N, B, M, keep]
        magnitude = delta.abs()
        huber = torch.where(magnitude > 1, magnitude - 0.5, 0.5 * delta.square())
        weight = (tau[:, None] - (delta.detach() < 0).to(delta.dtype)).abs()
        critic_loss = (weight * huber).mean((-1, -2)).sum(0).mean()
        pi, log_pi = tanh_normal_sample(actor_net, obs)
        set_requires_grad(params, False)
        q = torch.stack([critic(obs, pi) for critic in critics]).mean((0, -1))
        set_requires_grad(params, True)
        actor_loss = (alpha * log_pi - q).mean()
        alpha_loss = -(log_alpha * (log_pi.detach() - ACT_DIM)).mean()
        if diagnostics:
            with torch.no_grad():
                logged.update(
                    alpha=alpha,
                    entropy=-log_pi.mean(),
                    td_error=magnitude.detach().mean((-1, -2)).amax(0),
                )
        return actor_loss + critic_loss + alpha_loss

    return loss
