"""Trajectory tests: rlloss's loss and TorchRL's of the same name, on copies of the same
networks in float64, trained side by side for a few hundred Adam steps on identical batches,
each loss's target networks updated by TorchRL's ``SoftUpdate`` after every step, end with the
same parameters within 1e-8 (:mod:`tests.trajectory`). A failure here is a change of maths; a
tutorial whose per-seed figures move while these pass has met a change of rounding.

The losses and batches are those of each class's parity tests (their ``pair`` helpers and
batch builders), so each case names its set-up rather than writing it again. Losses that draw
random numbers (policy samples, noise, random actions) are compared with the global seed set to
the step's index before each forward in both libraries: the two draw the same numbers in the
same order (their parity tests check one such call), so the whole trajectory is comparable.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from torchrl.data import Bounded

import rlloss
from tests import test_crossq, test_dqn, test_sac, test_td3, test_tqc
from tests.trajectory import assert_same_trajectory, soft_update

NUM_BATCHES = 4  # cycled over the steps


def batches(make, count: int = NUM_BATCHES, seed: int = 11) -> list:
    """``count`` batches ``make()`` from a fixed seed."""
    torch.manual_seed(seed)
    return [make() for _ in range(count)]


def dqn(double_dqn: bool):
    actor = test_dqn.q_actor()
    kwargs = {"double_dqn": double_dqn, "action_space": "one-hot"}
    ours = rlloss.DQNLoss(copy.deepcopy(actor), priority_weighting="normalized", **kwargs)
    theirs = torchrl_objectives.DQNLoss(copy.deepcopy(actor), **kwargs)
    for loss in (ours, theirs):
        loss.make_value_estimator(gamma=0.9)
    return ours, theirs, batches(test_dqn.transitions), {"updater": soft_update}


def ddpg():
    policy, critic = test_td3.actor(), test_td3.qvalue()
    ours = rlloss.DDPGLoss(
        copy.deepcopy(policy), copy.deepcopy(critic), priority_weighting="normalized"
    )
    theirs = torchrl_objectives.DDPGLoss(copy.deepcopy(policy), copy.deepcopy(critic))
    theirs.make_value_estimator(gamma=0.99)
    return ours, theirs, batches(test_td3.transitions), {"updater": soft_update}


def td3(name: str, **kwargs):
    ours, theirs = test_td3.pair(name, **kwargs)
    options = {"updater": soft_update, "seeded": True}
    return ours, theirs, batches(test_td3.transitions), options


def sac_family(loss_class, policy, critics, make_batch, **common):
    """``test_sac.loss_pair`` of ``loss_class`` (SAC, TQC, REDQ: target critics moved
    identically), seeded steps."""
    ours, theirs = test_sac.loss_pair(loss_class, policy, critics, common)
    return ours, theirs, batches(make_batch), {"updater": soft_update, "seeded": True}


def sac():
    spec = Bounded(-1.0, 1.0, (test_sac.ACT,))
    critics = [test_sac.qvalue(), test_sac.qvalue()]
    return sac_family(
        rlloss.SACLoss, test_sac.actor(), critics, test_sac.transitions,
        num_qvalue_nets=2, action_spec=spec,
    )


def discrete_sac():
    critics = [test_sac.discrete_qvalue(), test_sac.discrete_qvalue()]
    return sac_family(
        rlloss.DiscreteSACLoss, test_sac.discrete_actor(True), critics,
        lambda: test_sac.discrete_transitions(True),
        num_qvalue_nets=2, num_actions=test_sac.NUM_ACTIONS, action_space="one-hot",
    )


def tqc():
    critics = [test_tqc.quantile_critic() for _ in range(3)]
    return sac_family(
        rlloss.TQCLoss, test_sac.actor(), critics, test_tqc.transitions,
        num_qvalue_nets=3, top_quantiles_to_drop_per_net=2,
        action_spec=Bounded(-1.0, 1.0, (test_sac.ACT,)),
    )


def redq():
    critics = [test_sac.qvalue() for _ in range(4)]
    return sac_family(
        rlloss.REDQLoss, test_sac.actor(), critics, test_sac.transitions,
        num_qvalue_nets=4, sub_sample_len=2, action_spec=Bounded(-1.0, 1.0, (test_sac.ACT,)),
    )


def crossq():
    critics = [test_crossq.critic("batchnorm") for _ in range(2)]
    common = {"num_qvalue_nets": 2, "action_spec": Bounded(-1.0, 1.0, (test_sac.ACT,))}
    ours, theirs = test_crossq.loss_pair(test_sac.actor(), critics, common)
    return ours, theirs, batches(test_sac.transitions), {"seeded": True}


CASES = {
    "DQNLoss": lambda: dqn(False),
    "DQNLoss-double": lambda: dqn(True),
    "DDPGLoss": ddpg,
    "TD3Loss": lambda: td3("TD3Loss", policy_noise=0.2, noise_clip=0.5),
    "TD3BCLoss": lambda: td3("TD3BCLoss"),
    "SACLoss": sac,
    "DiscreteSACLoss": discrete_sac,
    "TQCLoss": tqc,
    "REDQLoss": redq,
    "CrossQLoss": crossq,
}


@pytest.mark.parametrize("name", list(CASES))
def test_trajectory_matches_torchrl(name):
    ours, theirs, data, options = CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's notes on updaters and estimators
        assert_same_trajectory(ours, theirs, data, **options)
