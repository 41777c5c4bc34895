"""Bad inputs on the surface added since the first catalogue (issue 39's list): each behaviour a
careful user hit, now a clear error naming the entry, shape or value and the fix, or a
documented guard."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import MLP, DistributionalQValueActor

import rlloss
from rlloss.data import PrioritizedSampler
from tests import nets, test_dqn, test_iql, test_sac, test_td3

MASK = ("collector", "mask")


# ----------------------------------------------------------------------------- compile_update
def test_compile_update_refuses_an_optimizer_over_the_users_critic_instead_of_the_losss():
    """The loss stacks its own copy of the Q networks: an optimizer over the user's Q module
    (and the actor) would leave that copy untrained, silently."""
    actor, qvalue = test_sac.actor(), test_sac.qvalue()
    loss = rlloss.SACLoss(actor, qvalue)
    wrong = torch.optim.Adam([*actor.parameters(), *qvalue.parameters()], lr=1e-3)
    with pytest.raises(ValueError, match=r"not the loss module's parameters.*qvalue_network"):
        rlloss.compile_update(loss, wrong, compile=False)
    # the loss's own parameters, all or those of one term, are accepted
    rlloss.compile_update(loss, torch.optim.Adam(loss.parameters()), compile=False)
    actor_only = torch.optim.Adam(loss.actor_network_params.values(True, True))
    rlloss.compile_update(loss, actor_only, compile=False, loss_keys=["loss_actor"])


# ----------------------------------------------------------------------------- C51
def test_distributional_dqn_names_atoms_and_support_when_they_differ():
    net = MLP(in_features=test_sac.OBS, out_features=(9, test_sac.NUM_ACTIONS), num_cells=[8])
    actor = DistributionalQValueActor(
        net,
        in_keys=["observation"],
        support=torch.linspace(-1.0, 1.0, 11),
        action_space="categorical",
    )
    loss = rlloss.DistributionalDQNLoss(actor)
    batch = test_sac.discrete_transitions(False, 6)
    with pytest.raises(ValueError, match=r"gives 9 atoms per action.*support has 11"):
        loss(batch)


# ----------------------------------------------------------------------------- PrioritizedSampler
def _buffer(**sampler_kwargs):
    sampler = PrioritizedSampler(32, **{"alpha": 0.6, "beta": 0.4, **sampler_kwargs})
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(32), sampler=sampler, batch_size=4)
    buffer.extend(TensorDict({"x": torch.arange(8.0)}, [8]))
    return buffer


def test_priority_of_an_unwritten_item_is_refused():
    """Index 20 of a 32-slot buffer holding 8 items: refused at once, not at every later sample."""
    buffer = _buffer()
    with pytest.raises(RuntimeError, match=r"index is >= 8, the number of items the storage"):
        buffer.update_priority(torch.tensor([20]), torch.tensor([1.0]))
    assert buffer.sample()["x"].shape == (4,)  # the buffer still samples
    buffer.update_priority(torch.tensor([7]), torch.tensor([2.0]))  # a written item: accepted


def test_a_zero_priority_with_eps_zero_leaves_the_weights_of_the_others_positive():
    """With ``eps=0`` an item of priority 0 is never drawn; it must not set the smallest
    probability the weights divide by (every weight would be 0)."""
    buffer = _buffer(alpha=1.0, beta=1.0, eps=0.0)
    priorities = torch.arange(8.0)  # item 0: priority 0
    buffer.update_priority(torch.arange(8), priorities)
    torch.manual_seed(0)
    sample = buffer.sample(64)
    assert (sample["x"] != 0).all()  # never drawn
    expected = 1.0 / priorities[sample["x"].long()]  # (p_i / p_min)^-1, p_min = 1
    torch.testing.assert_close(sample["priority_weight"], expected.to(torch.float32))


# ----------------------------------------------------------------------------- padded diagnostics
def _padded(batch: TensorDict, valid: torch.Tensor) -> TensorDict:
    padded = batch.clone()
    padded.set(MASK, valid)
    return padded


def test_discrete_cql_diagnostics_are_over_valid_steps_only():
    torch.manual_seed(0)
    loss = rlloss.DiscreteCQLLoss(test_dqn.q_actor("categorical"))
    batch = test_dqn.transitions("categorical", 12)
    valid = torch.arange(12) % 3 != 0
    padded = loss(_padded(batch, valid))
    alone = loss(batch[valid])
    for key in ("td_error", "pred_value", "target_value", "loss_qvalue", "loss_cql"):
        torch.testing.assert_close(padded[key], alone[key])


def test_iql_entropy_is_over_valid_steps_only():
    torch.manual_seed(0)
    loss = rlloss.IQLLoss(test_sac.actor(), test_sac.qvalue(), test_iql.value_network())
    batch = test_sac.transitions(12)
    valid = torch.arange(12) >= 4
    torch.testing.assert_close(
        loss(_padded(batch, valid))["entropy"], loss(batch[valid])["entropy"]
    )


# ----------------------------------------------------------------------------- TD3+BC
def test_td3_bc_with_a_zero_initialised_critic_is_finite():
    """``lambda = alpha / mean|Q|`` with every Q = 0: floored, so the first step gives the
    behaviour-cloning loss and finite gradients (TorchRL and the paper's code: NaN)."""
    qvalue = test_td3.qvalue()
    last = [m for m in qvalue.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
    loss = rlloss.TD3BCLoss(test_td3.actor(), qvalue, bounds=(-1.0, 1.0))
    out = loss(test_td3.transitions())
    assert torch.isfinite(out["loss_actor"]) and torch.isfinite(out["lmbd"])
    torch.testing.assert_close(out["loss_actor"], out["bc_loss"])
    out["loss_actor"].backward()
    assert all(torch.isfinite(p.grad).all() for p in loss.parameters() if p.grad is not None)


# ----------------------------------------------------------------------------- schedules
def test_kl_adaptive_lr_refuses_a_backend_name_as_process_group():
    optimizer = torch.optim.Adam(nets.make_critic().parameters(), lr=1e-3)
    with pytest.raises(TypeError, match=r"process_group must be a torch.distributed process"):
        rlloss.KLAdaptiveLR(optimizer, process_group="gloo")


@pytest.mark.parametrize(
    "build",
    [
        lambda group: rlloss.KLEarlyStopping(0.01, process_group=group),
        lambda group: rlloss.RewardNormalizer(4, process_group=group),
        lambda group: rlloss.ValueNormalizer(process_group=group),
        lambda group: rlloss.ClipPPOLoss(
            nets.make_actor(), nets.make_critic(), process_group=group
        ),
    ],
    ids=["KLEarlyStopping", "RewardNormalizer", "ValueNormalizer", "ClipPPOLoss"],
)
def test_every_process_group_keyword_refuses_a_backend_name(build):
    with pytest.raises(TypeError, match=r"got 'gloo'.*init_process_group"):
        build("gloo")


@pytest.mark.parametrize("step", [float("nan"), float("inf"), torch.tensor(float("nan"))])
def test_piecewise_schedule_refuses_a_non_finite_step(step):
    schedule = rlloss.PiecewiseSchedule([(0, 3e-4), (1000, 0.0)])
    with pytest.raises(ValueError, match=r"step must be a finite number"):
        schedule(step)


# ----------------------------------------------------------------------------- add-ons
@pytest.mark.parametrize("stochastic", [True, False], ids=["stochastic-prior", "deterministic"])
def test_attraction_kl_names_a_prior_of_another_action_size(stochastic):
    """A prior over 3 action dims for a policy over 2: the add-on names both shapes."""
    if stochastic:
        loss = rlloss.SACLoss(
            test_sac.actor(),
            test_sac.qvalue(),
            policy_loss_addons=[rlloss.AttractionKL(_gaussian_actor(3))],
        )
        batch = test_sac.transitions()
    else:
        prior = test_td3.actor()
        prior.module[0][-1] = torch.nn.Linear(16, 3)  # 3 action dims
        loss = rlloss.TD3Loss(
            test_td3.actor(),
            test_td3.qvalue(),
            bounds=(-1.0, 1.0),
            policy_loss_addons=[rlloss.AttractionKL(prior)],
        )
        batch = test_td3.transitions()
    with pytest.raises(
        ValueError, match=r"AttractionKL: the prior's actions have shape \[\d+, 3\]"
    ):
        loss(batch)


def _gaussian_actor(action_size: int):
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torchrl.modules import ProbabilisticActor, TanhNormal

    net = torch.nn.Sequential(
        MLP(in_features=test_sac.OBS, out_features=2 * action_size, num_cells=[8]),
        NormalParamExtractor(),
    )
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module, in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True
    )


def test_attraction_kl_samples_are_checked_on_assignment_as_at_construction():
    from tests.test_bad_inputs import assert_assignment_refused

    with pytest.raises(ValueError, match=r"samples must be in \[1, inf\]"):
        rlloss.AttractionKL(_gaussian_actor(2), samples=0)
    addon = rlloss.AttractionKL(_gaussian_actor(2), samples=2)
    assert_assignment_refused(addon, "samples", 0)
    assert_assignment_refused(addon, "samples", 1.5)
    addon.samples = 4
    assert addon.samples == 4
