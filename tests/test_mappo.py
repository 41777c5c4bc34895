"""MAPPOLoss / IPPOLoss against TorchRL's on TorchRL's multi-agent networks, and the agent-dim
broadcasting of team and per-agent rewards and flags in MultiAgentGAE."""

from __future__ import annotations

import copy

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.modules import IndependentNormal, MultiAgentMLP, ProbabilisticActor
from torchrl.modules.value_norm import PopArtValueNorm, RunningValueNorm

import rlloss
from rlloss import functional as rlf

AGENTS, OBS, ACT = 3, 4, 2


def actor(share_params=True):
    net = torch.nn.Sequential(
        MultiAgentMLP(OBS, 2 * ACT, AGENTS, centralized=False, share_params=share_params),
        NormalParamExtractor(),
    )
    module = TensorDictModule(
        net, [("agents", "observation")], [("agents", "loc"), ("agents", "scale")]
    )
    return ProbabilisticActor(
        module,
        in_keys={"loc": ("agents", "loc"), "scale": ("agents", "scale")},
        out_keys=[("agents", "action")],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )


def critic(centralized=True, share_params=True):
    net = MultiAgentMLP(OBS, 1, AGENTS, centralized=centralized, share_params=share_params)
    return TensorDictModule(net, [("agents", "observation")], [("agents", "state_value")])


def batch(policy, batch_size=(4, 6), reward_shape=None, done_shape=None):
    """A rollout: per-agent observations, actions and (stale) log-probs, team reward and flags
    ``[*B, 1]`` unless other shapes are given."""
    reward_shape = reward_shape or (*batch_size, 1)
    done_shape = done_shape or (*batch_size, 1)
    agents = (*batch_size, AGENTS)
    td = TensorDict(
        {
            "agents": TensorDict({"observation": torch.randn(*agents, OBS)}, agents),
            "next": {
                "agents": TensorDict({"observation": torch.randn(*agents, OBS)}, agents),
                "reward": torch.randn(reward_shape),
                "done": torch.rand(done_shape) < 0.2,
            },
        },
        batch_size,
    )
    td["next", "terminated"] = td["next", "done"] & (torch.rand(done_shape) < 0.5)
    with torch.no_grad():
        sampled = policy(td.clone())
    td["agents", "action"] = sampled["agents", "action"]
    log_prob = sampled["agents", "action_log_prob"]
    td["agents", "action_log_prob"] = log_prob + 0.3 * torch.randn_like(log_prob)
    return td


def batch_with_advantage(policy):
    """A rollout whose per-agent advantages and value targets were estimated beforehand."""
    td = batch(policy)
    td["advantage"] = 2 * torch.randn(*td.batch_size, AGENTS, 1)
    td["value_target"] = torch.randn(*td.batch_size, AGENTS, 1)
    td["agents", "state_value"] = torch.randn(*td.batch_size, AGENTS, 1)
    return td


def pair(name, policy, value, **kwargs):
    ours = getattr(rlloss, name)(policy, value, **kwargs)
    theirs = getattr(torchrl_objectives, name)(policy, value, **kwargs)
    for loss in (ours, theirs):
        loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
    return ours, theirs


def run(loss, td, networks):
    out = loss(td.clone())
    for network in networks:
        network.zero_grad()
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    return out, [p.grad.clone() for n in networks for p in n.parameters()]


CASES = {
    "defaults": {},
    "value_norm": {"value_norm": "popart"},
    "value_norm+clip": {"value_norm": "running", "clip_value": 0.2},
    "separate": {"separate_losses": True, "value_norm": "popart"},
    "no-normalisation": {"normalize_advantage": False},
}


@pytest.mark.parametrize("name", ["MAPPOLoss", "IPPOLoss"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_torchrl(name, case):
    torch.manual_seed(0)
    policy, value = actor(), critic(centralized=name == "MAPPOLoss")
    kwargs = dict(CASES[case])
    norms = {"popart": PopArtValueNorm, "running": RunningValueNorm}
    norm_kind = kwargs.pop("value_norm", None)
    ours, theirs = pair(name, policy, value, **kwargs)
    if norm_kind:
        ours.value_norm, theirs.value_norm = norms[norm_kind](), norms[norm_kind]()
    for step in range(3):  # value norms move between steps
        td = batch(policy)
        td["next", "reward"] *= 10.0 * (step + 1)
        out_ours, grads_ours = run(ours, td, (policy, value))
        out_theirs, grads_theirs = run(theirs, td, (policy, value))
        assert set(out_ours.keys()) >= set(out_theirs.keys())
        for key in out_theirs.keys():  # ESS [n_agents], explained_variance [n_agents, 1]
            torch.testing.assert_close(out_ours[key], out_theirs[key].detach(), msg=key)
        for mine, expected in zip(grads_ours, grads_theirs, strict=True):
            torch.testing.assert_close(mine, expected)
    if norm_kind:
        torch.testing.assert_close(ours.value_norm.state_dict(), theirs.value_norm.state_dict())


@pytest.mark.parametrize("batch_size", [(6,), (4, 6)], ids=["B", "BxT"])
def test_clip_ppo_with_agent_dims_reports_torchrls_per_agent_diagnostics(batch_size):
    """Plain ClipPPOLoss on per-agent data (advantages ``[*B, n_agents, 1]`` given): ESS is one
    per agent (and time step), explained_variance one per agent, as TorchRL's, same values."""
    torch.manual_seed(0)
    policy, value = actor(), critic()
    td = batch(policy, batch_size=batch_size)
    td["advantage"] = torch.randn(*batch_size, AGENTS, 1)
    td["value_target"] = torch.randn(*batch_size, AGENTS, 1)
    ours, theirs = pair("ClipPPOLoss", policy, value)
    out_ours, out_theirs = ours(td.clone()), theirs(td.clone())
    assert out_ours["ESS"].shape == (*batch_size[1:], AGENTS)
    assert out_ours["explained_variance"].shape == (*batch_size[1:], AGENTS, 1)
    for key in ("ESS", "explained_variance", "loss_objective", "loss_critic", "clip_fraction"):
        torch.testing.assert_close(out_ours[key], out_theirs[key].detach(), msg=key)


def test_defaults_are_torchrls():
    loss = rlloss.MAPPOLoss(actor(), critic())
    assert loss.normalize_advantage and loss.normalize_advantage_exclude_dims == (-2,)
    assert float(loss.entropy_coeff) == pytest.approx(0.01)
    assert isinstance(loss, rlloss.ClipPPOLoss) and issubclass(rlloss.IPPOLoss, rlloss.MAPPOLoss)
    loss.set_keys(value=("agents", "state_value"))
    loss.make_value_estimator()
    assert isinstance(loss.value_estimator, rlloss.MultiAgentGAE)
    norm = PopArtValueNorm()
    state = rlloss.MAPPOLoss(actor(), critic(), value_norm=norm).state_dict()
    assert sorted(k for k in state if "value_norm" in k) == [
        "value_norm.debiasing_term",
        "value_norm.running_mean",
        "value_norm.running_mean_sq",
    ]


def test_bad_value_norm_is_refused():
    with pytest.raises(TypeError, match="value_norm must be a torchrl.modules.ValueNorm"):
        rlloss.MAPPOLoss(actor(), critic(), value_norm=object())


def test_per_agent_advantage_statistics():
    """One mean and std per agent: an agent with 100x larger advantages does not drown the
    others."""
    torch.manual_seed(1)
    policy, value = actor(), critic()
    loss = rlloss.MAPPOLoss(policy, value)
    loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
    td = batch(policy)
    td["advantage"] = torch.randn(4, 6, AGENTS, 1) * torch.tensor([1.0, 100.0, 0.01]).view(3, 1)
    td["value_target"] = torch.randn(4, 6, AGENTS, 1)
    standardized = rlf.standardize(td["advantage"], exclude_dims=(-2,))
    for agent in range(AGENTS):
        torch.testing.assert_close(standardized[..., agent, :].std(), torch.tensor(1.0))
    reference = copy.deepcopy(td)
    reference["advantage"] = standardized
    plain = rlloss.ClipPPOLoss(policy, value, entropy_coeff=0.01)
    plain.set_keys(value=("agents", "state_value"), action=("agents", "action"))
    torch.testing.assert_close(loss(td)["loss_objective"], plain(reference)["loss_objective"])


# --------------------------------------------------------------- agent-dim broadcasting (GAE)
B, T = 2, 5
VALUE = (B, T, AGENTS, 1)
SHAPES = {
    "team [B, T, 1]": ((B, T, 1), None),
    "per agent [B, T, n, 1]": ((B, T, AGENTS, 1), None),
    "team with an agent singleton [B, T, 1, 1]": ((B, T, 1, 1), None),
    "per agent without trailing dim [B, T, n]": ((B, T, AGENTS), "unsqueeze\\(-1\\)"),
    "team without trailing dim [B, T]": ((B, T), "unsqueeze\\(-1\\)"),
    "other agent count [B, T, 2, 1]": ((B, T, 2, 1), "expected the reward/done/terminated"),
}


@pytest.mark.parametrize("reward", list(SHAPES))
@pytest.mark.parametrize("done", list(SHAPES))
def test_reward_and_done_shapes_table(reward, done):
    """Every combination a multi-agent user sends: shared or per-agent reward and done, with
    or without the trailing dim. Each works (and equals GAE on explicitly expanded signals) or
    raises an error naming the entry, its shape, the value's shape and the fix."""
    torch.manual_seed(2)
    (reward_shape, reward_error), (done_shape, done_error) = SHAPES[reward], SHAPES[done]
    value, next_value = torch.randn(VALUE), torch.randn(VALUE)
    rewards = torch.randn(reward_shape)
    done_flags = torch.rand(done_shape) < 0.3
    gae = rlloss.MultiAgentGAE(gamma=0.9, lmbda=0.8, value_network=None)
    kwargs = {"value": value, "next_value": next_value, "gamma": 0.9, "time_dim": 1}
    kwargs |= {"reward": rewards, "done": done_flags, "terminated": done_flags, "groups": None}
    if reward_error or done_error:
        names = [n for n, e in (("reward", reward_error), ("done", done_error)) if e]
        with pytest.raises(ValueError, match=reward_error or done_error) as error:
            gae.estimate(**kwargs)
        assert f"got {names[0]} of shape" in str(error.value)
        assert str(VALUE) in str(error.value)
        return
    advantage, target = gae.estimate(**kwargs)

    def expanded(x):
        return (x.unsqueeze(2) if x.ndim == 3 else x).expand(VALUE)

    reference = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=None).estimate(
        **{**kwargs, "reward": expanded(rewards), "done": expanded(done_flags)}
        | {"terminated": expanded(done_flags)}
    )
    torch.testing.assert_close(advantage, reference[0])
    torch.testing.assert_close(target, reference[1])


@pytest.mark.parametrize("name", ["MAPPOLoss", "IPPOLoss"])
def test_signature_names_every_torchrl_keyword_with_its_default(name):
    """No catch-all: every keyword of TorchRL 0.14.1's class (its own and those its
    ``**kwargs`` reach, ClipPPOLoss's and PPOLoss's) is named with TorchRL's default and kind."""
    import inspect

    from torchrl.objectives.multiagent import mappo as torchrl_mappo

    ours = inspect.signature(getattr(rlloss, name).__init__).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
    theirs = {}
    for cls in (
        getattr(torchrl_mappo, name),
        torchrl_objectives.ClipPPOLoss,
        torchrl_objectives.PPOLoss,
    ):
        for key, parameter in inspect.signature(cls.__init__).parameters.items():
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD:
                theirs.setdefault(key, parameter)
    for key, parameter in theirs.items():
        assert key in ours, key
        assert ours[key].kind == parameter.kind, key
        assert ours[key].default == parameter.default, key
    assert list(ours)[:7] == list(theirs)[:7]  # TorchRL's MAPPO keywords first, in its order
