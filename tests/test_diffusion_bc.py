"""DiffusionBCLoss: parity with TorchRL's on the same DiffusionActor, demonstrations and seed
(every reduction, several batch layouts), the actor's schedule against the paper's, the
objective against one written out by hand, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import DiffusionActor
from torchrl.objectives import DiffusionBCLoss as TorchRLDiffusionBCLoss

import rlloss
from rlloss import functional as rlf
from tests.parity import assert_same_seeded

OBS, ACT, STEPS = 4, 2, 10


def actor() -> DiffusionActor:
    return DiffusionActor(action_dim=ACT, obs_dim=OBS, num_steps=STEPS)


def demonstrations(batch=(8,)) -> TensorDict:
    return TensorDict(
        {"observation": torch.randn(*batch, OBS), "action": torch.randn(*batch, ACT)}, batch
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("batch", [(8,), (2, 3), ()], ids=str)
def test_matches_torchrl(reduction, batch):
    net = actor()
    ours = rlloss.DiffusionBCLoss(net, reduction=reduction)
    theirs = TorchRLDiffusionBCLoss(copy.deepcopy(net), reduction=reduction)
    assert_same_seeded(ours, theirs, demonstrations(batch))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_matches_torchrl_in_other_dtypes(dtype):
    """A double-precision actor and batch, and a bfloat16 one (noised in float32, as TorchRL's
    DDPM does, then cast back)."""
    net = actor().to(dtype)
    ours, theirs = rlloss.DiffusionBCLoss(net), TorchRLDiffusionBCLoss(copy.deepcopy(net))
    assert_same_seeded(ours, theirs, demonstrations((8,)).to(dtype))


def test_the_actors_schedule_is_ddpms_linear_schedule():
    betas, alpha_bars = rlf.linear_beta_schedule(STEPS)
    torch.testing.assert_close(actor().module.betas, betas)
    torch.testing.assert_close(actor().module.alphas_cumprod, alpha_bars)


def test_the_loss_is_the_noise_prediction_error_at_the_drawn_steps():
    """The draws, in TorchRL's order (t, then eps), and the objective written out."""
    net, batch = actor(), demonstrations()
    torch.manual_seed(5)
    loss = rlloss.DiffusionBCLoss(net, reduction="none")(batch)["loss_diffusion_bc"]
    torch.manual_seed(5)
    step = torch.randint(0, STEPS, (8,))
    noise = torch.randn(8, ACT)
    alpha_bar = net.module.alphas_cumprod[step].unsqueeze(-1)
    noisy = alpha_bar.sqrt() * batch["action"] + (1 - alpha_bar).sqrt() * noise
    inputs = torch.cat([noisy, batch["observation"], step.float().unsqueeze(-1)], -1)
    expected = (net.module.score_network(inputs) - noise) ** 2
    torch.testing.assert_close(loss, expected)


def test_padding_is_left_out():
    loss = rlloss.DiffusionBCLoss(actor())
    batch = demonstrations((2, 4))
    batch["collector", "mask"] = torch.tensor([[True] * 4, [True, True, False, False]])
    torch.manual_seed(0)
    masked = loss(batch)["loss_diffusion_bc"]
    batch["action"][1, 2:] = 1e4
    torch.manual_seed(0)
    torch.testing.assert_close(loss(batch)["loss_diffusion_bc"], masked)


def test_an_actor_without_a_ddpm_module_raises():
    plain = TensorDictModule(nn.Linear(OBS, ACT), ["observation"], ["action"])
    with pytest.raises(TypeError, match=r"DDPM module holding \['score_network'"):
        rlloss.DiffusionBCLoss(plain)
    with pytest.raises(KeyError, match="observation"):
        rlloss.DiffusionBCLoss(actor())(demonstrations().exclude("observation"))
