"""The evaluation's parts: published rates, ETTR accounting, expectation runs, the exact optimum, live risk."""

from __future__ import annotations

import numpy as np
import pytest

from ucp.replication.cluster import ClusterSpec
from ucp.replication.evaluate import aggregate, ci95
from ucp.replication.failures import generate_trace
from ucp.replication.optimum import expected_seconds, optimum, small_instance
from ucp.replication.policies import GroupPlacement, StaticRandom, baseline_policies
from ucp.replication.published_rates import node_failure_probability, published_model, rack_event_share
from ucp.replication.recovery import Recovery
from ucp.replication.simulator import PolicyResult, Scenario, hazard_cases, simulate, simulate_expected

SPEC = ClusterSpec()


def test_published_rates_are_the_papers_numbers():
    assert node_failure_probability(SPEC) * 86_400 / SPEC.interval_s * 1000 == pytest.approx(6.5)
    model = published_model(SPEC)
    assert rack_event_share(model, SPEC) == pytest.approx(35 / 419)
    fast = published_model(SPEC, acceleration=100)
    assert fast.lifetime.mttf_intervals == pytest.approx(model.lifetime.mttf_intervals / 100)
    assert rack_event_share(fast, SPEC) == pytest.approx(35 / 419)


def test_ettr_counts_downtime_rollbacks_and_lost_work_apart():
    result = PolicyResult("p", interval_s=600.0, intervals=100)
    result.add(Recovery(65.0, False, False, 0.0))
    result.add(Recovery(60.0 + 80.0 + 1200.0, True, True, 0.0, rework_s=1200.0))
    out = result.summary()
    assert out["failures"] == 2 and out["rollback_s"] == 1200.0 and out["downtime_s"] == 65.0 + 140.0
    assert out["lost_work_s"] == 600.0  # half an interval per failure
    assert out["ettr"] == pytest.approx(60_000 / (60_000 + 65 + 1340 + 600))
    assert out["data_loss_events"] == 1 and out["remote_share"] == 0.5


def test_expectation_run_weights_every_case_by_its_true_probability():
    trace = generate_trace(SPEC, published_model(SPEC, acceleration=100), intervals=50, seed=3, family="x")
    scenario = Scenario.without_forecasts(trace)
    result = simulate_expected(GroupPlacement(), scenario)
    expected = sum(p for t in range(50) for _, p in hazard_cases(trace, t))
    assert result.failures == pytest.approx(expected)
    assert result.summary()["mean_recovery_s"] >= SPEC.restart_s
    # a sampled run of the same hazards agrees within its noise over many intervals
    long = generate_trace(SPEC, published_model(SPEC, acceleration=300), intervals=600, seed=4, family="x")
    sampled = simulate(StaticRandom(seed=0), Scenario.without_forecasts(long)).summary()["failures"]
    assert sampled == pytest.approx(simulate_expected(StaticRandom(seed=0), Scenario.without_forecasts(long)).failures,
                                    rel=0.35)


def test_intervals_and_aggregates():
    assert ci95([1.0]) is None
    lo, hi = ci95([1.0, 2.0, 3.0])
    assert lo < 2.0 < hi and hi - 2.0 == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)
    runs = [dict.fromkeys(("mean_recovery_s", "remote_share", "data_loss_events", "storage_bytes",
                           "storage_utilization", "failures", "downtime_s", "rollback_s", "lost_work_s", "ettr"),
                          float(v)) for v in (1, 2, 3)]
    row = aggregate(runs)
    assert row["ettr"] == 2.0 and row["ci95"]["ettr"] == [lo, hi]


def test_the_optimum_is_no_worse_than_any_policy_and_is_exact():
    instance = small_instance(seed=5)
    best, cost = optimum(instance)
    assert expected_seconds(instance, best) == pytest.approx(cost)
    for policy in baseline_policies(seed=1):
        assert expected_seconds(instance, policy.place(instance.request, instance.view)) >= cost - 1e-9
    # exact: no single-shard move improves on it
    from ucp.replication.placement import Placement, ReplicaSite, validate_placement
    from ucp.replication.errors import PlacementError

    for fid in best.sites:
        for node in range(4):
            for tier in ("memory", "disk"):
                sites = dict(best.sites)
                sites[fid] = (ReplicaSite(node, tier),)
                moved = Placement(sites)
                try:
                    validate_placement(instance.request, instance.view, moved)
                except PlacementError:
                    continue
                assert expected_seconds(instance, moved) >= cost - 1e-9


def test_log_risk_ranks_a_failing_node_above_a_quiet_one():
    from ucp.replication.live_risk import LogRisk
    from ucp.replication.scenarios import pretrained_forecaster
    from tests.replication.test_live_forecasts import _report

    risk = LogRisk(pretrained_forecaster(intervals=300))
    probs = risk.probabilities(_report("n1", 1e6), ["n0", "n1"], now=1e6)
    assert probs["n1"] > 3 * probs["n0"]
    later = risk.probabilities(_report("n1", 1e6), ["n0", "n1"], now=1e6 + 30 * 86_400)
    assert later["n1"] == pytest.approx(later["n0"], rel=0.5)
