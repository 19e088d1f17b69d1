"""AdaptiveIntervalPolicy: the SavePolicy protocol, learning from saves and failures, log reports."""

from __future__ import annotations

import json

import pytest

from ucp.reliability.ettr.adaptive import AdaptiveIntervalPolicy, failures_per_node_day_from_report
from ucp.reliability.ettr.model import ETTRInputError, JobReliability, optimal_interval_s
from ucp.reliability.ettr.tracker import ETTRTracker
from ucp.policies import AnyOf, EveryNSteps, SavePolicy


def policy(**options) -> AdaptiveIntervalPolicy:
    base = {"nodes": 2000, "failures_per_node_day": 0.0065, "restart_s": 300.0, "prior_save_s": 30.0}
    return AdaptiveIntervalPolicy(**{**base, **options})


def test_implements_the_managers_save_policy_protocol():
    adaptive = policy()
    assert isinstance(adaptive, SavePolicy)
    assert adaptive.should_save(step=1, seconds_since_save=adaptive.interval_s) is True
    assert adaptive.should_save(step=1, seconds_since_save=adaptive.interval_s - 1) is False
    combined = AnyOf(adaptive, EveryNSteps(1000))
    assert combined.should_save(step=1000, seconds_since_save=0.0) is True


def test_interval_is_the_model_optimum_for_the_measured_save_cost():
    adaptive = policy()
    adaptive.observe_save(blocking_s=60.0)  # the first measurement replaces the prior
    job = JobReliability(nodes=2000, failures_per_node_day=0.0065, restart_s=300.0, save_blocking_s=60.0)
    assert adaptive.interval_s == pytest.approx(optimal_interval_s(job, min_interval_s=10.0))


def test_costlier_saves_lengthen_the_interval_smoothly():
    adaptive = policy(smoothing=0.5)
    adaptive.observe_save(blocking_s=10.0)
    short = adaptive.interval_s
    adaptive.observe_save(blocking_s=90.0)
    assert adaptive.save_blocking_s == pytest.approx(50.0)
    assert adaptive.interval_s > short


def test_failures_seen_shorten_the_interval():
    adaptive = policy(prior_node_days=100.0)
    before = adaptive.interval_s
    # 2000 nodes for 2 h with 10 restarts: far worse than the prior of 0.0065/node-day
    adaptive.observe_exposure(failures=10, wall_s=7200.0)
    assert adaptive.failures_per_node_day == pytest.approx((0.65 + 10) / (100 + 2000 * 2 / 24))
    assert adaptive.interval_s < before
    adaptive.observe_exposure(failures=10, wall_s=7200.0)  # totals: the same reading twice changes nothing
    assert adaptive.failures_per_node_day == pytest.approx((0.65 + 10) / (100 + 2000 * 2 / 24))


def test_reads_restarts_and_wall_time_from_a_tracker(tmp_path):
    now = [0.0]
    tracker = ETTRTracker(tmp_path, clock=lambda: now[0])
    tracker.start()
    now[0] = 3600.0
    ETTRTracker(tmp_path, clock=lambda: now[0]).start(resumed_step=0)  # a restart after a crash
    adaptive = policy(nodes=4)
    adaptive.observe_tracker(ETTRTracker(tmp_path, clock=lambda: now[0]).summary())
    assert adaptive.to_dict()["failures_seen"] == 1


def test_async_background_time_is_a_floor():
    adaptive = policy()
    adaptive.observe_save(blocking_s=0.5, background_s=5000.0)
    assert adaptive.interval_s == pytest.approx(5000.0)


def test_interval_is_clamped():
    assert policy(min_interval_s=3600.0, max_interval_s=7200.0).interval_s == pytest.approx(3600.0, rel=1e-5)
    assert policy(prior_save_s=3000.0, max_interval_s=1800.0).interval_s == 1800.0


def test_from_logs_report_dict_and_file(tmp_path):
    report = {"rates": {"failures_per_1000_node_days": 6.5, "nodes": 400}, "fits": {"exponential": {"mttf_hours": 9.2}}}
    assert AdaptiveIntervalPolicy.from_logs_report(report, nodes=2000).failures_per_node_day == pytest.approx(0.0065)
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps({"rates": {"nodes": 10}, "fits": {"exponential": {"mttf_hours": 48.0}}}))
    from_file = AdaptiveIntervalPolicy.from_logs_report(path, nodes=2000, restart_s=60.0)
    assert from_file.failures_per_node_day == pytest.approx(24 / (48 * 10))


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ({}, "logs report has no usable failure rate"),
        ({"rates": {"failures_per_1000_node_days": 0}}, "logs report has no usable failure rate"),
        ({"fits": {"exponential": {"mttf_hours": 5.0}}}, "or fits.exponential.mttf_hours with rates.nodes"),
    ],
)
def test_unusable_logs_report(report, message):
    with pytest.raises(ETTRInputError) as caught:
        failures_per_node_day_from_report(report)
    assert message in str(caught.value)


def test_missing_logs_file_says_how_to_make_one(tmp_path):
    with pytest.raises(ETTRInputError) as caught:
        AdaptiveIntervalPolicy.from_logs_report(tmp_path / "nope.json", nodes=2)
    assert str(caught.value) == f"{tmp_path / 'nope.json'}: no such logs report (make one with `ucp logs analyze --json`)"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"smoothing": 0.0}, "smoothing must be in (0, 1], got 0.0"),
        ({"min_interval_s": 100.0, "max_interval_s": 10.0}, "need 0 < min_interval_s <= max_interval_s, got 100.0, 10.0"),
        ({"nodes": 0}, "nodes must be a positive integer, got 0"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ETTRInputError) as caught:
        policy(**options)
    assert str(caught.value) == message


def test_drives_the_real_checkpoint_manager(tmp_path):
    import time

    import torch

    from ucp.manager import CheckpointManager

    adaptive = policy(nodes=1, min_interval_s=0.2, max_interval_s=0.2)
    manager = CheckpointManager(tmp_path, save_policy=adaptive)
    state = {"w": torch.ones(2), "step": 1}
    assert manager.maybe_save(1, state) is None  # asked every step; not due yet
    time.sleep(0.25)
    assert manager.maybe_save(2, state) is not None
    adaptive.observe_save(blocking_s=manager.records[-1].blocking_seconds)
    assert manager.steps() == [2] and adaptive.saves_observed == 1
