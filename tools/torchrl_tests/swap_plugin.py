"""pytest plugin: run TorchRL's own objective tests against rlloss's classes.

Load with ``-p swap_plugin`` (this folder on ``PYTHONPATH``).  Plugins given with ``-p``
are imported before any conftest or test module, so the swap is in place when the test
modules execute ``from torchrl.objectives import PPOLoss`` and friends.

Environment:
  RLLOSS_SWAP=1     patch rlloss's classes into torchrl's namespaces (default 0: TorchRL's own).
  RLLOSS_SWAP_SAMPLERS=1  also patch ``rlloss.data.PrioritizedSampler`` and ``RandomSampler``
                    over TorchRL's (for its replay-buffer tests, ``test/rb``; see README.md).
  RLLOSS_RESULTS=F  append one JSON line per test to F (nodeid, outcome, message, ...).
                    Written as each test finishes, so a run killed by ``timeout`` keeps what
                    it had done.

Per test it also records ``touched``: whether the test (setup, call or teardown) constructed
at least one instance of the swapped classes (whichever implementation is active), so
tests that only exercise other TorchRL code can be told apart, and ``classes``: the sorted names
of the swapped classes it constructed (each construction counts once, under the most derived
swapped class of the new object: building a ``ClipPPOLoss`` counts ``ClipPPOLoss``, not the
``PPOLoss`` whose ``__init__`` it calls). ``gate.py`` attributes tests to classes by it.
"""

from __future__ import annotations

import functools
import json
import os

import pytest

SWAP = os.environ.get("RLLOSS_SWAP", "0") == "1"
SWAP_SAMPLERS = os.environ.get("RLLOSS_SWAP_SAMPLERS", "0") == "1"
# the defining modules of TorchRL's samplers and every namespace that re-exports them or builds
# one (every buffer's default RandomSampler, the prioritized buffers' PrioritizedSampler)
SAMPLER_MODULES = [
    "torchrl.data.replay_buffers.samplers.prioritized",
    "torchrl.data.replay_buffers.samplers.random",
    "torchrl.data.replay_buffers.samplers",
    "torchrl.data.replay_buffers",
    "torchrl.data",
    "torchrl.data.replay_buffers.replay_buffers.base",
    "torchrl.data.replay_buffers.replay_buffers.prioritized",
    "torchrl.data.replay_buffers.replay_buffers.prioritized_tensordict",
    "torchrl.data.replay_buffers.her",
]
SAMPLERS = ("PrioritizedSampler", "RandomSampler")
RESULTS = os.environ.get("RLLOSS_RESULTS")

# name -> torchrl modules whose attribute is replaced: the defining module plus the package
# namespaces that re-export it (the ones the tests import from).
TARGETS = {
    "PPOLoss": ["torchrl.objectives.ppo", "torchrl.objectives"],
    "ClipPPOLoss": ["torchrl.objectives.ppo", "torchrl.objectives"],
    "KLPENPPOLoss": ["torchrl.objectives.ppo", "torchrl.objectives"],
    "A2CLoss": ["torchrl.objectives.a2c", "torchrl.objectives"],
    "ReinforceLoss": ["torchrl.objectives.reinforce", "torchrl.objectives"],
    "DQNLoss": ["torchrl.objectives.dqn", "torchrl.objectives"],
    "DiscreteCQLLoss": ["torchrl.objectives.cql", "torchrl.objectives"],
    "DistributionalDQNLoss": ["torchrl.objectives.dqn", "torchrl.objectives"],
    "CQLLoss": ["torchrl.objectives.cql", "torchrl.objectives"],
    "DDPGLoss": ["torchrl.objectives.ddpg", "torchrl.objectives"],
    "TD3Loss": ["torchrl.objectives.td3", "torchrl.objectives"],
    "TD3BCLoss": ["torchrl.objectives.td3_bc", "torchrl.objectives"],
    "SACLoss": ["torchrl.objectives.sac", "torchrl.objectives"],
    "DiscreteSACLoss": ["torchrl.objectives.sac", "torchrl.objectives"],
    "IQLLoss": ["torchrl.objectives.iql", "torchrl.objectives"],
    "DiscreteIQLLoss": ["torchrl.objectives.iql", "torchrl.objectives"],
    "TQCLoss": ["torchrl.objectives.tqc", "torchrl.objectives"],
    "REDQLoss": ["torchrl.objectives.redq", "torchrl.objectives"],
    "CrossQLoss": ["torchrl.objectives.crossq", "torchrl.objectives"],
    "MAPPOLoss": ["torchrl.objectives.multiagent.mappo", "torchrl.objectives.multiagent", "torchrl.objectives"],
    "IPPOLoss": ["torchrl.objectives.multiagent.mappo", "torchrl.objectives.multiagent", "torchrl.objectives"],
    "QMixerLoss": ["torchrl.objectives.multiagent.qmixer", "torchrl.objectives.multiagent", "torchrl.objectives"],
    "BCLoss": ["torchrl.objectives.bc", "torchrl.objectives"],
    "RNDLoss": ["torchrl.objectives.rnd", "torchrl.objectives"],
    "GAILLoss": ["torchrl.objectives.gail", "torchrl.objectives"],
    "ACTLoss": ["torchrl.objectives.act", "torchrl.objectives"],
    "DiffusionBCLoss": ["torchrl.objectives.diffusion_bc", "torchrl.objectives"],
    "DTLoss": ["torchrl.objectives.decision_transformer", "torchrl.objectives"],
    "OnlineDTLoss": ["torchrl.objectives.decision_transformer", "torchrl.objectives"],
    "GAE": ["torchrl.objectives.value.advantages", "torchrl.objectives.value"],
    "TD0Estimator": ["torchrl.objectives.value.advantages", "torchrl.objectives.value"],
    "TD1Estimator": ["torchrl.objectives.value.advantages", "torchrl.objectives.value"],
    "TDLambdaEstimator": [
        "torchrl.objectives.value.advantages",
        "torchrl.objectives.value",
    ],
    "VTrace": ["torchrl.objectives.value.advantages", "torchrl.objectives.value"],
    "MultiAgentGAE": ["torchrl.objectives.value.advantages", "torchrl.objectives.value"],
    "DreamerModelLoss": ["torchrl.objectives.dreamer", "torchrl.objectives"],
    "DreamerActorLoss": ["torchrl.objectives.dreamer", "torchrl.objectives"],
    "DreamerValueLoss": ["torchrl.objectives.dreamer", "torchrl.objectives"],
    "DreamerV3ActorLoss": ["torchrl.objectives.dreamer_v3", "torchrl.objectives"],
    "DreamerV3Loss": ["torchrl.objectives.dreamer_v3", "torchrl.objectives"],
    "DreamerV3ModelLoss": ["torchrl.objectives.dreamer_v3", "torchrl.objectives"],
    "DreamerV3ValueLoss": ["torchrl.objectives.dreamer_v3", "torchrl.objectives"],
    "ExponentialQuadraticCost": ["torchrl.objectives.pilco", "torchrl.objectives"],
    "WorldModelLoss": ["torchrl.objectives.world_model_loss", "torchrl.objectives"],
    "SoftUpdate": ["torchrl.objectives.utils", "torchrl.objectives"],
    "HardUpdate": ["torchrl.objectives.utils", "torchrl.objectives"],
    "KLAdaptiveLR": ["torchrl.objectives.utils", "torchrl.objectives"],
    # the base class: the tests' own losses (test_loss_module.py's toy losses) subclass ours
    # (TorchRL's losses keep TorchRL's base: they are defined before the swap)
    "LossModule": ["torchrl.objectives.common", "torchrl.objectives"],
    # the LLM losses live in torchrl.objectives.llm (not re-exported by torchrl.objectives)
    "GRPOLoss": ["torchrl.objectives.llm.grpo", "torchrl.objectives.llm"],
    "DAPO": ["torchrl.objectives.llm.grpo", "torchrl.objectives.llm"],
    "CISPOLoss": ["torchrl.objectives.llm.grpo", "torchrl.objectives.llm"],
    "SFTLoss": ["torchrl.objectives.llm.sft", "torchrl.objectives.llm"],
    "DistillationLoss": ["torchrl.objectives.llm.distillation", "torchrl.objectives.llm"],
    # a replay-buffer transform; RayMCAdvantage builds its actor's MCAdvantage from the
    # grpo module's global, so the swap reaches it too
    "MCAdvantage": ["torchrl.objectives.llm.grpo", "torchrl.objectives.llm"],
    "MCAdvantageSelector": ["torchrl.objectives.llm.grpo", "torchrl.objectives.llm"],
}

_TOUCHED = set()
ACTIVE = {}
# active class -> its name (the name under which a construction is recorded)
_NAMES = {}


def _swapped_name(obj_type):
    """The name of the most derived swapped class in ``obj_type``'s MRO; for ``LossModule``
    only the tests' own subclasses count (TorchRL's unswapped losses subclass TorchRL's base in
    both settings: counting them would credit the reference alone)."""
    for klass in obj_type.__mro__:
        if klass in _NAMES:
            name = _NAMES[klass]
            if name == "LossModule" and obj_type.__module__.startswith(("torchrl.", "rlloss.")):
                return None
            return name
    return None


def _track(cls):
    """Count constructions of ``cls`` (wraps ``__init__``; signature preserved via __wrapped__)."""
    orig = cls.__init__
    if getattr(orig, "_dropin_tracked", False) and "__init__" in cls.__dict__:
        return

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        name = _swapped_name(type(self))
        if name is not None:
            _TOUCHED.add(name)
        return orig(self, *args, **kwargs)

    __init__._dropin_tracked = True
    cls.__init__ = __init__


def _install():
    import importlib

    import torchrl.objectives  # noqa: F401
    import torchrl.objectives.value.advantages  # noqa: F401

    if SWAP:
        import rlloss  # imported first: rlloss subclasses some of TorchRL's classes

    for name, modnames in TARGETS.items():
        mods = [importlib.import_module(m) for m in modnames]
        orig = getattr(mods[0], name)
        new = getattr(rlloss, name) if SWAP else orig
        for m in mods:
            setattr(m, name, new)
        ACTIVE[name] = new
    if SWAP_SAMPLERS:
        import rlloss.data

        for name in SAMPLER_MODULES:
            module = importlib.import_module(name)
            for sampler in SAMPLERS:
                if hasattr(module, sampler):
                    setattr(module, sampler, getattr(rlloss.data, sampler))
        ACTIVE.update({sampler: getattr(rlloss.data, sampler) for sampler in SAMPLERS})
    _NAMES.update({cls: name for name, cls in ACTIVE.items()})
    for cls in set(ACTIVE.values()):
        _track(cls)


_install()


def pytest_report_header(config):
    lines = [f"dropin swap_plugin: RLLOSS_SWAP={int(SWAP)}"]
    for name, cls in sorted(ACTIVE.items()):
        lines.append(f"  {name} -> {cls.__module__}.{cls.__qualname__}")
    return lines


# ----------------------------------------------------------------------------- recording

_state = {}


def _where(excinfo):
    """Deepest traceback frame inside rlloss, else inside torchrl/tensordict, else the test."""
    if excinfo is None:
        return None
    best = {}
    for entry in excinfo.traceback:
        p = str(entry.path)
        loc = f"{p}:{entry.lineno + 1}"
        if "/rlloss/" in p:
            best["rlloss"] = loc
        elif "/site-packages/torchrl/" in p:
            best["torchrl"] = loc
        elif "/site-packages/tensordict/" in p:
            best["tensordict"] = loc
        elif "rl_tests/" in p or "torchrl-tests/" in p:
            best["test"] = loc
    for k in ("rlloss", "torchrl", "tensordict", "test"):
        if k in best:
            location = best[k].split("site-packages/")[-1].split("rl_tests/")[-1]
            location = location.split("torchrl-tests/")[-1]
            return location[location.find("rlloss/") :] if k == "rlloss" else location
    return None


def _message(excinfo, report):
    if excinfo is not None:
        try:
            text = f"{excinfo.typename}: {excinfo.value}"
        except Exception:  # noqa: BLE001
            text = excinfo.typename
    else:
        text = str(getattr(report, "longrepr", "") or "")
        text = text.strip().splitlines()[-1] if text.strip() else ""
    return text[:2000]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    st = _state.setdefault(item.nodeid, {"outcome": None})
    if rep.failed and st.get("message") is None:
        st["message"] = _message(call.excinfo, rep)
        st["where"] = _where(call.excinfo)
        st["when"] = call.when
    if rep.skipped and call.when in ("setup", "call"):
        if hasattr(rep, "wasxfail"):
            st["outcome"] = "xfailed"
        else:
            st["outcome"] = "skipped"
            lr = rep.longrepr
            if isinstance(lr, tuple) and len(lr) == 3:
                st["message"] = str(lr[2])[:500]
    elif rep.failed:
        if call.when == "call":
            st["outcome"] = "failed"
        elif st["outcome"] in (None, "passed"):
            st["outcome"] = "error"
    elif rep.passed and call.when == "call":
        st["outcome"] = "xpassed" if hasattr(rep, "wasxfail") else "passed"
    st["duration"] = st.get("duration", 0.0) + rep.duration


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _TOUCHED.clear()


def pytest_runtest_logfinish(nodeid, location):
    st = _state.pop(nodeid, None)
    if st is None or RESULTS is None:
        return
    rec = {"nodeid": nodeid, "touched": bool(_TOUCHED), "classes": sorted(_TOUCHED), **st}
    rec["duration"] = round(rec.get("duration", 0.0), 3)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_collectreport(report):
    # collection errors: record so a module that fails to import is visible
    if report.failed and RESULTS is not None:
        text = str(report.longrepr)
        last = text.strip().splitlines()[-1] if text.strip() else ""
        with open(RESULTS, "a") as f:
            f.write(
                json.dumps(
                    {
                        "nodeid": report.nodeid + "::<collection>",
                        "outcome": "collection_error",
                        "message": last[:2000],
                        "touched": False,
                    }
                )
                + "\n"
            )


# ----------------------------------------------------------------------------- unskip
# test_ppo.py gates the whole TestPPO class on `transformers` being importable
# (`@pytest.mark.skipif(not _has_transformers, reason="requires transformers lib")`), although
# no TestPPO test uses it; transformers is not installed here. DROPIN_UNSKIP_TRANSFORMERS=1
# (the default) drops that one marker, in both settings, so TestPPO runs.
UNSKIP = os.environ.get("DROPIN_UNSKIP_TRANSFORMERS", "1") == "1"


def pytest_collection_modifyitems(config, items):
    if not UNSKIP:
        return
    for item in items:
        for node in item.listchain():
            own = getattr(node, "own_markers", None)
            if own:
                node.own_markers = [
                    m
                    for m in own
                    if not (
                        m.name == "skipif" and m.kwargs.get("reason") == "requires transformers lib"
                    )
                ]
