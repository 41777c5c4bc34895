"""SACLoss / DiscreteSACLoss: exact TorchRL parity (values, gradients, td_error), the soft target
against a naive loop, termination vs truncation, n-step, prioritized replay, temperature
handling, updaters and compile."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import distributions as D
from torch import nn
from torchrl.data import Bounded, Composite
from torchrl.modules import (
    MLP,
    IndependentNormal,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import SoftUpdate

from rlloss import DiscreteSACLoss, SACLoss

OBS, ACT, NUM_ACTIONS, B = 5, 2, 4, 16


def actor(distribution=TanhNormal, low=-1.0, high=1.0):
    params = TensorDictModule(
        nn.Sequential(
            MLP(in_features=OBS, out_features=2 * ACT, num_cells=[16]), NormalParamExtractor()
        ),
        ["observation"],
        ["loc", "scale"],
    )
    kwargs = {"low": low, "high": high} if distribution is TanhNormal else {}
    return ProbabilisticActor(
        params,
        in_keys=["loc", "scale"],
        distribution_class=distribution,
        distribution_kwargs=kwargs,
    )


def qvalue():
    return ValueOperator(
        MLP(in_features=OBS + ACT, out_features=1, num_cells=[16]),
        in_keys=["observation", "action"],
    )


def discrete_actor(one_hot):
    return ProbabilisticActor(
        TensorDictModule(
            MLP(in_features=OBS, out_features=NUM_ACTIONS, num_cells=[16]),
            ["observation"],
            ["logits"],
        ),
        in_keys=["logits"],
        distribution_class=OneHotCategorical if one_hot else D.Categorical,
    )


def discrete_qvalue():
    return TensorDictModule(
        MLP(in_features=OBS, out_features=NUM_ACTIONS, num_cells=[16]),
        ["observation"],
        ["action_value"],
    )


def transitions(batch=B, action=None):
    terminated = torch.rand(batch, 1) < 0.3
    truncated = torch.rand(batch, 1) < 0.3
    return TensorDict(
        {
            "observation": torch.randn(batch, OBS),
            "action": torch.rand(batch, ACT) * 2 - 1 if action is None else action,
            "next": {
                "observation": torch.randn(batch, OBS),
                "reward": torch.randn(batch, 1),
                "terminated": terminated,
                "done": terminated | truncated,
            },
        },
        [batch],
    )


def discrete_transitions(one_hot, batch=B):
    index = torch.randint(NUM_ACTIONS, (batch,))
    action = nn.functional.one_hot(index, NUM_ACTIONS) if one_hot else index
    return transitions(batch, action)


def shift_targets(loss, seed=3):
    torch.manual_seed(seed)
    with torch.no_grad():
        params = loss.target_qvalue_network_params.flatten_keys(".")
        for key in sorted(params.keys()):
            params[key].add_(0.1 * torch.randn_like(params[key]))


def loss_pair(loss_class, policy, critics, common, **ours_only):
    """rlloss's ``loss_class`` and TorchRL's class of the same name on copies of the same
    networks (with TorchRL's replay weighting), their target critics moved by the same amount;
    TorchRL's with ``gamma=0.99``, rlloss's default."""
    ours = loss_class(
        copy.deepcopy(policy),
        copy.deepcopy(critics),
        priority_weighting="normalized",
        **ours_only,
        **copy.deepcopy(common),
    )
    theirs_class = getattr(torchrl_objectives, loss_class.__name__)
    theirs = theirs_class(copy.deepcopy(policy), copy.deepcopy(critics), **common)
    theirs.make_value_estimator(gamma=0.99)
    if common.get("delay_qvalue", True):
        shift_targets(ours), shift_targets(theirs)
    return ours, theirs


def run_both(ours, theirs, batch):
    mine, reference = batch.clone(), batch.clone()
    torch.manual_seed(0)
    out_ours = ours(mine)
    torch.manual_seed(0)
    out_theirs = theirs(reference)
    return out_ours, out_theirs, mine, reference


def assert_same_outputs_and_gradients(ours, theirs, batch):
    out_ours, out_theirs, mine, reference = run_both(ours, theirs, batch)
    for key in out_theirs.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    torch.testing.assert_close(mine["td_error"], reference["td_error"])
    assert mine["td_error"].shape == reference["td_error"].shape == batch.batch_size
    for out in (out_ours, out_theirs):  # per-sample losses (reduction="none") summed
        sum(v.sum() for k, v in out.items() if k.startswith("loss_")).backward()
    theirs_q = theirs.qvalue_network_params.flatten_keys(".")
    for key, parameter in ours.qvalue_network_params.flatten_keys(".").items():
        torch.testing.assert_close(parameter.grad, theirs_q[key].grad, msg=key)
    theirs_actor = theirs.actor_network_params.flatten_keys(".")
    for key, parameter in ours.actor_network.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs_actor[key].grad, msg=key)
    if isinstance(theirs.log_alpha, nn.Parameter):
        torch.testing.assert_close(ours.log_alpha.grad, theirs.log_alpha.grad)
    torch.testing.assert_close(ours.log_alpha.detach(), theirs.log_alpha.detach())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha_init": 0.5},
        {"alpha_init": 0.3, "loss_function": "l2", "num": 3, "bounds": (-2.0, 0.5)},
        {"alpha_init": 5.0, "max_alpha": 2.0, "min_alpha": 0.1, "distribution": IndependentNormal},
        {"alpha_init": 0.01, "min_alpha": 0.1, "fixed_alpha": True, "delay_qvalue": False},
        # TorchRL's other keywords: same numbers (with skip_done_states TorchRL draws fewer
        # next actions when some next state is done, so the random streams differ: compared on
        # a batch without done states; test_skip_done_states checks the done case)
        {"skip_done_states": True, "delay_actor": True, "separate_losses": True, "done": False},
        {"deactivate_vmap": True},
        # SAC v1: a state-value network and its target
        {"value_network": True, "alpha_init": 0.5},
        {"value_network": True, "delay_actor": True, "delay_value": False, "num": 3, "b": 6},
    ],
)
def test_sac_matches_torchrl_exactly(kwargs):
    low, high = kwargs.pop("bounds", (-1.0, 1.0))
    policy = actor(kwargs.pop("distribution", TanhNormal), low, high)
    critics = [qvalue() for _ in range(kwargs.pop("num", 2))]
    spec = Bounded(low, high, shape=(ACT,))
    any_done = kwargs.pop("done", True)
    batch_size = kwargs.pop("b", B)
    if kwargs.pop("value_network", False):
        kwargs["value_network"] = ValueOperator(
            MLP(in_features=OBS, out_features=1), in_keys=["observation"]
        )
    common = {"num_qvalue_nets": len(critics), "action_spec": spec, **kwargs}
    ours, theirs = loss_pair(SACLoss, policy, critics, common)
    batch = transitions(batch_size)
    if not any_done:
        batch["next", "done"].fill_(False), batch["next", "terminated"].fill_(False)
    batch["priority_weight"] = torch.rand(batch_size)
    assert_same_outputs_and_gradients(ours, theirs, batch)


def assert_same_terms(ours, theirs, batch, calls):
    """Each ``(method, *args)`` of ``calls`` on both losses in turn (one random stream each,
    from the same seed) gives the same loss and the same metadata."""
    mine, reference = batch.clone(), batch.clone()
    results = []
    for loss, data in ((ours, mine), (theirs, reference)):
        torch.manual_seed(0)
        results.append([getattr(loss, name)(data) for name in calls])
    for name, (loss, info), (ref_loss, ref_info) in zip(calls, *results, strict=True):
        torch.testing.assert_close(loss, ref_loss, msg=name)
        for key, value in ref_info.items():
            torch.testing.assert_close(info[key], value, msg=f"{name}: {key}")
    return results


@pytest.mark.parametrize("version", [1, 2])
def test_sac_torchrl_per_term_methods_match_torchrl(version):
    """TorchRL's public per-term methods (a loop that steps the critics, then the policy and
    the temperature, calls these): same losses, metadata and temperature loss."""
    kwargs = {"num_qvalue_nets": 2, "action_spec": Bounded(-1.0, 1.0, shape=(ACT,))}
    calls = ["qvalue_v2_loss", "actor_loss"]
    if version == 1:  # (TorchRL's qvalue_v2_loss on a v1 loss bootstraps from V: not compared)
        kwargs["value_network"] = ValueOperator(
            MLP(in_features=OBS, out_features=1), in_keys=["observation"]
        )
        calls = ["qvalue_v1_loss", "value_loss", "actor_loss"]
    ours, theirs = loss_pair(SACLoss, actor(), [qvalue(), qvalue()], {**kwargs, "alpha_init": 0.4})
    results = assert_same_terms(ours, theirs, transitions(), calls)
    log_probs = [outputs[-1][1]["log_prob"] for outputs in results]
    assert log_probs[0].shape == (B,) and ours.device == theirs.device == torch.device("cpu")
    torch.testing.assert_close(ours.target_entropy_buffer, theirs.target_entropy_buffer)
    alpha_losses = [loss.alpha_loss(lp) for loss, lp in zip((ours, theirs), log_probs, strict=True)]
    torch.testing.assert_close(*alpha_losses)  # elementwise, [B]: the caller reduces
    alpha_losses[0].mean().backward()
    expected = -(log_probs[0] + ours.target_entropy).mean()
    torch.testing.assert_close(ours.log_alpha.grad, expected)


class NearlySaturated(nn.Module):
    """``loc`` far out (``5 tanh(loc / 5)`` with ``tanh_loc``: within 1e-5 of 5), a small
    ``scale``: a policy whose tanh is nearly saturated."""

    def __init__(self):
        super().__init__()
        self.net = MLP(in_features=OBS, out_features=2 * ACT, num_cells=[16])

    def forward(self, observation):
        loc, scale = self.net(observation).chunk(2, dim=-1)
        return 40.0 + loc, nn.functional.softplus(scale) * 0.1 + 1e-3


def test_a_saturated_policy_is_scored_at_its_latent_draw_as_torchrl_does():
    """A ``TanhNormal`` that rlloss samples through ``torch.distributions`` (``tanh_loc=True``)
    gives TorchRL's log-probs and actor loss: both score the latent draw
    (``rsample_and_log_prob``); scoring the rounded action instead was 1.9e-3 off here."""
    policy = ProbabilisticActor(
        TensorDictModule(NearlySaturated(), ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -1.0, "high": 1.0, "tanh_loc": True},
    )
    ours, theirs = loss_pair(SACLoss, policy, [qvalue(), qvalue()], {"num_qvalue_nets": 2})
    assert type(ours._actor_call).__name__ == "PlannedDistributionCall"
    results = assert_same_terms(ours, theirs, transitions(), ["actor_loss"])
    log_probs = [outputs[0][1]["log_prob"] for outputs in results]
    assert log_probs[0].min() > 10  # nearly saturated: a large log-density
    torch.testing.assert_close(log_probs[0], log_probs[1], rtol=0, atol=1e-6)


def test_sac_v1_methods_on_a_v2_loss_name_what_is_missing():
    loss = SACLoss(actor(), qvalue())
    for method in ("qvalue_v1_loss", "value_loss", "loss_value"):
        with pytest.raises(RuntimeError, match=f"SACLoss.{method} is SAC v1's.*value_network="):
            getattr(loss, method)(transitions())


@pytest.mark.parametrize("one_hot", [True, False])
def test_discrete_sac_torchrl_per_term_methods_match_torchrl(one_hot):
    common = {"num_actions": NUM_ACTIONS, "action_space": "one-hot" if one_hot else "categorical"}
    policy, critics = discrete_actor(one_hot), [discrete_qvalue(), discrete_qvalue()]
    ours = DiscreteSACLoss(copy.deepcopy(policy), copy.deepcopy(critics), **common)
    theirs = torchrl_objectives.DiscreteSACLoss(policy, critics, **common)
    theirs.make_value_estimator(gamma=0.99)
    shift_targets(ours), shift_targets(theirs)
    results = assert_same_terms(
        ours, theirs, discrete_transitions(one_hot), ["qvalue_loss", "actor_loss"]
    )
    log_probs = [outputs[1][1]["log_prob"] for outputs in results]
    torch.testing.assert_close(ours.alpha_loss(log_probs[0]), theirs.alpha_loss(log_probs[1]))
    assert ours.delay_actor is theirs.delay_actor is False


def test_skip_done_states():
    """TorchRL's skip_done_states: at a done next state the next action and its log-prob are
    0, so the target is ``r + gamma (1 - terminated) min_i Q_i,target(s', 0)``."""
    loss = SACLoss(actor(), qvalue(), skip_done_states=True, alpha_init=0.7)
    batch = transitions()
    _, info = loss.loss_qvalue(batch)
    next_obs = batch["next", "observation"]
    zero_q = torch.stack(
        [
            target_network(loss, i)(
                TensorDict(observation=next_obs, action=torch.zeros(B, ACT), batch_size=[B])
            )["state_action_value"]
            for i in range(2)
        ]
    ).min(0)[0]
    reward, terminated = batch["next", "reward"], batch["next", "terminated"].float()
    expected = reward + 0.99 * (1 - terminated) * zero_q
    done = batch["next", "done"].squeeze(-1)
    assert done.any()
    torch.testing.assert_close(info["target_value"].reshape(B, 1)[done], expected[done])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"one_hot": True, "alpha_init": 0.5},
        {"one_hot": False, "alpha_init": 0.2, "loss_function": "l2", "num": 3},
        {"one_hot": True, "alpha_init": 3.0, "max_alpha": 1.5, "target_entropy": 0.7},
        {
            "one_hot": False,
            "fixed_alpha": True,
            "delay_qvalue": False,
            "target_entropy_weight": 0.5,
        },
        {"one_hot": True, "skip_done_states": True, "deactivate_vmap": True},
    ],
)
def test_discrete_sac_matches_torchrl_exactly(kwargs):
    one_hot = kwargs.pop("one_hot")
    policy = discrete_actor(one_hot)
    critics = [discrete_qvalue() for _ in range(kwargs.pop("num", 2))]
    common = {
        "num_qvalue_nets": len(critics),
        "num_actions": NUM_ACTIONS,
        "action_space": "one-hot" if one_hot else "categorical",
        **kwargs,
    }
    ours = DiscreteSACLoss(
        copy.deepcopy(policy), copy.deepcopy(critics), priority_weighting="normalized", **common
    )
    theirs = torchrl_objectives.DiscreteSACLoss(
        copy.deepcopy(policy), copy.deepcopy(critics), **common
    )
    theirs.make_value_estimator(gamma=0.99)
    if common.get("delay_qvalue", True):
        shift_targets(ours), shift_targets(theirs)
    batch = discrete_transitions(one_hot)
    batch["priority_weight"] = torch.rand(B)
    assert_same_outputs_and_gradients(ours, theirs, batch)


def target_network(loss, index):
    critic = qvalue()
    for name, parameter in critic.named_parameters():
        parameter.data.copy_(loss.target_qvalue_network_params.flatten_keys(".")[name][index])
    return critic


def test_soft_target_against_naive_loop_with_n_step_and_truncation():
    policy = actor(TanhNormal, -2.0, 1.0)
    loss = SACLoss(
        policy, [qvalue() for _ in range(3)], num_qvalue_nets=3, alpha_init=0.4, gamma=0.9
    )
    shift_targets(loss)
    batch = transitions()
    batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    torch.manual_seed(7)
    _, info = loss.loss_qvalue(batch)
    torch.manual_seed(7)
    noise = torch.randn(B, ACT)
    critics = [target_network(loss, i) for i in range(3)]
    for b in range(B):
        with torch.no_grad():
            step = batch[b : b + 1]
            params = policy.module[0](step["next"].clone())
            preimage = params["loc"] + params["scale"] * noise[b]
            squashed = D.TransformedDistribution(
                D.Normal(params["loc"], params["scale"]),
                [D.TanhTransform(), D.AffineTransform(-0.5, 1.5)],
            )
            action = -0.5 + 1.5 * torch.tanh(preimage)
            log_prob = squashed.log_prob(action).sum()
            next_step = step["next"].clone().set("action", action)
            q = min(float(c(next_step.clone())["state_action_value"]) for c in critics)
            alive = 0.0 if bool(step["next", "terminated"]) else 1.0  # truncation bootstraps
            n = int(step["steps_to_next_obs"])
            expected = float(step["next", "reward"]) + 0.9**n * alive * (q - 0.4 * float(log_prob))
        assert float(info["target_value"][b]) == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_truncation_bootstraps_and_termination_does_not():
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0)
    batch = transitions()
    batch["next", "terminated"] = torch.zeros(B, 1, dtype=torch.bool)
    batch["next", "done"] = torch.ones(B, 1, dtype=torch.bool)
    torch.manual_seed(1)
    _, truncated = loss.loss_qvalue(batch)
    batch["next", "terminated"] = torch.ones(B, 1, dtype=torch.bool)
    torch.manual_seed(1)
    _, terminated = loss.loss_qvalue(batch)
    torch.testing.assert_close(terminated["target_value"], batch["next", "reward"].squeeze(-1))
    assert not torch.allclose(truncated["target_value"], terminated["target_value"])


def test_discrete_target_is_exact_expectation():
    policy = discrete_actor(one_hot=False)
    loss = DiscreteSACLoss(
        policy, discrete_qvalue(), num_actions=NUM_ACTIONS, alpha_init=0.3, gamma=0.8
    )
    shift_targets(loss)
    batch = discrete_transitions(one_hot=False)
    batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    _, info = loss.loss_qvalue(batch)
    with torch.no_grad():
        probs = policy.module[0](batch["next"].clone())["logits"].softmax(-1)
        values = torch.stack(
            [
                torch.stack([target_q(loss, i)(batch[b]["next"]) for i in range(2)]).min(0).values
                for b in range(B)
            ]
        )
        soft = (probs * (values - 0.3 * probs.log())).sum(-1)
        alive = (~batch["next", "terminated"]).squeeze(-1).float()
        steps = batch["steps_to_next_obs"].squeeze(-1)
        expected = batch["next", "reward"].squeeze(-1) + 0.8**steps * alive * soft
    torch.testing.assert_close(info["target_value"], expected, rtol=1e-5, atol=1e-5)


def target_q(loss, index):
    net = discrete_qvalue().module
    for name, parameter in net.named_parameters():
        parameter.data.copy_(
            loss.target_qvalue_network_params.flatten_keys(".")[f"module.{name}"][index]
        )
    return lambda step: net(step["observation"])


def test_prioritized_weights_and_td_error_shape():
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0, reduction="none")
    batch = transitions()
    torch.manual_seed(0)
    plain = loss(batch)
    assert batch["td_error"].shape == (B,)
    assert (
        plain["loss_qvalue"].shape == plain["loss_actor"].shape == plain["loss_alpha"].shape == (B,)
    )
    weights = torch.rand(B)
    batch["priority_weight"] = weights
    for weighting, expected in (
        ("mean", lambda x: (weights * x).mean()),
        ("normalized", lambda x: (weights * x).sum() / weights.sum()),
    ):
        weighted = SACLoss(actor(), qvalue(), target_entropy=-2.0, priority_weighting=weighting)
        weighted.load_state_dict(loss.state_dict())
        weighted.actor_network.load_state_dict(loss.actor_network.state_dict())
        torch.manual_seed(0)
        out = weighted(batch.clone())
        for key in ("loss_qvalue", "loss_actor", "loss_alpha"):
            torch.testing.assert_close(out[key], expected(plain[key]), msg=key)
    ignoring = SACLoss(actor(), qvalue(), target_entropy=-2.0, use_prioritized_weights=False)
    ignoring.load_state_dict(loss.state_dict())
    ignoring.actor_network.load_state_dict(loss.actor_network.state_dict())
    torch.manual_seed(0)
    torch.testing.assert_close(ignoring(batch.clone())["loss_qvalue"], plain["loss_qvalue"].mean())


def test_alpha_state_fixed_alpha_and_clamping():
    loss = SACLoss(actor(), qvalue(), alpha_init=0.5, target_entropy=-2.0)
    state = loss.state_dict()
    assert "log_alpha" in state and "target_entropy" in state
    assert any(p is loss.log_alpha for p in loss.parameters())
    loss.log_alpha.data.fill_(math.log(0.25))
    other = SACLoss(actor(), qvalue(), target_entropy=-1.0)
    other.load_state_dict(loss.state_dict())
    assert float(other.log_alpha.detach()) == pytest.approx(math.log(0.25))
    assert float(other.target_entropy) == -2.0

    fixed = SACLoss(actor(), qvalue(), alpha_init=0.5, fixed_alpha=True, target_entropy=-2.0)
    assert "log_alpha" in fixed.state_dict()
    assert not any(p is fixed.log_alpha for p in fixed.parameters())
    out = fixed(transitions())
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert fixed.log_alpha.grad is None and not out["loss_alpha"].requires_grad

    clamped = SACLoss(
        actor(), qvalue(), alpha_init=10.0, min_alpha=0.1, max_alpha=2.0, target_entropy=-2.0
    )
    out = clamped(transitions())
    assert float(out["alpha"]) == pytest.approx(2.0)
    assert float(clamped.log_alpha.detach()) == pytest.approx(math.log(2.0))
    clamped.log_alpha.data.fill_(math.log(0.01))
    assert float(clamped(transitions())["alpha"]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="max_alpha"):
        SACLoss(actor(), qvalue(), min_alpha=2.0, max_alpha=1.0)


def test_target_entropy_auto():
    spec = Bounded(-1.0, 1.0, shape=(ACT,))
    assert float(SACLoss(actor(), qvalue(), action_spec=spec).target_entropy) == -ACT
    policy = actor()
    policy.spec = Composite(action=Bounded(-1.0, 1.0, shape=(3,)))
    assert float(SACLoss(policy, qvalue()).target_entropy) == -3.0
    from_batch = SACLoss(actor(), qvalue())
    assert math.isnan(float(from_batch.target_entropy))
    from_batch(transitions())
    assert float(from_batch.target_entropy) == -ACT
    discrete = DiscreteSACLoss(discrete_actor(True), discrete_qvalue(), num_actions=NUM_ACTIONS)
    assert float(discrete.target_entropy) == pytest.approx(math.log(NUM_ACTIONS) * 0.98)
    with pytest.raises(ValueError, match="num_actions"):
        DiscreteSACLoss(discrete_actor(True), discrete_qvalue())


def test_reduction_none_scalar_output_mode():
    batch = transitions()
    for mode, scalars in (("exclude", set()), ("non_tensor", {"alpha", "entropy"})):
        out = SACLoss(actor(), qvalue(), reduction="none", scalar_output_mode=mode)(batch.clone())
        assert out.batch_size == batch.batch_size
        assert set(out.keys()) == {"loss_actor", "loss_qvalue", "loss_alpha", *scalars}
    with pytest.raises(ValueError, match="scalar_output_mode"):
        SACLoss(actor(), qvalue(), scalar_output_mode="all")
    with pytest.raises(RuntimeError, match=r"set_keys\(priority="):
        SACLoss(actor(), qvalue(), priority_key="p")


def test_gamma_from_make_value_estimator():
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0)
    loss.make_value_estimator(torchrl_objectives.ValueEstimators.TD0, gamma=0.5)
    assert loss.gamma == 0.5
    batch = transitions()
    batch["next", "terminated"].fill_(False)
    torch.manual_seed(0)
    _, half = loss.loss_qvalue(batch)
    loss.make_value_estimator(gamma=0.25)
    torch.manual_seed(0)
    _, quarter = loss.loss_qvalue(batch)
    reward = batch["next", "reward"].squeeze(-1)
    torch.testing.assert_close(
        (half["target_value"] - reward) / 2, quarter["target_value"] - reward
    )


def test_updaters_targets_and_gradients():
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0)
    updater = SoftUpdate(loss, tau=0.5)
    parameters = list(loss.parameters())
    targets = list(loss.target_qvalue_network_params.values(True, True))
    assert not {id(t) for t in targets} & {id(p) for p in parameters}
    optimizer = torch.optim.SGD(parameters, lr=0.5)
    out = loss(transitions())
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert all(t.grad is None and not t.requires_grad for t in targets)
    optimizer.step()
    before = loss.target_qvalue_network_params.clone()
    updater.step()
    online = loss.qvalue_network_params
    for key, value in loss.target_qvalue_network_params.items(True, True):
        torch.testing.assert_close(value, 0.5 * before[key] + 0.5 * online[key].detach())


def test_actor_loss_does_not_train_the_critics():
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0)
    actor_loss, _ = loss.loss_actor(transitions())
    actor_loss.backward()
    assert all(p.grad is None for p in loss.qvalue_network_params.values(True, True))
    assert all(p.grad is not None for p in loss.actor_network.parameters())
    loss.zero_grad(set_to_none=True)
    critic_loss, _ = loss.loss_qvalue(transitions())
    critic_loss.backward()
    assert all(p.grad is None for p in loss.actor_network.parameters())


@pytest.mark.parametrize("discrete", [False, True])
def test_compiles_as_one_graph_without_recompiling(discrete):
    torch._dynamo.reset()
    if discrete:
        loss = DiscreteSACLoss(
            discrete_actor(False), discrete_qvalue(), num_actions=NUM_ACTIONS, max_alpha=2.0
        )

        def batch_with_per():
            return discrete_transitions(False).set("priority_weight", torch.rand(B))
    else:
        loss = SACLoss(
            actor(TanhNormal, -2.0, 1.0),
            qvalue(),
            action_spec=Bounded(-2.0, 1.0, shape=(ACT,)),
            max_alpha=2.0,
        )

        def batch_with_per():
            return transitions().set("priority_weight", torch.rand(B))

    SoftUpdate(loss, tau=0.1)
    twin = copy.deepcopy(loss)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    compiled(batch_with_per())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            batch = batch_with_per()
            mine, reference = batch.clone(), batch.clone()
            torch.manual_seed(5)
            out = compiled(mine)
            torch.manual_seed(5)
            expected = loss(reference)
            for key in expected.keys():
                torch.testing.assert_close(out[key], expected[key], msg=key)
            torch.testing.assert_close(mine["td_error"], reference["td_error"])
    torch._dynamo.reset()


def test_finite_with_actions_at_the_bounds():
    loss = SACLoss(actor(), qvalue(), target_entropy=-2.0)
    with torch.no_grad():
        loss.actor_network.module[0].module[0][-1].bias.fill_(40.0)  # tanh saturates at +1
    out = loss(transitions())
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    assert torch.isfinite(total)
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in loss.actor_network.parameters())
