"""A hand-written DreamerV3 update in plain torch: the networks of
:func:`benchmarks.dreamer_v3_update.networks` called as plain ``nn.Module`` s on tensors, and the
maths of ``DreamerV3Loss`` with its defaults written out (no rlloss, no TensorDict):

- world model: the RSSM recurrence over the real sequence (prior logits and belief from the
  prior network, posterior logits from the posterior network, a straight-through categorical
  draw), the symlog squared reconstruction error, the two-hot reward cross-entropy and the
  balanced KL with free bits (alpha 0.8, 1 nat per categorical);
- the decoded rewards and values from the networks' own two-hot heads (TorchRL's
  ``SymExpTwoHot``), where the update needs a decoded value;
- actor: ``H`` imagined steps from every posterior state (the prior and reward head held out),
  a TanhNormal draw, the lambda-returns (no continuation model), the ``gamma^t`` step weights,
  the 5th-95th percentile return scale with its moving average, and the entropy bonus from
  ``-log pi`` of a fresh draw on the detached states;
- critic: the two-hot cross-entropy to the returns plus the slow critic's regularisation,
  weighted by the step weights, and the replay critic on the posterior features (discount
  ``1 - 1/333``, lambda 0.95, bootstrapped by the first imagined return), weight 0.3.

The benchmark's figure of merit: rlloss's update against this one, eager and compiled.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

GAMMA, LMBDA, ENTROPY_BONUS, ALPHA, FREE_BITS = 0.997, 0.95, 3e-4, 0.8, 1.0
REPLAY_WEIGHT, REPLAY_GAMMA, REPLAY_LMBDA, SLOW_BETA, RATE = 0.3, 1 - 1 / 333, 0.95, 1.0, 0.01


def symlog(x):
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x):
    return torch.sign(x) * torch.expm1(x.abs())


def bins(count: int) -> torch.Tensor:
    """The symexp support over [-20, 20], antisymmetric (as TorchRL's and rlloss's)."""
    negative = symexp(torch.linspace(-20.0, 0.0, count // 2 + 1))
    return torch.cat((negative, -negative[:-1].flip(0)))


def two_hot_ce(logits, target, support):
    """``-sum_k twohot(target)_k log softmax(logits)_k``, target ``[*B]``."""
    target = target.detach().clamp(support[0], support[-1])
    low = (torch.searchsorted(support, target.contiguous(), right=True) - 1).clamp(
        0, len(support) - 2
    )
    weight = ((target - support[low]) / (support[low + 1] - support[low])).unsqueeze(-1)
    log_probs = torch.log_softmax(logits, -1)
    at_low = log_probs.gather(-1, low.unsqueeze(-1))
    at_high = log_probs.gather(-1, (low + 1).unsqueeze(-1))
    return -((1 - weight) * at_low + weight * at_high).squeeze(-1)


def straight_through(logits):
    """A one-hot draw of each categorical with the softmax's gradient, flattened."""
    probs = torch.softmax(logits, -1)
    uniform = torch.rand(probs.shape[:-1], device=probs.device).unsqueeze(-1)
    index = (uniform > probs.cumsum(-1)).sum(-1, keepdim=True).clamp_max(probs.shape[-1] - 1)
    one_hot = torch.zeros_like(probs).scatter_(-1, index, 1.0)
    sample = probs + (one_hot - probs).detach()
    return sample.flatten(-2)


def balanced_kl(posterior, prior):
    log_q, log_p = torch.log_softmax(posterior, -1), torch.log_softmax(prior, -1)
    dynamics = (log_q.detach().exp() * (log_q.detach() - log_p)).sum(-1)
    representation = (log_q.exp() * (log_q - log_p.detach())).sum(-1)
    return ALPHA * dynamics.clamp_min(FREE_BITS) + (1 - ALPHA) * representation.clamp_min(FREE_BITS)


def tanh_normal_draw(loc, scale):
    """A reparameterised TanhNormal action and its log-probability (summed over the action)."""
    pre = loc + scale * torch.randn_like(loc)
    log_prob = -(((pre - loc) / scale) ** 2) / 2 - scale.log() - math.log(math.sqrt(2 * math.pi))
    log_det = 2 * (math.log(2) - pre - F.softplus(-2 * pre))
    return torch.tanh(pre), (log_prob - log_det).sum(-1)


def lambda_returns(reward, next_value):
    """``R_t = r_t + gamma ((1 - lmbda) v_{t+1} + lmbda R_{t+1})``, ``R_H = v_H``; ``[N, H]``."""
    following, returns = next_value[:, -1], []
    for t in reversed(range(reward.shape[1])):
        following = reward[:, t] + GAMMA * ((1 - LMBDA) * next_value[:, t] + LMBDA * following)
        returns.append(following)
    return torch.stack(returns[::-1], 1)


def held_out(module, *args):
    """``module(*args)`` with its parameters detached (no gradient reaches them; the inputs keep
    theirs), as TorchRL's ``hold_out_net``; traceable by ``torch.compile``."""
    detached = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, detached, args)


class PlainDreamerV3(torch.nn.Module):
    """The hand-written update's losses on ``(observation, action, is_init, reward, done)``."""

    def __init__(self, nets, horizon: int, num_bins: int) -> None:
        super().__init__()
        world_model, _, actor, value = copy.deepcopy(nets)
        encoder, rollout, decoder, reward = world_model.module[:4]
        self.encoder, self.decoder, self.reward_net = encoder.module, decoder.module, reward.module
        self.prior, self.posterior = rollout.rssm_prior.module, rollout.rssm_posterior.module
        self.actor_net, self.extractor = actor.module[0].module, actor.module[1].module
        self.value_net, self.value_decode = value.module[0].module, value.module[1].module
        self.reward_decode = world_model.module[4].module  # TorchRL's SymExpTwoHot heads
        self.slow_value = copy.deepcopy(self.value_net).requires_grad_(False)
        self.horizon = horizon
        self.register_buffer("support", bins(num_bins))
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))
        self.register_buffer("levels", torch.tensor([0.05, 0.95]))  # no host copy in a CUDA graph

    def world_model(self, observation, action, is_init):
        """Prior and posterior logits ``[B, T, C, K]``, posterior states and beliefs ``[B, T, *]``."""
        embedding = self.encoder(observation)
        batch, steps = action.shape[:2]
        state = observation.new_zeros(batch, self.prior.num_categoricals * self.prior.num_classes)
        belief = observation.new_zeros(batch, self.prior.rnn_hidden_dim)
        outputs = [], [], [], []  # prior and posterior logits, states, beliefs
        for t in range(steps):
            reset = is_init[:, t]
            state, belief = torch.where(reset, 0, state), torch.where(reset, 0, belief)
            prior, belief = self.prior._belief_and_logits(
                state, belief, torch.where(reset, 0, action[:, t])
            )
            posterior = self.posterior._logits(belief, embedding[:, t])
            state = straight_through(posterior)
            for store, value in zip(outputs, (prior, posterior, state, belief), strict=True):
                store.append(value)
        return [torch.stack(x, 1) for x in outputs]

    def model_losses(self, observation, true_reward, prior, posterior, state, belief):
        reco = (symlog(observation) - symlog(self.decoder(state, belief))).square().sum(-1).mean()
        reward = two_hot_ce(
            self.reward_net(state, belief), true_reward.squeeze(-1), self.support
        ).mean()
        return reco, reward, balanced_kl(posterior, prior).mean()

    def imagine(self, state, belief):
        """States, beliefs ``[N, H, *]``, rewards and next values ``[N, H]``."""
        states, beliefs, rewards = [], [], []
        for _ in range(self.horizon):
            states.append(state), beliefs.append(belief)
            loc, scale = self.extractor(self.actor_net(state, belief))
            action, _ = tanh_normal_draw(loc, scale)
            _, state, belief = held_out(self.prior, state, belief, action)  # with its draw
            rewards.append(self.reward_decode(held_out(self.reward_net, state, belief)).squeeze(-1))
        states.append(state), beliefs.append(belief)
        states, beliefs = torch.stack(states, 1), torch.stack(beliefs, 1)
        logits = held_out(self.value_net, states[:, 1:], beliefs[:, 1:])
        next_value = self.value_decode(logits).squeeze(-1)
        return states[:, :-1], beliefs[:, :-1], torch.stack(rewards, 1), next_value

    def actor_loss(self, state, belief, returns, weights):
        with torch.no_grad():
            ordered = returns.reshape(-1).sort().values
            position = (ordered.numel() - 1) * self.levels
            low, frac = position.floor().long(), position - position.floor()
            quantiles = torch.lerp(
                ordered[low], ordered[(low + 1).clamp_max(ordered.numel() - 1)], frac
            )
            self.low.lerp_(quantiles[0], RATE), self.high.lerp_(quantiles[1], RATE)
        scale_ = (self.high - self.low).clamp_min(1.0)
        loc, scale = self.extractor(self.actor_net(state.detach(), belief.detach()))
        entropy = -tanh_normal_draw(loc, scale)[1]
        return -(weights * returns / scale_).mean() - ENTROPY_BONUS * (weights * entropy).mean()

    def critic_loss(self, state, belief, target, weights):
        logits = self.value_net(state, belief)
        with torch.no_grad():
            slow = self.value_decode(self.slow_value(state, belief)).squeeze(-1)
        loss = two_hot_ce(logits, target, self.support) + SLOW_BETA * two_hot_ce(
            logits, slow, self.support
        )
        return logits, (weights * loss).mean()

    def replay_targets(self, reward, bootstrap, done):
        """TD(lambda) targets of the real sequence from step 1 on, ``[B, T - 1]``."""
        with torch.no_grad():
            keep = (~done).float()
            following, targets = bootstrap[:, -1], []
            for t in reversed(range(1, reward.shape[1])):
                mix = (1 - REPLAY_LMBDA) * bootstrap[:, t] + REPLAY_LMBDA * following
                following = reward[:, t] + REPLAY_GAMMA * keep[:, t] * mix
                targets.append(following)
            return torch.stack(targets[::-1], 1)

    def forward(self, observation, action, is_init, reward, done):
        prior, posterior, state, belief = self.world_model(observation, action, is_init)
        reco, reward_loss, kl = self.model_losses(
            observation, reward, prior, posterior, state, belief
        )
        batch, steps = action.shape[:2]
        start_state, start_belief = state.detach().flatten(0, 1), belief.detach().flatten(0, 1)
        states, beliefs, rewards, next_value = self.imagine(start_state, start_belief)
        returns = lambda_returns(rewards, next_value)
        weights = GAMMA ** torch.arange(
            self.horizon, dtype=returns.dtype, device=returns.device
        ).expand_as(returns)
        actor = self.actor_loss(states, beliefs, returns, weights)
        _, value = self.critic_loss(states.detach(), beliefs.detach(), returns.detach(), weights)
        bootstrap = returns[:, 0].detach().reshape(batch, steps)
        done = done.reshape(batch, steps)
        target = self.replay_targets(reward.reshape(batch, steps), bootstrap, done)
        _, replay = self.critic_loss(state[:, :-1], belief[:, :-1], target, (~done[:, :-1]).float())
        return reco + reward_loss + kl + actor + value + REPLAY_WEIGHT * replay
