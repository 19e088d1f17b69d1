"""`ucp place eval | forecast | train` end to end: exit codes, the exact JSON schema, the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ucp.tools.cli import main

DATA = Path(__file__).parent / "data"
from ucp.replication.scenarios import FAMILIES  # noqa: E402

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("place_cli")

POLICIES = ["greedy", "group", "rack-aware", "rl", "static-random"]
METRICS = ["ci95", "data_loss_events", "downtime_s", "ettr", "failures", "lost_work_s", "mean_recovery_s",
           "remote_share", "rollback_s", "storage_bytes", "storage_utilization"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("place")
    out, png = tmp / "eval.json", tmp / "eval.png"
    code = main(["place", "eval", "--intervals", "40", "--pretrain-intervals", "300", "--families",
                 "hetero-rack,log-replay,published", "--logs", str(DATA / "synthetic-analysis.json"),
                 "--json", str(out), "--plot", str(png), "--seeds", "2", "--optimum", "2", "--no-online", "--quiet"])
    return code, json.loads(out.read_text()), png


def test_eval_json_is_exactly_the_documented_schema(evaluated):
    code, report, _ = evaluated
    assert code == 0
    assert list(report) == ["scenarios", "seeds", "held_out", "io", "paired", "optimum"]
    assert sorted(report["scenarios"]) == ["hetero-rack", "log-replay", "published"]
    assert report["seeds"] == 2 and report["held_out"] == ["log-replay", "published"] and report["io"] == "measured"
    for family, pair in report["paired"].items():
        assert sorted(pair) == ["baseline", "ettr_ci95", "ettr_diff", "lost_relative", "lost_relative_ci95",
                                "lost_s_ci95", "lost_s_diff", "seeds"]
        assert pair["seeds"] == 2 and pair["baseline"] in POLICIES and pair["baseline"] != "rl"
        rows = report["scenarios"][family]
        assert pair["ettr_diff"] == pytest.approx(rows["rl"]["ettr"] - rows[pair["baseline"]]["ettr"])
    for family, rows in report["scenarios"].items():
        assert sorted(rows) == POLICIES
        for metrics in rows.values():
            assert sorted(metrics) == sorted(METRICS + ["optimum_gap"])
            assert metrics["optimum_gap"] >= -1e-9 and sorted(metrics["ci95"]) == ["downtime_s", "ettr",
                                                                                  "mean_recovery_s", "optimum_gap",
                                                                                  "rollback_s", "storage_utilization"]
            assert 0 <= metrics["remote_share"] <= 1 and 0 <= metrics["storage_utilization"] <= 1
            largest = 2 * 64e9 if family.startswith("hetero-") else 64e9  # hetero shards: up to 2x
            assert metrics["storage_bytes"] <= 2 * 16 * largest  # never above the budget
            assert 0 < metrics["ettr"] <= 1
            lo, hi = metrics["ci95"]["ettr"]
            assert lo <= metrics["ettr"] <= hi
    assert report["optimum"]["families"] == {
        "hetero-rack": {"instances": 2, "skipped": 0, "cluster_model": "hetero-rack"},
        "log-replay": {"instances": 2, "skipped": 0, "cluster_model": "homogeneous"},
        "published": {"instances": 2, "skipped": 0, "cluster_model": "homogeneous"}}
    for key in ("policies", "hetero_policies"):
        assert sorted(report["optimum"][key]) == POLICIES
        assert all(row["optimum_gap"] >= -1e-9 for row in report["optimum"][key].values())


def test_eval_plot_is_a_png(evaluated):
    assert evaluated[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_prints_the_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one line per sentence
    code = main(["place", "eval", "--intervals", "20", "--pretrain-intervals", "200", "--families", "lemon",
                 "--no-online"])
    out = capsys.readouterr().out
    assert code == 0
    assert "lemon:" in out and "static-random" in out and "(training family): rl ETTR" in out


@pytest.mark.parametrize("argv, message", [
    (["place", "eval", "--families", "meteor"], "ucp place: error: unknown scenario family 'meteor'; choose from "
                                                "independent, correlated-rack, lemon, log-replay, published, "
                                                "published-x100, log-thunderbird, hetero-rack, hetero-lemon, "
                                                "hetero-x100, hetero-thunderbird"),
    (["place", "eval", "--intervals", "0"], "ucp place: error: --intervals, --replicas, --pretrain-intervals and "
                                            "--seeds must be >= 1"),
    (["place", "eval", "--seeds", "0"], "ucp place: error: --intervals, --replicas, --pretrain-intervals and "
                                        "--seeds must be >= 1"),
    (["place", "eval", "--cluster", "nodes=x"], "ucp place: error: cluster spec 'nodes=x': nodes needs a number, "
                                                "got 'x'"),
    (["place", "eval", "--families", "log-replay", "--logs", "/nonexistent.json", "--pretrain-intervals", "50",
      "--intervals", "5"], "ucp place: error: /nonexistent.json: cannot read (No such file or directory)"),
    (["place", "online", "--tolerances", "0,half"], "ucp place: error: --tolerances '0,half': give numbers >= 0, "
                                                    "e.g. 0,0.5,inf"),
    (["place", "online", "--tolerances", "-1"], "ucp place: error: --tolerances must be >= 0, --intervals and "
                                                "--seeds >= 1"),
    (["place", "imitate", "--rounds", "0"], "ucp place: error: --instances, --rounds and --evaluate must be >= 1, "
                                            "--leash-weight >= 0"),
    (["place", "online", "--families", "meteor"], "ucp place: error: unknown scenario family 'meteor'; choose from "
                                                  "independent, correlated-rack, lemon, log-replay, published, "
                                                  "published-x100, log-thunderbird, hetero-rack, hetero-lemon, "
                                                  "hetero-x100, hetero-thunderbird"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message


def test_forecast_command(tmp_path):
    out = tmp_path / "f.json"
    assert main(["place", "forecast", "--intervals", "300", "--pretrain-intervals", "300", "--json", str(out),
                 "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert sorted(report) == sorted(FAMILIES)
    assert all({"roc_auc", "brier", "ece"} <= set(m) for m in report.values())


def test_train_command_writes_a_loadable_policy(tmp_path):
    out = tmp_path / "p.safetensors"
    assert main(["place", "train", "--timesteps", "1024", "--intervals", "100", "--pretrain-intervals", "100",
                 "--out", str(out), "--quiet"]) == 0
    from ucp.replication.rl_policy import RLPolicy

    assert RLPolicy.load(out, online=False).max_nodes == 32


def test_io_fit_reports_held_out_r2(tmp_path, capsys):
    out = tmp_path / "io.json"
    assert main(["place", "io-fit", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["split"] for r in report["r2"]] == ["run", "size"]
    assert all(r["r2_log_seconds"] > 0.5 for r in report["r2"])  # the shipped table: 0.9 and 0.8
    assert sorted(report["throughput_bps"]) == sorted(f"{op} {tier}" for tier in ("memory", "disk", "remote")
                                                      for op in ("write", "restore"))


@pytest.mark.slow
def test_io_measure_times_all_three_tiers_on_a_local_s3_server(tmp_path):
    out = tmp_path / "io.json"
    assert main(["place", "io-measure", "--out", str(out), "--runs", "2", "--max-mib", "1", "--quiet"]) == 0
    from ucp.replication.io_cost import IoCostModel, load_measurements

    rows = load_measurements(out)
    assert {(r.tier, r.op) for r in rows} == {(t, o) for t in ("memory", "disk", "remote") for o in ("write", "restore")}
    assert len(rows) == 3 * 5 * 2 * 2  # tiers x sizes (4 KiB .. 1 MiB) x runs x (write, restore)
    IoCostModel(rows)  # fits


def test_place_without_action_prints_help(capsys):
    assert main(["place"]) == 2
    assert "eval" in capsys.readouterr().out
