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
from tests import (
    test_act,
    test_bc,
    test_cql,
    test_crossq,
    test_diffusion_bc,
    test_distributional_dqn,
    test_dqn,
    test_dt,
    test_gail,
    test_iql,
    test_mappo,
    test_ppo,
    test_qmixer,
    test_rnd,
    test_sac,
    test_td3,
    test_tqc,
)
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
        rlloss.SACLoss,
        test_sac.actor(),
        critics,
        test_sac.transitions,
        num_qvalue_nets=2,
        action_spec=spec,
    )


def discrete_sac():
    critics = [test_sac.discrete_qvalue(), test_sac.discrete_qvalue()]
    return sac_family(
        rlloss.DiscreteSACLoss,
        test_sac.discrete_actor(True),
        critics,
        lambda: test_sac.discrete_transitions(True),
        num_qvalue_nets=2,
        num_actions=test_sac.NUM_ACTIONS,
        action_space="one-hot",
    )


def tqc():
    critics = [test_tqc.quantile_critic() for _ in range(3)]
    return sac_family(
        rlloss.TQCLoss,
        test_sac.actor(),
        critics,
        test_tqc.transitions,
        num_qvalue_nets=3,
        top_quantiles_to_drop_per_net=2,
        action_spec=Bounded(-1.0, 1.0, (test_sac.ACT,)),
    )


def redq():
    critics = [test_sac.qvalue() for _ in range(4)]
    return sac_family(
        rlloss.REDQLoss,
        test_sac.actor(),
        critics,
        test_sac.transitions,
        num_qvalue_nets=4,
        sub_sample_len=2,
        action_spec=Bounded(-1.0, 1.0, (test_sac.ACT,)),
    )


def crossq():
    critics = [test_crossq.critic("batchnorm") for _ in range(2)]
    common = {"num_qvalue_nets": 2, "action_spec": Bounded(-1.0, 1.0, (test_sac.ACT,))}
    ours, theirs = test_crossq.loss_pair(test_sac.actor(), critics, common)
    return ours, theirs, batches(test_sac.transitions), {"seeded": True}


def distributional_dqn():
    ours, theirs = test_distributional_dqn.pair()
    make = test_distributional_dqn.transitions
    return ours, theirs, batches(make), {"updater": soft_update}


def discrete_cql():
    """Without a target network: TorchRL's DiscreteCQLLoss reads ``V(s')`` from the online
    network even with one (docs/differences.md), so only the online bootstrap, which both
    compute, can be compared along a trajectory."""
    actor = test_dqn.q_actor()
    kwargs = {"action_space": "one-hot", "delay_value": False}
    ours = rlloss.DiscreteCQLLoss(copy.deepcopy(actor), **kwargs)
    theirs = torchrl_objectives.DiscreteCQLLoss(copy.deepcopy(actor), **kwargs)
    return ours, theirs, batches(test_dqn.transitions), {}


def cql():
    """Where the two penalties' groupings agree (``test_cql``: one action per proposal and
    ``s' = s``): TorchRL's log-sum-exp otherwise groups the proposals differently
    (docs/differences.md), and the trajectories part by design."""
    ours, theirs = test_cql.pair(num_random=1)

    def same_next_state():
        batch = test_sac.transitions()
        batch["next", "observation"] = batch["observation"].clone()
        return batch

    return ours, theirs, batches(same_next_state), {"updater": soft_update, "seeded": True}


def iql(discrete: bool):
    if discrete:
        networks = (
            test_sac.discrete_actor(True),
            [test_iql.discrete_qvalue(), test_iql.discrete_qvalue()],
            test_iql.value_network(),
        )
        kwargs = {"action_space": "one-hot", "expectile": 0.8}
        ours, theirs = (
            cls(*copy.deepcopy(networks), **kwargs)
            for cls in (rlloss.DiscreteIQLLoss, torchrl_objectives.DiscreteIQLLoss)
        )
        make = lambda: test_sac.discrete_transitions(True)  # noqa: E731
    else:
        ours, theirs = test_iql.pair()
        make = test_sac.transitions
    return ours, theirs, batches(make), {"updater": soft_update, "seeded": True}


def on_policy(name: str, **kwargs):
    """``test_ppo.pair``: the same perturbed actor and critic, one rollout trained on for every
    step (as PPO's epochs)."""
    ours, theirs, batch = test_ppo.pair(name, **kwargs)
    return ours, theirs, [batch], {"seeded": True}


def masked_on_policy():
    """ClipPPOLoss on a ``[B, T]`` rollout whose sequences are padded at the end and masked by
    ``("collector", "mask")``, which both libraries read (as ``tutorials/recurrent_ppo_cartpole.py``
    feeds it, l2 critic). Without advantage normalisation: TorchRL normalises over the padded
    steps too, rlloss over the valid ones (docs/differences.md; ``test_ppo``'s
    ``test_mask_reduces_over_valid_steps_only`` checks rlloss's against the valid rows alone)."""
    ours, theirs, _ = test_ppo.pair("ClipPPOLoss", loss_critic_type="l2", entropy_coeff=0.0)
    torch.manual_seed(5)
    batch = test_ppo.rollout(test_ppo.make_actor(), batch_size=(4, 8))
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[0, 5:] = False
    mask[2, 2:] = False
    batch["collector", "mask"] = mask
    return ours, theirs, [batch], {"seeded": True}


def multi_agent(name: str):
    """``test_mappo``'s per-agent networks (a centralised critic for MAPPO) on copies, one
    rollout with its per-agent advantages trained on for every step."""
    policy = test_mappo.actor()
    value = test_mappo.critic(centralized=name == "MAPPOLoss")
    losses = []
    for library in (rlloss, torchrl_objectives):
        loss = getattr(library, name)(copy.deepcopy(policy), copy.deepcopy(value))
        loss.set_keys(value=("agents", "state_value"), action=("agents", "action"))
        losses.append(loss)
    return *losses, [test_mappo.batch_with_advantage(policy)], {"seeded": True}


def qmixer():
    ours, theirs = test_qmixer.pair("categorical", "qmix")
    make = lambda: test_qmixer.team_batch("categorical")  # noqa: E731
    return ours, theirs, batches(make), {"updater": soft_update}


def rnd():
    predictor, target = test_rnd.networks()
    ours = rlloss.RNDLoss(copy.deepcopy(predictor), copy.deepcopy(target))
    theirs = torchrl_objectives.RNDLoss(copy.deepcopy(predictor), copy.deepcopy(target))
    return ours, theirs, batches(test_rnd.visited), {"seeded": True, **FLOAT32}


FLOAT32 = {"float32": True, "tolerance": 1e-5}


def imitation(ours_class, theirs_class, network, make_batch, float32=False, **kwargs):
    """Losses without targets on one network (behaviour cloning and its kin)."""
    ours = ours_class(copy.deepcopy(network), **kwargs)
    theirs = theirs_class(copy.deepcopy(network), **kwargs)
    return ours, theirs, batches(make_batch), {"seeded": True, **(FLOAT32 if float32 else {})}


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
    "DistributionalDQNLoss": distributional_dqn,
    "DiscreteCQLLoss": discrete_cql,
    "CQLLoss": cql,
    "IQLLoss": lambda: iql(False),
    "DiscreteIQLLoss": lambda: iql(True),
    "PPOLoss": lambda: on_policy("PPOLoss"),
    "ClipPPOLoss": lambda: on_policy("ClipPPOLoss", clip_value=0.2),
    "ClipPPOLoss-masked": masked_on_policy,
    # beta held constant: rlloss's gradient uses the beta it adapts in the forward, TorchRL's
    # the one before (docs/differences.md), so an adapting beta parts the trajectories
    "KLPENPPOLoss": lambda: on_policy("KLPENPPOLoss", increment=1.0, decrement=1.0),
    "A2CLoss": lambda: on_policy("A2CLoss"),
    "ReinforceLoss": lambda: on_policy("ReinforceLoss"),
    "QMixerLoss": qmixer,
    "MAPPOLoss": lambda: multi_agent("MAPPOLoss"),
    "IPPOLoss": lambda: multi_agent("IPPOLoss"),
    "BCLoss": lambda: imitation(
        rlloss.BCLoss,
        torchrl_objectives.BCLoss,
        test_bc.deterministic_actor(),
        test_bc.demonstrations,
    ),
    # GAIL's and RND's computations are float32 in both libraries whatever the inputs (GAIL's
    # labels, RND's observations cast with .float()): compared in float32, within 1e-5
    "GAILLoss": lambda: imitation(
        rlloss.GAILLoss,
        torchrl_objectives.GAILLoss,
        test_gail.discriminator(),
        test_gail.pairs,
        float32=True,
        use_grad_penalty=True,
        gp_lambda=2.0,
    ),
    "DTLoss": lambda: imitation(
        rlloss.DTLoss,
        torchrl_objectives.DTLoss,
        test_dt.deterministic_actor(),
        test_dt.trajectories,
    ),
    "OnlineDTLoss": lambda: imitation(
        rlloss.OnlineDTLoss,
        torchrl_objectives.OnlineDTLoss,
        test_dt.stochastic_actor(),
        test_dt.trajectories,
    ),
    "ACTLoss": lambda: imitation(
        rlloss.ACTLoss,
        torchrl_objectives.ACTLoss,
        test_act.policy(),
        test_act.chunks,
        kl_weight=10.0,
    ),
    "DiffusionBCLoss": lambda: imitation(
        rlloss.DiffusionBCLoss,
        torchrl_objectives.DiffusionBCLoss,
        test_diffusion_bc.actor(),
        test_diffusion_bc.demonstrations,
    ),
    "RNDLoss": rnd,
}


# The default run keeps DQN's two cases (a few seconds); the others, about 5 s of CPU each, are
# marked slow (CI runs them: ``--runslow``).
DEFAULT_RUN = {"DQNLoss", "DQNLoss-double"}


FLOAT32_CASES = {"GAILLoss", "RNDLoss"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[] if n in DEFAULT_RUN else [pytest.mark.slow]) for n in CASES],
)
def test_trajectory_matches_torchrl(name, float64_default):
    if name in FLOAT32_CASES:
        torch.set_default_dtype(torch.float32)
    ours, theirs, data, options = CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's notes on updaters and estimators
        assert_same_trajectory(ours, theirs, data, **options)


def test_a_change_of_maths_breaks_the_trajectory(float64_default):
    """The check can fail: the same DQN pair with a discount of 0.9 against 0.9 + 1e-6 (a change
    that one call's parity at float32 tolerances would not see) ends apart."""
    ours, theirs, data, options = CASES["DQNLoss"]()
    theirs.make_value_estimator(gamma=0.9 + 1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError):
            assert_same_trajectory(ours, theirs, data, **options)
