"""The module paths of the flat layout (before the family folders) still import, and hold the
public names they held (``rlloss.MOVED_MODULES``); the family packages re-export their bases."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import rlloss

# old module -> public names it defined before the family folders
OLD_PUBLIC_NAMES = {
    "a2c": ["A2CLoss", "ReinforceLoss"],
    "ppo": ["PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "RPOLoss"],
    "dqn": ["DQNLoss", "DDQNLoss", "DiscreteCQLLoss", "DistributionalDQNLoss"],
    "ddpg": ["DDPGLoss"],
    "td3": ["TD3Loss", "TD3BCLoss", "action_bounds"],
    "sac": ["SACLoss", "DiscreteSACLoss", "CQLLoss", "TQCLoss", "REDQLoss", "CrossQLoss"],
    "mpo": ["MPOLoss", "DiscreteMPOLoss"],
    "iql": ["IQLLoss", "DiscreteIQLLoss"],
    "distributed": ["all_mean", "all_sum", "all_moments", "global_standardize", "resolve_group"],
    "normalizers": ["RewardNormalizer", "ValueNormalizer", "merged_moments"],
    "schedulers": ["KLAdaptiveLR", "KLEarlyStopping", "PiecewiseSchedule", "kl_exceeds"],
    "sequences": ["chunk_sequences", "recurrent_state_keys", "recurrent_modules"],
    "update": ["Update", "compile_update"],
    "updaters": ["SoftUpdate", "HardUpdate"],
    "onpolicy": ["OnPolicyLoss", "as_scalar_output"],
    "offpolicy": ["TDTargetLoss", "ensemble_architecture", "ACTION_SPACES", "PRIORITY_WEIGHTINGS"],
    "estimators": [
        "GAE",
        "MultiAgentGAE",
        "TD0Estimator",
        "TD1Estimator",
        "TDLambdaEstimator",
        "VTrace",
        "ValueEstimator",
        "build_value_estimator",
        "DEFAULT_GAMMA",
    ],
}


def test_every_moved_module_is_checked():
    assert set(rlloss.MOVED_MODULES) <= set(OLD_PUBLIC_NAMES)


@pytest.mark.parametrize("old", sorted(OLD_PUBLIC_NAMES))
def test_old_module_path_keeps_its_public_names(old):
    module = importlib.import_module(f"rlloss.{old}")
    assert getattr(rlloss, old) is module  # ``import rlloss.sac; rlloss.sac.SACLoss`` works
    missing = [name for name in OLD_PUBLIC_NAMES[old] if not hasattr(module, name)]
    assert not missing, f"rlloss.{old} lost {missing}"
    for name in OLD_PUBLIC_NAMES[old]:
        if hasattr(rlloss, name):  # the same object as the public name
            assert getattr(module, name) is getattr(rlloss, name)


def test_old_paths_import_first_in_a_fresh_interpreter():
    """``from rlloss.sac import CQLLoss`` as the first import of a process."""
    script = "from rlloss.sac import CQLLoss\nfrom rlloss.dqn import DiscreteCQLLoss\nprint('ok')"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_pickled_loss_classes_resolve_by_their_new_paths():
    """A class pickles under its defining module, which imports on its own."""
    import pickle

    assert pickle.loads(pickle.dumps(rlloss.SACLoss)) is rlloss.SACLoss
    assert rlloss.SACLoss.__module__ == "rlloss.offpolicy.sac"
