"""ClipPPOLoss / PPOLoss: parity with TorchRL, dual clip, masks, options, errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from torchrl.modules.value_norm import PopArtValueNorm

import rlloss
from rlloss import functional as rlf
from tests.nets import ACTOR_KINDS, make_actor, make_critic, perturbed, rollout


def total(out: TensorDict) -> torch.Tensor:
    return sum(value for key, value in out.items() if key.startswith("loss_"))


def pair(loss_cls, kind="normal", **kwargs):
    """The same (perturbed) networks in an rlloss loss and in TorchRL's loss of the same name,
    and a batch collected with the unperturbed actor."""
    actor, critic = make_actor(kind), make_critic()
    batch = rollout(actor)
    new_actor, new_critic = perturbed(actor), perturbed(critic)
    ours = getattr(rlloss, loss_cls)(copy.deepcopy(new_actor), copy.deepcopy(new_critic), **kwargs)
    theirs = getattr(torchrl_objectives, loss_cls)(
        copy.deepcopy(new_actor), copy.deepcopy(new_critic), **kwargs
    )
    return ours, theirs, batch


def assert_parity(ours, theirs, batch, seed_each=False):
    if seed_each:
        torch.manual_seed(1)
    out_ours = ours(batch.clone())
    if seed_each:
        torch.manual_seed(1)
    out_theirs = theirs(batch.clone())
    compared = 0
    for key in out_ours.keys():
        # the diagnostics keep TorchRL's shapes (explained_variance and ESS: over dim 0 only,
        # one value per time step of a [B, T] batch); KLPEN's kl is a mean (see docs)
        if key in ("explained_variance", "ESS"):
            assert out_ours[key].shape == out_theirs[key].shape, key
        if key in out_theirs.keys() and out_ours[key].numel() == out_theirs[key].numel():
            torch.testing.assert_close(
                out_ours[key].detach().reshape(out_theirs[key].shape),
                out_theirs[key].detach(),
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m, key=key: f"{key}: {m}",
            )
            compared += 1
    assert set(out_theirs.keys()) - set(out_ours.keys()) <= {"composite_entropy"}
    assert compared >= 5
    total(out_ours).backward()
    total(out_theirs).backward()
    for name in ("actor_network", "critic_network"):
        ours_grads = dict(getattr(ours, name).named_parameters())
        theirs_params = getattr(theirs, f"{name}_params").flatten_keys(".")
        assert set(ours_grads) == set(theirs_params.keys())
        for key, parameter in ours_grads.items():
            expected = theirs_params[key].grad
            actual = parameter.grad
            if expected is None:
                assert actual is None or not actual.any(), key
                continue
            torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-6, msg=key)


CLIP_CONFIGS = [
    {},
    {"clip_value": 0.1, "loss_critic_type": "l2"},
    {"normalize_advantage": True, "entropy_coeff": 0.05},
    {"clip_epsilon": (0.1, 0.3), "loss_critic_type": "l1", "critic_coeff": 0.5},
    {"clip_value": True, "normalize_advantage": True, "separate_losses": True},
    {"reduction": "sum"},
]


@pytest.mark.parametrize("kwargs", CLIP_CONFIGS)
def test_clip_ppo_matches_torchrl(kwargs):
    assert_parity(*pair("ClipPPOLoss", **kwargs))


@pytest.mark.parametrize("kind", ACTOR_KINDS)
def test_clip_ppo_matches_torchrl_for_every_actor(kind):
    # TanhNormal has no closed-form entropy: both libraries draw one reparameterised sample, so
    # the same seed gives the same estimate.
    assert_parity(*pair("ClipPPOLoss", kind=kind, clip_value=0.2), seed_each=kind == "tanh_normal")


@pytest.mark.parametrize("kwargs", [{}, {"clip_value": 0.1, "normalize_advantage": True}])
def test_ppo_matches_torchrl(kwargs):
    assert_parity(*pair("PPOLoss", **kwargs))


def test_advantage_estimated_with_gae_when_absent_matches_torchrl():
    ours, theirs, _ = pair("ClipPPOLoss")
    batch = rollout(make_actor(), batch_size=(4, 10))
    del batch["advantage"], batch["value_target"], batch["state_value"]
    for loss in (ours, theirs):
        loss.make_value_estimator(gamma=0.9, lmbda=0.8)
    assert_parity(ours, theirs, batch)
    assert "advantage" not in batch.keys()  # the caller's batch is left alone


def test_reduction_none_gives_per_sample_losses():
    ours, theirs, batch = pair("ClipPPOLoss", reduction="none")
    out_ours, out_theirs = ours(batch), theirs(batch)
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        assert out_ours[key].shape == (32,)
        torch.testing.assert_close(out_ours[key], out_theirs[key])


def test_dual_clip_bounds_negative_advantages():
    actor = make_actor()
    batch = rollout(actor)
    batch["advantage"] = -batch["advantage"].abs()
    batch["action_log_prob"] = batch["action_log_prob"] - 3.0  # ratios of e^3 ~ 20
    loss = rlloss.ClipPPOLoss(actor, make_critic(), dual_clip=3.0, entropy_bonus=False)
    plain = rlloss.ClipPPOLoss(actor, make_critic(), entropy_bonus=False)
    advantage = batch["advantage"]
    assert loss(batch)["loss_objective"].item() == pytest.approx((-3.0 * advantage).mean().item())
    assert plain(batch)["loss_objective"] > loss(batch)["loss_objective"]


def test_mask_reduces_over_valid_steps_only():
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor, batch_size=(3, 8))
    mask = torch.ones(3, 8, 1, dtype=torch.bool)
    mask[0, 5:] = False
    mask[2, 2:] = False
    batch["collector", "mask"] = mask
    loss = rlloss.ClipPPOLoss(perturbed(actor), critic, normalize_advantage=True)
    masked = loss(batch)
    flat = batch[mask.squeeze(-1)]
    del flat["collector"]
    reference = loss(flat)
    for key in (
        "loss_objective",
        "loss_critic",
        "loss_entropy",
        "clip_fraction",
        "kl_approx",
    ):
        torch.testing.assert_close(masked[key], reference[key], msg=key)
    # ESS is one per time step (over dim 0, as TorchRL's), from that step's valid rows
    assert masked["ESS"].shape == (8,)
    for step in (0, 3, 6):
        rows = batch[:, step][mask[:, step, 0]]
        del rows["collector"]
        torch.testing.assert_close(masked["ESS"][step], loss(rows)["ESS"], msg=f"ESS {step}")
    # NaN in padding cannot leak through the selection
    batch["advantage"][~mask] = torch.nan
    assert torch.isfinite(loss(batch)["loss_objective"])


def test_separate_losses_stops_critic_gradient_into_shared_trunk():
    trunk = torch.nn.Linear(5, 16)
    actor, critic = make_actor(), make_critic()
    actor.module[0].module[0][0] = trunk
    critic.module[0] = trunk
    batch = rollout(actor)
    for separate, expect_grad in ((True, False), (False, True)):
        loss = rlloss.ClipPPOLoss(actor, critic, separate_losses=separate, entropy_bonus=False)
        trunk.zero_grad(set_to_none=True)
        loss(batch)["loss_critic"].backward()
        assert (trunk.weight.grad is not None) == expect_grad


def test_loss_critic_touches_only_critic_and_objective_only_actor():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    batch = rollout(make_actor())
    out = loss(batch)
    out["loss_critic"].backward(retain_graph=True)
    assert all(p.grad is None for p in loss.actor_network.parameters())
    assert all(p.grad is not None for p in loss.critic_network.parameters())
    loss.zero_grad(set_to_none=True)
    out["loss_objective"].backward()
    assert all(p.grad is None for p in loss.critic_network.parameters())


def test_two_forwards_give_identical_outputs_and_input_is_untouched():
    loss = rlloss.ClipPPOLoss(perturbed(make_actor()), make_critic())
    batch = rollout(make_actor())
    before = batch.clone()
    first, second = loss(batch), loss(batch)
    for key in first.keys():
        torch.testing.assert_close(first[key], second[key])
    assert set(batch.keys(True, True)) == set(before.keys(True, True))
    assert (batch == before).all()


def test_extreme_inputs_stay_finite():
    actor = make_actor()
    batch = rollout(actor)
    batch["action_log_prob"] = batch["action_log_prob"] + 50 * torch.sign(torch.randn(32))
    batch["advantage"] = 1e6 * torch.randn(32, 1)
    loss = rlloss.ClipPPOLoss(actor, make_critic(), dual_clip=3.0, normalize_advantage=False)
    out = loss(batch)
    total(out).backward()
    assert all(torch.isfinite(value).all() for value in out.values())
    assert all(torch.isfinite(p.grad).all() for p in loss.parameters() if p.grad is not None)


def test_state_dict_round_trip():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic(), clip_epsilon=0.3, entropy_coeff=0.02)
    other = rlloss.ClipPPOLoss(make_actor(), make_critic())
    other.load_state_dict(loss.state_dict())
    batch = rollout(make_actor())
    for key, value in loss(batch).items():
        torch.testing.assert_close(value, other(batch)[key])
    assert float(other.clip_epsilon) == pytest.approx(0.3)
    assert float(other.entropy_coeff) == pytest.approx(0.02)


def test_coefficients_are_buffers_changed_in_place():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    buffer = loss.entropy_coeff
    loss.entropy_coeff = 0.5
    loss.clip_epsilon = 0.1
    assert loss.entropy_coeff is buffer and float(buffer) == 0.5
    assert float(loss.clip_epsilon) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"clip_epsilon": 0.0}, "clip_epsilon must be in (0.0, 1.0)"),
        ({"clip_epsilon": (0.2, -1.0)}, "clip_epsilon[1]"),
        ({"dual_clip": 1.0}, "dual_clip must be in (1.0, inf]"),
        ({"entropy_coeff": -1.0}, "entropy_coeff"),
        ({"loss_critic_type": "huber"}, "loss_critic_type must be one of"),
        ({"reduction": "avg"}, "reduction must be one of"),
        ({"clip_value": -0.1}, "clip_value"),
    ],
)
def test_bad_hyperparameters_raise_value_error(kwargs, message):
    with pytest.raises(ValueError) as error:
        rlloss.ClipPPOLoss(make_actor(), make_critic(), **kwargs)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"advantage_norm": object()}, TypeError, "advantage_norm must be a torchrl"),
        (
            {"advantage_norm": "norm", "normalize_advantage": True},
            ValueError,
            "mutually exclusive",
        ),
        ({"normalize_advantage_exclude_dims": -2}, TypeError, "tuple of ints"),
        ({"max_importance_ratio": 0.0}, ValueError, "max_importance_ratio"),
        ({"delay_actor": True, "functional": False}, ValueError, "requires functional=True"),
    ],
)
def test_new_keywords_refuse_bad_values(kwargs, error, message):
    if kwargs.get("advantage_norm") == "norm":
        kwargs = {**kwargs, "advantage_norm": PopArtValueNorm(shape=1)}
    with pytest.raises(error, match=message):
        rlloss.ClipPPOLoss(make_actor(), make_critic(), **kwargs)


def test_missing_key_error_names_key_and_fix():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    batch = rollout(make_actor())
    del batch["value_target"]
    with pytest.raises(KeyError) as error:
        loss(batch)
    text = error.value.args[0]
    for fragment in ("ClipPPOLoss", "'value_target'", "observation", "loss.set_keys(value_target="):
        assert fragment in text


def test_set_keys_remaps_and_rejects_unknown_names():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    batch = rollout(make_actor())
    expected = loss(batch)
    batch.rename_key_("advantage", ("my", "adv"))
    loss.set_keys(advantage=("my", "adv"))
    torch.testing.assert_close(loss(batch)["loss_objective"], expected["loss_objective"])
    loss.set_keys(advantage=None)
    assert loss.tensor_keys.advantage == "advantage"
    with pytest.raises(ValueError) as error:
        loss.set_keys(advantages="x")
    assert "advantages" in str(error.value) and "value_target" in str(error.value)


def test_shape_mismatch_b_vs_b1_is_refused():
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic())
    batch = rollout(make_actor())
    batch["advantage"] = batch["advantage"].squeeze(-1)
    with pytest.raises(ValueError) as error:
        loss(batch)
    assert "(32, 1)" in str(error.value) and "(32,)" in str(error.value)


def test_clipped_surrogate_is_what_the_loss_reports():
    actor = make_actor()
    batch = rollout(actor)
    new_actor = perturbed(actor, 0.5)
    loss = rlloss.ClipPPOLoss(new_actor, make_critic(), clip_epsilon=0.2, entropy_bonus=False)
    dist = new_actor.get_dist(batch.clone())
    log_ratio = (dist.log_prob(batch["action"]) - batch["action_log_prob"]).unsqueeze(-1)
    ratio = log_ratio.exp()
    expected = -torch.minimum(
        ratio * batch["advantage"], ratio.clamp(0.8, 1.2) * batch["advantage"]
    )
    torch.testing.assert_close(loss(batch)["loss_objective"], expected.mean())
    clipped = ((ratio < 0.8) | (ratio > 1.2)).float().mean()
    torch.testing.assert_close(loss(batch)["clip_fraction"], clipped)
    torch.testing.assert_close(
        loss(batch)["ESS"], ratio.sum() ** 2 / (ratio.square().sum() * 32), rtol=1e-5, atol=1e-6
    )
    assert rlf.kl_k3(log_ratio).min() >= 0


@pytest.mark.parametrize("kwargs", CLIP_CONFIGS + [{"entropy_bonus": False, "critic_coeff": 0.0}])
def test_declared_out_keys_are_the_produced_keys(kwargs):
    loss = rlloss.ClipPPOLoss(make_actor(), make_critic(), **kwargs)
    assert sorted(loss(rollout(make_actor())).keys()) == sorted(loss.out_keys)
    assert "observation" in loss.in_keys and "advantage" in loss.in_keys
    assert "ClipPPOLoss" in repr(loss)


@pytest.mark.parametrize("name", ["ClipPPOLoss", "KLPENPPOLoss", "RPOLoss"])
def test_bf16_autocast_and_tanh_actions_at_the_bounds_stay_finite(name):
    actor = make_actor("tanh_normal")
    batch = rollout(actor)
    batch["action"][:4] = torch.tensor([1.0, -1.0, 1.0])  # exactly on the bounds
    loss = getattr(rlloss, name)(perturbed(actor), make_critic(), entropy_bonus=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss(batch)
    total(out).backward()
    assert all(torch.isfinite(value).all() for value in out.values())
    assert all(torch.isfinite(p.grad).all() for p in loss.parameters() if p.grad is not None)


def test_in_place_clip_changes_reach_the_next_eager_forward():
    actor = make_actor()
    batch = rollout(actor)
    loss = rlloss.ClipPPOLoss(perturbed(actor, 0.3), make_critic())
    wide = loss(batch)["clip_fraction"]
    loss.clip_epsilon.copy_(0.01)  # as a schedule does
    narrow = loss(batch)["clip_fraction"]
    reference = rlloss.ClipPPOLoss(
        copy.deepcopy(loss.actor_network), make_critic(), clip_epsilon=0.01
    )
    torch.testing.assert_close(narrow, reference(batch)["clip_fraction"])
    assert narrow > wide


@pytest.mark.parametrize("change", ["assign", "fill_", "load_state_dict", "replace", "inference"])
def test_every_way_of_changing_the_clip_reaches_the_cached_bounds(change):
    """The log-space clip bounds are kept between forwards while the buffers are unchanged;
    every way of changing them reaches the next forward (asymmetric clip: both buffers)."""
    actor = make_actor()
    batch = rollout(actor)
    loss = rlloss.ClipPPOLoss(perturbed(actor, 0.3), make_critic(), clip_epsilon=(0.2, 0.3))
    loss(batch)  # the bounds of (0.2, 0.3) cached
    if change == "assign":
        loss.clip_epsilon_low, loss.clip_epsilon_high = 0.01, 0.02
    elif change == "fill_":
        loss.clip_epsilon_low.fill_(0.01)
        loss.clip_epsilon_high.fill_(0.02)
    elif change == "load_state_dict":
        source = rlloss.ClipPPOLoss(copy.deepcopy(loss.actor_network), clip_epsilon=(0.01, 0.02))
        state = {k: v for k, v in source.state_dict().items() if "clip_epsilon" in k}
        loss.load_state_dict(state, strict=False)
    elif change == "replace":
        loss.clip_epsilon_low = torch.tensor(0.01)
        loss.clip_epsilon_high = torch.tensor(0.02)
    else:  # buffers made under inference mode keep no version counter: no cache, no error
        with torch.inference_mode():
            low, high = torch.tensor(0.01), torch.tensor(0.02)
        loss.clip_epsilon_low, loss.clip_epsilon_high = low, high
        loss(batch)
    reference = rlloss.ClipPPOLoss(
        copy.deepcopy(loss.actor_network), make_critic(), clip_epsilon=(0.01, 0.02)
    )
    for key in ("loss_objective", "clip_fraction"):
        torch.testing.assert_close(loss(batch)[key], reference(batch)[key])
    assert loss(batch)["clip_fraction"] > 0.5


def test_vf_clip_param_clamps_the_per_element_critic_loss():
    """rl8's ``vf_clip_param``: each element's critic loss is clamped to ``[0, c]`` before the
    mean (elements above ``c`` send no gradient); the objective and entropy are untouched."""
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor, (32,), critic)
    batch["value_target"] = batch["value_target"] * 4.0  # some large errors
    plain = rlloss.ClipPPOLoss(actor, critic, loss_critic_type="l2")
    clamped = rlloss.ClipPPOLoss(actor, critic, loss_critic_type="l2", vf_clip_param=0.5)
    with torch.no_grad():
        value = critic(batch.clone())["state_value"]
    expected = (value - batch["value_target"]).square().clamp(max=0.5).mean()
    out = clamped(batch)
    torch.testing.assert_close(out["loss_critic"], expected)
    torch.testing.assert_close(out["loss_objective"], plain(batch)["loss_objective"])
    assert out["loss_critic"] < plain(batch)["loss_critic"]
    critic.zero_grad()
    out["loss_critic"].backward()
    errors = (value - batch["value_target"]).squeeze(-1)
    inside = errors.square() <= 0.5
    reference = torch.where(inside, 2 * errors, 0.0).mean()  # d loss / d bias of the last layer
    torch.testing.assert_close(critic.module[-1].bias.grad, reference.reshape(1))
    with pytest.raises(ValueError, match="vf_clip_param must be in"):
        rlloss.PPOLoss(actor, critic, vf_clip_param=0.0)
    with pytest.raises(ValueError, match="vf_clip_param must be in"):
        clamped.vf_clip_param = -1.0


@pytest.mark.parametrize("max_importance_ratio", [None, 2.0])
def test_surrogate_hook_receives_the_record_of_its_inputs(max_importance_ratio):
    """A PPO variant overriding ``_surrogate`` gets one ``SurrogateInputs``: the log-ratio to the
    collecting policy, the log-weight (``None`` unless the behaviour ratio is capped), the
    batch's advantage, the mask, the batch and the current policy."""
    from rlloss.onpolicy.ppo import SurrogateInputs

    seen = []

    class Recording(rlloss.PPOLoss):
        def _surrogate(self, inputs):
            seen.append(inputs)
            return super()._surrogate(inputs)

    actor = make_actor()
    batch = rollout(actor)
    new_actor = perturbed(actor, 0.5)
    loss = Recording(new_actor, make_critic(), max_importance_ratio=max_importance_ratio)
    out = loss(batch)
    (inputs,) = seen
    assert isinstance(inputs, SurrogateInputs)
    log_prob = new_actor.get_dist(batch.clone()).log_prob(batch["action"])
    expected = (log_prob - batch["action_log_prob"]).unsqueeze(-1)
    torch.testing.assert_close(inputs.log_ratio, expected)
    torch.testing.assert_close(inputs.advantage, batch["advantage"])
    assert inputs.mask is None and inputs.batch.batch_size == batch.batch_size
    assert isinstance(inputs.distribution, torch.distributions.Distribution)
    if max_importance_ratio is None:
        assert inputs.log_weight is None
        torch.testing.assert_close(inputs.behaviour_log_ratio, expected)
    else:  # the cap lifts the behaviour log-prob: log r + w <= log(cap)
        behaviour = inputs.log_ratio + inputs.log_weight
        torch.testing.assert_close(inputs.behaviour_log_ratio, behaviour)
        assert behaviour.max() <= torch.tensor(2.0).log() + 1e-6
    surrogate = inputs.behaviour_log_ratio.exp() * batch["advantage"]
    torch.testing.assert_close(out["loss_objective"], -surrogate.mean())
