"""The package layout: ``import rlloss`` loads only real modules (files of the package, no
synthetic aliases), the family packages re-export their bases, and the module paths of the
unreleased flat layout (``rlloss.sac``, ``rlloss.ppo``...) are gone."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import pytest

import rlloss

# family package -> the bases and helpers it re-exports
FAMILY_NAMES = {
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

# module paths of the flat layout before the family folders (never released)
FLAT_PATHS = ["a2c", "ppo", "dqn", "ddpg", "td3", "sac", "mpo", "iql", "distributed"]
FLAT_PATHS += ["normalizers", "schedulers", "sequences", "update", "updaters"]


@pytest.mark.parametrize("family", sorted(FAMILY_NAMES))
def test_family_package_re_exports_its_bases(family):
    module = importlib.import_module(f"rlloss.{family}")
    assert getattr(rlloss, family) is module
    missing = [name for name in FAMILY_NAMES[family] if not hasattr(module, name)]
    assert not missing, f"rlloss.{family} lost {missing}"
    for name in FAMILY_NAMES[family]:
        if hasattr(rlloss, name):  # the same object as the public name
            assert getattr(module, name) is getattr(rlloss, name)


def test_import_rlloss_loads_only_files_of_the_package():
    """Every ``rlloss.*`` entry of ``sys.modules`` after a fresh ``import rlloss`` is a file
    under ``rlloss/``: no module is synthesised at import."""
    root = pathlib.Path(rlloss.__file__).resolve().parent
    script = (
        "import sys, rlloss\n"
        "for name, m in sorted(sys.modules.items()):\n"
        "    if name == 'rlloss' or name.startswith('rlloss.'):\n"
        "        print(name, getattr(m, '__file__', None))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(loaded) > 50, loaded  # the whole package, not an empty listing
    outside = {
        name: path
        for name, path in loaded.items()
        if path == "None" or root not in pathlib.Path(path).resolve().parents
    }
    assert not outside, f"modules that are not files of {root}: {outside}"
    for name, path in loaded.items():  # each module name matches its file
        relative = pathlib.Path(path).resolve().relative_to(root.parent).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        assert ".".join(parts) == name, (name, path)


@pytest.mark.parametrize("old", FLAT_PATHS)
def test_flat_layout_paths_are_gone(old):
    assert not hasattr(rlloss, old)
    with pytest.raises(ModuleNotFoundError, match=f"rlloss.{old}"):
        importlib.import_module(f"rlloss.{old}")


def test_pickled_loss_classes_resolve_by_their_new_paths():
    """A class pickles under its defining module, which imports on its own."""
    import pickle

    assert pickle.loads(pickle.dumps(rlloss.SACLoss)) is rlloss.SACLoss
    assert rlloss.SACLoss.__module__ == "rlloss.offpolicy.sac"
