"""Shared test set-up: one seed per test, one inductor cache per run, the ``slow`` marker, and
the ``float64_default`` fixture.

Tests marked ``@pytest.mark.slow`` (end-to-end tutorial runs, multi-process ``torch.distributed``
runs, statistical tests, compile tests beyond a representative few) are left out of the default
run, so that ``python -m pytest -q`` takes minutes. ``--runslow`` or ``RLLOSS_RUN_SLOW=1`` runs
them too (CI does: ``.ci/run``); ``-m slow`` runs them alone.
"""

import os

import pytest
import torch

# One inductor cache for the whole run: the compile tests share kernels.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.getcwd(), ".inductor-cache"))


def pytest_addoption(parser):
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (as does RLLOSS_RUN_SLOW=1)",
    )


def _run_slow(config) -> bool:
    return (
        config.getoption("--runslow")
        or os.environ.get("RLLOSS_RUN_SLOW", "") not in ("", "0")
        or "slow" in (config.getoption("markexpr") or "")
    )


def pytest_collection_modifyitems(config, items):
    if _run_slow(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)


def pytest_report_header(config):
    if not _run_slow(config):
        return "tests marked slow are left out: --runslow or RLLOSS_RUN_SLOW=1 runs them"
    return None


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def float64_default():
    """Networks, distributions' bounds and batches built in float64 (``.double()`` does not
    reach a distribution's ``low``/``high`` kept as plain tensors, nor every loss's constants)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(default)
