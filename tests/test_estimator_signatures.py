"""The estimators' signatures name every keyword of TorchRL 0.14.1's class of the same name
(``ValueEstimator``: TorchRL's ``ValueEstimatorBase``), keyword-only as TorchRL's, with TorchRL's
defaults, and no catch-all (issue 47's convention)."""

from __future__ import annotations

import inspect

import pytest
from torchrl.objectives.value import advantages as torchrl_advantages

import rlloss

# TorchRL requires value_network; rlloss reads the values from the batch without one
# (docs/differences.md, "Value estimators").
OPTIONAL_HERE = {"value_network"}
CLASSES = [
    ("GAE", "GAE"),
    ("TD0Estimator", "TD0Estimator"),
    ("TD1Estimator", "TD1Estimator"),
    ("TDLambdaEstimator", "TDLambdaEstimator"),
    ("VTrace", "VTrace"),
    ("MultiAgentGAE", "MultiAgentGAE"),
    ("ValueEstimator", "ValueEstimatorBase"),
]


def torchrl_parameters(name: str) -> dict[str, inspect.Parameter]:
    parameters = dict(inspect.signature(getattr(torchrl_advantages, name).__init__).parameters)
    if name == "MultiAgentGAE":  # TorchRL's forwards **kwargs to GAE
        del parameters["kwargs"]
        parameters |= inspect.signature(torchrl_advantages.GAE.__init__).parameters
    return {k: v for k, v in parameters.items() if k != "self"}


@pytest.mark.parametrize("ours, theirs", CLASSES)
def test_every_torchrl_keyword_is_named_with_its_default_and_kind(ours, theirs):
    mine = dict(inspect.signature(getattr(rlloss, ours).__init__).parameters)
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in mine.values()), mine
    assert all(p.kind is not inspect.Parameter.VAR_POSITIONAL for p in mine.values()), mine
    for name, parameter in torchrl_parameters(theirs).items():
        assert name in mine, f"{ours} does not name TorchRL's {name!r}"
        assert mine[name].kind == parameter.kind, name
        if name in OPTIONAL_HERE:
            assert parameter.default is inspect.Parameter.empty and mine[name].default is None
        else:
            assert mine[name].default == parameter.default, name
        assert mine[name].annotation is not inspect.Parameter.empty, name


@pytest.mark.parametrize("ours, theirs", CLASSES)
def test_torchrl_keyword_order_is_kept(ours, theirs):
    mine = [n for n in inspect.signature(getattr(rlloss, ours).__init__).parameters if n != "self"]
    order = [n for n in torchrl_parameters(theirs) if n in mine]
    assert [n for n in mine if n in order] == order
