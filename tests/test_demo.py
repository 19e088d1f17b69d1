"""The README's main job, end to end: train on 4 processes, SIGKILL, resume on 2 under another layout."""

import json

from tools.cli import main
from tools.demo import run_demo


def test_demo_kills_resumes_and_reshards(tmp_path):
    lines: list[str] = []
    report = run_demo(tmp_path / "demo", say=lines.append, steps=30, save_every=10, kill_after_step=25)
    # The kill lands after step 25: step 20 is the last committed checkpoint, resumed on 2 ranks.
    assert report.killed_at_step >= 25
    assert report.resumed_from_step == 20
    assert report.final_step == 30
    assert report.checkpoints == [10, 20, 30]
    assert report.verified_tensors == 6          # every logical parameter checked against the shards
    assert report.resharded_tensors == 2 * 6     # 2 target ranks x 6 parameters, bit-exact
    assert report.losses[30] < report.losses[1] / 4
    summary = report.ettr
    assert summary.restarts == 1 and summary.lost_steps >= 5 and 0 < summary.ettr < 1
    assert any("resuming on 2 processes as tp=1,dp=2" in line for line in lines)


def test_demo_cli_rejects_too_few_steps(capsys):
    assert main(["demo", "--steps", "5"]) == 2
    assert "--steps must be at least 26" in capsys.readouterr().out


def test_demo_cli_json(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "d"), "--steps", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resumed_from_step"] == 20 and data["ettr"]["restarts"] == 1
