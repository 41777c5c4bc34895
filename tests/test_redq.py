"""REDQLoss: parity with TorchRL's REDQLoss (values, diagnostics, td_error, gradients; seeded
alike, so the critic subset and the actions are TorchRL's draws), the subset target against a
loop over the chosen critics, the subset draw, any ensemble size, replay weights, arguments."""

from __future__ import annotations

import collections

import pytest
import torch
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import ProbabilisticActor, TanhNormal
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import REDQLoss
from tests import test_sac
from tests.test_sac import (
    ACT,
    B,
    actor,
    assert_same_outputs_and_gradients,
    loss_pair,
    qvalue,
    run_both,
)

SPEC = Bounded(-1.0, 1.0, shape=(ACT,))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num": 2, "loss_function": "l2", "reduction": "sum"},
        {"num": 5, "sub_sample_len": 3, "reduction": "none", "alpha_init": 0.5},
        {"num": 1, "fixed_alpha": True, "alpha_init": 0.3},
        # (no steps_to_next_obs: TorchRL's REDQ ignores it, rlloss discounts by gamma^n, see
        # test_target_is_the_minimum_over_the_drawn_critics)
        {"num": 4, "delay_qvalue": False, "target_entropy": -0.5},
        # alpha_init above max_alpha: the clamped value with the identity's gradient
        {"num": 3, "alpha_init": 20.0, "max_alpha": 5.0, "min_alpha": 0.2},
        {"num": 3, "estimator": ValueEstimators.TDLambda, "bounds": (-2.0, 0.5)},
        {"num": 3, "sub_sample_len": 7, "deactivate_vmap": True, "separate_losses": True},
    ],
)
def test_matches_torchrl(kwargs):
    low, high = kwargs.pop("bounds", (-1.0, 1.0))
    critics = [qvalue() for _ in range(kwargs.pop("num", 10))]
    estimator = kwargs.pop("estimator", None)
    batch = test_sac.transitions()
    if estimator is not None:  # lambda-returns over the last batch dim (time)
        batch = batch.reshape(4, 4)
    common = {"num_qvalue_nets": len(critics), "action_spec": Bounded(low, high, (ACT,))}
    common.update(kwargs)
    if common.get("reduction") == "none":
        common["scalar_output_mode"] = "exclude"
    ours, theirs = loss_pair(REDQLoss, actor(low=low, high=high), critics, common)
    if estimator is not None:
        ours.make_value_estimator(estimator, gamma=0.9, lmbda=0.8)
        theirs.make_value_estimator(estimator, gamma=0.9, lmbda=0.8)
    assert ours.sub_sample_len == theirs.sub_sample_len
    if len(critics) > 1:
        assert_same_outputs_and_gradients(ours, theirs, batch)
        return
    # one critic: TorchRL's REDQ then exposes no trainable critic parameters (its
    # qvalue_network_params get no gradient), so only the values are compared
    out_ours, out_theirs, mine, reference = run_both(ours, theirs, batch)
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])


def critic_member(loss, index, target=True):
    """The ``index``-th critic of ``loss`` as a standalone module."""
    critic = qvalue()
    stacked = loss.target_qvalue_network_params if target else loss.qvalue_network_params
    for name, parameter in critic.named_parameters():
        parameter.data.copy_(stacked.flatten_keys(".")[name][index])
    return critic


def test_target_is_the_minimum_over_the_drawn_critics():
    """The subset drawn (read back from the same seed) and the actions fixed: ``y`` against a
    loop over the chosen target critics (arXiv:2101.05982, Algorithm 1), discounted by
    ``gamma^n`` for n-step transitions (TorchRL's REDQ ignores ``steps_to_next_obs``)."""
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=6, sub_sample_len=3, alpha_init=0.4)
    SoftUpdate(loss, eps=0.9)
    test_sac.shift_targets(loss)
    batch = test_sac.transitions()
    batch["steps_to_next_obs"] = torch.randint(1, 3, (B, 1))
    torch.manual_seed(11)
    subset = torch.randperm(6)[:3].tolist()
    drawn = loss._current_and_next_sample(batch)
    torch.manual_seed(11)
    out = loss(batch.clone())
    next_action, next_log_prob = drawn[0][1], drawn[1][1]
    next_step = batch["next"].clone().set("action", next_action)
    with torch.no_grad():
        values = [critic_member(loss, j)(next_step.clone())["state_action_value"] for j in subset]
    for b in range(B):
        soft = min(float(v[b]) for v in values) - 0.4 * float(next_log_prob[b])
        alive = 0.0 if bool(batch["next", "terminated"][b]) else 1.0
        n = int(batch["steps_to_next_obs"][b])
        expected = float(batch["next", "reward"][b]) + 0.99**n * alive * soft
        assert float(out["next.state_value"][b]) == pytest.approx(soft, rel=1e-5, abs=1e-5)
        assert float(out["target_value"][b]) == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_actor_differentiates_the_current_states_only():
    """``a~`` and ``a'`` are one draw from the actor's parameters at ``s`` and ``s'`` stacked
    (the same numbers as the actor called on the stacked inputs), but only the ``s`` half is
    computed with gradient: no loss term differentiates ``a'``, so the actor's backward never
    runs over the next states (it did, doubling the actor's backward)."""
    policy = actor()
    loss = REDQLoss(policy, qvalue(), num_qvalue_nets=3)
    batch = test_sac.transitions()
    torch.manual_seed(5)
    split = loss._current_and_next_sample(batch)
    torch.manual_seed(5)
    stacked = loss._policy_sample(loss._current_and_next_inputs(batch))
    for mine, reference in zip(split, stacked, strict=True):
        torch.testing.assert_close(mine, reference)
    assert split[0][0].requires_grad
    calls = []
    first_layer = next(m for m in policy.modules() if isinstance(m, nn.Linear))
    first_layer.register_forward_hook(
        lambda module, args, output: calls.append((tuple(args[0].shape), output.requires_grad))
    )
    loss(batch)
    assert calls == [((B, test_sac.OBS), True), ((B, test_sac.OBS), False)]


def test_subset_draw_is_uniform_distinct_and_on_device():
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=5, sub_sample_len=2)
    counts = collections.Counter()
    for _ in range(2000):
        subset = loss._target_subset()
        assert subset.shape == (2,) and subset.device == loss.log_alpha.device
        assert subset.dtype == torch.int64 and subset[0] != subset[1]
        counts.update(subset.tolist())
    assert set(counts) == set(range(5))
    assert all(abs(c / 4000 - 0.2) < 0.03 for c in counts.values())


@pytest.mark.parametrize(
    "num, requested, used", [(1, 2, 1), (2, 2, 1), (3, 2, 2), (10, 2, 2), (10, 9, 9), (4, 9, 3)]
)
def test_any_ensemble_size(num, requested, used):
    """TorchRL's rule: at most ``N - 1`` critics in the subset (one when ``N = 1``)."""
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=num, sub_sample_len=requested)
    assert loss.sub_sample_len == used
    batch = test_sac.transitions()
    out = loss(batch)
    assert out["state_action_value_actor"].shape == (num, B)
    assert batch["td_error"].shape == (B,)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert all(p.grad is not None for p in loss.qvalue_network_params.values(True, True))


def test_per_critic_losses_and_reductions():
    """``reduction="none"``: ``[N, B]`` critic and actor losses, ``[2, B]`` temperature loss
    (``s`` and ``s'``); ``"mean"`` and ``"sum"`` reduce over every dim."""
    losses = {
        reduction: REDQLoss(actor(), qvalue(), num_qvalue_nets=4, reduction=reduction)
        for reduction in ("none", "mean", "sum")
    }
    for reduction in ("mean", "sum"):
        losses[reduction].load_state_dict(losses["none"].state_dict())
        losses[reduction].actor_network.load_state_dict(losses["none"].actor_network.state_dict())
    batch = test_sac.transitions()
    outs = {}
    for reduction, loss in losses.items():
        torch.manual_seed(2)
        outs[reduction] = loss(batch.clone())
    for key, shape in (("loss_actor", (4, B)), ("loss_qvalue", (4, B)), ("loss_alpha", (2, B))):
        per_element = outs["none"][key]
        assert per_element.shape == shape
        torch.testing.assert_close(outs["mean"][key], per_element.mean())
        torch.testing.assert_close(outs["sum"][key], per_element.sum())


def test_prioritized_weights_weight_every_loss():
    """Replay weights multiply each transition's losses, for every critic (TorchRL's REDQ
    ignores them: README difference)."""
    plain = REDQLoss(actor(), qvalue(), num_qvalue_nets=3, reduction="none")
    weighted = REDQLoss(actor(), qvalue(), num_qvalue_nets=3)
    weighted.load_state_dict(plain.state_dict())
    weighted.actor_network.load_state_dict(plain.actor_network.state_dict())
    batch = test_sac.transitions()
    weights = torch.rand(B)
    torch.manual_seed(4)
    per_element = plain(batch.clone())
    torch.manual_seed(4)
    out = weighted(batch.clone().set("priority_weight", weights))
    for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
        torch.testing.assert_close(out[key], (weights * per_element[key]).mean(), msg=key)


def test_separate_losses_route_their_gradients():
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=3)
    batch = test_sac.transitions()
    actor_loss, _ = loss.loss_actor(batch)
    actor_loss.backward()
    assert all(p.grad is None for p in loss.qvalue_network_params.values(True, True))
    assert all(p.grad is not None for p in loss.actor_network.parameters())
    loss.zero_grad(set_to_none=True)
    critic_loss, info = loss.loss_qvalue(batch)
    critic_loss.backward()
    assert all(p.grad is None for p in loss.actor_network.parameters())
    assert info["td_error"].shape == (B,) and loss.log_alpha.grad is None


def test_alpha_is_clamped_but_log_alpha_is_not_projected():
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=2, alpha_init=50.0, target_entropy=-1.0)
    out = loss(test_sac.transitions())
    torch.testing.assert_close(out["alpha"], torch.tensor(10.0))
    torch.testing.assert_close(loss.alpha, torch.tensor(10.0))
    out["loss_alpha"].backward()
    assert loss.log_alpha.grad != 0  # the bound does not stop the temperature's gradient
    torch.testing.assert_close(loss.log_alpha.detach().exp(), torch.tensor(50.0))


def test_gsde_keyword_gives_the_actor_zero_noise():
    class NoiseReader(nn.Module):  # a gSDE-style actor head that reads the noise entry
        def forward(self, loc, eps):
            return loc + eps.unsqueeze(-1)

    plain = REDQLoss(actor(), qvalue(), num_qvalue_nets=2)
    gsde = REDQLoss(actor(), qvalue(), num_qvalue_nets=2, gSDE=True)
    gsde.load_state_dict(plain.state_dict())
    gsde.actor_network.load_state_dict(plain.actor_network.state_dict())
    batch = test_sac.transitions()
    stacked = gsde._current_and_next_inputs(batch)
    torch.testing.assert_close(stacked["_eps_gSDE"], torch.zeros(2, B))
    torch.manual_seed(0)
    expected = plain(batch.clone())
    torch.manual_seed(0)
    torch.testing.assert_close(gsde(batch.clone())["loss_qvalue"], expected["loss_qvalue"])
    assert NoiseReader()(torch.zeros(2, 1), stacked["_eps_gSDE"][:, :1]).eq(0).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="sub_sample_len"):
        REDQLoss(actor(), qvalue(), sub_sample_len=0)
    with pytest.raises(ValueError, match="integer"):
        REDQLoss(actor(), qvalue(), sub_sample_len=1.5)
    with pytest.raises(TypeError, match="value_network"):
        REDQLoss(actor(), qvalue(), value_network=qvalue())
    with pytest.raises(NotImplementedError):
        REDQLoss(actor(), qvalue()).make_value_estimator(ValueEstimators.GAE)
    assert REDQLoss(actor(), qvalue(), action_spec=SPEC).target_entropy == -ACT


class TensorDictNetwork(TensorDictModuleBase):
    """A network that reads and writes a TensorDict itself (no plan of tensor steps: it is
    called on a TensorDict of its inputs)."""

    def __init__(self, network):
        super().__init__()
        self.network = network
        self.in_keys, self.out_keys = network.in_keys, network.out_keys

    def forward(self, tensordict):
        return self.network(tensordict)


def test_networks_called_on_tensordicts_give_the_same_numbers():
    """Critics and an actor that rlloss cannot run on plain tensors (their own TensorDict
    forward): the same numbers as the plain networks."""
    critics, policy = [qvalue() for _ in range(3)], actor()
    plain = REDQLoss(policy, critics, num_qvalue_nets=3)
    wrapped_actor = ProbabilisticActor(
        TensorDictNetwork(policy.module[0]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -1.0, "high": 1.0},
    )
    wrapped = REDQLoss(wrapped_actor, [TensorDictNetwork(c) for c in critics], num_qvalue_nets=3)
    batch = test_sac.transitions()
    torch.manual_seed(3)
    expected = plain(batch.clone())
    torch.manual_seed(3)
    out = wrapped(batch.clone())
    for key in expected.keys():
        torch.testing.assert_close(out[key], expected[key], msg=key)


@pytest.mark.parametrize("bounds", [(-1.0, 1.0), (-2.0, 0.5)])
def test_fast_and_generic_paths_give_the_same_losses(bounds):
    """A TanhNormal actor sampled from its ``loc``/``scale`` (``a~`` and ``a'`` from parameters
    stacked) or through its distribution (one call on the stacked inputs): the same values and
    gradients under the same seed (up to float32 rounding: see
    tests/test_cql.py::test_fast_and_generic_paths_give_the_same_bounds_and_losses)."""
    from tests.test_cql import same_actor_generic_path

    fast = REDQLoss(actor(low=bounds[0], high=bounds[1]), qvalue(), num_qvalue_nets=3)
    generic = REDQLoss(same_actor_generic_path(fast.actor_network), qvalue(), num_qvalue_nets=3)
    generic.load_state_dict(fast.state_dict())
    assert fast._actor_call.squashes and not generic._actor_call.squashes
    batch = test_sac.transitions()
    outputs = []
    for loss in (fast, generic):
        torch.manual_seed(2)
        out = loss(batch.clone())
        (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
        outputs.append(out)
    for key in outputs[0].keys():
        torch.testing.assert_close(outputs[1][key], outputs[0][key], rtol=1e-4, atol=1e-4)
    grads = [loss.actor_network_params.flatten_keys(".") for loss in (fast, generic)]
    for key in grads[0].keys():
        torch.testing.assert_close(
            grads[1][key].grad, grads[0][key].grad, rtol=1e-4, atol=1e-4, msg=key
        )
