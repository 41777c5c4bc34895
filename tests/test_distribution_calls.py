"""rlloss._distribution_calls: ``DistributionCall(actor)`` picks one class per kind of actor,
and every class gives what the actor's own ``get_dist`` gives, without writing to the batch."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import ProbabilisticTensorDictSequential

from rlloss._distribution_calls import (
    DistributionCall,
    OpaqueDistributionCall,
    PlannedDistributionCall,
    SplitDistributionCall,
    SquashedDistributionCall,
)
from tests.nets import OBS, make_actor


class OwnGetDist(ProbabilisticTensorDictSequential):
    """An actor with a ``get_dist`` of its own: its parameters cannot be taken apart."""

    def get_dist(self, tensordict, **kwargs):
        return super().get_dist(tensordict, **kwargs)


def opaque_actor():
    actor = make_actor("normal")
    return OwnGetDist(*actor.module, return_composite=False)


def split_actor():
    """An actor whose parameter module has a forward hook (the planner leaves it alone)."""
    actor = make_actor("normal")
    actor.module[0].register_forward_hook(lambda module, args, out: out)
    return actor


ACTORS = {
    "opaque": (opaque_actor, OpaqueDistributionCall),
    "split": (split_actor, SplitDistributionCall),
    "planned-normal": (lambda: make_actor("normal"), PlannedDistributionCall),
    "planned-categorical": (lambda: make_actor("categorical"), PlannedDistributionCall),
    "squashed": (lambda: make_actor("tanh_normal"), SquashedDistributionCall),
}


@pytest.mark.parametrize("name", list(ACTORS))
def test_the_factory_picks_the_actors_case_and_matches_get_dist(name):
    torch.manual_seed(0)
    build, expected_class = ACTORS[name]
    actor = build()
    call = DistributionCall(actor)
    assert type(call) is expected_class and isinstance(call, DistributionCall)
    assert (call.splittable, call.direct, call.squashes) == (
        expected_class is not OpaqueDistributionCall,
        issubclass(expected_class, PlannedDistributionCall),
        expected_class is SquashedDistributionCall,
    )
    batch = TensorDict({"observation": torch.randn(7, OBS)}, [7])
    before = set(batch.keys())
    ours, theirs = call(batch), actor.get_dist(batch.clone())
    assert set(batch.keys()) == before  # nothing written into the caller's batch
    action = theirs.sample()
    torch.testing.assert_close(ours.log_prob(action), theirs.log_prob(action))
    params = call.distribution_parameters(batch)
    expected = actor.get_dist_params(batch.clone())
    for key, value in params.items():
        torch.testing.assert_close(value, expected[key])


@pytest.mark.parametrize("name", ["split", "planned-normal", "squashed"])
def test_perturb_builds_the_distribution_from_the_returned_parameters(name):
    torch.manual_seed(0)
    actor = ACTORS[name][0]()
    batch = TensorDict({"observation": torch.randn(7, OBS)}, [7])
    shifted = DistributionCall(actor)(batch, perturb=lambda p: {**p, "loc": p["loc"] + 0.25})
    params = actor.get_dist_params(batch.clone())
    params.set("loc", params["loc"] + 0.25)
    expected = actor.module[-1].get_dist(params)
    action = expected.sample()
    torch.testing.assert_close(shifted.log_prob(action), expected.log_prob(action))


@pytest.mark.parametrize("name", list(ACTORS))
def test_a_copied_or_pickled_call_keeps_its_case(name):
    call = DistributionCall(ACTORS[name][0]())
    assert type(copy.deepcopy(call)) is type(call)
    if name not in ("opaque", "split"):  # a local class, a hook's lambda: not picklable
        assert type(pickle.loads(pickle.dumps(call))) is type(call)
