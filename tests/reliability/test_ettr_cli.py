"""`ucp ettr`: JSON output, the table, exit codes, the plot file."""

from __future__ import annotations

import json

import pytest

from ucp.tools.cli import main

KOKOLIS = ["--gpus", "16000", "--failures-per-1000-node-days", "6.5", "--restart-min", "5"]


def run_json(capsys, *argv: str) -> dict:
    assert main(["ettr", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_optimum_and_the_given_interval(capsys):
    report = run_json(capsys, *KOKOLIS, "--save-min", "1", "--interval-min", "60")
    assert report["nodes"] == 2000
    assert report["optimal_interval_min"] == pytest.approx(13.58, abs=0.01)
    assert report["ettr_at_optimal"] == pytest.approx(0.832, abs=0.001)
    assert report["young_interval_min"] == pytest.approx(14.88, abs=0.01)
    assert report["interval_min"] == 60.0
    rows = {round(row["interval_min"], 6): row["ettr"] for row in report["intervals"]}
    assert 60.0 in rows and round(report["optimal_interval_min"], 6) in rows
    assert rows[60.0] == pytest.approx(0.68 / (1 + 1 / 60), abs=0.005)
    assert max(rows.values()) == pytest.approx(report["ettr_at_optimal"])


def test_paper_numbers_with_no_save_cost(capsys):
    report = run_json(capsys, *KOKOLIS, "--interval-min", "5")
    assert report["ettr_at_interval"] == pytest.approx(0.93, abs=0.005)


def test_mttf_hours_and_from_logs_agree(capsys, tmp_path):
    logs = tmp_path / "analysis.json"
    logs.write_text(json.dumps({"rates": {"failures_per_1000_node_days": 6.5, "nodes": 300}}))
    from_logs = run_json(capsys, "--nodes", "2000", "--from-logs", str(logs), "--save-min", "1")
    from_mttf = run_json(capsys, "--nodes", "2000", "--mttf-hours", str(24 / 13), "--save-min", "1")
    assert from_logs["optimal_interval_min"] == pytest.approx(from_mttf["optimal_interval_min"])


def test_table_marks_optimum_and_simulates(capsys):
    assert main(["ettr", *KOKOLIS, "--save-min", "1", "--interval-min", "30", "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "optimal" in out and "your T" in out and "ETTR simulated" in out
    assert "Young (1974): 14.88 min" in out and "Daly (2006): 14.22 min" in out


def test_plot_file_is_a_png(capsys, tmp_path):
    png = tmp_path / "ettr.png"
    report = run_json(capsys, *KOKOLIS, "--save-min", "1", "--plot", str(png))
    assert report["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("required", "code"), [("0.5", 0), ("0.9", 1)])
def test_require_ettr_exit_code(capsys, required, code):
    assert main(["ettr", *KOKOLIS, "--save-min", "1", "--json", "--require-ettr", required]) == code


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "8", "--mttf-hours", "0"], "ucp ettr: error: mttf_hours must be a finite number > 0, got 0.0"),
        (["--nodes", "8", "--mttf-hours", "5", "--save-min", "-1"], "ucp ettr: error: --save-min must be >= 0 minutes, got -1.0"),
        (["--nodes", "8", "--mttf-hours", "5", "--interval-min", "0"], "ucp ettr: error: --interval-min must be > 0, got 0.0"),
        (["--nodes", "0", "--mttf-hours", "5"], "ucp ettr: error: nodes must be a positive integer, got 0"),
    ],
)
def test_bad_values_exit_2_with_the_reason(capsys, argv, message):
    assert main(["ettr", *argv]) == 2
    assert capsys.readouterr().err.strip() == message


def test_missing_logs_file_exit_2(capsys, tmp_path):
    assert main(["ettr", "--nodes", "8", "--from-logs", str(tmp_path / "x.json")]) == 2
    assert "no such logs report" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--nodes", "8"], ["--mttf-hours", "5"], ["--nodes", "8", "--gpus", "64", "--mttf-hours", "5"]],
)
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as caught:
        main(["ettr", *argv])
    assert caught.value.code == 2


def test_help(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["ettr", "--help"])
    assert caught.value.code == 0
    assert "--failures-per-1000-node-days" in capsys.readouterr().out


@pytest.mark.slow
def test_from_a_real_logs_analysis(capsys, tmp_path):
    # The seam with `ucp logs analyze --json`, on a real Loghub sample.
    from pathlib import Path

    from ucp.reliability.logs import analyze

    sample = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "loghub" / "HPC_2k.log"
    assert sample.is_file(), f"the shared Loghub sample must sit beside the repository: {sample}"
    report = analyze.analyze_logs([str(sample)]).to_dict()
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(report))
    ettr = run_json(capsys, "--nodes", "128", "--from-logs", str(path), "--save-min", "1")
    expected = report["rates"]["failures_per_1000_node_days"]
    assert expected > 0 and ettr["failures_per_1000_node_days"] == pytest.approx(expected)
    assert 0 < ettr["ettr_at_optimal"] < 1


def test_the_report_is_library_code_the_cli_prints(capsys, tmp_path):
    from ucp.reliability.ettr import compute_report, job_from_inputs, plot_report

    job = job_from_inputs(gpus=16000, failures_per_1000_node_days=6.5, restart_min=5, save_min=1)
    report = compute_report(job, interval_s=3600.0)
    assert report == run_json(capsys, *KOKOLIS, "--save-min", "1", "--interval-min", "60")
    plot_report(job, report, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("inputs", "message"), [
    ({"mttf_hours": 5.0}, "give exactly one of nodes and gpus"),
    ({"nodes": 8}, "give exactly one of failures_per_1000_node_days, mttf_hours and logs_report"),
    ({"nodes": 8, "mttf_hours": 5.0, "queue_min": float("nan")}, "--queue-min must be >= 0 minutes, got nan"),
])
def test_job_inputs_are_checked_in_the_library(inputs, message):
    from ucp.reliability.ettr import ETTRInputError, job_from_inputs

    with pytest.raises(ETTRInputError) as err:
        job_from_inputs(**inputs)
    assert str(err.value) == message


@pytest.mark.parametrize("kind", ["binary", "fifo", "directory"])
def test_a_logs_report_that_is_not_json_text_is_exit_2_without_blocking(capsys, tmp_path, kind):
    import os
    import threading

    report = tmp_path / "report.json"
    if kind == "binary":
        report.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "fifo":
        os.mkfifo(report)
    else:
        report.mkdir()
    codes: list = []
    thread = threading.Thread(target=lambda: codes.append(main(["ettr", "--nodes", "8", "--from-logs", str(report)])),
                              daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        os.close(os.open(report, os.O_WRONLY | os.O_NONBLOCK))
    assert codes == [2]
    err = capsys.readouterr().err
    assert err.startswith(f"ucp ettr: error: {report}: not a readable JSON logs report: ")
    if kind != "binary":
        assert f"is {'a FIFO' if kind == 'fifo' else 'a directory'}, not a regular file" in err


def test_a_tracker_state_that_is_not_json_text_is_a_tracker_state_error(tmp_path):
    from ucp.reliability.ettr import TrackerStateError, read_summary

    (tmp_path / "ettr.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TrackerStateError, match=r"ettr.json: cannot read tracker state: .* codec can't decode"):
        read_summary(tmp_path)
