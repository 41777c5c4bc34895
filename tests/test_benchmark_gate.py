"""The overhead harness's equality gate (benchmarks/harness.py): what it lets through and what it
stops, on hand-made methods whose totals and gradients differ by known amounts."""

from __future__ import annotations

import pytest
import torch

from benchmarks.cases import CASES, imitation, llm, multiagent
from benchmarks.harness import CaseSetup, Method, gate


def method(terms: list[float], offset: float = 0.0, grad_scale: float = 1.0, scaled=True):
    """A method whose loss is ``sum(terms) + offset`` (``terms`` times a parameter equal to 1,
    so that its gradient is ``sum(terms) * grad_scale``); ``scaled``: it reports its terms'
    magnitudes as a library loss module does."""
    weight = torch.nn.Parameter(torch.ones(()))
    values = torch.tensor(terms, dtype=torch.float64)

    def loss() -> torch.Tensor:
        return (values * weight).sum() * grad_scale + offset + weight * 0

    return Method(
        loss=loss,
        params={"w": weight},
        trainable=(weight,),
        loss_scale=(lambda: values.abs().sum()) if scaled else None,
    )


def verdict(reference: Method, candidate: Method, rtol: float = 1e-5) -> dict:
    setup = CaseSetup(
        batches={"only": None},
        factories={"ref": lambda _: reference, "candidate": lambda _: candidate},
        reference="ref",
    )
    report, _ = gate(setup, ["ref", "candidate"], rtol, compiled=False)
    return report["candidate"]


# Terms that nearly cancel: a total of 2e-3 from terms of magnitude ~1.
CANCELLING = [1.0, -0.5, -0.498]


def test_a_cancelling_total_is_held_to_the_scale_of_its_terms():
    # 1e-7 away: 5e-5 of the tiny total (which its own magnitude would refuse), 5e-8 of the terms
    report = verdict(method(CANCELLING), method(CANCELLING, offset=1e-7))
    assert report["ok"], report
    assert 1e-8 < report["max_rel_err"] < 1e-7


def test_a_total_off_by_more_than_rtol_of_its_terms_fails():
    report = verdict(method(CANCELLING), method(CANCELLING, offset=1e-4))
    assert not report["ok"]
    assert report["worst"] == "only:loss"
    assert report["max_rel_err"] > 1e-5


def test_a_reference_without_terms_falls_back_to_its_total():
    # the plain reference of cases TorchRL does not have: the total's own magnitude
    report = verdict(method(CANCELLING, scaled=False), method(CANCELLING, offset=1e-7))
    assert not report["ok"]
    assert report["max_rel_err"] > 1e-5


def test_gradients_are_still_compared_on_their_own_scale():
    report = verdict(method(CANCELLING), method(CANCELLING, grad_scale=1 + 1e-3))
    assert not report["ok"]
    assert report["worst"] == "only:grad/w"


@pytest.mark.parametrize("case", list(multiagent.CASES))
def test_the_multi_agent_cases_agree_with_torchrl(case):
    """rlloss, TorchRL and the hand-written plain torch agree on the multi-agent cases (small
    batch): losses and every network parameter's gradient."""
    setup = CASES[case](8, 0)
    report, _ = gate(setup, list(setup.factories), 1e-5, compiled=False)
    assert set(report) == set(setup.factories)
    assert all(entry["ok"] for entry in report.values()), report


def test_the_gate_stops_a_baseline_that_pools_the_agents_advantages(monkeypatch):
    """Standardising the advantage over the agents too (not per agent, as MAPPO does) is a
    different loss: the gate refuses it."""
    monkeypatch.setattr(multiagent, "ADV_STATS_DIMS", (0, 1, 2))
    setup = CASES["MAPPOLoss"](8, 0)
    report, _ = gate(setup, ["torchrl", "plain"], 1e-5, compiled=False)
    assert not report["plain"]["ok"]
    assert report["plain"]["max_rel_err"] > 1e-3


@pytest.mark.parametrize("case", list(llm.CASES))
def test_the_llm_cases_agree_with_torchrl(case):
    """rlloss, TorchRL and the hand-written GRPO step agree on the LLM cases (small batch, the
    on-policy batch and the off-policy one whose clip is active): losses and gradients."""
    setup = CASES[case](4, 0)
    report, _ = gate(setup, list(setup.factories), 1e-5, compiled=False)
    assert set(report) == set(setup.factories)
    assert all(entry["ok"] for entry in report.values()), report


def test_the_gate_stops_a_grpo_step_that_averages_the_kl_over_the_response_only(monkeypatch):
    """Both libraries average the k3 KL over every padded position; a hand-written step that
    averages it over the response tokens is another loss: the gate refuses it."""

    def over_the_response(mask, value):
        return torch.where(mask, value, 0.0).sum() / mask.sum()

    monkeypatch.setattr(llm, "kl_mean", over_the_response)
    setup = CASES["GRPOLoss"](4, 0)
    report, _ = gate(setup, ["torchrl", "plain"], 1e-5, compiled=False)
    assert not report["plain"]["ok"]
@pytest.mark.parametrize("case", list(imitation.CASES))
def test_the_imitation_cases_agree_with_torchrl(case):
    """rlloss, TorchRL and the hand-written plain torch agree on the imitation and exploration
    cases (small batch): losses and every trained parameter's gradient (log_alpha included)."""
    setup = CASES[case](8, 0)
    report, _ = gate(setup, list(setup.factories), 1e-5, compiled=False)
    assert set(report) == {"plain", "rlloss", "torchrl"}
    assert all(entry["ok"] for entry in report.values()), report


def test_the_gate_stops_an_rnd_baseline_that_averages_over_the_whole_batch(monkeypatch):
    """RND's predictor loss averages over the selected quarter only: a baseline dividing by
    the batch size instead is refused."""

    def whole_batch(nets, batch):
        obs = batch["next", "observation"]

        def loss():
            error = (nets["predictor"](obs) - nets["target"](obs)).square().mean(-1)
            return torch.where(torch.rand(error.shape) < 0.25, error, 0.0).mean()

        return loss

    monkeypatch.setitem(imitation.PLAIN, "RNDLoss", whole_batch)
    setup = CASES["RNDLoss"](8, 0)
    report, _ = gate(setup, ["torchrl", "plain"], 1e-5, compiled=False)
    assert not report["plain"]["ok"]
    assert report["plain"]["max_rel_err"] > 1e-2


def test_hand_written_comparison_keeps_an_explicit_subset_of_its_cases():
    """``--hand-written`` runs its own cases, or those of ``--cases`` among them (to refresh some
    rows with ``--merge``), always eager at the backward level."""
    from benchmarks.cases import HAND_WRITTEN
    from benchmarks.overhead import parse_args

    assert parse_args(["--hand-written"]).cases == list(HAND_WRITTEN)
    subset = parse_args(["--hand-written", "--cases", "DQNLoss", "TQCLoss", "A2CLoss"])
    assert subset.cases == ["DQNLoss", "A2CLoss"]  # TQCLoss's hand-written case is the custom one
    assert (subset.levels, subset.modes) == (["backward"], ["eager"])
