"""Every public class spells out its constructor (issue 47): no catch-all (``**kwargs``,
``*args``), an annotation on every parameter, and every keyword of TorchRL 0.14.1's class of
the same name named with TorchRL's default and kind (keyword-only or not), or listed in
``EXCEPTIONS`` with its reason and described in docs/differences.md."""

from __future__ import annotations

import functools
import importlib
import inspect
from pathlib import Path

import pytest

import rlloss

P = inspect.Parameter
_CATCH_ALL = (P.VAR_KEYWORD, P.VAR_POSITIONAL)
_TORCHRL_MODULES = (
    "torchrl.objectives",
    "torchrl.objectives.value",
    "torchrl.objectives.multiagent",
    "torchrl.objectives.llm",
)
_DIFFERENCES = (Path(__file__).parent.parent / "docs" / "differences.md").read_text()

# (class, TorchRL keyword) -> why rlloss's parameter differs from TorchRL's (default or kind);
# each is described under the class in docs/differences.md.
EXCEPTIONS = {
    ("ReinforceLoss", "actor_network"): (
        "optional, as in rlloss's other on-policy losses, so that TorchRL's own alias actor= "
        "can stand in for it (TorchRL's ReinforceLoss requires it positionally)"
    ),
    ("DistributionalDQNLoss", "gamma"): (
        "defaults to 0.99 (TorchRL requires it), as every other off-policy loss's gamma"
    ),
    **{
        (name, "value_network"): (
            "optional: without a network the values are read from the batch (TorchRL requires it)"
        )
        for name in ("GAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace")
    },
    ("KLAdaptiveLR", "target_kl"): "skrl's rule and keywords first; TorchRL's as keywords",
    ("KLAdaptiveLR", "factor"): "skrl's rule and keywords first; TorchRL's as keywords",
    ("KLAdaptiveLR", "min_lr"): "skrl's rule and keywords first; TorchRL's as keywords",
    ("KLAdaptiveLR", "max_lr"): "skrl's rule and keywords first; TorchRL's as keywords",
}


def _public_classes() -> list[str]:
    names = [name for name in rlloss.__all__ if inspect.isclass(getattr(rlloss, name))]
    return [name for name in names if not issubclass(getattr(rlloss, name), BaseException)]


def _torchrl_class(name: str):
    for module in _TORCHRL_MODULES:
        found = getattr(importlib.import_module(module), name, None)
        if inspect.isclass(found):
            return found
    return None


PUBLIC = _public_classes()
SHARED = [name for name in PUBLIC if _torchrl_class(name) is not None]


def _parameters(cls) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls).parameters)


def _torchrl_keywords(name: str) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(_torchrl_class(name).__init__).parameters
    return {k: p for k, p in parameters.items() if k != "self" and p.kind not in _CATCH_ALL}


def _same_default(theirs, ours) -> bool:
    if theirs is ours:
        return True
    try:
        same = theirs == ours
    except Exception:  # e.g. tensors: compare by identity only
        return False
    return same if isinstance(same, bool) else False


def _mismatches(name: str) -> list[str]:
    """TorchRL's keywords of ``name`` that rlloss's class does not name, or names with another
    default or kind; ``keyword: why`` each."""
    ours = _parameters(getattr(rlloss, name))
    wrong = []
    for keyword, theirs in _torchrl_keywords(name).items():
        if keyword not in ours:
            wrong.append(f"{keyword}: not named")
            continue
        mine = ours[keyword]
        if (theirs.kind == P.KEYWORD_ONLY) != (mine.kind == P.KEYWORD_ONLY):
            wrong.append(f"{keyword}: {mine.kind.description}, TorchRL's is {theirs.kind}")
        if not _same_default(theirs.default, mine.default):
            wrong.append(f"{keyword}: default {mine.default!r}, TorchRL's {theirs.default!r}")
    return wrong


def test_the_tables_cover_the_shared_classes():
    assert len(PUBLIC) >= 70 and len(SHARED) >= 55  # the tables below are not empty
    assert {"PPOLoss", "SACLoss", "GAE", "MAPPOLoss", "GRPOLoss"} <= set(SHARED)


@pytest.mark.parametrize("name", PUBLIC)
def test_no_catch_all(name):
    caught = [f"{p}" for p in _parameters(getattr(rlloss, name)).values() if p.kind in _CATCH_ALL]
    assert not caught, f"{name} takes {caught}: name each keyword it accepts instead."


@pytest.mark.parametrize("name", PUBLIC)
def test_every_parameter_is_annotated(name):
    parameters = _parameters(getattr(rlloss, name)).values()
    bare = [p.name for p in parameters if p.annotation is P.empty]
    assert not bare, f"{name}: no annotation on {bare}."


@pytest.mark.parametrize("name", SHARED)
def test_torchrl_keywords_named_with_torchrl_default_and_kind(name):
    wrong = [
        reason for reason in _mismatches(name) if (name, reason.split(":")[0]) not in EXCEPTIONS
    ]
    assert not wrong, f"{name} differs from TorchRL 0.14.1's: {wrong}"


@pytest.mark.parametrize(("name", "keyword"), sorted(EXCEPTIONS))
def test_each_exception_is_needed_and_documented(name, keyword):
    assert any(reason.startswith(f"{keyword}:") for reason in _mismatches(name)), (
        f"{name}.{keyword} now matches TorchRL: drop its EXCEPTIONS row."
    )
    assert f"`{name}`" in _DIFFERENCES and f"`{keyword}`" in _DIFFERENCES


# ------------------------------------------------- TorchRL's translated keywords, now named
def _builders() -> dict:
    """Class name -> ``build(**kwargs)`` with tiny networks (the contract table's)."""
    from tests import test_distributional_dqn, test_sac, test_tqc
    from tests.test_contract import cql_row, dqn_row, iql_row, ppo_row, sac_row, td3_row

    def on_policy(name, **kw):
        return ppo_row(name, **kw).build()

    def sac_family(name, critic=test_sac.qvalue):
        return lambda **kw: getattr(rlloss, name)(test_sac.actor(), critic(), **kw)

    return {
        **{name: functools.partial(on_policy, name) for name in _ON_POLICY},
        "DQNLoss": lambda **kw: dqn_row(**kw).build(),
        "DistributionalDQNLoss": lambda **kw: rlloss.DistributionalDQNLoss(
            test_distributional_dqn.c51_actor(), **kw
        ),
        "TD3Loss": lambda **kw: td3_row(**kw).build(),
        "TD3BCLoss": lambda **kw: td3_row(name="TD3BCLoss", **kw).build(),
        "SACLoss": lambda **kw: sac_row(**kw).build(),
        "DiscreteSACLoss": lambda **kw: sac_row(discrete=True, **kw).build(),
        "REDQLoss": sac_family("REDQLoss"),
        "CrossQLoss": sac_family("CrossQLoss"),
        "TQCLoss": sac_family("TQCLoss", test_tqc.quantile_critic),
        "IQLLoss": lambda **kw: iql_row(**kw).build(),
        "DiscreteIQLLoss": lambda **kw: iql_row(discrete=True, **kw).build(),
        "CQLLoss": lambda **kw: cql_row(**kw).build(),
    }


_ON_POLICY = ("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss", "RPOLoss", "A2CLoss")
_PRIORITY_KEY = ("DQNLoss", "DistributionalDQNLoss", "TD3Loss", "TD3BCLoss", "SACLoss")
_PRIORITY_KEY += ("DiscreteSACLoss", "REDQLoss", "CrossQLoss", "IQLLoss", "DiscreteIQLLoss")
_DEACTIVATE_VMAP = ("TD3Loss", "TD3BCLoss", "SACLoss", "DiscreteSACLoss", "REDQLoss")
_DEACTIVATE_VMAP += ("CrossQLoss", "TQCLoss", "IQLLoss", "CQLLoss")


@pytest.mark.parametrize("name", _ON_POLICY)
@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"gamma": 0.9}, TypeError, "make_value_estimator"),
        ({"advantage_key": "adv"}, RuntimeError, r"set_keys\(advantage='adv'\)"),
        ({"value_target_key": "vt"}, RuntimeError, r"set_keys\(value_target='vt'\)"),
        ({"entropy_coef": None}, TypeError, "'entropy_coef' has been removed in torchrl v0.11"),
        ({"critic_coef": 0.5}, TypeError, "'critic_coef' has been removed in torchrl v0.11"),
    ],
)
def test_on_policy_torchrl_keywords_keep_torchrl_errors(name, keywords, error, message):
    """Named in the signature now, TorchRL's removed keywords still raise TorchRL's errors
    (``entropy_coef=None`` too: TorchRL raises whatever the value)."""
    with pytest.raises(error, match=message):
        _builders()[name](**keywords)


@pytest.mark.parametrize("name", _PRIORITY_KEY)
def test_priority_key_keeps_torchrl_error(name):
    with pytest.raises(RuntimeError, match=rf"{name}: .*set_keys\(priority='p'\)"):
        _builders()[name](priority_key="p")


@pytest.mark.parametrize("name", _DEACTIVATE_VMAP)
def test_deactivate_vmap_is_kept_as_given(name):
    build = _builders()[name]
    assert build().deactivate_vmap is False
    assert build(deactivate_vmap=True).deactivate_vmap is True


def test_on_policy_entropy_coeff_none_is_torchrl_default():
    build = _builders()["ClipPPOLoss"]
    assert float(build(entropy_coeff=None).entropy_coeff) == pytest.approx(0.01)
    assert float(build().entropy_coeff) == pytest.approx(0.01)
