"""ETTRTracker: live ETTR, lost work, restarts, atomic persistence, survival of SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ucp.reliability.ettr.tracker import ETTRTracker, TrackerStateError, format_seconds
from ucp.errors import UcpError

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def run_steps(tracker: ETTRTracker, clock: FakeClock, steps, *, seconds: float = 1.0) -> None:
    for step in steps:
        clock.now += seconds
        tracker.record_step(step, seconds=seconds)


def test_ettr_counts_saves_and_idle_time(tmp_path):
    clock = FakeClock()
    tracker = ETTRTracker(tmp_path, clock=clock)
    tracker.start(resumed_step=0)
    run_steps(tracker, clock, range(1, 11))
    clock.now += 2.0
    tracker.record_save(step=10, blocking_s=2.0, background_s=5.0)
    clock.now += 8.0  # idle: data loading, logging...
    summary = tracker.summary()
    assert (summary.ettr, summary.productive_s, summary.wall_s) == (0.5, 10.0, 20.0)
    assert (summary.save_blocking_s, summary.save_background_s, summary.saves) == (2.0, 5.0, 1)
    assert tracker.mean_save_blocking_s == 2.0


def test_restart_after_crash_counts_lost_work_and_downtime(tmp_path):
    clock = FakeClock()
    first = ETTRTracker(tmp_path, clock=clock, flush_every_s=0.0)
    first.start(resumed_step=0)
    run_steps(first, clock, range(1, 11))
    first.record_save(step=10, blocking_s=0.0)
    run_steps(first, clock, range(11, 16))  # 5 steps after the checkpoint, then "SIGKILL"
    clock.now += 30.0  # the job is down

    second = ETTRTracker(tmp_path, clock=clock)
    second.start(resumed_step=10)
    run_steps(second, clock, range(11, 21))
    summary = second.summary()
    assert (summary.restarts, summary.resumes, summary.lost_steps) == (1, 0, 5)
    assert summary.lost_s == 5.0
    assert summary.downtime_s == 30.0
    assert summary.productive_s == 20.0  # steps 1..20 once each
    assert summary.wall_s == 55.0  # 10 + 5 steps, 30 down, 10 steps
    assert summary.ettr == pytest.approx(20.0 / 55.0)
    assert str(summary) == (
        "ETTR 0.364 over 55s wall: 20s productive, 0s blocked on saves, 5s lost (5 steps redone), 1 restart"
    )


def test_second_crash_before_any_new_save_is_measured_from_the_restart(tmp_path):
    clock = FakeClock()
    tracker = ETTRTracker(tmp_path, clock=clock, flush_every_s=0.0)
    tracker.start(resumed_step=0)
    run_steps(tracker, clock, range(1, 6))
    tracker.record_save(step=5, blocking_s=0.0)
    run_steps(tracker, clock, range(6, 9))
    again = ETTRTracker(tmp_path, clock=clock, flush_every_s=0.0)
    again.start(resumed_step=5)
    run_steps(again, clock, range(6, 8))
    third = ETTRTracker(tmp_path, clock=clock)
    third.start(resumed_step=5)
    summary = third.summary()
    assert (summary.restarts, summary.lost_steps, summary.lost_s) == (2, 5, 5.0)
    assert summary.productive_s == 5.0


def test_unrecorded_checkpoint_is_estimated_from_mean_step_time(tmp_path):
    clock = FakeClock()
    tracker = ETTRTracker(tmp_path, clock=clock, flush_every_s=0.0)
    tracker.start(resumed_step=0)
    run_steps(tracker, clock, range(1, 11), seconds=2.0)
    # killed after checkpoint 8 committed, before record_save(step=8) ran
    restarted = ETTRTracker(tmp_path, clock=clock)
    restarted.start(resumed_step=8)
    assert restarted.summary().lost_s == 4.0


def test_clean_close_then_start_is_a_resume_not_a_restart(tmp_path):
    clock = FakeClock()
    tracker = ETTRTracker(tmp_path, clock=clock)
    tracker.start()
    run_steps(tracker, clock, range(1, 4))
    tracker.record_save(step=3, blocking_s=0.5)
    tracker.close()
    clock.now += 100.0
    later = ETTRTracker(tmp_path, clock=clock)
    later.start(resumed_step=3)
    summary = later.summary()
    assert (summary.restarts, summary.resumes, summary.lost_s, summary.downtime_s) == (0, 1, 0.0, 100.0)


def test_state_file_is_json_written_atomically(tmp_path):
    tracker = ETTRTracker(tmp_path, flush_every_s=0.0)
    tracker.start()
    for step in range(1, 50):
        tracker.record_step(step, seconds=0.01)
    data = json.loads((tmp_path / "ettr.json").read_text())
    assert data["format"] == "ucp-ettr/1" and data["last_step"] == 49 and data["running"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["ettr.json"]  # no temp files left behind


def test_step_context_manager_times_the_block(tmp_path):
    tracker = ETTRTracker(tmp_path)
    tracker.start()
    with tracker.step(1):
        time.sleep(0.01)
    assert tracker.summary().productive_s >= 0.01


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read tracker state"),
        ('{"format": "other/9"}', "not an ETTR tracker file (expected format 'ucp-ettr/1')"),
        ('{"format": "ucp-ettr/1", "saves": 1, "gross_compute_s": 1.0, "restarts": "x", "extra": 1}', None),
    ],
)
def test_bad_state_file(tmp_path, content, message):
    (tmp_path / "ettr.json").write_text(content)
    if message is None:  # unknown keys are ignored (newer writers may add some)
        assert ETTRTracker(tmp_path).summary().saves == 1
        return
    with pytest.raises(TrackerStateError) as caught:
        ETTRTracker(tmp_path)
    assert message in str(caught.value) and str(tmp_path / "ettr.json") in str(caught.value)
    assert isinstance(caught.value, UcpError)


def test_recording_before_start_is_refused(tmp_path):
    with pytest.raises(TrackerStateError, match=r"call start\(resumed_step=...\) before recording"):
        ETTRTracker(tmp_path).record_step(1, seconds=1.0)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (7325, "2h02m")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


_CHILD = textwrap.dedent(
    """
    import sys, time
    from ucp.reliability.ettr.tracker import ETTRTracker
    directory, resumed = sys.argv[1], int(sys.argv[2])
    tracker = ETTRTracker(directory, flush_every_s=0.0)
    tracker.start(resumed_step=resumed)
    step = resumed
    while True:
        step += 1
        with tracker.step(step):
            time.sleep(0.005)
        if step % 10 == 0:
            tracker.record_save(step=step, blocking_s=0.001)
            print("saved", step, flush=True)
    """
)


def test_survives_sigkill_of_a_real_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), "0"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        for line in child.stdout:
            if line.split() == ["saved", "30"]:
                break
        time.sleep(0.05)  # a few steps past the checkpoint
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    before = json.loads((tmp_path / "ettr.json").read_text())
    assert before["running"] is True and before["last_step"] > 30

    tracker = ETTRTracker(tmp_path)
    tracker.start(resumed_step=30)
    summary = tracker.summary()
    assert summary.restarts == 1
    assert summary.lost_steps == before["last_step"] - 30 and summary.lost_s > 0
    assert summary.downtime_s > 0
    assert 0 < summary.ettr < 1


def test_read_summary_of_a_finished_run_stops_the_clock_at_close(tmp_path):
    from ucp.reliability.ettr.tracker import read_summary

    clock = FakeClock()
    tracker = ETTRTracker(tmp_path, clock=clock)
    tracker.start()
    run_steps(tracker, clock, range(1, 5))
    tracker.close()
    clock.now += 1000.0  # read long after the run ended
    assert read_summary(tmp_path).wall_s == 4.0
    assert read_summary(tmp_path).to_dict()["productive_s"] == 4.0
    with pytest.raises(TrackerStateError, match="no ETTR tracker file"):
        read_summary(tmp_path / "elsewhere")
