"""ETTR from the recovery bench's measurements: the costs file, the extrapolation, `ucp ettr --measured`."""

from __future__ import annotations

import copy
import json
import math

import pytest

from ucp.reliability.ettr.measured import (
    COSTS_FILE,
    EXAMPLE,
    MeasuredCosts,
    MeasuredCostsError,
    compare_systems,
    llama3_failures_per_1000_node_days,
)
from ucp.reliability.ettr.model import JobReliability, expected_ettr
from ucp.tools.cli import main

SYSTEMS = {"ucp-hot", "ucp-restart", "dcp-restart", "deepspeed-universal", "torchft"}


def summary_with_restart() -> dict:
    summary = copy.deepcopy(EXAMPLE)
    summary["scenarios"]["demo-spare"]["dcp-restart"] = {
        "recovery_s": 3.0, "first_step_s": 1.4, "lost_steps": 1,
        "parts": {"detect_s": 0.1, "teardown_s": 0.2, "convert_s": 0.0, "restart_s": 1.5, "load_s": 1.2}}
    return summary


def test_the_shipped_costs_file_has_the_bench_schema_for_both_sizes_and_transitions():
    summary = json.loads(COSTS_FILE.read_text())
    for size in ("demo", "1gib"):
        assert size in summary["save_costs"] and summary["sizes"][size]["state_bytes"] > 0
        for transition in ("shrink", "spare"):
            rows = summary["scenarios"][f"{size}-{transition}"]
            assert {"ucp-hot", "ucp-restart", "dcp-restart"} <= set(rows) <= SYSTEMS
            for row in rows.values():
                assert row["ci95"][0] <= row["recovery_s"] <= row["ci95"][1]
                assert set(row) >= {"recovery_s", "ci95", "first_step_s", "lost_steps", "bitwise"}
    assert summary["sizes"]["1gib"]["state_bytes"] >= 2**30
    assert MeasuredCosts.load().recovery["ucp-hot"].recovery_s > 0


def test_coordination_parts_grow_with_log2_of_the_gpus_and_the_rest_stays():
    costs = MeasuredCosts.from_summary(summary_with_restart(), size="demo", scenario="spare")
    hot, restart = costs.recovery["ucp-hot"], costs.recovery["dcp-restart"]
    assert hot.coordination_s == 0.5 and restart.coordination_s == 1.5
    assert hot.at(gpus=4) == pytest.approx(1.0) and restart.at(gpus=4) == pytest.approx(3.0)
    assert hot.at(gpus=16384) == pytest.approx(0.5 + 0.5 * 14 / 2)
    assert restart.at(gpus=16384) == pytest.approx(1.5 + 1.5 * 14 / 2)


def test_compare_charges_downtime_warm_up_and_the_background_save_cost():
    costs = MeasuredCosts.from_summary(summary_with_restart(), size="demo", scenario="spare")
    job = JobReliability(nodes=2048, failures_per_node_day=llama3_failures_per_1000_node_days() / 1000,
                         queue_s=60.0)
    rows = {r["system"]: r for r in compare_systems(costs, job, gpus=16384, interval_s=600.0)}
    assert rows["ucp-hot"]["save_cost_s"] == pytest.approx(0.9 + 0.1)  # snapshot + slowed steps
    assert rows["dcp-restart"]["downtime_s"] == pytest.approx(1.5 + 1.5 * 7 + (1.4 - 0.4))  # + warm-up step
    assert rows["ucp-hot"]["downtime_s"] == pytest.approx(0.5 + 0.5 * 7 + 0.1)
    restart_job = JobReliability(nodes=2048, failures_per_node_day=job.failures_per_node_day, queue_s=60.0,
                                 restart_s=rows["dcp-restart"]["downtime_s"], save_blocking_s=1.0)
    assert rows["dcp-restart"]["ettr_at_interval"] == pytest.approx(expected_ettr(restart_job, interval_s=600.0))
    assert rows["ucp-hot"]["ettr_at_interval"] > rows["dcp-restart"]["ettr_at_interval"]  # no queue, less downtime


def test_llama3_rate_is_419_interruptions_in_54_days_on_16k_gpus():
    assert llama3_failures_per_1000_node_days() == pytest.approx(419 / (54 * 2048) * 1000)
    job = JobReliability.from_per_1000_node_days(2048, llama3_failures_per_1000_node_days())
    assert job.mttf_s / 3600 == pytest.approx(54 * 24 / 419)


def test_missing_scenario_or_file_is_refused_with_the_fix(tmp_path):
    with pytest.raises(MeasuredCostsError) as error:
        MeasuredCosts.from_summary(EXAMPLE, size="1gib", scenario="spare", source="costs.json")
    assert str(error.value) == ("recovery-costs file costs.json has no scenario '1gib-spare' (it has scenarios "
                                "demo-spare); rerun the recovery bench with that size and transition")
    with pytest.raises(MeasuredCostsError) as error:
        MeasuredCosts.load(tmp_path / "none.json")
    assert str(error.value) == (f"no recovery-costs file at {tmp_path / 'none.json'}; write one with "
                                "`python -m ucp.tools.bench.recovery_bench --json FILE`")
    assert isinstance(error.value, ValueError)


def test_cli_measured_compares_every_system_of_the_file(capsys, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(summary_with_restart()))
    assert main(["ettr", "--gpus", "16384", "--llama3", "--measured", str(path), "--size", "demo",
                 "--interval-min", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nodes"] == 2048 and report["measured_world"] == 4
    assert report["failures_per_1000_node_days"] == pytest.approx(3.789, abs=1e-3)
    assert [r["system"] for r in report["systems"]] == ["ucp-hot", "dcp-restart"]
    assert all(0 < r["ettr_at_interval"] < 1 and math.isfinite(r["optimal_interval_s"]) for r in report["systems"])
    assert main(["ettr", "--gpus", "16384", "--llama3", "--measured", str(path), "--size", "demo"]) == 0
    out = capsys.readouterr().out
    assert "recovery s at 16384 GPUs" in out and "log2(16384)/log2(4)" in out


def test_cli_measured_without_the_size_exits_2(capsys, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(EXAMPLE))
    assert main(["ettr", "--gpus", "16384", "--llama3", "--measured", str(path)]) == 2
    assert "has no scenario '1gib-spare'" in capsys.readouterr().err
