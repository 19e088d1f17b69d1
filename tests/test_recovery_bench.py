"""The recovery benchmark runs end to end, writes the summary a program can check, refuses bad options.

No timing is asserted."""

import json
import sys

import pytest

from ucp.tools.bench.recovery_bench import SCENARIOS, SIZES, main, median_ci95, merge_costs, not_run_reason
from ucp.tools.bench.torchft_recovery import torchft_unavailable

SHRINK, SPARE = SCENARIOS


@pytest.mark.slow
def test_recovery_bench_writes_hot_restart_and_torchft_side_by_side(capsys, tmp_path):
    out = tmp_path / "out.json"
    assert main(["--sizes", "demo", "--repeats", "1", "--scenarios", "spare", "--save-rounds", "1",
                 "--systems", "ucp-hot,dcp-restart,torchft", "--dir", str(tmp_path / "runs"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["scenarios"]["demo-spare"]
    assert set(rows) == {"ucp-hot", "dcp-restart", "torchft"}
    for row in rows.values():
        assert row["recovery_s"] > 0 and row["ci95"][0] <= row["recovery_s"] <= row["ci95"][1]
        assert row["first_step_s"] > 0 and row["lost_steps"] in (0, 1)
    assert rows["ucp-hot"]["lost_steps"] == 1 == rows["dcp-restart"]["lost_steps"]
    assert rows["ucp-hot"]["bitwise"] is True and rows["dcp-restart"]["bitwise"] is None
    assert rows["torchft"]["bitwise"] is True  # the healed spare's state equals its healthy peers'
    assert rows["dcp-restart"]["vs_dcp_restart"] == 1.0
    costs = data["save_costs"]["demo"]
    assert costs["save_blocking_s"] > 0 and costs["save_background_s"] >= 0 and costs["slowdown_s"] >= 0
    assert data["sizes"]["demo"]["state_bytes"] == SIZES[0].state_bytes() and data["not_run"] == {}
    assert "| demo-spare | ucp-hot | tp=2,dp=2,zero=1 |" in capsys.readouterr().out


def test_the_large_size_holds_at_least_one_gib_of_training_state():
    large = next(s for s in SIZES if s.name == "1gib")
    assert large.state_bytes() >= 2**30 and large.save_every <= large.kill_after < large.steps


def test_torchft_is_reported_as_not_run_in_the_shrink_transition(capsys, tmp_path):
    out = tmp_path / "out.json"
    assert main(["--sizes", "demo", "--repeats", "1", "--scenarios", "shrink", "--systems", "torchft",
                 "--save-rounds", "0", "--dir", str(tmp_path), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["scenarios"] == {}
    assert data["not_run"] == {"demo-shrink": {"torchft": "torchft heals a replica in the same layout; it cannot "
                                                          "change the layout (no shrink)"}}
    assert "| demo-shrink | torchft | not run: torchft heals a replica" in capsys.readouterr().out


def test_torchft_that_cannot_import_is_not_run_with_the_error_text(monkeypatch):
    assert torchft_unavailable() is None  # installed here (the `torchft` extra)
    monkeypatch.setitem(sys.modules, "torchft", None)  # a real failed import, as where it is not installed
    assert not_run_reason(SPARE, "torchft") == ("torchft cannot run here: ModuleNotFoundError: import of torchft "
                                                "halted; None in sys.modules")
    assert not_run_reason(SPARE, "ucp-hot") is None


def test_merge_costs_replaces_what_was_rerun_and_keeps_the_rest(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"scenarios": {"demo-spare": {"a": 1}, "1gib-spare": {"b": 2}}, "world": 4,
                                "save_costs": {"demo": {"x": 1}, "1gib": {"y": 2}}, "sizes": {"demo": {}, "1gib": {}}}))
    merged = merge_costs({"scenarios": {"1gib-spare": {"c": 3}}, "save_costs": {"1gib": {"z": 3}},
                          "sizes": {"1gib": {"model": "m"}}, "repeats_done": {"1gib": 3}, "load_average": [1, 2, 3], "world": 4},
                         path)
    assert merged["scenarios"] == {"demo-spare": {"a": 1}, "1gib-spare": {"c": 3}}
    assert merged["save_costs"] == {"demo": {"x": 1}, "1gib": {"z": 3}}
    assert merged["runs"] == {"1gib": {"repeats": 3, "load_average": [1, 2, 3]}}


def test_median_interval_covers_at_least_95_percent_when_it_can():
    assert median_ci95([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert median_ci95(list(map(float, range(1, 17)))) == (4.0, 13.0)  # n=16: k=4 covers 97.9 %


def test_recovery_bench_refuses_zero_repeats_and_unknown_names(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--repeats", "0"])
    assert exit_info.value.code == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--systems", "torchelastic"])
    assert ("unknown system(s) ['torchelastic']; expected some of ucp-hot, ucp-restart, dcp-restart, "
            "deepspeed-universal, torchft") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--sizes", "huge"])
    assert "unknown size(s) ['huge']; expected some of demo, 1gib" in capsys.readouterr().err
