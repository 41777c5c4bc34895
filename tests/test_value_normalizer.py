"""ValueNormalizer (skrl's PPO ``value_preprocessor=RunningStandardScaler``): running moments
against numpy over the concatenated data, the standardisation written out, the PPO family with
the critic in normalised units against a hand-written reference (GAE by the naive loop on
de-normalised values), state, eval mode, compilation and bad input."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch._dynamo
from torchrl.objectives.value import GAE as TorchRLGAE

import rlloss
from rlloss import ValueNormalizer
from tests import reference
from tests.nets import make_actor, make_critic, perturbed, rollout

EPS, CLIP = 1e-8, 5.0


def standardized(x: float, mean: float, var: float, clip: float | None = CLIP) -> float:
    """``clip((x - mean) / (sqrt(var) + eps), -c, c)`` (the identity's scale 1 while var = 0)."""
    scale = math.sqrt(var) + EPS if var > 0 else 1.0
    z = (x - mean) / scale
    return z if clip is None else min(max(z, -clip), clip)


def destandardized(z: float, mean: float, var: float, clip: float | None = CLIP) -> float:
    scale = math.sqrt(var) + EPS if var > 0 else 1.0
    z = z if clip is None else min(max(z, -clip), clip)
    return z * scale + mean


def moments(normalizer: ValueNormalizer) -> tuple[float, float, float]:
    return float(normalizer.count), float(normalizer.mean), float(normalizer.var)


# ----------------------------------------------------------------------------- the module
def test_running_moments_equal_numpy_over_the_concatenated_data():
    normalizer = ValueNormalizer()
    seen = []
    for size in (1, 7, 64, 3):
        chunk = 4.0 + 3.0 * torch.randn(size, 1)
        normalizer.update(chunk)
        seen.append(chunk.numpy().ravel())
        data = np.concatenate(seen).astype(np.float64)
        count, mean, var = moments(normalizer)
        assert count == data.size
        np.testing.assert_allclose(mean, data.mean(), rtol=1e-12)
        np.testing.assert_allclose(var, data.var(), rtol=1e-10)


def test_non_finite_and_padded_targets_stay_out_of_the_moments():
    normalizer = ValueNormalizer()
    target = torch.tensor([[1.0], [float("nan")], [3.0], [float("inf")], [100.0]])
    valid = torch.tensor([True, True, True, True, False])
    normalizer.update(target, valid)
    count, mean, var = moments(normalizer)
    assert count == 2 and mean == 2.0 and var == 1.0


def test_standardisation_written_out_and_exact_inverse_within_the_bounds():
    normalizer = ValueNormalizer()
    x = torch.tensor([[-30.0], [-1.0], [0.5], [2.0], [40.0]])
    # nothing seen yet: the identity (then clipped)
    assert torch.equal(normalizer.normalize(torch.tensor([[1.5]])), torch.tensor([[1.5]]))
    normalizer.update(torch.tensor([[1.0], [2.0], [6.0]]))
    count, mean, var = moments(normalizer)
    expected = reference.elementwise(lambda v: standardized(v, mean, var), x)
    torch.testing.assert_close(normalizer.normalize(x), expected.float())
    torch.testing.assert_close(normalizer(x), expected.float())  # forward is normalize
    z = torch.tensor([[-9.0], [-1.0], [0.3], [4.9], [7.0]])
    expected = reference.elementwise(lambda v: destandardized(v, mean, var), z)
    torch.testing.assert_close(normalizer.denormalize(z), expected.float())
    inside = torch.tensor([[-4.0], [0.0], [0.25], [4.5]])
    torch.testing.assert_close(normalizer.normalize(normalizer.denormalize(inside)), inside)
    unclipped = ValueNormalizer(clip_threshold=None)
    unclipped.load_state_dict(normalizer.state_dict())
    expected = reference.elementwise(lambda v: standardized(v, mean, var, None), x)
    torch.testing.assert_close(unclipped.normalize(x), expected.float())


def test_equal_targets_give_a_unit_scale_not_a_division_by_eps():
    normalizer = ValueNormalizer()
    normalizer.update(torch.full((5, 1), 3.0))
    assert float(normalizer.scale) == 1.0
    torch.testing.assert_close(normalizer.normalize(torch.tensor([4.0])), torch.tensor([1.0]))


def test_eval_mode_freezes_the_moments_and_state_dict_round_trips():
    normalizer = ValueNormalizer(eps=1e-6, clip_threshold=3.0)
    normalizer.update(torch.randn(10, 1) * 2 + 1)
    before = {k: v.clone() for k, v in normalizer.state_dict().items()}
    normalizer.eval()
    normalizer.update(torch.randn(10, 1) + 50)
    assert all(torch.equal(before[k], v) for k, v in normalizer.state_dict().items())
    normalizer.train()
    other = ValueNormalizer(eps=1e-6, clip_threshold=3.0)
    other.load_state_dict(normalizer.state_dict())
    assert set(normalizer.state_dict()) == {"count", "mean", "m2"}
    x = torch.randn(6, 1) * 4
    torch.testing.assert_close(other.normalize(x), normalizer.normalize(x))


# ----------------------------------------------------------------------------- PPO family
def sequence_batch(actor, envs=4, steps=8):
    batch = rollout(actor, (envs, steps))
    for key in ("advantage", "value_target", "state_value"):
        del batch[key]
    batch["next", "reward"] = 10.0 + 5.0 * batch["next", "reward"]  # returns far from N(0, 1)
    return batch


def primed(seed_data: torch.Tensor) -> ValueNormalizer:
    normalizer = ValueNormalizer()
    normalizer.update(seed_data)
    return normalizer


def hand_gae_targets(critic, batch, mean, var, gamma=0.99, lmbda=0.95):
    """GAE by the naive loop on the critic's outputs de-normalised by hand; ``(advantage,
    value_target, V)`` as float64 ``[E, T, 1]``."""
    with torch.no_grad():
        v_hat = critic(batch.select("observation").clone())["state_value"]
        next_v_hat = critic(batch["next"].select("observation").clone())["state_value"]
    value = reference.elementwise(lambda z: destandardized(z, mean, var), v_hat)
    next_value = reference.elementwise(lambda z: destandardized(z, mean, var), next_v_hat)

    def one(reward, value, next_value, done, terminated):
        return reference.gae(reward, value, next_value, done, terminated, gamma, lmbda)

    flags = [batch["next", "done"].double(), batch["next", "terminated"].double()]
    advantage = reference.per_sequence(
        one, batch["next", "reward"], value, next_value, *flags, time_dim=-2
    )
    return advantage, advantage + value, value


@pytest.mark.parametrize("name", ["PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "RPOLoss", "A2CLoss"])
def test_ppo_family_critic_learns_normalised_targets_against_a_hand_reference(name):
    actor = make_actor("normal")
    policy, critic = perturbed(actor), make_critic()
    prior_data = 12.0 + 4.0 * torch.randn(20, 1)
    normalizer = primed(prior_data)
    kwargs = {"rpo_alpha": 0.0} if name == "RPOLoss" else {}
    loss = getattr(rlloss, name)(
        policy, critic, value_normalizer=normalizer, loss_critic_type="l2", **kwargs
    )
    plain = getattr(rlloss, name)(
        copy.deepcopy(policy), copy.deepcopy(critic), loss_critic_type="l2", **kwargs
    )
    if name == "KLPENPPOLoss":
        loss.adaptive_beta = plain.adaptive_beta = False
    batch = sequence_batch(actor)
    _, mean, var = moments(normalizer)
    advantage, target, _ = hand_gae_targets(critic, batch, mean, var)

    out = loss(batch)  # no advantage in the batch: GAE runs inside, the moments learn R
    data = np.concatenate([prior_data.numpy().ravel(), target.numpy().ravel()])
    count, new_mean, new_var = moments(normalizer)
    assert count == data.size
    np.testing.assert_allclose([new_mean, new_var], [data.mean(), data.var()], rtol=1e-6)

    v_hat = critic(batch.select("observation").clone())["state_value"]
    normalized_target = reference.elementwise(
        lambda r: standardized(r, new_mean, new_var), target
    ).float()
    expected_critic = ((v_hat - normalized_target) ** 2).mean()
    torch.testing.assert_close(out["loss_critic"], expected_critic, rtol=1e-5, atol=1e-6)
    # the policy sees the advantage of the de-normalised values
    given = batch.clone()
    given["advantage"] = advantage.float()
    given["value_target"] = target.float()
    torch.testing.assert_close(out["loss_objective"], plain(given)["loss_objective"])
    # the critic's gradient is that of the hand-written loss
    grads = torch.autograd.grad(out["loss_critic"], list(loss.critic_network.parameters()))
    hand = torch.autograd.grad(expected_critic, list(critic.parameters()))
    for got, want in zip(grads, hand, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # eval mode: the same loss, no update
    loss.eval()
    frozen = moments(normalizer)
    loss(batch)
    assert moments(normalizer) == frozen


def test_value_clipping_normalises_the_stored_value():
    actor = make_actor("normal")
    normalizer = primed(3.0 + 2.0 * torch.randn(50, 1))
    critic = make_critic()
    loss = rlloss.ClipPPOLoss(
        actor, critic, value_normalizer=normalizer, clip_value=0.1, loss_critic_type="l2"
    )
    batch = rollout(actor)
    batch["state_value"] = 3.0 + 2.0 * torch.randn(32, 1)  # V_old in return units
    batch["value_target"] = 3.0 + 2.0 * torch.randn(32, 1)
    out = loss(batch)  # value_target given: nothing estimated, the moments do not move
    _, mean, var = moments(normalizer)
    v_hat = critic(batch.select("observation").clone())["state_value"]

    def clipped(v, old, r):
        return reference.clipped_value_loss(
            v, standardized(old, mean, var), standardized(r, mean, var), 0.1, "l2"
        )

    expected = reference.elementwise(clipped, v_hat, batch["state_value"], batch["value_target"])
    torch.testing.assert_close(out["loss_critic"], expected.mean().float())


def test_estimators_built_outside_the_loss_share_the_normaliser():
    actor = make_actor("normal")
    critic = make_critic()
    normalizer = primed(7.0 + 3.0 * torch.randn(40, 1))
    gae = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, value_normalizer=normalizer)
    loss = rlloss.ClipPPOLoss(actor, critic, value_normalizer=normalizer)
    loss.make_value_estimator(gae)
    batch = sequence_batch(actor)
    _, mean, var = moments(normalizer)
    advantage, target, value = hand_gae_targets(critic, batch, mean, var, 0.9, 0.8)
    out = loss.value_estimator(batch)  # once per rollout, as a training loop does
    torch.testing.assert_close(out["state_value"], value.float())  # written in return units
    torch.testing.assert_close(out["advantage"], advantage.float())
    torch.testing.assert_close(out["value_target"], target.float())
    assert float(normalizer.count) == 40 + 32
    # the loss builds its own estimator with the normaliser when none is given
    other = rlloss.A2CLoss(actor, critic, value_normalizer=ValueNormalizer())
    assert other.value_estimator.value_normalizer is other.value_normalizer


def test_loss_state_dict_round_trip_carries_the_moments():
    actor = make_actor("normal")
    loss = rlloss.ClipPPOLoss(perturbed(actor), make_critic(), value_normalizer=ValueNormalizer())
    batch = sequence_batch(actor)
    loss(batch)
    state = loss.state_dict()
    assert float(state["value_normalizer.count"]) == 32
    other = rlloss.ClipPPOLoss(perturbed(actor), make_critic(), value_normalizer=ValueNormalizer())
    other.load_state_dict(state)
    assert moments(other.value_normalizer) == moments(loss.value_normalizer)
    loss.eval(), other.eval()
    a, b = loss(batch), other(batch)
    for key in a.keys():
        torch.testing.assert_close(a[key], b[key])


@pytest.mark.slow  # compiled with inductor: tens of seconds with a cold cache
def test_compiled_loss_with_normaliser_matches_eager_and_updates_in_place():
    torch._dynamo.reset()
    actor = make_actor("normal")
    eager = rlloss.ClipPPOLoss(perturbed(actor), make_critic(), value_normalizer=ValueNormalizer())
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True)
    for step in range(3):
        batch = sequence_batch(actor)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            out = compiled(batch)
        ref = eager(batch)
        for key in ref.keys():
            torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5, msg=key)
        assert moments(twin.value_normalizer) == pytest.approx(moments(eager.value_normalizer))
    assert float(twin.value_normalizer.count) == 3 * 32
    torch._dynamo.reset()


def test_bad_normalisers_are_refused_with_clear_errors():
    actor, critic = make_actor("normal"), make_critic()
    with pytest.raises(TypeError, match="value_normalizer must be an rlloss.ValueNormalizer"):
        rlloss.ClipPPOLoss(actor, critic, value_normalizer=rlloss.RewardNormalizer(4))
    with pytest.raises(TypeError, match="value_normalizer must be an rlloss.ValueNormalizer"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, value_normalizer=object())
    with pytest.raises(ValueError, match="needs a critic_network"):
        rlloss.PPOLoss(actor, None, value_normalizer=ValueNormalizer())
    loss = rlloss.ClipPPOLoss(actor, critic, value_normalizer=ValueNormalizer())
    with pytest.raises(ValueError, match="another ValueNormalizer"):
        loss.make_value_estimator(
            rlloss.GAE(
                gamma=0.9, lmbda=0.9, value_network=critic, value_normalizer=ValueNormalizer()
            )
        )
    with pytest.raises(TypeError, match="rlloss's value estimators"):
        loss.make_value_estimator(TorchRLGAE(gamma=0.9, lmbda=0.9, value_network=critic))
    with pytest.raises(ValueError, match="eps"):
        ValueNormalizer(eps=-1.0)
    with pytest.raises(ValueError, match="clip_threshold"):
        ValueNormalizer(clip_threshold=0.0)
