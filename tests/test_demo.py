"""The README's main job, end to end: 8 processes, SIGKILL of one rank, resume on 6 under another layout."""

import json
from pathlib import Path

import pytest

from ucp.tools.cli import main
from ucp.tools.demo import PLOT_NAME, run_demo

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("demo")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo, run once for this module (it takes a minute): its report and the lines it said."""
    lines: list[str] = []
    report = run_demo(tmp_path_factory.mktemp("demo") / "demo", say=lines.append, steps=14, save_every=4,
                      kill_after_step=10)
    return report, lines


@pytest.mark.slow
def test_demo_kills_a_rank_resumes_on_another_layout_and_matches_the_reference(demo_run):
    report, lines = demo_run
    r = report.recovery
    # The kill lands after step 10: step 8 is the last committed checkpoint, resumed on 6 ranks.
    assert r.killed_at_step >= 10 and r.resumed_from == 8 and r.final_step == 14
    assert sorted(r.losses) == list(range(1, 15))
    assert report.max_relative_error < 1e-4                     # an unbroken loss curve
    assert r.verified_tensors == 3 * 39 + 39 and not r.verify_mismatches  # params, fp32 masters, 2 moments
    assert report.verified
    assert 0 < r.detect_s < r.recovery_s and r.load_s > 0 and r.checkpoint_bytes > 0
    assert report.time_lost_s > r.recovery_s
    summary = report.ettr
    assert summary.restarts == 1 and summary.lost_steps >= 2 and 0 < summary.ettr < 1
    assert Path(report.plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    hot = report.hot  # the same failure without a restart: checkpoint at step 4, kill after step 5
    assert hot.bitwise and hot.resumed_from == 4 and hot.layout_after == "tp=2,dp=3,zero=1"
    assert sorted(hot.losses) == list(range(1, 9)) and report.hot_relative_error < 1e-4
    assert hot.elements["storage"] == 0 and hot.elements["peer"] > 0
    text = "\n".join(lines)
    for expected in ("restarting on fewer ranks as tp=2,dp=3,zero=1 from checkpoint step 8",
                     "SIGKILL -> rank 5", "all bit-exact", "recovery time", "ETTR", PLOT_NAME,
                     "the survivors resharded step 4 from memory into tp=2,dp=3,zero=1, no restart",
                     "recovery, hot: no restart"):
        assert expected in text


def test_demo_cli_rejects_too_few_steps(capsys):
    assert main(["demo", "--steps", "5"]) == 2
    assert "--steps must be at least 12" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_cli_json(demo_run, tmp_path, capsys, monkeypatch):
    """The command's wiring and its JSON, on the report of the run above (the demo is not run twice)."""
    from ucp.tools import demo

    calls = []

    def the_run_above(directory, **options):
        calls.append((directory, options))
        options["say"]("a line the demo says")  # silenced: with --json, standard output is the report alone
        return demo_run[0]

    monkeypatch.setattr(demo, "run_demo", the_run_above)
    assert main(["demo", "--dir", str(tmp_path / "d"), "--steps", "12", "--json"]) == 0
    ((directory, options),) = calls
    assert directory == str(tmp_path / "d") and (options["steps"], options["save_every"]) == (12, 5)
    assert options["kill_after_step"] == 7
    data = json.loads(capsys.readouterr().out)
    assert data["killed_at_step"] >= 10 and data["resumed_from_step"] == 8 and data["final_step"] == 14
    assert data["ettr"]["restarts"] == 1 and data["max_relative_error"] < 1e-4
    assert data["plot"].endswith(PLOT_NAME) and data["second_layout"] == "tp=2,dp=3,zero=1"
    assert data["hot"]["bitwise"] and data["hot"]["layout_after"] == "tp=2,dp=3,zero=1"


def test_demo_cli_exits_1_when_a_check_fails(monkeypatch, capsys):
    from ucp.tools import demo

    def fails(*_args, **_kwargs):
        raise demo.DemoCheckFailed("the run's loss left the uninterrupted reference: 3.0e-02 relative at "
                                         "step 9 (tolerance 1e-04)")

    monkeypatch.setattr(demo, "run_demo", fails)
    assert main(["demo", "--steps", "12"]) == 1
    assert capsys.readouterr().err == ("ucp demo: the run's loss left the uninterrupted reference: 3.0e-02 relative "
                                       "at step 9 (tolerance 1e-04)\n")
