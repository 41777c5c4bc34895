"""KLPENPPOLoss and RPOLoss: TorchRL parity, the adaptive-beta fixes, RPO's noise, and the
contract every PPO-family loss shares (masks, compile, state)."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import rlloss
from rlloss import functional as rlf
from tests.nets import make_actor, make_critic, perturbed, rollout
from tests.test_ppo import assert_parity, pair

PPO_FAMILY = {
    "PPOLoss": {},
    "ClipPPOLoss": {"dual_clip": 3.0},
    "KLPENPPOLoss": {"dtarg": 0.01},
    "RPOLoss": {"rpo_alpha": 0.5},
}


# ------------------------------------------------------------------------------- KLPEN
@pytest.mark.parametrize("kind, scale", [("normal", 0.1), ("normal", 0.001), ("categorical", 0.5)])
def test_klpen_matches_torchrl_values_and_beta(kind, scale):
    actor, critic = make_actor(kind), make_critic()
    batch = rollout(actor)
    new_actor = perturbed(actor, scale)
    ours = rlloss.KLPENPPOLoss(copy.deepcopy(new_actor), copy.deepcopy(critic), beta=0.7)
    theirs = torchrl_objectives.KLPENPPOLoss(
        copy.deepcopy(new_actor), copy.deepcopy(critic), beta=0.7
    )
    out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    for key in ("loss_objective", "loss_critic", "loss_entropy", "entropy", "kl_approx"):
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(out_ours["kl"], out_theirs["kl"].mean())
    assert float(out_ours["beta"]) == pytest.approx(0.7)  # the beta this loss used
    torch.testing.assert_close(ours.beta, theirs.beta)  # the beta after one forward
    assert float(ours.beta) != pytest.approx(0.7)  # it did adapt (up for 0.1/0.5, down for 0.001)


def test_klpen_gradient_is_the_gradient_of_the_reported_loss():
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor)
    new_actor = perturbed(actor, 0.3)  # large KL: beta doubles during the forward
    adaptive = rlloss.KLPENPPOLoss(copy.deepcopy(new_actor), copy.deepcopy(critic), beta=1.0)
    frozen = rlloss.KLPENPPOLoss(
        copy.deepcopy(new_actor), copy.deepcopy(critic), beta=1.0, adaptive_beta=False
    )
    theirs = torchrl_objectives.KLPENPPOLoss(
        copy.deepcopy(new_actor), copy.deepcopy(critic), beta=1.0
    )
    out_adaptive, out_frozen, out_theirs = adaptive(batch), frozen(batch), theirs(batch)
    assert float(adaptive.beta) == 2.0 and float(frozen.beta) == 1.0
    torch.testing.assert_close(out_adaptive["loss_objective"], out_frozen["loss_objective"])
    for out in (out_adaptive, out_frozen, out_theirs):
        out["loss_objective"].backward()
    for (name, ours), theirs_grad in zip(
        adaptive.actor_network.named_parameters(),
        theirs.actor_network_params.flatten_keys(".").values(),
        strict=True,
    ):
        torch.testing.assert_close(
            ours.grad, dict(frozen.actor_network.named_parameters())[name].grad
        )
        # TorchRL's backward sees the doubled beta: its gradient is not that of its loss value
        assert not torch.allclose(ours.grad, theirs_grad.grad, rtol=1e-3, atol=1e-6)


def test_klpen_beta_adapts_only_in_training_with_grad():
    actor = make_actor()
    batch = rollout(actor)
    loss = rlloss.KLPENPPOLoss(perturbed(actor, 0.3), make_critic())
    loss.eval()
    loss(batch)
    with torch.no_grad():
        loss.train()
        loss(batch)
    assert float(loss.beta) == 1.0
    loss(batch)
    assert float(loss.beta) == 2.0


def test_klpen_manual_update_bounds_and_strict_inequalities():
    loss = rlloss.KLPENPPOLoss(
        make_actor(), make_critic(), dtarg=0.01, adaptive_beta=False, beta_min=0.3, beta_max=3.0
    )
    loss(rollout(make_actor()))
    assert float(loss.beta) == 1.0  # adaptive_beta=False: forward leaves beta alone
    assert float(loss.update_beta(0.015)) == 1.0  # exactly 1.5 dtarg: no change
    assert float(loss.update_beta(0.0151)) == 2.0
    assert float(loss.update_beta(torch.tensor([0.02]))) == 3.0  # clamped at beta_max
    assert float(loss.update_beta(0.01 / 1.5)) == 3.0  # exactly dtarg / 1.5: no change
    for expected in (1.5, 0.75, 0.375, 0.3, 0.3):
        assert float(loss.update_beta(0.0)) == pytest.approx(expected)


def test_klpen_adaptation_follows_hyperparameters_changed_after_construction():
    """The adaptation's constants are kept between forwards as tensors beside beta; assigning
    dtarg, increment or decrement later, moving beta to another dtype, or making beta a
    parameter reaches the next update."""
    loss = rlloss.KLPENPPOLoss(make_actor(), make_critic(), dtarg=0.01, adaptive_beta=False)
    assert float(loss.update_beta(0.02)) == 2.0  # 0.02 > 1.5 * 0.01
    loss.dtarg, loss.increment = 0.1, 3.0
    assert float(loss.update_beta(0.1)) == 2.0  # 0.1 / 1.5 <= 0.1 <= 0.15: unchanged
    assert float(loss.update_beta(0.2)) == 6.0
    loss.decrement = 0.25
    assert float(loss.update_beta(0.01)) == 1.5
    loss.double()
    assert loss.update_beta(0.01).dtype == torch.float64 and float(loss.beta) == 0.375
    loss.increment = torch.tensor(4.0, dtype=torch.float64)  # a tensor: used as given
    assert float(loss.update_beta(0.2)) == 1.5
    actor = make_actor()
    learned = rlloss.KLPENPPOLoss(perturbed(actor, 0.3), make_critic())
    learned.beta = torch.nn.Parameter(torch.tensor(1.0))
    learned(rollout(actor))  # adapts without a graph, in place of the parameter
    assert float(learned.beta) == 2.0 and learned.beta.grad_fn is None


def test_klpen_with_zero_beta_is_the_plain_surrogate():
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor)
    new_actor = perturbed(actor)
    klpen = rlloss.KLPENPPOLoss(new_actor, critic, beta=0.0)
    plain = rlloss.PPOLoss(new_actor, critic)
    torch.testing.assert_close(klpen(batch)["loss_objective"], plain(batch)["loss_objective"])


def test_klpen_monte_carlo_kl_for_tanh_normal_matches_base_kl():
    """KL is invariant under the tanh bijection: the MC estimate over many draws approaches the
    analytic KL of the base Gaussians."""
    actor = make_actor("tanh_normal")
    batch = rollout(actor)
    new_actor = perturbed(actor, 0.2)
    loss = rlloss.KLPENPPOLoss(new_actor, make_critic(), samples_mc_kl=4000, adaptive_beta=False)
    loc, scale = new_actor.module[0](batch.clone()).select("loc", "scale").values()
    base = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)
    stored = torch.distributions.Independent(
        torch.distributions.Normal(batch["loc"], batch["scale"]), 1
    )
    expected = torch.distributions.kl_divergence(stored, base).mean()
    assert loss(batch)["kl"].item() == pytest.approx(expected.item(), rel=0.1)


def test_klpen_state_dict_and_missing_parameters():
    loss = rlloss.KLPENPPOLoss(make_actor(), make_critic(), adaptive_beta=False)
    loss.update_beta(1.0)
    other = rlloss.KLPENPPOLoss(make_actor(), make_critic())
    other.load_state_dict(loss.state_dict())
    assert float(other.beta) == 2.0
    batch = rollout(make_actor())
    del batch["loc"]
    with pytest.raises(KeyError, match="distribution parameters"):
        loss(batch)


# ------------------------------------------------------------------------------- RPO
@pytest.mark.parametrize("kind", ["normal", "tanh_normal"])
def test_rpo_with_zero_alpha_is_clip_ppo(kind):
    actor, critic = make_actor(kind), make_critic()
    batch = rollout(actor)
    new_actor = perturbed(actor)
    rpo = rlloss.RPOLoss(new_actor, critic, rpo_alpha=0.0, entropy_bonus=kind == "normal")
    clip = rlloss.ClipPPOLoss(new_actor, critic, entropy_bonus=kind == "normal")
    out_rpo, out_clip = rpo(batch), clip(batch)
    assert set(out_rpo.keys()) == set(out_clip.keys())
    for key in out_clip.keys():
        torch.testing.assert_close(out_rpo[key], out_clip[key], msg=key)


def test_rpo_noise_reaches_the_new_log_prob_only():
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor)
    new_actor = perturbed(actor)
    rpo = rlloss.RPOLoss(new_actor, critic, rpo_alpha=0.5)
    clip = rlloss.ClipPPOLoss(new_actor, critic)
    torch.manual_seed(3)
    out = rpo(batch)
    torch.manual_seed(3)
    loc, scale = new_actor.module[0](batch.clone()).select("loc", "scale").values()
    noisy = torch.distributions.Independent(
        torch.distributions.Normal(loc + (2 * torch.rand_like(loc) - 1) * 0.5, scale), 1
    )
    log_ratio = (noisy.log_prob(batch["action"]) - batch["action_log_prob"]).unsqueeze(-1)
    low, high = rlf.clip_bounds(0.2, 0.2)
    expected = -rlf.clipped_surrogate(log_ratio, batch["advantage"], low, high).mean()
    torch.testing.assert_close(out["loss_objective"], expected)
    reference = clip(batch)
    torch.testing.assert_close(out["loss_critic"], reference["loss_critic"])
    assert not torch.allclose(out["loss_objective"], reference["loss_objective"])
    assert not torch.allclose(rpo(batch)["loss_objective"], out["loss_objective"])  # fresh noise
    assert "rpo_alpha" not in batch.keys() and torch.equal(batch["loc"], rollout_loc(batch))


def rollout_loc(batch):
    return batch["loc"]


def test_rpo_perturbation_bounds():
    loc = torch.zeros(200_000)
    noisy = rlf.rpo_perturbation(loc, 0.3)
    assert noisy.abs().max() <= 0.3
    assert noisy.min() < -0.29 and noisy.max() > 0.29
    assert abs(float(noisy.mean())) < 0.005
    assert float(noisy.var()) == pytest.approx(0.3**2 / 3, rel=0.02)  # Var U(-a, a) = a^2 / 3


def test_rpo_noise_in_actor_writes_alpha_into_the_batch():
    seen = {}

    def params(observation, rpo_alpha):
        seen["rpo_alpha"] = rpo_alpha
        return observation[..., :3], torch.ones_like(observation[..., :3])

    actor = make_actor()
    custom = copy.deepcopy(actor)
    custom.module[0] = TensorDictModule(params, ["observation", "rpo_alpha"], ["loc", "scale"])
    loss = rlloss.RPOLoss(custom, make_critic(), rpo_alpha=0.25, noise_in_actor=True)
    batch = rollout(actor)
    loss(batch)
    assert seen["rpo_alpha"].shape == (32, 1) and bool((seen["rpo_alpha"] == 0.25).all())
    assert "rpo_alpha" not in batch.keys()


def test_rpo_refuses_actors_without_loc():
    with pytest.raises(TypeError, match="noise_in_actor=True"):
        rlloss.RPOLoss(make_actor("categorical"), make_critic())


# ------------------------------------------------------------------------------- family
@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("PPOLoss", {}),
        # beta held fixed (factors of 1): TorchRL's backward then sees the beta of its loss too
        ("KLPENPPOLoss", {"increment": 1.0, "decrement": 1.0, "beta": 0.5}),
    ],
)
def test_torchrl_parity_of_family_members(name, kwargs):
    assert_parity(*pair(name, normalize_advantage=True, clip_value=0.2, **kwargs))


@pytest.mark.parametrize("name", list(PPO_FAMILY))
def test_padded_sequence_batch_equals_flattened_valid_steps(name):
    actor = make_actor()
    batch = rollout(actor, batch_size=(3, 8))
    mask = torch.ones(3, 8, 1, dtype=torch.bool)
    mask[0, 5:] = False
    mask[2, 2:] = False
    batch["collector", "mask"] = mask
    kwargs = {**PPO_FAMILY[name], "normalize_advantage": True}
    if name == "KLPENPPOLoss":
        kwargs["adaptive_beta"] = False
    loss = getattr(rlloss, name)(perturbed(actor), make_critic(), **kwargs)
    flat = batch[mask.squeeze(-1)]
    del flat["collector"]
    torch.manual_seed(5)
    masked = loss(batch)
    torch.manual_seed(5)
    reference = loss(flat)
    keys = ["loss_objective", "loss_critic", "loss_entropy", "kl_approx", "kl_k3"]
    for key in keys if name != "RPOLoss" else ["loss_critic", "loss_entropy"]:
        torch.testing.assert_close(masked[key], reference[key], msg=key)
    loss.set_keys(mask="valid")
    batch.rename_key_(("collector", "mask"), "valid")
    torch.testing.assert_close(loss(batch)["loss_critic"], reference["loss_critic"])


def test_klpen_compiled_adapts_beta_like_eager_without_recompiling():
    torch._dynamo.reset()
    actor = make_actor()
    eager = rlloss.KLPENPPOLoss(perturbed(actor, 0.05), make_critic())
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    batches = [rollout(actor) for _ in range(4)]
    compiled(batches[0]), eager(batches[0])
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step, batch in enumerate(batches[1:]):
            for loss in (eager, twin):
                loss.beta = 0.5 * (step + 1)  # in place: no recompilation
            out_compiled, out_eager = compiled(batch), eager(batch)
            assert float(out_compiled["beta"]) == 0.5 * (step + 1)
            torch.testing.assert_close(out_compiled["loss_objective"], out_eager["loss_objective"])
            torch.testing.assert_close(twin.beta, eager.beta)
            assert float(twin.beta) != 0.5 * (step + 1)  # it adapted inside the compiled graph
    torch._dynamo.reset()


def test_family_outputs_are_tensordicts_of_scalars():
    out = rlloss.KLPENPPOLoss(make_actor(), make_critic())(rollout(make_actor()))
    assert isinstance(out, TensorDict)
    # explained_variance keeps TorchRL's shape: over dim 0, [1] for [B, 1] values
    assert {k: v.shape for k, v in out.items() if v.shape != ()} == {"explained_variance": (1,)}


ON_POLICY = {**PPO_FAMILY, "A2CLoss": {}, "ReinforceLoss": {}}
DIAGNOSTICS = {
    "kl_approx",
    "kl_k3",
    "clip_fraction",
    "ESS",
    "max_ratio",
    "mean_ratio",
    "entropy",
    "explained_variance",
    "value_clip_fraction",
}


@pytest.mark.parametrize("name", list(ON_POLICY))
def test_diagnostics_off_gives_the_same_losses_and_gradients_without_diagnostics(name):
    actor = make_actor()
    batch = rollout(actor)
    kwargs = {**ON_POLICY[name], "clip_value": 0.2}
    if name == "KLPENPPOLoss":
        kwargs["adaptive_beta"] = False
    new_actor, critic = perturbed(actor), make_critic()
    full = getattr(rlloss, name)(copy.deepcopy(new_actor), copy.deepcopy(critic), **kwargs)
    bare = getattr(rlloss, name)(new_actor, critic, diagnostics=False, **kwargs)
    torch.manual_seed(3)
    out_full = full(batch)
    torch.manual_seed(3)
    out_bare = bare(batch)
    losses = sorted(k for k in out_full.keys() if k.startswith("loss_"))
    assert losses and losses == sorted(k for k in out_bare.keys() if k.startswith("loss_"))
    reported = set(out_full.keys()) & DIAGNOSTICS
    assert reported and not set(out_bare.keys()) & DIAGNOSTICS  # something was dropped
    assert set(out_bare.keys()) == set(bare.out_keys) and set(out_full.keys()) == set(full.out_keys)
    if name == "KLPENPPOLoss":  # what the loss needs itself stays
        assert {"kl", "beta"} <= set(out_bare.keys())
    for key in losses:
        torch.testing.assert_close(out_bare[key], out_full[key], msg=key)
    sum(out_full[k] for k in losses).backward()
    sum(out_bare[k] for k in losses).backward()
    for (n, p_full), p_bare in zip(full.named_parameters(), bare.parameters(), strict=True):
        if p_full.grad is not None:
            torch.testing.assert_close(p_bare.grad, p_full.grad, msg=n)
