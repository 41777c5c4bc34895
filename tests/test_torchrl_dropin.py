"""TorchRL's keyword and attribute surface on rlloss's losses, compared with TorchRL's own class
on the same networks (what TorchRL's tests, run with rlloss swapped in, showed missing; see
tools/torchrl_tests/)."""

from __future__ import annotations

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from torchrl.data import Bounded
from torchrl.objectives import SoftUpdate

import rlloss
from tests import test_dqn, test_sac, test_td3
from tests.nets import make_actor, make_critic, rollout

PPO_LOSSES = ["PPOLoss", "ClipPPOLoss", "KLPENPPOLoss"]
SAC_SPEC = Bounded(-1.0, 1.0, (test_sac.ACT,))


def flat_keys(params) -> set:
    return set(params.flatten_keys(".").keys())


@pytest.mark.parametrize("name", PPO_LOSSES)
def test_ppo_functional_exposes_the_parameters_torchrl_does(name):
    actor, critic = make_actor(), make_critic()
    ours = getattr(rlloss, name)(actor, critic, functional=True)
    theirs = getattr(torchrl_objectives, name)(actor, critic, functional=True)
    for attribute in ("actor_network_params", "critic_network_params"):
        assert flat_keys(getattr(ours, attribute)) == flat_keys(getattr(theirs, attribute))
    # views of the networks' own parameters: an optimizer built from them trains the loss
    ours_ids = {id(p) for p in ours.actor_network_params.values(True, True)}
    assert ours_ids == {id(p) for p in actor.parameters()}
    # TorchRL's fallback gives detached copies for a loss without target parameters
    target = ours.target_critic_network_params
    assert flat_keys(target) == flat_keys(ours.critic_network_params)
    assert not any(t.requires_grad for t in target.values(True, True))


@pytest.mark.parametrize("name", PPO_LOSSES)
def test_ppo_functional_false_gives_the_same_losses_and_no_params(name):
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor, critic=critic)
    functional = getattr(rlloss, name)(actor, critic, functional=True)(batch.clone())
    plain_loss = getattr(rlloss, name)(actor, critic, functional=False)
    plain = plain_loss(batch.clone())
    assert plain_loss.actor_network_params is None and plain_loss.critic_network_params is None
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(plain[key], functional[key])


@pytest.mark.parametrize("name", PPO_LOSSES)
def test_ppo_device_keyword_places_the_coefficients(name):
    loss = getattr(rlloss, name)(make_actor(), make_critic(), device="cpu")
    assert loss.entropy_coeff.device == torch.device("cpu")
    assert loss.critic_coeff.device == torch.device("cpu")


def offpolicy_pairs():
    """(name, rlloss loss, TorchRL loss) on the same networks."""
    q_actor = test_dqn.q_actor()
    yield (
        "DQNLoss",
        rlloss.DQNLoss(q_actor),
        torchrl_objectives.DQNLoss(q_actor, action_space="one-hot"),
    )
    actor, qvalue = test_td3.actor(), test_td3.qvalue()
    yield (
        "DDPGLoss",
        rlloss.DDPGLoss(actor, qvalue),
        torchrl_objectives.DDPGLoss(actor, qvalue),
    )
    yield (
        "TD3Loss",
        rlloss.TD3Loss(actor, qvalue, bounds=(-1.0, 1.0), delay_actor=False),
        torchrl_objectives.TD3Loss(actor, qvalue, bounds=(-1.0, 1.0), delay_actor=False),
    )
    sac_actor, sac_qvalue = test_sac.actor(), test_sac.qvalue()
    yield (
        "SACLoss",
        rlloss.SACLoss(sac_actor, sac_qvalue, action_spec=SAC_SPEC),
        torchrl_objectives.SACLoss(sac_actor, sac_qvalue, action_spec=SAC_SPEC),
    )


@pytest.mark.parametrize("pair", list(offpolicy_pairs()), ids=lambda pair: pair[0])
def test_offpolicy_losses_expose_torchrls_parameter_attributes(pair):
    _, ours, theirs = pair
    attributes = [
        name
        for name in (
            "actor_network_params",
            "value_network_params",
            "qvalue_network_params",
            "target_value_network_params",
            "target_qvalue_network_params",
        )
        if getattr(theirs, name, None) is not None
    ]
    assert attributes
    for attribute in attributes:
        mine = getattr(ours, attribute)
        assert flat_keys(mine) == flat_keys(getattr(theirs, attribute)), attribute
        assert mine.batch_size == getattr(theirs, attribute).batch_size, attribute


def test_optimizer_from_actor_network_params_trains_the_actor():
    """TorchRL's example scripts build their optimizers from these attributes."""
    loss = rlloss.SACLoss(test_sac.actor(), test_sac.qvalue(), action_spec=SAC_SPEC)
    SoftUpdate(loss, tau=0.1)
    optimizer = torch.optim.SGD(list(loss.actor_network_params.values(True, True)), lr=0.1)
    before = [p.detach().clone() for p in loss.actor_network.parameters()]
    loss(test_sac.transitions())["loss_actor"].backward()
    optimizer.step()
    after = list(loss.actor_network.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_parameter_views_follow_a_dtype_change():
    loss = rlloss.DDPGLoss(test_td3.actor(), test_td3.qvalue()).double()
    for attribute in ("actor_network_params", "value_network_params"):
        tensors = list(getattr(loss, attribute).values(True, True))
        assert all(t.dtype == torch.float64 for t in tensors), attribute
    assert {id(p) for p in loss.actor_network_params.values(True, True)} == {
        id(p) for p in loss.actor_network.parameters()
    }


def test_sac_accepts_and_ignores_delay_value_as_torchrl_does():
    actor, qvalue = test_sac.actor(), test_sac.qvalue()
    batch = test_sac.transitions()
    outputs = []
    for delay_value in (True, False):
        torch.manual_seed(0)  # the same re-initialised second Q network
        loss = rlloss.SACLoss(actor, qvalue, action_spec=SAC_SPEC, delay_value=delay_value)
        torch.manual_seed(1)  # the same policy samples
        outputs.append(loss(batch.clone()))
    for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
        torch.testing.assert_close(outputs[0][key], outputs[1][key], rtol=0, atol=0)


@pytest.mark.parametrize("name", PPO_LOSSES)
def test_the_loss_shares_its_sample_log_prob_key_with_its_estimator(name):
    """TorchRL's estimators declare ``sample_log_prob`` (V-trace reads it) and a PPO loss
    passes its own key on, as TorchRL's does."""
    ours = getattr(rlloss, name)(make_actor(), make_critic())
    theirs = getattr(torchrl_objectives, name)(make_actor(), make_critic())
    for loss in (ours, theirs):
        loss.make_value_estimator(gamma=0.9, lmbda=0.9)
        loss.set_keys(sample_log_prob="my_log_prob")
        assert loss.value_estimator.tensor_keys.sample_log_prob == "my_log_prob"
    gae = rlloss.GAE(gamma=0.9, lmbda=0.9)
    assert gae.tensor_keys.sample_log_prob == "action_log_prob"
    gae.set_keys(sample_log_prob=("stats", "log_prob"))
    assert gae.tensor_keys.sample_log_prob == ("stats", "log_prob")


def offpolicy_cases():
    """(name, rlloss loss, TorchRL loss, batch): same networks, deterministic losses."""
    q_actor = test_dqn.q_actor()
    yield (
        "DQNLoss",
        rlloss.DQNLoss(q_actor, delay_value=True),
        torchrl_objectives.DQNLoss(q_actor, action_space="one-hot", delay_value=True),
        test_dqn.transitions(),
    )
    actor, qvalue = test_td3.actor(), test_td3.qvalue()
    yield (
        "DDPGLoss",
        rlloss.DDPGLoss(actor, qvalue),
        torchrl_objectives.DDPGLoss(actor, qvalue),
        test_td3.transitions(),
    )


@pytest.mark.parametrize(
    "value_type",
    [
        torchrl_objectives.ValueEstimators.TD0,
        torchrl_objectives.ValueEstimators.TD1,
        torchrl_objectives.ValueEstimators.TDLambda,
    ],
    ids=str,
)
@pytest.mark.parametrize("case", list(offpolicy_cases()), ids=lambda case: case[0])
def test_offpolicy_estimators_and_tensor_calls_match_torchrl(case, value_type):
    """TD0 / TD1 / TD(lambda) targets (the batch's last dim as time) give TorchRL's numbers, and
    a call with keyword tensors returns the out_keys of the TensorDict call."""
    _, ours, theirs, batch = case
    for loss in (ours, theirs):
        loss.make_value_estimator(value_type, gamma=0.9)
    SoftUpdate(ours, eps=0.5), SoftUpdate(theirs, eps=0.5)
    out_ours, out_theirs = ours(batch.clone()), theirs(batch.clone())
    for key in ("loss", "loss_value", "loss_actor"):
        if key in out_theirs.keys():
            torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    keywords = {
        "_".join(k) if isinstance(k, tuple) else k: batch.get(k)
        for k in ours.in_keys
        if batch.get(k, None) is not None
    }
    values = ours(**keywords)
    values = values if isinstance(values, tuple) else (values,)
    for key, value in zip(ours.out_keys, values, strict=True):
        torch.testing.assert_close(value, out_ours[key], msg=key)


def test_select_out_keys_narrows_a_tensor_call():
    loss = rlloss.DQNLoss(test_dqn.q_actor())
    batch = test_dqn.transitions()
    keywords = {"_".join(k) if isinstance(k, tuple) else k: batch.get(k) for k in loss.in_keys}
    loss.select_out_keys("loss")
    torch.testing.assert_close(loss(**keywords), loss(batch.clone())["loss"])
    with pytest.raises(TypeError, match="in_keys, nested keys joined by '_'"):
        loss(**keywords, not_a_key=torch.zeros(1))


@pytest.mark.parametrize("name", ["DQNLoss", "DDPGLoss", "TD3Loss", "SACLoss"])
def test_on_policy_estimators_are_refused_as_torchrl_does(name):
    loss = dict((n, ours) for n, ours, _ in offpolicy_pairs())[name]
    for value_type in ("GAE", "VTrace", "MAGAE"):
        with pytest.raises(NotImplementedError, match="TD0, TD1 or TDLambda"):
            loss.make_value_estimator(getattr(torchrl_objectives.ValueEstimators, value_type))


@pytest.mark.parametrize("name", PPO_LOSSES)
def test_ppo_tensor_call_runs_the_estimator(name):
    actor, critic = make_actor(), make_critic()
    batch = rollout(actor, critic=critic)
    del batch["advantage"], batch["value_target"]
    loss = getattr(rlloss, name)(actor, critic)
    keywords = {
        "_".join(k) if isinstance(k, tuple) else k: batch.get(k)
        for k in loss.in_keys
        if batch.get(k, None) is not None
    }
    beta = getattr(loss, "beta", torch.zeros(())).clone()  # KLPEN adapts it in each call
    torch.manual_seed(0)
    values = loss(**keywords)
    if hasattr(loss, "beta"):
        loss.beta.copy_(beta)
    torch.manual_seed(0)
    expected = loss(batch.clone())
    for key, value in zip(loss.out_keys, values, strict=True):
        torch.testing.assert_close(value, expected[key], msg=key)


def test_offpolicy_losses_apply_torchrls_loss_mask():
    """TorchRL's loss_mask_key: ("collector", "mask") drops padded transitions ("auto"); a key
    reads that entry; None masks nothing."""
    q_actor = test_dqn.q_actor()
    batch = test_dqn.transitions()
    batch["collector", "mask"] = torch.arange(batch.shape[0]).unsqueeze(-1) % 3 != 0
    ours = rlloss.DQNLoss(q_actor, priority_weighting="normalized")
    theirs = torchrl_objectives.DQNLoss(q_actor, action_space="one-hot")
    torch.testing.assert_close(ours(batch.clone())["loss"], theirs(batch.clone())["loss"])
    valid = batch[batch["collector", "mask"].squeeze(-1)]
    del valid["collector"]
    torch.testing.assert_close(ours(batch.clone())["loss"], ours(valid)["loss"])
    ours.loss_mask_key = None
    unmasked = batch.clone()
    del unmasked["collector"]
    torch.testing.assert_close(ours(batch.clone())["loss"], ours(unmasked)["loss"])


def test_klpen_reset_restores_beta():
    actor, critic = make_actor(), make_critic()
    loss = rlloss.KLPENPPOLoss(actor, critic, beta=0.7)
    loss.beta.fill_(3.0)
    loss.reset()
    assert float(loss.beta) == pytest.approx(0.7)


@pytest.mark.parametrize("name", ["GAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator"])
def test_estimators_accept_tensor_arguments_as_torchrls(name):
    """``estimator(obs=..., next_reward=...)`` returns (advantage, value_target), TorchRL's."""
    from tensordict.nn import TensorDictModule
    from torchrl.objectives import value as torchrl_value

    critic = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["obs"], out_keys=["state_value"])
    kwargs = {"gamma": 0.9, **({"lmbda": 0.8} if name in ("GAE", "TDLambdaEstimator") else {})}
    inputs = {
        "obs": torch.randn(2, 7, 3),
        "next_obs": torch.randn(2, 7, 3),
        "next_reward": torch.randn(2, 7, 1),
        "next_done": torch.rand(2, 7, 1) < 0.2,
        "next_terminated": torch.zeros(2, 7, 1, dtype=torch.bool),
    }
    ours = getattr(rlloss, name)(value_network=critic, **kwargs)(**inputs)
    theirs = getattr(torchrl_value, name)(value_network=critic, **kwargs)(**inputs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["DQNLoss", "DDPGLoss", "TD3Loss", "SACLoss"])
def test_reset_parameters_recursive_redraws_every_network(name):
    """TorchRL's reset_parameters_recursive: every weight is re-drawn (ensemble members
    independently), targets restart from the new online weights, coefficients stay."""
    loss = dict((n, ours) for n, ours, _ in offpolicy_pairs())[name]
    before = {k: v.clone() for k, v in loss.state_dict().items()}
    loss.reset_parameters_recursive()
    after = loss.state_dict()
    weights = [k for k in after if k.endswith(("weight", "bias"))]
    assert weights and all(not torch.equal(before[k], after[k]) for k in weights)
    for key in (k for k in weights if k.startswith("target_")):
        online = key.removeprefix("target_")
        if online in after:
            torch.testing.assert_close(after[key], after[online])
    stacked = [k for k in weights if k.startswith("qvalue_network_params")]
    for key in stacked:
        assert not torch.equal(after[key][0], after[key][1])


def test_every_name_of_torchrl_objectives_imports_from_rlloss():
    """A script's import line ``from torchrl.objectives import SACLoss, SoftUpdate,
    ValueEstimators`` becomes ``from rlloss import ...`` whole: every public name of
    ``torchrl.objectives`` but its submodules is in rlloss (and of ``torchrl.objectives.llm`` in
    ``rlloss.llm``, but ``RayMCAdvantage``: Differences from TorchRL), the helpers as TorchRL's
    own objects; the enum drives rlloss's estimators."""
    import torchrl.objectives.llm as torchrl_llm

    for theirs, ours, absent in (
        (torchrl_objectives, rlloss, []),
        (torchrl_llm, rlloss.llm, ["RayMCAdvantage", "annotations"]),
    ):
        names = [
            name
            for name in dir(theirs)
            if not name.startswith("_") and type(getattr(theirs, name)).__name__ != "module"
        ]
        assert len(names) > 15 and sorted(n for n in names if not hasattr(ours, n)) == absent
    for name in ("ValueEstimators", "TargetNetUpdater", "hold_out_net", "group_optimizers"):
        assert getattr(rlloss, name) is getattr(torchrl_objectives, name)
        assert name not in rlloss.__all__  # TorchRL's, not rlloss's API
    from rlloss import SACLoss, SoftUpdate, TargetNetUpdater, ValueEstimators

    loss = SACLoss(test_sac.actor(), test_sac.qvalue(), action_spec=SAC_SPEC)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=0.5)
    assert isinstance(SoftUpdate(loss, tau=0.1), TargetNetUpdater)
    assert isinstance(loss.value_estimator, rlloss.TD0Estimator)
    torch.testing.assert_close(torch.as_tensor(loss.value_estimator.gamma), torch.tensor(0.5))


@pytest.mark.parametrize("kind", ["normal", "categorical", "one_hot"])
def test_a2c_get_entropy_bonus_matches_torchrl(kind):
    """TorchRL's ``A2CLoss.get_entropy_bonus(dist)``: the entropy ``[*B, 1]``, unscaled."""
    actor, critic = make_actor(kind), make_critic()
    ours = rlloss.A2CLoss(actor, critic, entropy_coeff=0.3)
    theirs = torchrl_objectives.A2CLoss(actor, critic, entropy_coeff=0.3)
    dist = actor.get_dist(rollout(actor, (4, 8)))
    bonus = ours.get_entropy_bonus(dist)
    assert bonus.shape == (4, 8, 1)
    torch.testing.assert_close(bonus, theirs.get_entropy_bonus(dist))


def test_iql_loss_value_diff_is_torchrls():
    """TorchRL's static ``IQLLoss.loss_value_diff(diff, expectile=0.8)``: same values and
    gradients, the default expectile included, on both IQL classes."""
    diff = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], requires_grad=True)
    for name in ("IQLLoss", "DiscreteIQLLoss"):
        ours, theirs = getattr(rlloss, name), getattr(torchrl_objectives, name)
        for args in ((), (0.3,)):
            mine = ours.loss_value_diff(diff, *args)
            reference = theirs.loss_value_diff(diff, *args)
            torch.testing.assert_close(mine, reference)
            grads = [torch.autograd.grad(x.sum(), diff)[0] for x in (mine, reference)]
            torch.testing.assert_close(*grads)
