"""The analytical ETTR model: the paper's numbers, the optimal intervals, bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.reliability.ettr.model import (
    ETTRInputError,
    JobReliability,
    closed_form_optimal_interval_s,
    daly_interval_s,
    expected_ettr,
    optimal_interval_s,
    young_interval_s,
)
from ucp.errors import UcpError

MIN = 60.0


def kokolis_job(**options) -> JobReliability:
    # 16,000 GPUs = 2,000 nodes of 8; 6.5 failures per 1000 node-days; 5-minute restart.
    return JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=5 * MIN, **options)


@pytest.mark.parametrize(("interval_min", "expected"), [(60.0, 0.68), (5.0, 0.93)])
def test_paper_example_with_consistent_units(interval_min, expected):
    assert expected_ettr(kokolis_job(), interval_s=interval_min * MIN) == pytest.approx(expected, abs=0.005)


def test_paper_example_by_hand_in_days():
    # The same numbers, computed in days to show the unit bookkeeping.
    n_rf = 2000 * 6.5 / 1000  # 13 job failures per day
    assert 1 - n_rf * (5 + 60 / 2) / 1440 == pytest.approx(expected_ettr(kokolis_job(), interval_s=3600.0))
    # Mixing units (r_f per node-day, times in minutes) is what makes the
    # formula "not give" the paper's numbers: it goes hugely negative.
    assert 1 - n_rf * (5 + 60 / 2) < -400


def test_mttf_is_one_over_n_rf():
    job = kokolis_job()
    assert job.mttf_s == pytest.approx(86400.0 / 13.0)
    same = JobReliability.from_mttf_hours(2000, job.mttf_s / 3600.0, restart_s=300.0)
    assert same.failures_per_node_day == pytest.approx(job.failures_per_node_day)


def test_queue_time_costs_its_share_of_each_failure():
    base = kokolis_job()
    queued = kokolis_job(queue_s=10 * MIN)
    drop = expected_ettr(base, interval_s=600.0) - expected_ettr(queued, interval_s=600.0)
    assert drop == pytest.approx(13.0 * 10 / 1440)


def test_blocking_save_divides_by_one_plus_w_over_dt():
    job = kokolis_job(save_blocking_s=60.0)
    no_save = expected_ettr(kokolis_job(), interval_s=600.0)
    assert expected_ettr(job, interval_s=600.0) == pytest.approx(no_save / 1.1)


def test_young_and_daly_known_values():
    job = JobReliability.from_mttf_hours(1, 24.0, save_blocking_s=60.0)
    assert young_interval_s(job) == pytest.approx(math.sqrt(2 * 60 * 86400))
    ratio = 60 / (2 * 86400)
    daly = math.sqrt(2 * 60 * 86400) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - 60
    assert daly_interval_s(job) == pytest.approx(daly)
    # Daly's rule for a save longer than twice the MTTF: checkpoint every MTTF.
    huge = JobReliability.from_mttf_hours(1, 1.0, save_blocking_s=3 * 3600.0)
    assert daly_interval_s(huge) == pytest.approx(3600.0)


@pytest.mark.parametrize(
    ("nodes", "per_1000", "restart_min", "save_min"),
    [(2000, 6.5, 5, 1), (2000, 6.5, 5, 0.1), (128, 5.0, 10, 2), (16, 2.0, 1, 5), (4096, 8.0, 15, 0.5)],
)
def test_numerical_optimum_matches_closed_form_and_is_near_young(nodes, per_1000, restart_min, save_min):
    job = JobReliability.from_per_1000_node_days(nodes, per_1000, restart_s=restart_min * MIN, save_blocking_s=save_min * MIN)
    best = optimal_interval_s(job)
    assert best == pytest.approx(closed_form_optimal_interval_s(job), rel=1e-4)
    for other in (best * 0.9, best * 1.1, young_interval_s(job), daly_interval_s(job)):
        assert expected_ettr(job, interval_s=best) >= expected_ettr(job, interval_s=other) - 1e-12
    # Young's rule shrunk by the fraction of time not spent restarting, less one save (as Daly).
    uptime = 1 - job.job_failure_rate_per_s * job.downtime_s
    assert best == pytest.approx(young_interval_s(job) * math.sqrt(uptime) - job.save_blocking_s, rel=0.02)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 20000),
    per_1000=st.floats(0.1, 20.0),
    restart_s=st.floats(0.0, 1800.0),
    save_s=st.floats(0.5, 600.0),
)
def test_optimum_is_a_maximum(nodes, per_1000, restart_s, save_s):
    job = JobReliability.from_per_1000_node_days(nodes, per_1000, restart_s=restart_s, save_blocking_s=save_s)
    if job.job_failure_rate_per_s * job.downtime_s >= 0.5:
        return  # the job spends most of its time restarting; no interior optimum worth testing
    best = optimal_interval_s(job)
    assert 1.0 <= best <= job.mttf_s
    value = expected_ettr(job, interval_s=best)
    assert value >= expected_ettr(job, interval_s=best * 0.8) - 1e-9
    assert value >= expected_ettr(job, interval_s=min(best * 1.25, job.mttf_s)) - 1e-9


def test_no_save_cost_means_shortest_interval():
    assert optimal_interval_s(kokolis_job(), min_interval_s=30.0) == 30.0
    assert young_interval_s(kokolis_job()) == 0.0


def test_ettr_is_clipped_at_zero_past_the_model_range():
    assert expected_ettr(kokolis_job(), interval_s=10 * 3600.0) == 0.0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: JobReliability(nodes=0, failures_per_node_day=0.1), "nodes must be a positive integer, got 0"),
        (lambda: JobReliability(nodes=2, failures_per_node_day=-1.0), "failures_per_node_day must be a finite number >= 0, got -1.0"),
        (lambda: JobReliability(nodes=2, failures_per_node_day=0.0), "failures_per_node_day must be > 0 (a job that never fails needs no checkpoints)"),
        (lambda: JobReliability(nodes=2, failures_per_node_day=0.1, restart_s=float("nan")), "restart_s must be a finite number >= 0, got nan"),
        (lambda: JobReliability.from_mttf_hours(2, 0.0), "mttf_hours must be a finite number > 0, got 0.0"),
        (lambda: expected_ettr(kokolis_job(), interval_s=0.0), "interval_s must be > 0"),
    ],
)
def test_bad_input_is_named(build, message):
    with pytest.raises(ETTRInputError) as caught:
        build()
    assert str(caught.value) == message
    assert isinstance(caught.value, UcpError) and isinstance(caught.value, ValueError)


def test_closed_form_refuses_a_job_that_cannot_restart():
    job = JobReliability.from_mttf_hours(1, 1.0, restart_s=7200.0, save_blocking_s=1.0)
    with pytest.raises(ETTRInputError, match="fails faster than it can restart"):
        closed_form_optimal_interval_s(job)
