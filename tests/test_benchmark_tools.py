"""The benchmark scripts' own logic: the ensemble sweep of ``benchmarks/overhead.py``, the
BENCHMARKS.md generator (``benchmarks/report.py``), the cases and the bool-mask timing of
``benchmarks/compiled_update.py``."""

from __future__ import annotations

import json

import pytest
from torch import nn
from torchrl.modules import MLP

import rlloss
from benchmarks.compiled_update import CASES, bool_mask_store
from benchmarks.compiled_update import parse_args as update_args
from benchmarks.overhead import parse_args, with_growth
from benchmarks.report import MISSES, render


def test_ensemble_scaling_runs_each_loss_at_its_numbers_of_critics():
    cfg = parse_args(["--ensemble-scaling"])
    assert cfg.critics == {"REDQLoss": [2, 4, 10], "TQCLoss": [2, 5, 10]}
    assert (cfg.batch_sizes, cfg.levels, cfg.modes) == ([256], ["update"], ["eager"])
    assert cfg.methods == ("plain", "rlloss", "torchrl")
    assert cfg.out.name == "ensemble-scaling.json"
    custom = parse_args(["--ensemble-scaling", "--custom-critic", "--critics", "2", "3"])
    assert custom.critics == {"REDQLoss-custom-critic": [2, 3], "TQCLoss-custom-critic": [2, 3]}
    assert custom.out.name == "ensemble-scaling-custom-critic.json"


def test_critics_refuse_a_case_that_is_not_an_ensemble():
    with pytest.raises(ValueError, match="not SACLoss: choose those with --cases"):
        parse_args(["--cases", "REDQLoss", "SACLoss", "--critics", "2", "4"])


def test_growth_is_each_methods_time_over_its_time_with_the_fewest_critics():
    def row(critics: int, plain: float, rlloss: float | None) -> dict:
        methods = {"plain": {"time_us": {"median": plain}}, "rlloss": {"status": "FAILED"}}
        if rlloss is not None:
            methods["rlloss"] = {"time_us": {"median": rlloss}}
        key = {"case": "REDQLoss", "batch_size": 256, "mode": "eager", "level": "update"}
        return {**key, "num_critics": critics, "methods": methods}

    rows = with_growth([row(4, 300.0, 500.0), row(2, 100.0, 200.0), row(10, 900.0, None)])
    assert [r["growth"] for r in rows] == [
        {"plain": 3.0, "rlloss": 2.5},
        {"plain": 1.0, "rlloss": 1.0},
        {"plain": 9.0},  # a method that failed its gate has no time, hence no growth
    ]
    assert {r["growth_from_critics"] for r in rows} == {2}


def test_report_summarises_the_compile_rows_and_ends_with_the_missed_targets(tmp_path):
    rows = [
        {"case": "DQNLoss", "library": "rlloss", "graph_count": 1, "graph_break_count": 0,
         "fullgraph_ok": True, "recompiles": 0, "cold_s": 3.84, "warm_s": 0.412},
        {"case": "DQNLoss", "library": "torchrl", "graph_count": 5, "graph_break_count": 4,
         "fullgraph_ok": False, "cold_s": 7.3},
    ]  # fmt: skip
    machine = {"date": "2026-11-28T21:00:00+00:00"}
    (tmp_path / "compile.json").write_text(json.dumps({"machine": machine, "results": rows}))
    # compiled_update.json matches compile*.json too: its rows have no library, and are left out
    (tmp_path / "compiled_update.json").write_text(json.dumps({"rows": [{"case": "SAC"}]}))
    text, notes = render(tmp_path)
    assert "| DQNLoss | yes | 1 / 0 | 0 | 3.8 / 0.41 | **no** | 5 / 4 | - | 7.3 / - |" in text
    assert "From `compile.json` (2026-11-28)." in text
    assert "No overhead results in the results dir." in text
    assert any("no learning*.json" in note for note in notes)
    misses = MISSES.read_text()
    assert text.endswith(misses) and misses.startswith("## Missed targets, explained\n")
    assert len(misses.splitlines()) <= 150  # the misses stay a summary (issue 48)


def hidden_activations(network: nn.Module) -> list[type]:
    """The activation layers inside the network's ``MLP``s (not a policy's tanh squashing)."""
    return [
        type(m)
        for mlp in network.modules()
        if isinstance(mlp, MLP)
        for m in mlp
        if isinstance(m, (nn.ReLU, nn.Tanh))
    ]


@pytest.mark.parametrize("case", ["SAC", "TD3"])
@pytest.mark.parametrize("network", ["actor_network", "qvalue_network"])
def test_update_cases_are_tanh_networks_and_their_relu_twins(case, network):
    tanh, relu = (getattr(CASES[name][0](rlloss, 0), network) for name in (case, f"{case}-relu"))
    assert hidden_activations(tanh) == [nn.Tanh, nn.Tanh]  # two hidden layers of 256
    assert hidden_activations(relu) == [nn.ReLU, nn.ReLU]


@pytest.mark.slow  # two small inductor compiles
def test_bool_mask_store_times_each_form_eager_and_compiled():
    a = update_args(["--repeats", "2", "--inner", "1", "--warmup", "1"])
    timings = bool_mask_store(a)
    assert timings["shape"] == [2, 256, 256]
    methods = {"bool eager", "bool compiled", "float eager", "float compiled"}
    assert set(timings["cpu_median_us"]) == methods
    assert all(us > 0 for us in timings["cpu_median_us"].values())
