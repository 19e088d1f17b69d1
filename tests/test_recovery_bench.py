"""The recovery benchmark runs end to end and refuses bad options (no timing is asserted)."""

import json

import pytest

from tools.bench.recovery_bench import main


@pytest.mark.slow
def test_recovery_bench_runs_ucp_and_dcp_side_by_side(capsys, tmp_path):
    assert main(["--repeats", "1", "--scenarios", "native", "--model", "layers=1,vocab_size=64",
                 "--dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    systems = [row["system"] for row in data["rows"]]
    assert systems == ["ucp", "FSDP2 + DCP"] and set(data["load_phase"]) == {"ucp", "dcp"}
    ucp_row, dcp_row = data["rows"]
    assert dcp_row["vs_best_peer"] == 1.0 and ucp_row["vs_best_peer"] > 0
    parts = ("detect_s", "teardown_s", "convert_s", "restart_s", "load_s", "first_step_s")
    for row in data["rows"]:
        assert abs(sum(row[p] for p in parts) - row["recovery_s"]) < 1e-6 and row["checkpoint_bytes"] > 0


def test_recovery_bench_refuses_zero_repeats(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--repeats", "0"])
    assert exit_info.value.code == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
