"""The recovery benchmark runs end to end, writes the summary a program can check, refuses bad options.

No timing is asserted."""

import json

import pytest

from ucp.tools.bench.recovery_bench import main, median_ci95


@pytest.mark.slow
def test_recovery_bench_writes_hot_and_restart_side_by_side(capsys, tmp_path):
    out = tmp_path / "out.json"
    assert main(["--repeats", "1", "--scenarios", "spare", "--systems", "ucp-hot,dcp-restart",
                 "--dir", str(tmp_path / "runs"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["scenarios"]["spare"]
    assert set(rows) == {"ucp-hot", "dcp-restart"}
    for row in rows.values():
        assert row["recovery_s"] > 0 and row["ci95"][0] <= row["recovery_s"] <= row["ci95"][1]
        assert row["first_step_s"] > 0 and row["lost_steps"] == 1
    assert rows["ucp-hot"]["bitwise"] is True and rows["dcp-restart"]["bitwise"] is None
    assert rows["dcp-restart"]["vs_dcp_restart"] == 1.0
    assert "| spare | ucp-hot | tp=2,dp=2,zero=1 |" in capsys.readouterr().out


def test_median_interval_covers_at_least_95_percent_when_it_can():
    assert median_ci95([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert median_ci95(list(map(float, range(1, 17)))) == (4.0, 13.0)  # n=16: k=4 covers 97.9 %


def test_recovery_bench_refuses_zero_repeats_and_unknown_systems(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--repeats", "0"])
    assert exit_info.value.code == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--systems", "torchft"])
    assert "unknown system(s) ['torchft']" in capsys.readouterr().err
