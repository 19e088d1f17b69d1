"""`ucp logs analyze` end to end: exit codes, JSON schema, HTML plots, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.cli import main

ROOT = Path(__file__).resolve().parents[3]
LOGHUB = ROOT / ".." / "shared" / "data" / "loghub"

CASCADE = [
    "Jun  3 10:00:00 gpu-a07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
    *[f"2024-06-03 10:10:{i % 60:02d}.000 gpu-{i // 8:03d}:1:2 [0] [Rank {i}] Watchdog caught collective operation "
      f"timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600{i:03d} milliseconds before timing out."
      for i in range(64)],
    "Jun  3 12:00:00 gpu-b01 kernel: mlx5_core 0000:0c:00.0 ib2: Link down",
    "Jun  3 15:00:00 gpu-c01 kernel: Out of memory: Killed process 8812 (python) total-vm:1kB",
    "Jun  3 18:30:00 gpu-c02 kernel: LustreError: 11-0: scratch-OST0004: operation ost_write failed: rc = -107",
    "Jun  3 18:30:01 gpu-c02 kernel: systemd[1]: Started Session 3 of user bob.",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    log = tmp / "cluster.log"
    log.write_text("\n".join(CASCADE) + "\n")
    out_json, out_html = tmp / "r.json", tmp / "r.html"
    code = main(["logs", "analyze", str(log), str(LOGHUB / "Linux_2k.log"), "--year", "2024",
                 "--json", str(out_json), "--html", str(out_html), "--state", str(tmp / "t.drain3"), "--quiet"])
    return code, json.loads(out_json.read_text()), out_html.read_text(), tmp


def test_exit_code_and_json_schema(report):
    code, d, _, _ = report
    assert code == 0
    for key in ("events", "incidents", "categories", "fits", "rates", "lemon_nodes", "input", "summary"):
        assert key in d
    assert set(d["rates"]) >= {"failures_per_1000_node_days", "node_days", "nodes", "failures", "by_category"}
    assert isinstance(d["rates"]["failures_per_1000_node_days"], float) and isinstance(d["rates"]["nodes"], int)
    assert set(d["fits"]) >= {"exponential", "weibull", "ks"}
    assert set(d["fits"]["exponential"]) >= {"mttf_hours", "ci95_hours"}
    assert set(d["fits"]["weibull"]) >= {"shape", "scale_hours"}
    ev = d["events"][0]
    assert set(ev) >= {"file", "line", "timestamp", "node", "job", "category", "template_id", "incident_id"}
    assert (ev["line"], ev["category"], ev["node"]) == (1, "hardware/gpu/xid-79", "gpu-a07")


def test_cascade_is_one_incident_and_normal_lines_are_counted_not_listed(report):
    _, d, _, _ = report
    cascade = [i for i in d["incidents"] if i["event_count"] == 65]
    assert len(cascade) == 1 and cascade[0]["root_cause"]["category"] == "hardware/gpu/xid-79"
    ours = [i for i in d["incidents"] if i["root_cause"]["file"].endswith("cluster.log")]
    assert [i["root_cause"]["category"] for i in ours] == [
        "hardware/gpu/xid-79", "hardware/network/ib-link", "user/oom/host-oom", "infra/filesystem/lustre"]
    assert d["summary"]["normal_lines"] > 1500
    assert all(e["category"] != "normal" for e in d["events"])
    assert len([e for e in d["events"] if e["file"].endswith("cluster.log")]) == 68


def test_html_report_is_self_contained_with_the_plots(report):
    _, _, html, _ = report
    for name in ("categories", "timeline", "mttf", "heatmap"):
        assert f'alt="{name}" src="data:image/png;base64,' in html
    assert "http://" not in html and "https://" not in html


def test_state_file_written(report):
    _, _, _, tmp = report
    assert (tmp / "t.drain3").stat().st_size > 0


def test_missing_input_is_exit_2(capsys):
    assert main(["logs", "analyze", "/nonexistent/file.log", "--quiet"]) == 2
    assert "no log files match '/nonexistent/file.log'" in capsys.readouterr().err


def test_bad_taxonomy_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "tax.json"
    bad.write_text("[]")
    assert main(["logs", "analyze", str(LOGHUB / "HPC_2k.log"), "--taxonomy", str(bad), "--quiet"]) == 2
    assert 'expected an object with a "categories" object' in capsys.readouterr().err


def test_help_and_no_torch_import():
    code = ("import sys; from tools.cli import main\n"
            "try:\n    main(['logs', 'analyze', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "import reliability.logs.analyze, reliability.logs.report_html, reliability.logs.report_terminal\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--taxonomy FILE" in proc.stdout and "--state FILE" in proc.stdout


def test_terminal_summary_renders(tmp_path, capsys):
    assert main(["logs", "analyze", str(LOGHUB / "HPC_2k.log")]) == 0
    out = capsys.readouterr().out
    assert "Failure categories" in out and "Lemon nodes" in out and "weibull" in out and "skipped binary 0" in out


def test_logs_without_action_is_usage_error(capsys):
    assert main(["logs"]) == 2
    assert "analyze" in capsys.readouterr().out
