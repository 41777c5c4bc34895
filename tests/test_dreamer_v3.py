"""DreamerV3's losses: parity with TorchRL's classes (values and gradients) on the same small
networks and batches, keys, bad input."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import MLP, SymExpTwoHot

import rlloss

B, T, CATS, CLASSES, BELIEF, OBS, BINS = 3, 4, 3, 5, 6, 7, 11


class TinyWorldModel(nn.Module):
    """Prior and posterior logits from the latent, a reconstruction of the next observation and
    a reward head (two-hot logits and their decoded value, or a scalar)."""

    def __init__(self, two_hot=True, continuation=False):
        super().__init__()
        features = CATS * CLASSES + BELIEF
        self.prior = nn.Linear(features, CATS * CLASSES)
        self.posterior = nn.Linear(features + OBS, CATS * CLASSES)
        self.decoder = nn.Linear(features, OBS)
        self.reward = nn.Linear(features, BINS if two_hot else 1)
        self.decode = SymExpTwoHot(BINS)
        self.continuation = nn.Linear(features, 1) if continuation else None
        self.two_hot = two_hot

    def forward(self, td):
        latent = torch.cat([td["state"], td["belief"]], -1)
        shape = (*td.shape, CATS, CLASSES)
        td["next", "prior_logits"] = self.prior(latent).view(shape)
        posterior_in = torch.cat([latent, td["next", "observation"]], -1)
        td["next", "posterior_logits"] = self.posterior(posterior_in).view(shape)
        td["next", "reco_observation"] = self.decoder(latent)
        reward = self.reward(latent)
        if self.two_hot:
            td["next", "reward_logits"] = reward
            reward = self.decode(reward)
        td["next", "reward"] = reward
        if self.continuation is not None:
            td["next", "continue_pred"] = self.continuation(latent)
        return td


def sequences(seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    return TensorDict(
        {
            "state": randn(B, T, CATS * CLASSES),
            "belief": randn(B, T, BELIEF),
            "next": {
                "observation": 5 * randn(B, T, OBS),
                "reward": 3 * randn(B, T, 1),
                "done": torch.zeros(B, T, 1, dtype=torch.bool),
                "terminated": randn(B, T, 1) > 1.0,
            },
        },
        [B, T],
    )


def model_pair(continuation=False, two_hot=True, **kwargs):
    world_model = TinyWorldModel(two_hot, continuation)
    kwargs = {"num_reward_bins": BINS, "reward_two_hot": two_hot, **kwargs}
    ours = rlloss.DreamerV3ModelLoss(copy.deepcopy(world_model), **kwargs)
    theirs = torchrl_objectives.DreamerV3ModelLoss(copy.deepcopy(world_model), **kwargs)
    for loss in (ours, theirs):
        loss.set_keys(pixels="observation", reco_pixels="reco_observation")
    return ours, theirs


def assert_same_gradients(ours, theirs, losses, expected):
    ours_params, theirs_params = list(ours.parameters()), list(theirs.parameters())
    grads = torch.autograd.grad(sum(losses.values()).sum(), ours_params, allow_unused=True)
    grads_expected = torch.autograd.grad(
        sum(expected.values()).sum(), theirs_params, allow_unused=True
    )
    for grad, grad_expected in zip(grads, grads_expected, strict=True):
        if grad_expected is None:
            assert grad is None or not grad.any()
        else:
            torch.testing.assert_close(grad, grad_expected, rtol=1e-4, atol=1e-5)


MODEL_SETTINGS = [
    {},
    {"reward_two_hot": False},
    {"kl_mode": "separate", "unimix": 0.01},
    {"kl_mode": "separate", "free_bits": 0.0, "lambda_dynamic": 0.5},
    {"reco_loss": "l1", "global_average": True, "free_bits": 0.1, "kl_alpha": 0.5},
    {"reco_symlog": False, "lambda_kl": 0.3, "lambda_reco": 2.0, "lambda_reward": 0.5},
    {"lambda_continue": 1.0, "continuation": True, "continue_target_scale": 0.99},
]


@pytest.mark.parametrize("settings", MODEL_SETTINGS)
def test_model_loss_matches_torchrl(settings):
    settings = dict(settings)
    two_hot = settings.pop("reward_two_hot", True)
    ours, theirs = model_pair(settings.pop("continuation", False), two_hot, **settings)
    batch = sequences()
    losses, output = ours(batch)
    expected, expected_output = theirs(batch)
    assert sorted(losses.keys()) == sorted(expected.keys())
    for key in expected.keys():
        assert losses[key].shape == (1,)
        torch.testing.assert_close(losses[key], expected[key], rtol=1e-5, atol=1e-6)
    assert set(output.keys(True)) == set(expected_output.keys(True))
    assert ("next", "reward") in batch.keys(True) and ("next", "true_reward") not in batch.keys(
        True
    )
    assert_same_gradients(ours, theirs, dict(losses.items()), dict(expected.items()))


def test_model_loss_detach_output_and_missing_keys():
    ours, _ = model_pair(detach_output=False)
    _, output = ours(sequences())
    assert output["next", "posterior_logits"].requires_grad
    with pytest.raises(KeyError, match="reward"):
        ours(sequences().exclude(("next", "reward")))
    ours.set_keys(pixels=["observation", "observation"])
    with pytest.raises(ValueError, match="same nonzero number of reconstruction heads"):
        ours(sequences())


def test_model_loss_bad_keywords():
    with pytest.raises(ValueError, match="kl_mode"):
        rlloss.DreamerV3ModelLoss(TinyWorldModel(), kl_mode="mixed")
    with pytest.raises(ValueError, match="continue_target_scale"):
        rlloss.DreamerV3ModelLoss(TinyWorldModel(), continue_target_scale=0.0)
    with pytest.raises(ValueError, match="lambda_kl"):
        rlloss.DreamerV3ModelLoss(TinyWorldModel(), lambda_kl=-1.0)
    ours, _ = model_pair(num_reward_bins=BINS + 1)
    with pytest.raises(ValueError, match="bins"):
        ours(sequences())


# ----------------------------------------------------------------------------- value loss


def value_network(bins=None):
    head = MLP(in_features=CATS * CLASSES + BELIEF, out_features=bins or 1, num_cells=[8])
    if bins is None:
        return TensorDictModule(head, ["state", "belief"], ["state_value"])
    return TensorDictSequential(
        TensorDictModule(head, ["state", "belief"], ["state_value_logits"]),
        TensorDictModule(SymExpTwoHot(bins), ["state_value_logits"], ["state_value"]),
    )


def imagined(shape=(B, T), weights=False, seed=1):
    generator = torch.Generator().manual_seed(seed)
    td = TensorDict(
        {
            "state": torch.randn(*shape, CATS * CLASSES, generator=generator),
            "belief": torch.randn(*shape, BELIEF, generator=generator),
            "lambda_target": 4 * torch.randn(*shape, 1, generator=generator),
        },
        shape,
    )
    if weights:
        td["discount_weight"] = torch.rand(*shape, 1, generator=generator)
    return td


def value_pair(bins=None, **kwargs):
    network = value_network(bins)
    if bins:
        kwargs.update(value_loss="two_hot", num_value_bins=bins)
    ours = rlloss.DreamerV3ValueLoss(copy.deepcopy(network), **kwargs)
    theirs = torchrl_objectives.DreamerV3ValueLoss(copy.deepcopy(network), **kwargs)
    if kwargs.get("slow_critic_regularization"):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchRL's target-network warning
            moved = theirs.target_value_model_params.apply(lambda x: x + 0.1)
            theirs.target_value_model_params.update_(moved)
            ours.target_value_model_params.update_(moved)
    return ours, theirs


def trained(loss):
    return [p for p in loss.value_model_params.values(True, True) if p.requires_grad]


VALUE_SETTINGS = [
    ({}, {}),
    ({"bins": BINS}, {}),
    ({"discount_loss": False, "reduction": "sum"}, {}),
    ({"reduction": "none", "gamma": 0.9}, {}),
    ({"bins": BINS, "slow_critic_regularization": 1.0}, {}),
    ({"slow_critic_regularization": 0.5}, {"weights": True}),
    ({}, {"shape": (B * T,)}),
]


@pytest.mark.parametrize("settings,data", VALUE_SETTINGS)
def test_value_loss_matches_torchrl(settings, data):
    ours, theirs = value_pair(**settings)
    batch = imagined(**data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's target-network warning
        losses, _ = ours(batch)
        expected, _ = theirs(batch)
    for key in ("loss_value", "value_slow_loss"):
        torch.testing.assert_close(losses[key], expected[key], rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(losses["loss_value"].sum(), trained(ours))
    expected_grads = torch.autograd.grad(expected["loss_value"].sum(), trained(theirs))
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("bins", [None, BINS])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_replay_value_loss_matches_torchrl(bins, reduction):
    ours, theirs = value_pair(bins, reduction=reduction, slow_critic_regularization=0.3)
    replay = imagined().exclude("lambda_target")
    replay["bootstrap"] = torch.randn(B, T)
    replay["next"] = sequences()["next"].select("reward", "done", "terminated")
    replay["next", "done"][0, 1] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = ours.replay_value_loss(replay, horizon=50.0, lmbda=0.9)["loss_replay_value"]
        expected = theirs.replay_value_loss(replay, horizon=50.0, lmbda=0.9)["loss_replay_value"]
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_value_loss_bad_input():
    with pytest.raises(ValueError, match="symlog_mse.*two_hot"):
        rlloss.DreamerV3ValueLoss(value_network(), value_loss="mse")
    with pytest.raises(ValueError, match="non-negative"):
        rlloss.DreamerV3ValueLoss(value_network(), slow_critic_regularization=-1.0)
    loss = rlloss.DreamerV3ValueLoss(value_network())
    with pytest.raises(KeyError, match="lambda_target"):
        loss(imagined().exclude("lambda_target"))
    two_hot = rlloss.DreamerV3ValueLoss(value_network(BINS), value_loss="two_hot", num_value_bins=5)
    with pytest.raises(ValueError, match="5 bins"):
        two_hot(imagined())


# ----------------------------------------------------------------------------- actor loss

STATE, ACTION, HORIZON = CATS * CLASSES, 2, 4


def rssm_prior():
    from torchrl.modules import RSSMPriorV3

    return RSSMPriorV3(
        action_shape=(ACTION,),
        hidden_dim=8,
        rnn_hidden_dim=BELIEF,
        num_categoricals=CATS,
        num_classes=CLASSES,
        action_dim=ACTION,
    )


def imagination_env(prior=None, reward_net=None, sizes=(STATE, BELIEF, ACTION)):
    """TorchRL's DreamerEnv over a transition (an RSSM prior whose last two outputs are the next
    state and belief) and a reward head; new small V3 ones by default."""
    from torchrl.data import Bounded, Composite, Unbounded
    from torchrl.envs.model_based import DreamerEnv
    from torchrl.modules import RSSMPrior, WorldModelWrapper

    state, belief, action = sizes
    prior = prior or rssm_prior()
    reward_net = reward_net or MLP(in_features=state + belief, out_features=1, num_cells=[8])
    outputs = (
        ["_", "_", "state", "belief"] if isinstance(prior, RSSMPrior) else ["_", "state", "belief"]
    )
    transition = TensorDictModule(prior, ["state", "belief", "action"], outputs)
    reward = TensorDictModule(reward_net, ["state", "belief"], ["reward"])
    env = DreamerEnv(
        WorldModelWrapper(transition, reward), prior_shape=(state,), belief_shape=(belief,)
    )
    env.observation_spec = Composite(state=Unbounded(state), belief=Unbounded(belief))
    env.state_spec = env.observation_spec.clone()
    env.action_spec = Bounded(-1, 1, (action,))
    env.reward_spec = Unbounded((1,))
    return env


def tanh_normal_actor(log_prob=False, state=STATE, belief=BELIEF, action=ACTION):
    from tensordict.nn import (
        NormalParamExtractor,
        ProbabilisticTensorDictModule,
        ProbabilisticTensorDictSequential,
    )
    from torchrl.modules import TanhNormal

    extra = {"return_log_prob": True, "log_prob_key": "action_log_prob"} if log_prob else {}
    return ProbabilisticTensorDictSequential(
        TensorDictModule(
            MLP(in_features=state + belief, out_features=2 * action, num_cells=[8]),
            ["state", "belief"],
            ["params"],
        ),
        TensorDictModule(NormalParamExtractor(), ["params"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(
            in_keys=["loc", "scale"], out_keys=["action"], distribution_class=TanhNormal, **extra
        ),
    )


class HalfContinuation(nn.Module):
    def forward(self, state, belief):
        return torch.sigmoid(state[..., :1] + belief[..., :1])


class NoEnd(nn.Module):
    def forward(self, state, belief):
        return torch.ones_like(state[..., :1])


def actor_pair(continuation=False, estimator=None, estimator_kwargs=None, **kwargs):
    """rlloss's and TorchRL's actor losses on copies of one environment, actor and critic.

    TorchRL 0.14.1 computes TD(0) targets where it means lambda-returns when it has no
    continuation model (see test_torchrl_lambda_target_without_continuation_is_td0); its
    continuation path is the paper's recursion, so a TD(lambda) comparison without continuation
    gives TorchRL a continuation model that always continues (the same weights and returns).
    """
    env, actor, value = imagination_env(), tanh_normal_actor(True), value_network()
    made = []
    for cls in (rlloss.DreamerV3ActorLoss, torchrl_objectives.DreamerV3ActorLoss):
        networks = copy.deepcopy((actor, value, env))
        module = HalfContinuation() if continuation else None
        if module is None and cls is torchrl_objectives.DreamerV3ActorLoss and estimator is None:
            module = NoEnd()
        if module is not None:
            kwargs["continuation_model"] = TensorDictModule(
                module, ["state", "belief"], ["continuation"]
            )
        else:
            kwargs.pop("continuation_model", None)
        loss = cls(*networks, imagination_horizon=HORIZON, **kwargs)
        loss.make_value_estimator(estimator, **(estimator_kwargs or {}))
        made.append(loss)
    return made


def test_torchrl_lambda_target_without_continuation_is_td0():
    """Pins the TorchRL 0.14.1 behaviour docs/differences.md describes: without a continuation
    model its lambda_target is r_t + gamma v_{t+1} whatever lmbda; rlloss's is the recursion."""
    ours, theirs = actor_pair(continuation=True)
    reward, value = torch.randn(3, HORIZON, 1), torch.randn(3, HORIZON, 1)
    torch.testing.assert_close(theirs.lambda_target(reward, value), reward + 0.99 * value)
    ones = torch.ones_like(reward)
    torch.testing.assert_close(
        ours.lambda_target(reward, value), theirs.lambda_target(reward, value, ones)
    )


def starts(count=5, seed=2):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "state": torch.randn(count, STATE, generator=generator),
            "belief": torch.randn(count, BELIEF, generator=generator),
        },
        [count],
    )


def run_both(ours, theirs, batch, seed=3):
    torch.manual_seed(seed)
    losses, imagined_ours = ours(batch)
    torch.manual_seed(seed)
    expected, imagined_theirs = theirs(batch)
    return losses, imagined_ours, expected, imagined_theirs


ACTOR_SETTINGS = [
    {"entropy_bonus": 0.0},
    {"entropy_bonus": 0.0, "discount_loss": False, "return_normalization": False},
    {"entropy_bonus": 0.0, "use_reinforce": True},
    {"entropy_bonus": 0.0, "continuation": True, "use_reinforce": True},
    {"entropy_bonus": 0.0, "continuation": True, "return_normalization_rate": 0.5},
    {"entropy_bonus": 0.0, "estimator": "TD0"},
    {"entropy_bonus": 0.0, "estimator_kwargs": {"gamma": 0.9, "lmbda": 0.7}},
    {"entropy_bonus": 0.01},
]


@pytest.mark.parametrize("settings", ACTOR_SETTINGS)
def test_actor_loss_matches_torchrl(settings):
    from torchrl.objectives.utils import ValueEstimators

    settings = dict(settings)
    estimator = settings.pop("estimator", None)
    if estimator is not None:
        settings["estimator"] = getattr(ValueEstimators, estimator)
    ours, theirs = actor_pair(**settings)
    for _ in range(2):  # twice: the return percentiles move
        losses, imagined_ours, expected, imagined_theirs = run_both(ours, theirs, starts())
        for key in expected.keys():
            torch.testing.assert_close(losses[key], expected[key], rtol=1e-4, atol=1e-5)
        for key in ("lambda_target", "discount_weight"):
            torch.testing.assert_close(imagined_ours[key], imagined_theirs[key])
        grads = torch.autograd.grad(losses["loss_actor"], list(ours.actor_model.parameters()))
        expected_grads = torch.autograd.grad(
            expected["loss_actor"], list(theirs.actor_model.parameters())
        )
        torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.retnorm.low, theirs.retnorm.low)


def imagination_run(loss, fast: bool, seed=3):
    """The actor loss's outputs, imagined data and actor gradients with the tensor rollout on
    or off (TorchRL's ``env.rollout``), from the same percentiles and seed."""
    loss._rollout.enabled = fast
    loss.retnorm.low.zero_(), loss.retnorm.high.zero_()
    torch.manual_seed(seed)
    losses, imagined = loss(starts())
    objective = losses["loss_actor"]
    return losses, imagined, torch.autograd.grad(objective, list(loss.actor_model.parameters()))


@pytest.mark.parametrize("log_prob", [False, True])
@pytest.mark.parametrize("continuation", [False, True])
def test_tensor_imagination_is_the_env_rollout(log_prob, continuation):
    """rlloss's rollout on tensors gives TorchRL's ``DreamerEnv.rollout`` exactly: every entry
    of the imagined data (keys, shapes, dtypes, values, the batch size and device), the losses
    and the actor's gradients."""
    kwargs = {"imagination_horizon": HORIZON, "entropy_bonus": 0.01}
    if continuation:
        kwargs["continuation_model"] = TensorDictModule(
            HalfContinuation(), ["state", "belief"], ["continuation"]
        )
    loss = rlloss.DreamerV3ActorLoss(
        tanh_normal_actor(log_prob), value_network(), imagination_env(), **kwargs
    )
    assert loss._rollout.enabled
    fast, slow = imagination_run(loss, True), imagination_run(loss, False)
    (losses, imagined, grads), (expected, expected_imagined, expected_grads) = fast, slow
    assert imagined.batch_size == expected_imagined.batch_size == (5, HORIZON)
    assert imagined.device == expected_imagined.device
    keys = set(expected_imagined.keys(True, True))
    assert set(imagined.keys(True, True)) == keys
    assert ("action_log_prob" in keys) == log_prob
    for key in keys:
        value, reference = imagined[key], expected_imagined[key]
        assert value.dtype == reference.dtype, key
        torch.testing.assert_close(value, reference, rtol=0, atol=0, msg=str(key))
    for key in expected.keys():
        torch.testing.assert_close(losses[key], expected[key], rtol=0, atol=0)
    torch.testing.assert_close(grads, expected_grads, rtol=0, atol=0)


def test_tensor_imagination_leaves_other_environments_and_actors_to_the_rollout():
    """An environment other than a plain ``DreamerEnv``, or an actor whose call the plan would
    not reproduce (a forward hook), imagines through ``env.rollout``."""
    from torchrl.envs.model_based import DreamerEnv

    class SubclassedEnv(DreamerEnv):
        pass

    env = imagination_env()
    env.__class__ = SubclassedEnv
    loss = rlloss.DreamerV3ActorLoss(tanh_normal_actor(), value_network(), env)
    assert not loss._rollout.enabled
    hooked = tanh_normal_actor()
    hooked.module[-1].register_forward_hook(lambda module, args, out: out)
    loss_hooked = rlloss.DreamerV3ActorLoss(hooked, value_network(), imagination_env())
    assert not loss_hooked._rollout.enabled
    for each in (loss, loss_hooked):
        losses, imagined = each(starts())
        assert imagined.batch_size == (5, 15)
        assert torch.isfinite(losses["loss_actor"])


def test_actor_loss_keywords_and_state():
    ours, _ = actor_pair(entropy_bonus=0.0)
    with pytest.raises(TypeError, match="make_value_estimator"):
        rlloss.DreamerV3ActorLoss(
            tanh_normal_actor(), value_network(), imagination_env(), gamma=0.9
        )
    with pytest.raises(ValueError, match="quantiles"):
        rlloss.DreamerV3ActorLoss(
            tanh_normal_actor(),
            value_network(),
            imagination_env(),
            return_normalization_quantiles=(0.9, 0.1),
        )
    from torchrl.objectives.utils import ValueEstimators

    with pytest.raises(NotImplementedError, match="GAE"):
        ours.make_value_estimator(ValueEstimators.GAE)
    ours(starts())
    state = ours.state_dict()
    legacy = {k: v for k, v in state.items() if not k.startswith("retnorm")}
    legacy["return_low"], legacy["return_high"] = state["retnorm.low"][0], state["retnorm.high"][0]
    ours.retnorm.low.zero_()
    ours.load_state_dict(legacy)
    torch.testing.assert_close(ours.retnorm.low, state["retnorm.low"])
    ours.eval()
    before = ours.return_high.clone()
    ours(starts())
    torch.testing.assert_close(ours.return_high, before)


# ----------------------------------------------------------------------------- composed loss


def learner():
    """A world model (encoder, RSSM rollout, decoder, reward) whose prior and reward head are
    shared with the imagination environment; an actor, a critic, a continuation model."""
    from torchrl.modules import RSSMPosteriorV3, RSSMRolloutV3

    prior_net, reward_net = (
        rssm_prior(),
        MLP(in_features=STATE + BELIEF, out_features=1, num_cells=[8]),
    )
    posterior_net = RSSMPosteriorV3(
        hidden_dim=8,
        rnn_hidden_dim=BELIEF,
        num_categoricals=CATS,
        num_classes=CLASSES,
        obs_embed_dim=8,
    )
    prior = TensorDictModule(
        prior_net,
        ["state", "belief", "action"],
        [("next", "prior_logits"), ("next", "state"), ("next", "belief")],
    )
    posterior = TensorDictModule(
        posterior_net,
        [("next", "belief"), ("next", "encoded")],
        [("next", "posterior_logits"), ("next", "state")],
    )
    latent = [("next", "state"), ("next", "belief")]
    decoder = MLP(in_features=STATE + BELIEF, out_features=OBS, num_cells=[8])
    world_model = TensorDictSequential(
        TensorDictModule(nn.Linear(OBS, 8), [("next", "observation")], [("next", "encoded")]),
        RSSMRolloutV3(prior, posterior, reset_key="is_init"),
        TensorDictModule(decoder, latent, [("next", "reco_pixels")]),
        TensorDictModule(reward_net, latent, [("next", "reward")]),
    )
    env = imagination_env(prior_net, reward_net)
    continuation = TensorDictModule(HalfContinuation(), ["state", "belief"], ["continuation"])
    return world_model, env, tanh_normal_actor(True), value_network(), continuation


def composed(library, networks, **kwargs):
    world_model, env, actor, value, continuation = copy.deepcopy(networks)
    model_loss = library.DreamerV3ModelLoss(world_model, reward_two_hot=False, detach_output=False)
    model_loss.set_keys(pixels="observation")
    actor_loss = library.DreamerV3ActorLoss(
        actor, value, env, continuation_model=continuation, imagination_horizon=3
    )
    actor_loss.make_value_estimator(None, gamma=0.95, lmbda=0.9)
    value_loss = library.DreamerV3ValueLoss(
        value, actor_loss=actor_loss, slow_critic_regularization=1.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        library.SoftUpdate(value_loss, tau=0.02)
    return library.DreamerV3Loss(model_loss, actor_loss, value_loss, **kwargs)


def real_sequences(seed=4):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "state": torch.zeros(2, 3, STATE),
            "belief": torch.zeros(2, 3, BELIEF),
            "action": torch.rand(2, 3, ACTION, generator=generator) * 2 - 1,
            "is_init": torch.zeros(2, 3, 1, dtype=torch.bool),
            "next": {
                "observation": torch.randn(2, 3, OBS, generator=generator),
                "reward": torch.randn(2, 3, 1, generator=generator),
                "done": torch.zeros(2, 3, 1, dtype=torch.bool),
                "terminated": torch.zeros(2, 3, 1, dtype=torch.bool),
            },
        },
        [2, 3],
    )


@pytest.mark.parametrize("weight", [0.3, 0.0])
def test_composed_loss_matches_torchrl(weight):
    networks = learner()
    extra = {"replay_value_loss_weight": weight}
    ours, theirs = (
        composed(rlloss, networks, **extra),
        composed(torchrl_objectives, networks, **extra),
    )
    if not weight:
        ours.model_loss.detach_output = theirs.model_loss.detach_output = True
    assert ours.in_keys == theirs.in_keys
    sample = real_sequences()
    torch.manual_seed(5)
    out = ours(sample)
    torch.manual_seed(5)
    expected = theirs(sample)
    assert set(out.keys(True)) == set(expected.keys(True))
    for key in expected.keys():
        if key != "replay_context":
            torch.testing.assert_close(out[key], expected[key], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["replay_context"], expected["replay_context"])
    total = sum(value for key, value in out.items() if key.startswith("loss_"))
    expected_total = sum(value for key, value in expected.items() if key.startswith("loss_"))
    grads = torch.autograd.grad(total, list(ours.model_loss.world_model.parameters()))
    expected_grads = torch.autograd.grad(
        expected_total, list(theirs.model_loss.world_model.parameters())
    )
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)


def test_composed_loss_refuses_a_detached_model_output():
    networks = learner()
    model_loss = rlloss.DreamerV3ModelLoss(networks[0], reward_two_hot=False)
    actor_loss = rlloss.DreamerV3ActorLoss(*networks[2:4], networks[1])
    with pytest.raises(ValueError, match="detach_output=False"):
        rlloss.DreamerV3Loss(model_loss, actor_loss, rlloss.DreamerV3ValueLoss(networks[3]))
    with pytest.raises(ValueError, match="non-negative"):
        rlloss.DreamerV3Loss(
            model_loss,
            actor_loss,
            rlloss.DreamerV3ValueLoss(networks[3]),
            replay_value_loss_weight=-1,
        )


def test_model_and_value_losses_read_no_tensor_on_the_host():
    """No forward or backward of the model and value losses needs a tensor's value on the host
    (the actor loss's: test_actor_loss_imagining_on_tensors_reads_no_tensor_on_the_host)."""
    from tests.test_contract import HostReads

    model_loss, _ = model_pair(kl_mode="separate", unimix=0.01)
    value_loss, _ = value_pair(BINS, slow_critic_regularization=1.0)
    runs = [(model_loss, sequences()), (value_loss, imagined())]
    for loss, batch in runs:
        loss(batch)  # the first call may prepare things
        with HostReads() as reads, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            losses, _ = loss(batch)
            sum(v.sum() for k, v in losses.items() if k.startswith("loss_")).backward()
        assert not reads.seen, type(loss).__name__


def test_actor_loss_imagining_on_tensors_reads_no_tensor_on_the_host():
    """With TorchRL's ``DreamerEnv`` and a planned actor the rollout runs on tensors: no forward
    or backward of the actor loss needs a tensor's value on the host."""
    from tests.test_contract import HostReads

    continuation = TensorDictModule(HalfContinuation(), ["state", "belief"], ["continuation"])
    loss = rlloss.DreamerV3ActorLoss(
        tanh_normal_actor(), value_network(), imagination_env(), continuation_model=continuation
    )
    assert loss._rollout.enabled
    loss(starts())  # the first call builds the value estimator
    with HostReads() as reads:
        losses, _ = loss(starts())
        losses["loss_actor"].backward()
    assert not reads.seen


@pytest.mark.slow
def test_composed_loss_compiles_fullgraph_without_recompiles():
    """``torch.compile(fullgraph=True)`` of ``DreamerV3Loss`` (model, actor with its imagination
    rollout, value and replay value losses) and of the actor loss alone: one graph each, the
    eager numbers, and no recompilation on fresh batches."""
    import torch._dynamo

    torch._dynamo.reset()
    networks = learner()
    eager = composed(rlloss, networks)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, backend="eager")
    eager_actor = copy.deepcopy(eager.actor_loss)
    compiled_actor = torch.compile(copy.deepcopy(eager_actor), fullgraph=True, backend="eager")
    for seed in range(3):
        with torch._dynamo.config.patch(error_on_recompile=seed > 0):
            sample = real_sequences(seed)
            torch.manual_seed(seed)
            expected = eager(sample)
            torch.manual_seed(seed)
            out = compiled(sample)
            for key in expected.keys():
                if key != "replay_context":
                    torch.testing.assert_close(out[key], expected[key], msg=key)
            torch.manual_seed(seed)
            expected, _ = eager_actor(starts(seed=seed))
            torch.manual_seed(seed)
            out, _ = compiled_actor(starts(seed=seed))
            torch.testing.assert_close(out["loss_actor"], expected["loss_actor"])
    torch._dynamo.reset()
