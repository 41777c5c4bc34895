"""ACTLoss: parity with TorchRL's on the same ACT policy and chunks (reductions, KL weights,
batch shapes), the padding mask, and the error for chunks of another length than the
policy's."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.objectives import ACTLoss as TorchRLACTLoss

import rlloss
from tests.parity import assert_same_seeded

OBS, ACT, CHUNK, LATENT = 5, 2, 4, 3


class TinyACT(nn.Module):
    """A CVAE with ACTModel's contract: ``(observation, action_chunk)`` -> ``(action_pred, mu,
    log_var)``, the latent drawn by reparameterisation."""

    def __init__(self, chunk: int = CHUNK) -> None:
        super().__init__()
        self.chunk = chunk
        self.encoder = nn.Linear(OBS + chunk * ACT, 2 * LATENT)
        self.decoder = nn.Linear(OBS + LATENT, chunk * ACT)

    def forward(self, observation, action_chunk):
        flat = action_chunk.flatten(-2)
        mu, log_var = self.encoder(torch.cat([observation, flat], -1)).chunk(2, -1)
        latent = mu + (0.5 * log_var).exp() * torch.randn_like(mu)
        out = self.decoder(torch.cat([observation, latent], -1))
        return out.unflatten(-1, (self.chunk, ACT)), mu, log_var


def policy(chunk: int = CHUNK) -> TensorDictModule:
    return TensorDictModule(
        TinyACT(chunk), ["observation", "action_chunk"], ["action_pred", "mu", "log_var"]
    )


def chunks(batch=(6,)) -> TensorDict:
    data = TensorDict({"observation": torch.randn(*batch, OBS)}, batch)
    data["vla_action", "chunk"] = torch.randn(*batch, CHUNK, ACT)
    return data


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("kl_weight", [0.0, 10.0])
@pytest.mark.parametrize("batch", [(6,), (2, 3)], ids=str)
def test_matches_torchrl(reduction, kl_weight, batch):
    net = policy()
    kwargs = {"reduction": reduction, "kl_weight": kl_weight}
    ours, theirs = rlloss.ACTLoss(net, **kwargs), TorchRLACTLoss(copy.deepcopy(net), **kwargs)
    assert_same_seeded(ours, theirs, chunks(batch))


def test_matches_torchrls_act_model():
    from torchrl.modules.models import ACTModel

    net = TensorDictModule(
        ACTModel(
            obs_dim=OBS,
            action_dim=ACT,
            chunk_size=CHUNK,
            hidden_dim=16,
            nheads=2,
            num_encoder_layers=1,
            num_decoder_layers=1,
            latent_dim=4,
        ),
        ["observation", "action_chunk"],
        ["action_pred", "mu", "log_var"],
    ).eval()  # no dropout: the two calls see the same network
    ours, theirs = rlloss.ACTLoss(net), TorchRLACTLoss(copy.deepcopy(net))
    assert_same_seeded(ours, theirs, chunks())


def test_padded_steps_leave_the_reconstruction():
    """With a padding mask, the reconstruction averages over each chunk's valid steps."""
    loss = rlloss.ACTLoss(policy(), kl_weight=0.0)
    loss.set_keys(pad_mask="action_is_pad")
    batch = chunks()
    pad = torch.zeros(6, CHUNK, dtype=torch.bool)
    pad[:, -1], pad[0, 1:] = True, True
    batch["action_is_pad"] = pad
    torch.manual_seed(0)
    out = loss(batch)
    torch.manual_seed(0)
    prediction = loss.actor_network.module(batch["observation"], batch["vla_action", "chunk"])[0]
    error = (prediction - batch["vla_action", "chunk"]).abs()
    expected = torch.stack(
        [error[i][~pad[i]].mean() for i in range(6)]  # the valid steps of each chunk
    ).mean()
    torch.testing.assert_close(out["loss_reconstruction"], expected)
    torch.testing.assert_close(out["loss_act"], expected)
    assert "action_is_pad" in loss.in_keys


def test_kl_weight_is_a_schedulable_buffer():
    loss = rlloss.ACTLoss(policy())
    buffer = loss.kl_weight
    loss.kl_weight = 2.0
    assert loss.kl_weight is buffer and loss.kl_weight.item() == 2.0
    with pytest.raises(ValueError, match="kl_weight must be in"):
        loss.kl_weight = -1.0


def test_chunks_of_another_length_than_the_policys_raise():
    loss = rlloss.ACTLoss(policy(chunk=CHUNK))
    batch = chunks()
    batch["vla_action", "chunk"] = torch.randn(6, CHUNK, ACT)
    loss.actor_network.module.chunk = CHUNK  # unchanged: fine
    loss(batch)
    short = rlloss.ACTLoss(
        TensorDictModule(
            _Truncating(), ["observation", "action_chunk"], ["action_pred", "mu", "log_var"]
        )
    )
    with pytest.raises(ValueError, match=r"predicts chunks 'action_pred' of shape \(6, 3, 2\)"):
        short(batch)
    bad = chunks()
    bad["action_is_pad"] = torch.zeros(6, CHUNK + 1, dtype=torch.bool)
    loss.set_keys(pad_mask="action_is_pad")
    with pytest.raises(ValueError, match=r"padding mask has shape \(6, 5\)"):
        loss(bad)


class _Truncating(TinyACT):
    """A policy predicting one step fewer than the demonstrated chunks."""

    def forward(self, observation, action_chunk):
        prediction, mu, log_var = super().forward(observation, action_chunk)
        return prediction[..., :-1, :], mu, log_var
