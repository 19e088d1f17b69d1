"""`ucp logs analyze` end to end: exit codes, JSON schema, HTML plots, no torch import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ucp.tools.cli import main

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
    code = ("import sys; from ucp.tools.cli import main\n"
            "try:\n    main(['logs', 'analyze', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "import ucp.reliability.logs.analyze, ucp.reliability.logs.report_html, ucp.reliability.logs.report_terminal\n"
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


def test_events_carry_severity_discovered_and_confidence(report):
    _, d, _, _ = report
    assert d["schema_version"] == 2
    for ev in d["events"]:
        assert {"severity", "discovered", "confidence"} <= set(ev)
        assert ev["severity"] in (None, "debug", "info", "warning", "error", "critical")
        assert isinstance(ev["discovered"], bool) and 0.0 <= ev["confidence"] <= 1.0
    mined = {c["path"] for c in d["discovered_categories"]}
    assert all(ev["discovered"] == (ev["category"] in mined) for ev in d["events"])


BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00\x01"


def test_binary_taxonomy_is_a_clear_input_error(tmp_path, capsys):
    # issue 8 item 15: this was a raw UnicodeDecodeError, exit 1 ("check failed")
    bad = tmp_path / "tax.json"
    bad.write_bytes(BINARY)
    assert main(["logs", "analyze", str(LOGHUB / "HPC_2k.log"), "--taxonomy", str(bad), "--quiet"]) == 2
    assert (f"taxonomy file '{bad}' is not UTF-8 text (binary data at byte 0); a taxonomy is a JSON file "
            "(docs/LOGS.md)") in capsys.readouterr().err
    assert main(["logs", "analyze", str(LOGHUB / "HPC_2k.log"), "--taxonomy", str(tmp_path), "--quiet"]) == 2
    assert "is a directory; give a JSON file" in capsys.readouterr().err
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # would block forever if opened
    assert main(["logs", "analyze", str(LOGHUB / "HPC_2k.log"), "--taxonomy", str(fifo), "--quiet"]) == 2
    assert "is not a regular file; give a JSON file" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (BINARY, "is not UTF-8 JSON (binary data at byte 0); delete it to start afresh"),
    (b'{"py/reduce": [{"py/function": "os.system"}, {"py/tuple": ["touch PWNED"]}]}',
     "is a jsonpickle document (e.g. a drain3 state): it can run code when loaded, so it is never loaded"),
])
def test_bad_state_files_are_input_errors(tmp_path, capsys, content, message):
    state = tmp_path / "state.json"
    state.write_bytes(content)
    for action in (["analyze", str(LOGHUB / "HPC_2k.log"), "--quiet"], ["templates", str(LOGHUB / "HPC_2k.log"),
                                                                          "--json", str(tmp_path / "t.json")]):
        assert main(["logs", *action, "--state", str(state)]) == 2
        assert message in capsys.readouterr().err
    assert not (Path.cwd() / "PWNED").exists()


def test_templates_command_writes_every_line_and_keeps_ids(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("\n".join(CASCADE) + "\n\n")
    out, state = tmp_path / "t.json", tmp_path / "state.json"
    assert main(["logs", "templates", str(log), "--json", str(out), "--state", str(state)]) == 0
    first = json.loads(out.read_text())
    assert len(first["lines"]) == len(CASCADE) + 1 and first["lines"][-1] == 0  # the blank line has no template
    texts = {t["id"]: t["template"] for t in first["templates"]}
    assert sum(t["count"] for t in first["templates"]) == len(CASCADE)
    assert len({first["lines"][i] for i in range(1, 65)}) == 1  # the 64 watchdog lines share a template
    assert "Watchdog caught collective operation timeout" in texts[first["lines"][1]]
    # A second run over other lines of the same kinds: the ids it knew stay.
    log.write_text("\n".join(reversed(CASCADE)) + "\n")
    assert main(["logs", "templates", str(log), "--json", str(out), "--state", str(state)]) == 0
    second = json.loads(out.read_text())
    assert second["lines"] == list(reversed(first["lines"][:-1]))


def test_taxonomy_out_writes_mined_categories_a_site_can_keep(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("".join(f"Jun  3 10:0{i}:00 n{i} foo: FATAL frobnicator quux failed on shelf {i}\n"
                           for i in range(5)) + "Jun  3 10:09:00 n1 foo: all good\n")
    out, mined, report = tmp_path / "mined.json", tmp_path / "r.json", tmp_path / "r2.json"
    assert main(["logs", "analyze", str(log), "--year", "2024", "--json", str(report), "--taxonomy-out", str(mined),
                 "--quiet"]) == 0
    d = json.loads(report.read_text())
    [cat] = d["discovered_categories"]
    assert cat["path"].endswith("/discovered/frobnicator-quux-failed-shelf") and cat["lines"] == 5
    assert cat["domain"] in ("hardware", "infra", "software", "user") and 0 < cat["domain_confidence"] <= 1
    assert len(cat["nodes"]) == 5 and cat["examples"][0].startswith("foo: FATAL frobnicator")
    assert {e["category"] for e in d["events"]} == {cat["path"]} and all(e["discovered"] for e in d["events"])
    kept = json.loads(mined.read_text())
    assert list(kept["categories"]) == [cat["path"]]
    # A site renames nothing and keeps the file: the category is now a known one.
    assert main(["logs", "analyze", str(log), "--year", "2024", "--json", str(out), "--taxonomy", str(mined),
                 "--quiet"]) == 0
    again = json.loads(out.read_text())
    assert {e["category"] for e in again["events"]} == {cat["path"]}
    assert not any(e["discovered"] for e in again["events"]) and again["discovered_categories"] == []
