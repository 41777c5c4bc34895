"""TQCLoss: parity with TorchRL's TQCLoss (values, gradients, td_error), the target, the
critic and the actor losses against the paper on hand-made quantile critics, terminal and
truncated next states, TorchRL's method names and the argument checks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, IndependentNormal, TanhNormal, ValueOperator
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import TQCLoss
from tests import reference
from tests.test_sac import ACT, OBS, actor, assert_same_outputs_and_gradients, loss_pair
from tests.test_sac import transitions as sac_transitions

B, M = 16, 5


def quantile_critic(num_quantiles=M):
    return ValueOperator(
        MLP(in_features=OBS + ACT, out_features=num_quantiles, num_cells=[16]),
        in_keys=["observation", "action"],
    )


def transitions(batch=B):
    return sac_transitions(batch)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num": 3, "drop": 1, "alpha_init": 0.5, "reduction": "sum", "steps": True},
        {"num": 2, "quantiles": 1, "drop": 0, "bounds": (-2.0, 0.5), "reduction": "none"},
        {"alpha_init": 5.0, "max_alpha": 2.0, "min_alpha": 0.1, "distribution": IndependentNormal},
        {"alpha_init": 0.3, "fixed_alpha": True, "delay_qvalue": False, "quantiles": 8},
        {"deactivate_vmap": True, "separate_losses": True, "target_entropy": -0.5},
        # TorchRL draws no next action at terminal next states with skip_done_states: the
        # random streams then differ, so this runs on a batch without terminations
        {"skip_done_states": True, "terminated": False},
    ],
)
def test_matches_torchrl(kwargs):
    low, high = kwargs.pop("bounds", (-1.0, 1.0))
    policy = actor(kwargs.pop("distribution", TanhNormal), low, high)
    num, quantiles = kwargs.pop("num", 5), kwargs.pop("quantiles", M)
    critics = [quantile_critic(quantiles) for _ in range(num)]
    batch = transitions()
    if kwargs.pop("steps", False):
        batch["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    if not kwargs.pop("terminated", True):
        batch["next", "terminated"].fill_(False)
    batch["priority_weight"] = torch.rand(B)
    common = {
        "num_qvalue_nets": num,
        "top_quantiles_to_drop_per_net": kwargs.pop("drop", 2),
        "action_spec": Bounded(low, high, shape=(ACT,)),
        **kwargs,
    }
    if common.get("reduction") == "none":
        common["scalar_output_mode"] = "exclude"
    ours, theirs = loss_pair(TQCLoss, policy, critics, common)
    assert_same_outputs_and_gradients(ours, theirs, batch)
    for name in ("actor_loss", "qvalue_v2_loss", "compute_target"):
        torch.manual_seed(1)
        mine = getattr(ours, name)(batch.clone())
        torch.manual_seed(1)
        reference_out = getattr(theirs, name)(batch.clone())
        mine, reference_out = (x[0] if isinstance(x, tuple) else x for x in (mine, reference_out))
        torch.testing.assert_close(mine, reference_out, msg=name)
    log_prob = torch.randn(B)  # alpha_loss: elementwise, as TorchRL's (the caller reduces)
    torch.testing.assert_close(ours.alpha_loss(log_prob), theirs.alpha_loss(log_prob))


class ConstantAtoms(nn.Module):
    """A critic whose atoms do not depend on its inputs (a parameter)."""

    def __init__(self, atoms):
        super().__init__()
        self.atoms = nn.Parameter(torch.tensor(atoms))

    def forward(self, observation, action):
        return self.atoms.expand(*observation.shape[:-1], -1)


def constant_loss(critics, drop, **kwargs):
    modules = [ValueOperator(ConstantAtoms(c), in_keys=["observation", "action"]) for c in critics]
    loss = TQCLoss(
        actor(),
        modules,
        num_qvalue_nets=len(critics),
        top_quantiles_to_drop_per_net=drop,
        action_spec=Bounded(-1.0, 1.0, shape=(ACT,)),
        **kwargs,
    )
    SoftUpdate(loss, eps=0.9)
    return loss


def test_target_critic_and_actor_losses_against_the_paper():
    """Hand-made atoms, the actor's sample and log-prob fixed: each piece equals the loop
    written from arXiv:2005.04269."""
    critics = [[-1.0, 0.5, 4.0, 9.0], [0.0, 2.0, 2.5, 30.0], [-3.0, 1.0, 1.5, 6.0]]
    loss = constant_loss(critics, drop=1, alpha_init=0.7, reduction="none")
    loss.make_value_estimator(ValueEstimators.TD0, gamma=0.9)
    batch = transitions(6)
    batch["steps_to_next_obs"] = torch.tensor([[1], [2], [3], [1], [2], [1]])
    log_prob = torch.linspace(-2.0, 1.0, 6)
    action = torch.zeros(6, ACT)
    loss._policy_sample = lambda step, call=None: (action, log_prob)
    target = loss.compute_target(batch)
    kept = reference.truncated_mixture(critics, 1)
    assert target.shape == (6, len(kept))
    for b in range(6):
        reward = float(batch["next", "reward"][b])
        alive = 0.0 if bool(batch["next", "terminated"][b]) else 1.0
        discount = 0.9 ** int(batch["steps_to_next_obs"][b])
        expected = [reward + discount * alive * (z - 0.7 * float(log_prob[b])) for z in kept]
        torch.testing.assert_close(target[b], torch.tensor(expected))
    critic_loss, info = loss.loss_qvalue(batch)
    expected = [
        sum(reference.quantile_huber_loss(c, target[b].tolist(), 1.0) for c in critics)
        for b in range(6)
    ]
    torch.testing.assert_close(critic_loss, torch.tensor(expected))
    expected_td = [
        max(reference.mean_absolute_pairwise_error(c, target[b].tolist()) for c in critics)
        for b in range(6)
    ]
    torch.testing.assert_close(info["td_error"], torch.tensor(expected_td))
    actor_loss, _ = loss.actor_loss(batch)
    mixture_mean = sum(sum(c) for c in critics) / 12
    torch.testing.assert_close(actor_loss, 0.7 * log_prob - mixture_mean)


def test_truncation_bootstraps_and_terminal_nan_is_harmless():
    """``skip_done_states``: a terminal next state (NaN observation) gives ``y = r``, finite
    losses and gradients; a truncated one (done, not terminated) bootstraps as usual."""
    loss = TQCLoss(actor(), quantile_critic(), num_qvalue_nets=2, skip_done_states=True)
    batch = transitions()
    batch["next", "terminated"][:4] = True
    batch["next", "done"][:4] = True
    batch["next", "observation"][:4] = float("nan")
    target = loss.compute_target(batch)
    torch.testing.assert_close(target[:4], batch["next", "reward"][:4].expand_as(target[:4]))
    out = loss(batch)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    grads = [p.grad for p in loss.parameters() if p.grad is not None]
    assert grads and all(g.isfinite().all() for g in grads)
    fresh = transitions()
    fresh["next", "terminated"].fill_(False)
    fresh["next", "done"].fill_(False)
    torch.manual_seed(0)
    expected = loss.compute_target(fresh)
    fresh["next", "done"].fill_(True)
    torch.manual_seed(0)
    torch.testing.assert_close(loss.compute_target(fresh), expected)


def test_bad_arguments():
    with pytest.raises(ValueError, match="greater than or equal"):
        TQCLoss(actor(), quantile_critic(), top_quantiles_to_drop_per_net=-1)
    with pytest.raises(ValueError, match="integer"):
        TQCLoss(actor(), quantile_critic(), top_quantiles_to_drop_per_net=1.5)
    with pytest.raises(TypeError, match="loss_function"):
        TQCLoss(actor(), quantile_critic(), loss_function="l2")
    loss = TQCLoss(actor(), quantile_critic(2), num_qvalue_nets=2, top_quantiles_to_drop_per_net=2)
    with pytest.raises(ValueError, match="smaller than the critic's number of quantiles"):
        loss(transitions())
    for estimator in (ValueEstimators.TD1, ValueEstimators.TDLambda):
        with pytest.raises(NotImplementedError, match="TD0"):
            loss.make_value_estimator(estimator)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=0.5)
    assert loss.gamma == 0.5
    flat = TensorDictModule(FlatCritic(), ["observation", "action"], ["state_action_value"])
    no_atoms = TQCLoss(actor(), flat, num_qvalue_nets=2)
    with pytest.raises(RuntimeError, match="quantile dim"):
        no_atoms(transitions())


class FlatCritic(nn.Module):
    """A critic writing ``[*B]`` values (no atom dim)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(OBS + ACT, 1)

    def forward(self, observation, action):
        return self.linear(torch.cat([observation, action], -1)).squeeze(-1)


def test_batch_with_two_dims():
    loss = TQCLoss(actor(), quantile_critic(), num_qvalue_nets=2, reduction="none")
    flat = transitions(12)
    batch = flat.reshape(3, 4)
    out = loss(batch)
    assert out["loss_qvalue"].shape == out["loss_actor"].shape == (3, 4)
    assert batch["td_error"].shape == (3, 4)
    assert isinstance(out, TensorDict)
