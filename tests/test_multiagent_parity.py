"""Multi-agent shaped inputs against TorchRL's own classes (issue 35): values and gradients.

- The PPO family with a composite (multi-head) action per agent: TorchRL sums the heads' log-probs
  and entropies to the advantage's shape, ``[B, n_agents]`` for a per-agent advantage (its
  ``test_ppo_marl_aggregate``); rlloss did so over the batch's dims only, ``[B]``, and refused the
  stored per-agent log-probs.
- ``DiscreteSACLoss`` with agent dims (pytorch/rl #1459): ``[B, n_agents, n_actions]`` action values
  from a ``MultiAgentMLP``, per-agent reward and flags, one-hot and categorical actions.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives
from tensordict import TensorDict
from tensordict.nn import CompositeDistribution, TensorDictModule, set_composite_lp_aggregate
from torch import distributions as D
from torch import nn
from torchrl.modules import OneHotCategorical, ProbabilisticActor

import rlloss
from tests import test_multiagent_networks as nets

N, OBS, ACT, K, B = nets.N, nets.OBS, nets.ACT, nets.ACTIONS, nets.B
HEADS = [("agents", "move"), ("agents", "pick")]


@pytest.fixture(autouse=True)
def _quiet_and_per_head_log_probs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with set_composite_lp_aggregate(False):
            yield


def mlp(outputs: int, centralized: bool = False, share: bool = True):
    return nets.mlp(OBS, outputs, centralized=centralized, share=share)


class TwoHeads(nn.Module):
    """Per agent: a Gaussian move (loc, scale) and the logits of a K-way pick."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = mlp(2 * ACT + K)

    def forward(self, observation):
        out = self.mlp(observation)
        scale = nn.functional.softplus(out[..., ACT : 2 * ACT]) + 0.1
        return out[..., :ACT], scale, out[..., 2 * ACT :]


def gaussian(loc, scale):
    return D.Independent(D.Normal(loc, scale), 1)


def composite_actor() -> ProbabilisticActor:
    move, pick = ("params", *HEADS[0]), ("params", *HEADS[1])
    params = [(*move, "loc"), (*move, "scale"), (*pick, "logits")]
    module = TensorDictModule(TwoHeads(), [("agents", "observation")], params)
    return ProbabilisticActor(
        module,
        in_keys=["params"],
        out_keys=HEADS,
        distribution_class=CompositeDistribution,
        distribution_kwargs={
            "distribution_map": {HEADS[0]: gaussian, HEADS[1]: D.Categorical},
        },
        return_log_prob=True,
    )


def composite_batch(actor) -> TensorDict:
    """Per-agent actions and per-head log-probs ``[B, n]`` from ``actor``, a per-agent advantage
    and value target ``[B, n, 1]``; then the actor moves, so the ratios are not 1."""
    torch.manual_seed(0)
    observation = torch.randn(B, N, OBS)
    batch = TensorDict({"agents": TensorDict({"observation": observation}, [B, N])}, [B])
    with torch.no_grad():
        batch = actor(batch)
        for parameter in actor.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    batch["advantage"] = torch.randn(B, N, 1)
    batch["value_target"] = torch.randn(B, N, 1)
    return batch


def ppo_pair(name: str, **kwargs):
    torch.manual_seed(0)
    actor = composite_actor()
    critic = TensorDictModule(
        mlp(1, centralized=True), [("agents", "observation")], [("agents", "state_value")]
    )
    batch = composite_batch(actor)
    pair = []
    for module in (rlloss, torchrl.objectives):
        loss = getattr(module, name)(copy.deepcopy(actor), copy.deepcopy(critic), **kwargs)
        loss.set_keys(value=("agents", "state_value"))
        pair.append(loss)
    return (*pair, batch)


def assert_same_gradients(ours, theirs) -> None:
    """rlloss's networks hold their parameters; TorchRL's loss holds ``<name>_params``."""
    for name in ("actor_network", "critic_network"):
        expected = getattr(theirs, f"{name}_params").flatten_keys(".")
        got = dict(getattr(ours, name).named_parameters())
        assert got.keys() == set(expected.keys())
        for key, parameter in got.items():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, key
            torch.testing.assert_close(parameter.grad, expected[key].grad, msg=f"{name}.{key}")


PPO_CASES = {
    "clip": ("ClipPPOLoss", {"entropy_coeff": 0.05}),
    "clip-normalized-advantage": ("ClipPPOLoss", {"normalize_advantage": True}),
    "plain": ("PPOLoss", {"entropy_coeff": 0.01, "critic_coeff": 0.5}),
}


@pytest.mark.parametrize("case", sorted(PPO_CASES))
def test_ppo_composite_action_per_agent_matches_torchrl(case):
    name, kwargs = PPO_CASES[case]
    ours, theirs, batch = ppo_pair(name, **kwargs)
    assert ours.tensor_keys.sample_log_prob == theirs.tensor_keys.sample_log_prob
    assert ours.tensor_keys.action == theirs.tensor_keys.action == HEADS
    got, expected = ours(batch.clone()), theirs(batch.clone())
    assert got["loss_objective"].abs() > 0
    for key in expected.keys(True, True):
        torch.testing.assert_close(got[key], expected[key], msg=str(key))
    per_head = got["composite_entropy", "agents", "pick_entropy"]
    assert per_head.shape == (B, N, 1)
    for out in (got, expected):
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert_same_gradients(ours, theirs)


def test_klpen_composite_action_penalises_the_kl_of_each_agent():
    """KLPEN's penalty per agent: ``loss = PPO's loss + beta * mean over (B, n) of the sum of
    the heads' exact KL(old || new)`` (TorchRL draws a Monte-Carlo KL for a composite action,
    so the reference is written here from the distributions)."""
    ours, _, batch = ppo_pair("KLPENPPOLoss", beta=0.7, entropy_coeff=0.0)
    plain, _, _ = ppo_pair("PPOLoss", entropy_coeff=0.0)
    out = ours(batch.clone())
    old = batch["params", "agents"]
    with torch.no_grad():
        heads = ours.actor_network.module[0].module  # the TwoHeads network
        new_loc, new_scale, new_logits = heads(batch["agents", "observation"])
    kl = D.kl_divergence(
        gaussian(old["move", "loc"], old["move", "scale"]), gaussian(new_loc, new_scale)
    )
    pick = D.kl_divergence(
        D.Categorical(logits=old["pick", "logits"]), D.Categorical(logits=new_logits)
    )
    kl = kl + pick
    assert kl.shape == (B, N)
    expected = plain(batch.clone())["loss_objective"] + 0.7 * kl.mean()
    torch.testing.assert_close(out["loss_objective"], expected)
    torch.testing.assert_close(out["kl"], kl.mean())


def discrete_sac_pair(one_hot: bool, **kwargs):
    torch.manual_seed(0)
    logits = TensorDictModule(mlp(K), [("agents", "observation")], [("agents", "logits")])
    actor = ProbabilisticActor(
        logits,
        in_keys={"logits": ("agents", "logits")},
        out_keys=[("agents", "action")],
        distribution_class=OneHotCategorical if one_hot else torch.distributions.Categorical,
    )
    qvalue = TensorDictModule(
        mlp(K, share=False), [("agents", "observation")], [("agents", "action_value")]
    )
    space = {"num_actions": K, "action_space": "one-hot" if one_hot else "categorical"}
    ours = rlloss.DiscreteSACLoss(copy.deepcopy(actor), copy.deepcopy(qvalue), **space, **kwargs)
    theirs = torchrl.objectives.DiscreteSACLoss(
        copy.deepcopy(actor), copy.deepcopy(qvalue), **space, **kwargs
    )
    theirs.make_value_estimator(gamma=0.99)
    with torch.no_grad():  # TorchRL initialises its ensemble members in its own way
        theirs.qvalue_network_params.data.copy_(ours.qvalue_network_params.data)
        moved = ours.target_qvalue_network_params.data
        moved.apply_(lambda p: p.add_(0.1 * torch.randn_like(p)))  # a target behind the online
        theirs.target_qvalue_network_params.data.copy_(moved)
    keys = {e: ("agents", e) for e in ("reward", "done", "terminated")}
    for loss in (ours, theirs):
        loss.set_keys(action=("agents", "action"), action_value=("agents", "action_value"), **keys)
    return ours, theirs


def discrete_transitions(one_hot: bool) -> TensorDict:
    gen = torch.Generator().manual_seed(5)
    action = torch.randint(K, (B, N), generator=gen)
    if one_hot:
        action = nn.functional.one_hot(action, K)

    def agents(**extra):
        return TensorDict({"observation": torch.randn(B, N, OBS, generator=gen), **extra}, [B, N])

    flags = {
        "reward": torch.randn(B, N, 1, generator=gen),
        "done": torch.rand(B, N, 1, generator=gen) < 0.3,
        "terminated": torch.rand(B, N, 1, generator=gen) < 0.2,
    }
    nxt = TensorDict({"agents": agents(**flags)}, [B])
    return TensorDict({"agents": agents(action=action), "next": nxt}, [B])


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("one_hot", [True, False], ids=["one-hot", "categorical"])
def test_discrete_sac_with_agent_dims_matches_torchrl(one_hot, reduction):
    ours, theirs = discrete_sac_pair(one_hot, num_qvalue_nets=2, reduction=reduction)
    batch = discrete_transitions(one_hot)
    torch.testing.assert_close(ours.target_entropy, theirs.target_entropy)
    torch.manual_seed(1)
    got = ours(batch.clone())
    torch.manual_seed(1)
    expected = theirs(batch.clone())
    assert got["loss_qvalue"].abs().sum() > 0
    for key in expected.keys():
        assert got[key].shape == expected[key].shape, key
        torch.testing.assert_close(got[key], expected[key], msg=key)
    for out in (got, expected):
        sum(v.sum() for k, v in out.items() if k.startswith("loss_")).backward()
    theirs_q = theirs.qvalue_network_params.flatten_keys(".")
    for key, parameter in ours.qvalue_network_params.flatten_keys(".").items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, key
        torch.testing.assert_close(parameter.grad, theirs_q[key].grad, msg=key)
    theirs_actor = theirs.actor_network_params.flatten_keys(".")
    for key, parameter in ours.actor_network.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs_actor[key].grad, msg=key)
    torch.testing.assert_close(ours.log_alpha.grad, theirs.log_alpha.grad)
