"""The Monte-Carlo timeline simulator: exact small cases, agreement with the model, breakdown."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ucp.reliability.ettr.model import ETTRInputError, JobReliability, expected_ettr
from ucp.reliability.ettr.simulator import FailureLaw, ettr_per_run, sample_failure_times, simulate_ettr, simulate_grid

MIN = 60.0


def job_with(*, restart_s=0.0, blocking_s=0.0) -> JobReliability:
    # The rate is irrelevant when failure times are given by hand.
    return JobReliability(nodes=1, failures_per_node_day=1.0, restart_s=restart_s, save_blocking_s=blocking_s)


def one_run(failures, job, **options) -> float:
    times = np.array([failures or [math.inf]], dtype=float)
    return float(ettr_per_run(times, job, horizon_s=1000.0, **options)[0])


def test_no_failures_only_blocking_saves_cost():
    assert one_run([], job_with(blocking_s=10.0), interval_s=90.0) == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("failure_at", "expected"),
    [
        (120.0, 0.880),  # the save of t=100 commits at 130: in flight at the failure, so lost
        (140.0, 0.960),  # committed at 130: 100 s kept, 40 s lost
    ],
)
def test_async_save_in_flight_at_failure_does_not_count(failure_at, expected):
    assert one_run([failure_at], job_with(), interval_s=100.0, save_background_s=30.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("failures", "expected"),
    [
        ([200.0, 230.0], 0.920),  # second failure hits the restart: the restart begins again
        ([200.0, 300.0], 0.850),  # 50 s of compute after the restart, lost: no save yet
    ],
)
def test_restart_and_lost_work(failures, expected):
    assert one_run(failures, job_with(restart_s=50.0), interval_s=100.0) == pytest.approx(expected)


def test_background_longer_than_interval_makes_saves_wait():
    # interval 100, background 150: a save every 150 s, each committing 150 s after it starts.
    assert one_run([], job_with(), interval_s=100.0, save_background_s=150.0) == pytest.approx(
        (6 * 100 + 100) / 1000
    )


def _agreement_grid():
    # Where the model's assumptions hold: exponential failures and
    # N*r_f*(u0 + dt + background) small (at most ~0.1 here).
    for nodes, per_1000, restart_min, save_min, background_min in itertools.product(
        (100, 1000), (2.0, 5.0), (2.0, 5.0), (0.0, 0.5), (0.0, 1.0)
    ):
        yield JobReliability.from_per_1000_node_days(
            nodes, per_1000, restart_s=restart_min * MIN, save_blocking_s=save_min * MIN
        ), background_min * MIN


def test_simulator_agrees_with_model_within_two_percent_where_assumptions_hold():
    checked = 0
    for job, background_s in _agreement_grid():
        intervals = [5 * MIN, 10 * MIN, 20 * MIN]
        results = simulate_grid(job, intervals_s=intervals, runs=100, seed=7, save_background_s=background_s)
        for result in results:
            model = expected_ettr(job, interval_s=result.interval_s)
            assert abs(result.ettr - model) / model < 0.02, (job, background_s, result, model)
            checked += 1
    assert checked == 96


def test_model_breaks_down_for_intervals_near_the_mttf():
    job = JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=5 * MIN)
    near, far = simulate_grid(job, intervals_s=[0.05 * job.mttf_s, job.mttf_s], runs=100, seed=3)
    assert near.ettr == pytest.approx(expected_ettr(job, interval_s=near.interval_s), rel=0.02)
    # The model charges dt/2 per failure; the simulator knows a failure often
    # comes before the first save after a restart, so it loses less.
    assert far.ettr - expected_ettr(job, interval_s=far.interval_s) > 0.05


def test_model_breaks_down_for_weibull_infant_mortality_on_fresh_nodes():
    job = JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=5 * MIN)
    law = FailureLaw(weibull_shape=0.5, fresh_nodes=True)
    result = simulate_ettr(job, interval_s=30 * MIN, runs=20, seed=1, horizon_s=30 * 86400.0, law=law)
    assert result.ettr < expected_ettr(job, interval_s=30 * MIN) - 0.1


def test_stationary_weibull_nodes_superpose_to_the_mean_rate():
    # Many aged nodes together fail at N * r_f whatever the shape (Palm-Khintchine).
    job = JobReliability.from_per_1000_node_days(2000, 6.5)
    rng = np.random.default_rng(5)
    horizon = 30 * 86400.0
    times = sample_failure_times(job, horizon_s=horizon, runs=40, rng=rng, law=FailureLaw(weibull_shape=0.6))
    per_run = np.isfinite(times).sum(axis=1).mean()
    assert per_run == pytest.approx(job.job_failure_rate_per_s * horizon, rel=0.05)
    finite = np.where(np.isfinite(times), times, horizon)
    assert np.all(np.diff(finite, axis=1) >= 0)  # each run's failures come sorted


def test_same_seed_same_answer_and_stderr_shrinks():
    job = JobReliability.from_mttf_hours(8, 6.0, restart_s=120.0, save_blocking_s=20.0)
    a = simulate_ettr(job, interval_s=900.0, runs=50, seed=11)
    b = simulate_ettr(job, interval_s=900.0, runs=50, seed=11)
    assert a == b
    assert simulate_ettr(job, interval_s=900.0, runs=200, seed=11).stderr < a.stderr


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda job: simulate_grid(job, intervals_s=[60.0], runs=1), "runs must be >= 2 (for a standard error), got 1"),
        (lambda job: simulate_ettr(job, interval_s=0.0, runs=2), "interval_s must be > 0, got 0.0"),
        (lambda job: simulate_ettr(job, interval_s=60.0, runs=2, horizon_s=-1.0), "horizon_s must be > 0, got -1.0"),
        (lambda job: FailureLaw(weibull_shape=0.0), "weibull_shape must be > 0, got 0.0"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ETTRInputError) as caught:
        call(JobReliability.from_mttf_hours(1, 1.0))
    assert str(caught.value) == message
