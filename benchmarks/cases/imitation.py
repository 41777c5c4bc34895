"""The imitation and exploration family: BCLoss (a deterministic actor, MSE), DiffusionBCLoss
(TorchRL's ``DiffusionActor``, noise prediction), ACTLoss (a CVAE over action chunks), GAILLoss
(a sigmoid discriminator on expert and policy pairs), DTLoss and OnlineDTLoss (an actor on the
state and its return-to-go; the online one a TanhNormal with a learned temperature) and RNDLoss
(a predictor regressing a frozen random target), with their hand-written plain-torch baselines.

Every network is ``HIDDEN`` relu layers (:func:`benchmarks.cases.common.mlp`); the batch is
``B`` demonstrations (flat, no sequence dim) holding every key any of the losses reads."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
import torchrl.objectives
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import DiffusionActor, ProbabilisticActor, TanhNormal

from benchmarks import harness
from benchmarks.cases.common import (
    ACT_DIM,
    HIDDEN_TEXT,
    OBS_DIM,
    described,
    loss_module_method,
    mlp,
    prefixed,
    rlloss_attr,
)
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (64, 4096)
CHUNK, LATENT = 8, 16  # ACT: actions per chunk, the CVAE's latent dim
DIFFUSION_STEPS = 100  # DDPM's schedule length (TorchRL's default)
RND_FEATURES = 64
TARGET_ENTROPY = -float(ACT_DIM)  # OnlineDTLoss's "auto" for an ACT_DIM-dim action
# Per case: (the loss's keywords, the outputs summed into the total).
SETTINGS: dict[str, tuple[dict, tuple[str, ...]]] = {
    "BCLoss": ({}, ("loss_bc",)),
    "DiffusionBCLoss": ({}, ("loss_diffusion_bc",)),
    "ACTLoss": ({"kl_weight": 10.0}, ("loss_act",)),
    "GAILLoss": ({}, ("loss",)),
    "DTLoss": ({"loss_function": "l2"}, ("loss",)),
    "OnlineDTLoss": (
        {"target_entropy": TARGET_ENTROPY, "samples_mc_entropy": 1},
        ("loss_log_likelihood", "loss_entropy", "loss_alpha"),
    ),
    "RNDLoss": ({"update_fraction": 0.25}, ("loss_predictor",)),
}


class Concat(nn.Module):
    """``net`` on its inputs joined along the last dim (an actor of (s, R), a discriminator of
    (s, a))."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *inputs: torch.Tensor):
        return self.net(torch.cat(inputs, -1))


class CVAE(nn.Module):
    """ACT's contract, ``(observation, action_chunk) -> (action_pred, mu, log_var)``: an encoder
    of the state and the demonstrated chunk to the latent's Gaussian, a latent drawn by
    reparameterisation, a decoder of the state and the latent to the chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = mlp(OBS_DIM + CHUNK * ACT_DIM, 2 * LATENT)
        self.decoder = mlp(OBS_DIM + LATENT, CHUNK * ACT_DIM)

    def forward(self, observation: torch.Tensor, action_chunk: torch.Tensor):
        encoded = self.encoder(torch.cat([observation, action_chunk.flatten(-2)], -1))
        mu, log_var = encoded.chunk(2, -1)
        latent = mu + (0.5 * log_var).exp() * torch.randn_like(mu)
        out = self.decoder(torch.cat([observation, latent], -1))
        return out.unflatten(-1, (CHUNK, ACT_DIM)), mu, log_var


def networks(name: str, seed: int) -> tuple[tuple[nn.Module, ...], dict[str, nn.Module]]:
    """``name``'s networks: the modules its loss takes (positional), and the raw networks by
    name (what the plain step calls and the gate compares)."""
    torch.manual_seed(seed)
    if name == "BCLoss":
        net = mlp(OBS_DIM, ACT_DIM)
        return (TensorDictModule(net, ["observation"], ["action"]),), {"actor": net}
    if name == "DiffusionBCLoss":
        net = mlp(ACT_DIM + OBS_DIM + 1, ACT_DIM)
        actor = DiffusionActor(ACT_DIM, OBS_DIM, score_network=net, num_steps=DIFFUSION_STEPS)
        return (actor,), {"score": net, "ddpm": actor.module}
    if name == "ACTLoss":
        net = CVAE()
        keys = ["observation", "action_chunk"], ["action_pred", "mu", "log_var"]
        return (TensorDictModule(net, *keys),), {"cvae": net}
    if name == "GAILLoss":
        net = Concat(nn.Sequential(mlp(OBS_DIM + ACT_DIM, 1), nn.Sigmoid()))
        return (TensorDictModule(net, ["observation", "action"], ["d_logits"]),), {"disc": net}
    if name == "DTLoss":
        net = Concat(mlp(OBS_DIM + 1, ACT_DIM))
        return (TensorDictModule(net, ["observation", "return_to_go"], ["action"]),), {"actor": net}
    if name == "OnlineDTLoss":
        net = Concat(nn.Sequential(mlp(OBS_DIM + 1, 2 * ACT_DIM), NormalParamExtractor()))
        spec = Bounded(-torch.ones(ACT_DIM), torch.ones(ACT_DIM), (ACT_DIM,))
        module = TensorDictModule(net, ["observation", "return_to_go"], ["loc", "scale"])
        actor = ProbabilisticActor(
            module, ["loc", "scale"], distribution_class=TanhNormal, spec=spec
        )
        return (actor,), {"actor": net}
    predictor, target = mlp(OBS_DIM, RND_FEATURES), mlp(OBS_DIM, RND_FEATURES)  # RNDLoss
    return (predictor, target), {"predictor": predictor, "target": target}


def demonstrations(batch_size: int, seed: int) -> TensorDict:
    """A batch of ``batch_size`` demonstrations with every key the family reads: observation,
    action in (-0.9, 0.9), return-to-go, a chunk of ``CHUNK`` actions, a policy pair for
    GAIL and the next observation; on the harness's device."""
    g = torch.Generator().manual_seed(seed + 1)
    b = batch_size
    return TensorDict(
        {
            "observation": torch.randn(b, OBS_DIM, generator=g),
            "action": torch.rand(b, ACT_DIM, generator=g) * 1.8 - 0.9,
            "return_to_go": torch.randn(b, 1, generator=g),
            "vla_action": {"chunk": torch.randn(b, CHUNK, ACT_DIM, generator=g)},
            "collector_observation": torch.randn(b, OBS_DIM, generator=g) + 0.5,
            "collector_action": torch.rand(b, ACT_DIM, generator=g) * 2.0 - 1.0,
            "next": {"observation": torch.randn(b, OBS_DIM, generator=g)},
        },
        [b],
    ).to(harness.DEVICE)


# --------------------------------------------------------------------------- #
# The plain-torch steps: (raw networks, batch) -> loss(); log_alpha for OnlineDT's temperature
# --------------------------------------------------------------------------- #
def plain_bc(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """Behaviour cloning of a deterministic actor: the squared error to the expert action."""
    obs, action = batch["observation"], batch["action"]
    return lambda: F.mse_loss(nets["actor"](obs), action)


def plain_diffusion_bc(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """DDPM's noise prediction (Ho et al., eq. 14): a step t per sample, the action noised to
    ``sqrt(a_t) a + sqrt(1 - a_t) eps``, the score network's guess of ``eps`` regressed."""
    obs, action = batch["observation"], batch["action"]
    score, alphas_cumprod = nets["score"], nets["ddpm"].alphas_cumprod

    def loss() -> torch.Tensor:
        t = torch.randint(0, DIFFUSION_STEPS, action.shape[:-1], device=action.device)
        alpha_bar = alphas_cumprod[t].unsqueeze(-1)
        noise = torch.randn_like(action)
        noisy = alpha_bar.sqrt() * action + (1.0 - alpha_bar).sqrt() * noise
        prediction = score(torch.cat([noisy, obs, t.to(action.dtype).unsqueeze(-1)], -1))
        return F.mse_loss(prediction, noise)

    return loss


def plain_act(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """ACT: the chunk's L1 reconstruction plus ``kl_weight`` times the CVAE's KL to N(0, I)."""
    obs, chunk = batch["observation"], batch["vla_action", "chunk"]
    kl_weight = SETTINGS["ACTLoss"][0]["kl_weight"]

    def loss() -> torch.Tensor:
        prediction, mu, log_var = nets["cvae"](obs, chunk)
        reconstruction = (prediction - chunk).abs().mean()
        kl = (-0.5 * (1.0 + log_var - mu.square() - log_var.exp())).sum(-1).mean()
        return reconstruction + kl_weight * kl

    return loss


def plain_gail(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """GAIL's discriminator: binary cross-entropy, expert pairs labelled 1, policy pairs 0,
    both halves in one forward."""
    obs = torch.cat([batch["observation"], batch["collector_observation"]])
    action = torch.cat([batch["action"], batch["collector_action"]])
    half = batch.shape[0]

    def loss() -> torch.Tensor:
        expert, policy = nets["disc"](obs, action).split(half)
        return F.binary_cross_entropy(expert, torch.ones_like(expert)) + F.binary_cross_entropy(
            policy, torch.zeros_like(policy)
        )

    return loss


def plain_dt(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """The Decision Transformer's regression of the dataset's action (squared error)."""
    obs, rtg, action = batch["observation"], batch["return_to_go"], batch["action"]
    return lambda: F.mse_loss(nets["actor"](obs, rtg), action)


def plain_online_dt(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """The online Decision Transformer: the action's negative log-likelihood, minus the entropy
    (one reparameterised sample) weighted by the detached temperature, and the temperature's
    loss ``alpha (H - H_target)`` with the entropy detached."""
    obs, rtg, action = batch["observation"], batch["return_to_go"], batch["action"]
    log_alpha = nets["log_alpha"]

    def loss() -> torch.Tensor:
        dist = TanhNormal(*nets["actor"](obs, rtg))
        log_likelihood = dist.log_prob(action)
        entropy = -dist.rsample_and_log_prob((1,))[1].mean(0)
        alpha = log_alpha.exp()
        loss_alpha = alpha * (entropy - TARGET_ENTROPY).detach()
        return (-log_likelihood - alpha.detach() * entropy + loss_alpha).mean()

    return loss


def plain_rnd(nets: dict, batch: TensorDict) -> Callable[[], torch.Tensor]:
    """RND's predictor: ``1/K ||f_hat(s') - f(s')||^2`` averaged over a random quarter of the
    batch (the target without gradient)."""
    obs = batch["next", "observation"]
    fraction = SETTINGS["RNDLoss"][0]["update_fraction"]

    def loss() -> torch.Tensor:
        with torch.no_grad():
            target = nets["target"](obs)
        error = (nets["predictor"](obs) - target).square().mean(-1)
        selected = torch.rand(error.shape, device=error.device) < fraction
        return torch.where(selected, error, 0.0).sum() / selected.sum()

    return loss


PLAIN = {
    "BCLoss": plain_bc,
    "DiffusionBCLoss": plain_diffusion_bc,
    "ACTLoss": plain_act,
    "GAILLoss": plain_gail,
    "DTLoss": plain_dt,
    "OnlineDTLoss": plain_online_dt,
    "RNDLoss": plain_rnd,
}
# the raw networks whose gradients the gate compares (the others: frozen, or inside one of these)
GATED = {"DiffusionBCLoss": ("score",), "RNDLoss": ("predictor",)}


def gated(name: str, raw: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """The parameters of ``name``'s trained networks, named ``<network>.<parameter>``."""
    out = {}
    for key in GATED.get(name, tuple(k for k in raw if k != "log_alpha")):
        out.update(prefixed(key, raw[key]))
    return out


def build(name: str, batch_size: int, seed: int) -> CaseSetup:
    """``name`` of the family at ``batch_size`` demonstrations."""
    modules, raw = networks(name, seed)
    batch = demonstrations(batch_size, seed)
    for module in (*modules, *raw.values()):
        module.to(harness.DEVICE)
    kwargs, loss_keys = SETTINGS[name]

    def library(cls_getter: Callable[[], type]) -> Callable[[TensorDict], Method]:
        def make(batch) -> Method:
            m, r = copy.deepcopy((modules, raw))  # one memo: wrappers and raw nets stay linked
            loss = cls_getter()(*m, **kwargs)
            params = gated(name, r)
            if name == "OnlineDTLoss":
                params["log_alpha"] = loss.log_alpha
            return loss_module_method(loss, batch, params, loss_keys, soft_update=False)

        return make

    def plain(batch) -> Method:
        r = copy.deepcopy(raw)
        if name == "RNDLoss":
            r["target"].requires_grad_(False)
        if name == "OnlineDTLoss":
            r["log_alpha"] = nn.Parameter(torch.zeros((), device=harness.DEVICE))  # alpha_init 1
        params = gated(name, r)
        if name == "OnlineDTLoss":
            params["log_alpha"] = r["log_alpha"]
        return Method(loss=PLAIN[name](r, batch), params=params, trainable=tuple(params.values()))

    return CaseSetup(
        batches={"demonstrations": batch},
        factories={
            "plain": plain,
            "rlloss": library(lambda: rlloss_attr(name)),
            "torchrl": library(lambda: getattr(torchrl.objectives, name)),
        },
        description=f"{described(name, kwargs)}; {NETWORK_TEXT[name]}, {HIDDEN_TEXT} relu",
    )


NETWORK_TEXT = {
    "BCLoss": f"deterministic actor {OBS_DIM}->{ACT_DIM} (MSE to the expert action)",
    "DiffusionBCLoss": f"DiffusionActor, {DIFFUSION_STEPS} steps, score network "
    f"{ACT_DIM}+{OBS_DIM}+1->{ACT_DIM}",
    "ACTLoss": f"CVAE over chunks of {CHUNK}x{ACT_DIM}, latent {LATENT}, MLP encoder and decoder",
    "GAILLoss": f"sigmoid discriminator on (s, a), {OBS_DIM}+{ACT_DIM}->1, no gradient penalty",
    "DTLoss": f"regression actor on (s, return-to-go) {OBS_DIM}+1->{ACT_DIM}",
    "OnlineDTLoss": f"TanhNormal actor on (s, return-to-go) {OBS_DIM}+1->2x{ACT_DIM}, "
    "learned temperature",
    "RNDLoss": f"predictor and frozen target {OBS_DIM}->{RND_FEATURES}",
}
CASES = {name: partial(build, name) for name in SETTINGS}
