"""DreamerV1's losses: parity with TorchRL's classes (values and gradients) on the same small
Gaussian RSSM, actor, critic and imagination environment; keys; bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import MLP

import rlloss
from tests.test_dreamer_v3 import imagination_env as v3_imagination_env
from tests.test_dreamer_v3 import tanh_normal_actor

B, T, STATE, BELIEF, ACTION, PIXELS = 2, 3, 5, 6, 2, (3, 4, 4)


class GaussianHead(nn.Module):
    """A Gaussian's mean and a positive scale from the latent state."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(STATE + BELIEF, 2 * STATE)

    def forward(self, state, belief):
        mean, raw_std = self.linear(torch.cat([state, belief], -1)).chunk(2, -1)
        return mean, nn.functional.softplus(raw_std) + 0.1


class PixelDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(STATE + BELIEF, 3 * 4 * 4)

    def forward(self, state, belief):
        return self.linear(torch.cat([state, belief], -1)).unflatten(-1, PIXELS)


def world_model():
    """TorchRL's layout: WorldModelWrapper(modeler ending in the decoder, reward model)."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import WorldModelWrapper

    latent = ["state", "belief"]
    modeler = TensorDictSequential(
        TensorDictModule(GaussianHead(), latent, [("next", "prior_mean"), ("next", "prior_std")]),
        TensorDictModule(
            GaussianHead(), latent, [("next", "posterior_mean"), ("next", "posterior_std")]
        ),
        TensorDictModule(PixelDecoder(), latent, [("next", "reco_pixels")]),
    )
    reward = TensorDictModule(
        MLP(in_features=STATE + BELIEF, out_features=1, num_cells=[8]),
        latent,
        [("next", "reward")],
    )
    return WorldModelWrapper(modeler, reward)


def sequences(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "state": torch.randn(B, T, STATE, generator=generator),
            "belief": torch.randn(B, T, BELIEF, generator=generator),
            "next": {
                "pixels": torch.rand(B, T, *PIXELS, generator=generator),
                "reward": torch.randn(B, T, 1, generator=generator),
            },
        },
        [B, T],
    )


def gradients(loss, total):
    return torch.autograd.grad(total, [p for p in loss.parameters() if p.requires_grad])


MODEL_SETTINGS = [
    {},
    {"free_nats": 0.0, "lambda_kl": 0.5},
    {"delayed_clamp": True, "free_nats": 0.1, "reco_loss": "smooth_l1"},
    {"global_average": True, "reward_loss": "l1", "free_nats": -1.0},
]


@pytest.mark.parametrize("settings", MODEL_SETTINGS)
def test_model_loss_matches_torchrl(settings):
    model = world_model()
    ours = rlloss.DreamerModelLoss(copy.deepcopy(model), **settings)
    theirs = torchrl_objectives.DreamerModelLoss(copy.deepcopy(model), **settings)
    assert ours.decoder is ours.world_model[0][-1] and ours.reward_model is ours.world_model[1]
    batch = sequences()
    losses, output = ours(batch)
    expected, expected_output = theirs(batch)
    for key in expected.keys():
        assert losses[key].shape == (1,)
        torch.testing.assert_close(losses[key], expected[key])
    assert set(output.keys(True)) == set(expected_output.keys(True))
    total, expected_total = sum(losses.values()).sum(), sum(expected.values()).sum()
    torch.testing.assert_close(gradients(ours, total), gradients(theirs, expected_total))


def test_model_loss_bad_input():
    with pytest.raises(ValueError, match="reco_loss"):
        rlloss.DreamerModelLoss(world_model(), reco_loss="l3")
    with pytest.raises(ValueError, match="lambda_reco"):
        rlloss.DreamerModelLoss(world_model(), lambda_reco=-1.0)
    with pytest.raises(KeyError, match="reward"):
        rlloss.DreamerModelLoss(world_model())(sequences().exclude(("next", "reward")))


# ----------------------------------------------------------------------------- actor, value


def imagination_env():
    """TorchRL's DreamerEnv over a Gaussian RSSM prior (RSSMPrior) and a reward MLP."""
    from torchrl.data import Bounded
    from torchrl.modules import RSSMPrior

    prior = RSSMPrior(
        action_spec=Bounded(-1, 1, (ACTION,)),
        hidden_dim=BELIEF,
        rnn_hidden_dim=BELIEF,
        state_dim=STATE,
        action_dim=ACTION,
    )
    return v3_imagination_env(prior, sizes=(STATE, BELIEF, ACTION))


def value_network():
    return TensorDictModule(
        MLP(in_features=STATE + BELIEF, out_features=1, num_cells=[8]),
        ["state", "belief"],
        ["state_value"],
    )


def actor():
    return tanh_normal_actor(state=STATE, belief=BELIEF, action=ACTION)


def starts(count=4, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "state": torch.randn(count, STATE, generator=generator),
            "belief": torch.randn(count, BELIEF, generator=generator),
        },
        [count],
    )


@pytest.mark.parametrize("discount_loss", [True, False])
@pytest.mark.parametrize("estimator", ["TD0", "TDLambda"])
def test_actor_and_value_losses_match_torchrl(discount_loss, estimator):
    """TorchRL's actor loss has TD(0) targets for every estimator (docs/differences.md): with
    TD(0) both agree; with TD(lambda) rlloss's targets are checked against the V3 actor loss's
    continuation path of TorchRL (the recursion of the paper) run on the same rollout."""
    from torchrl.objectives.utils import ValueEstimators

    networks = (actor(), value_network(), imagination_env())
    kwargs = {"imagination_horizon": 4, "discount_loss": discount_loss}
    ours = rlloss.DreamerActorLoss(*copy.deepcopy(networks), **kwargs)
    theirs = torchrl_objectives.DreamerActorLoss(*copy.deepcopy(networks), **kwargs)
    for loss in (ours, theirs):
        loss.make_value_estimator(getattr(ValueEstimators, estimator), gamma=0.9)
    torch.manual_seed(2)
    losses, imagined = ours(starts())
    torch.manual_seed(2)
    expected, expected_imagined = theirs(starts())
    torch.testing.assert_close(imagined["next", "reward"], expected_imagined["next", "reward"])
    if estimator == "TDLambda":
        reference = torchrl_objectives.DreamerV3ActorLoss(*copy.deepcopy(networks))
        reference.make_value_estimator(ValueEstimators.TDLambda, gamma=0.9)
        value = theirs.value_model(expected_imagined["next"].select("state", "belief").clone())[
            "state_value"
        ]
        ones = torch.ones_like(value)
        target = reference.lambda_target(expected_imagined["next", "reward"], value, ones)
        torch.testing.assert_close(imagined["lambda_target"], target)
        return
    torch.testing.assert_close(losses["loss_actor"], expected["loss_actor"])
    torch.testing.assert_close(imagined["lambda_target"], expected_imagined["lambda_target"])
    grads = torch.autograd.grad(losses["loss_actor"], list(ours.actor_model.parameters()))
    expected_grads = torch.autograd.grad(
        expected["loss_actor"], list(theirs.actor_model.parameters())
    )
    torch.testing.assert_close(grads, expected_grads)
    value_kwargs = {"discount_loss": discount_loss, "gamma": 0.9, "value_loss": "smooth_l1"}
    critic = value_network()
    value_ours = rlloss.DreamerValueLoss(copy.deepcopy(critic), **value_kwargs)
    value_theirs = torchrl_objectives.DreamerValueLoss(copy.deepcopy(critic), **value_kwargs)
    out, _ = value_ours(imagined.detach())
    out_expected, _ = value_theirs(expected_imagined.detach())
    torch.testing.assert_close(out["loss_value"], out_expected["loss_value"])
    torch.testing.assert_close(
        gradients(value_ours, out["loss_value"]),
        gradients(value_theirs, out_expected["loss_value"]),
    )


def test_actor_and_value_bad_input():
    with pytest.raises(TypeError, match="make_value_estimator"):
        rlloss.DreamerActorLoss(actor(), value_network(), imagination_env(), lmbda=0.9)
    with pytest.raises(ValueError, match="value_loss"):
        rlloss.DreamerValueLoss(value_network(), value_loss="huber")
    with pytest.raises(KeyError, match="lambda_target"):
        rlloss.DreamerValueLoss(value_network())(starts())


def test_model_and_value_losses_read_no_tensor_on_the_host():
    from tests.test_contract import HostReads

    model_loss = rlloss.DreamerModelLoss(world_model())
    value_loss = rlloss.DreamerValueLoss(value_network())
    imagined = starts().unsqueeze(-1).expand(4, 3).clone()
    imagined["lambda_target"] = torch.randn(4, 3, 1)
    for loss, batch in ((model_loss, sequences()), (value_loss, imagined)):
        loss(batch)
        with HostReads() as reads:
            losses, _ = loss(batch)
            sum(v.sum() for v in losses.values()).backward()
        assert not reads.seen, type(loss).__name__
