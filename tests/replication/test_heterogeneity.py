"""Heterogeneous clusters: capacity binds, slow nodes read slowly, churn, the exact optimum, paired statistics."""

from __future__ import annotations

import numpy as np
import pytest

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementError
from ucp.replication.evaluate import paired_difference
from ucp.replication.heterogeneity import HeteroModel
from ucp.replication.optimum import expected_seconds, optimum, small_instance
from ucp.replication.placement import (ClusterView, FragmentRequest, NodeState, Placement, PlacementRequest,
                                       ReplicaSite, validate_placement)
from ucp.replication.policies import GreedyForecast, GroupPlacement, baseline_policies
from ucp.replication.recovery import recover
from ucp.replication.scenarios import HELD_OUT, HETERO, HETERO_TRAINING, family_trace
from ucp.replication.simulator import Scenario, simulate

GB = 1e9
SPEC = ClusterSpec(nodes=4, rack_size=2, shard_bytes=10 * GB, restart_s=60, memory_bandwidth_bps=10 * GB,
                   disk_bandwidth_bps=2 * GB)


def _view(memory=(10, 10, 10, 10), disk=(0, 0, 0, 0), speed=(1, 1, 1, 1)) -> ClusterView:
    return ClusterView(tuple(NodeState(i, SPEC.rack_of(i), True, memory[i] * GB, disk[i] * GB, 0.0, speed[i])
                             for i in range(4)), SPEC)


def _request(sizes=(10, 10, 10, 10)) -> PlacementRequest:
    return PlacementRequest(tuple(FragmentRequest(f"shard-{i}", i, sizes[i] * GB) for i in range(4)),
                            replicas=1, max_replicas=1)


def test_capacity_in_bytes_binds_and_names_the_node():
    request, view = _request((20, 10, 10, 10)), _view(memory=(10, 10, 30, 10))
    too_big = {"shard-0": (ReplicaSite(1, "memory"),), "shard-1": (ReplicaSite(2, "memory"),),
               "shard-2": (ReplicaSite(3, "memory"),), "shard-3": (ReplicaSite(0, "memory"),)}
    with pytest.raises(PlacementError) as err:
        validate_placement(request, view, Placement(too_big))
    assert str(err.value) == "node 1 memory: 20000000000 bytes placed, 10000000000 free"


def test_a_shard_may_go_unreplicated_only_when_nothing_has_room():
    request, view = _request((20, 10, 10, 10)), _view(memory=(10, 10, 10, 10))
    rest = {"shard-1": (ReplicaSite(2, "memory"),), "shard-2": (ReplicaSite(3, "memory"),),
            "shard-3": (ReplicaSite(0, "memory"),)}
    validate_placement(request, view, Placement(rest))  # the 20 GB shard fits nowhere: allowed, and penalized
    cost = recover(request, Placement(rest), spec=SPEC, lost=frozenset({0}), unavailable=frozenset({0}))
    assert cost.remote and cost.seconds == pytest.approx(60 + 20)  # read from the remote store at 1 GB/s
    roomy = _view(memory=(10, 20, 10, 10))
    with pytest.raises(PlacementError) as err:
        validate_placement(request, roomy, Placement(rest))
    assert str(err.value) == ("shard-0: 0 replicas, the request allows 1..1, and node 1 memory still has room "
                              "for it")


def test_a_slow_node_serves_its_replica_slower_and_greedy_avoids_it():
    request, view = _request(), _view(disk=(20, 20, 20, 20), speed=(1, 1, 0.1, 1))
    on_slow = Placement({"shard-0": (ReplicaSite(2, "memory"),)})
    seconds = recover(request, on_slow, spec=SPEC, lost=frozenset({0}), unavailable=frozenset({0}),
                      times=view.times).seconds
    assert seconds == pytest.approx(60 + 10.0)  # 10 GB at 10 GB/s, ten times slower (a fast disk: 5 s)
    placement = GreedyForecast().place(request, view)
    validate_placement(request, view, placement)
    assert all(s.node != 2 for sites in placement.sites.values() for s in sites)  # other racks have room
    assert any(s.node == 2 for s in GroupPlacement().place(request, view).sites["shard-0"])  # a fixed rule does not


def test_churn_absent_nodes_own_nothing_hold_nothing_and_cannot_fail():
    spec = ClusterSpec(nodes=8, rack_size=2)
    het = HeteroModel(churn_mtbl_intervals=5, away_intervals=5).draw(spec, intervals=60, seed=2)
    assert not het.present.all() and het.present.sum(1).min() >= 2
    trace = het.restrict(family_trace("correlated-rack", intervals=60, seed=2, spec=spec))
    for t, events in enumerate(trace.failures):
        for lost in events:
            assert het.present[t, sorted(lost)].all()
    assert (trace.node_hazard[~het.present] == 0).all()
    t = int(np.flatnonzero(~het.present.all(1))[0])
    request = het.request(spec, t, replicas=2, intervals_since_remote=0)
    view = het.view(spec, t, np.zeros(8))
    absent = set(np.flatnonzero(~het.present[t]).tolist())
    assert {f.owner for f in request.fragments}.isdisjoint(absent)
    for policy in baseline_policies(seed=0):
        placement = policy.place(request, view)
        validate_placement(request, view, placement)
        assert all(s.node not in absent for sites in placement.sites.values() for s in sites)


def test_hetero_draws_are_reproducible_and_differ_per_node():
    spec = ClusterSpec()
    a = HeteroModel().draw(spec, intervals=10, seed=7)
    b = HeteroModel().draw(spec, intervals=10, seed=7)
    assert (a.speed == b.speed).all() and (a.shard_bytes == b.shard_bytes).all()
    assert len(set(a.shard_bytes)) == spec.nodes and set(a.speed) == {1.0, 0.25}
    assert set(HETERO_TRAINING).isdisjoint(HELD_OUT) and set(HETERO) - set(HETERO_TRAINING) <= set(HELD_OUT)


def test_every_policy_fits_a_heterogeneous_scenario():
    from ucp.replication.scenarios import build_scenario, pretrained_forecaster

    scenario = build_scenario("hetero-thunderbird", intervals=30, seed=1, forecaster=pretrained_forecaster(
        intervals=200))
    for policy in baseline_policies(seed=0):
        assert simulate(policy, scenario).summary()["failures"] >= 0  # validate_placement ran every interval
    assert isinstance(scenario, Scenario) and scenario.hetero is not None


def test_the_heterogeneous_optimum_is_exact_and_a_fixed_rule_misses_it():
    gaps = []
    for seed in range(4):
        instance = small_instance(seed=seed, hetero=True)
        best, cost = optimum(instance)
        assert expected_seconds(instance, best) == pytest.approx(cost)
        for policy in baseline_policies(seed=1):
            placement = policy.place(instance.request, instance.view)
            validate_placement(instance.request, instance.view, placement)
            assert expected_seconds(instance, placement) >= cost - 1e-9
        group = expected_seconds(instance, GroupPlacement().place(instance.request, instance.view))
        gaps.append(group / cost - 1)
        for fid in best.sites:  # exact: no single-shard move improves on it
            for node in range(4):
                for tier in ("memory", "disk"):
                    moved = Placement({**best.sites, fid: (ReplicaSite(node, tier),)})
                    try:
                        validate_placement(instance.request, instance.view, moved)
                    except PlacementError:
                        continue
                    assert expected_seconds(instance, moved) >= cost - 1e-9
    assert max(gaps) > 0.05  # the homogeneous model's optimum was a fixed rule; this one is not


def test_paired_difference_is_per_seed_against_the_best_other_policy():
    runs = {"a": [{"ettr": 0.90, "downtime_s": 100.0, "rollback_s": 0.0}, {"ettr": 0.80, "downtime_s": 300.0,
                                                                          "rollback_s": 0.0}],
            "b": [{"ettr": 0.91, "downtime_s": 90.0, "rollback_s": 0.0}, {"ettr": 0.81, "downtime_s": 290.0,
                                                                         "rollback_s": 10.0}],
            "rl": [{"ettr": 0.92, "downtime_s": 80.0, "rollback_s": 0.0}, {"ettr": 0.82, "downtime_s": 280.0,
                                                                          "rollback_s": 0.0}]}
    pair = paired_difference(runs)
    assert pair["baseline"] == "b" and pair["seeds"] == 2
    assert pair["lost_s_diff"] == pytest.approx(-15.0)  # (-10, -20): seed by seed
    assert pair["lost_relative"] == pytest.approx(-15.0 / 195.0)
    assert pair["ettr_diff"] == pytest.approx(0.01)
    lo, hi = pair["lost_s_ci95"]
    assert lo < -15.0 < hi and hi - (-15.0) == pytest.approx(12.706205 * np.std([-10, -20], ddof=1) / np.sqrt(2), rel=1e-5)


def test_the_rl_observation_shows_speed_free_memory_and_shard_size():
    from ucp.replication.rl_env import NODE_FEATURES, PlacementBuilder

    request, view = _request((20, 10, 10, 10)), _view(memory=(10, 40, 10, 10), disk=(20, 20, 20, 20),
                                                      speed=(1, 1, 0.25, 1))
    builder = PlacementBuilder(request, view, max_nodes=4)
    obs = builder.observation()
    nodes = obs[: 4 * NODE_FEATURES].reshape(4, NODE_FEATURES)
    assert nodes[:, 11].tolist() == [0.0, 0.0, -1.0, 0.0]  # log2(speed) / 2
    frag = builder.current
    expected_memory = [min(m / (2 * frag.nbytes / 1e9), 1.0) for m in (10, 40, 10, 10)]
    assert nodes[:, 12].tolist() == pytest.approx(expected_memory)
    assert obs[-1] == pytest.approx(np.log2(frag.nbytes / (50e9 / 4)) / 2)  # the shard against the mean


def test_the_rl_builder_replicates_shards_of_unequal_float_sizes():
    # Regression: the budget mask used an absolute 1e-6 slack; with unequal float shard sizes the
    # budget and the deficit (sums in different orders) differ by ~1e-5 and a shard was skipped.
    from ucp.replication.rl_env import PlacementBuilder

    instance = small_instance(seed=2, hetero=True)
    builder = PlacementBuilder(instance.request, instance.view, max_nodes=4)
    while not builder.done:
        mask = builder.action_masks()
        builder.apply(int(np.flatnonzero(mask[:-1])[0]) if mask[:-1].any() else len(mask) - 1)
    validate_placement(instance.request, instance.view, builder.placement())


def test_a_family_s_small_instances_come_from_its_cluster_model():
    model = HETERO["hetero-x100"][1]
    instance = small_instance(seed=3, cluster=model)
    drawn = model.draw(small_instance.__kwdefaults__["spec"], intervals=1, seed=3)
    assert [s.speed for s in instance.view.nodes] == drawn.speed.tolist()
    assert [s.memory_free_bytes for s in instance.view.nodes] == drawn.memory_bytes.tolist()
    assert [f.nbytes for f in instance.request.fragments] == drawn.shard_bytes.tolist()
    assert instance.view.io is None  # the caller's read times (the evaluation passes its own)


def test_family_optimum_gaps_skip_draws_that_fit_nowhere_and_refuse_when_too_few_fit():
    from ucp.replication.optimum import optimum_gaps

    skipped: list[int] = []
    tight = HeteroModel(memory_shards=(0.0,), disk_shards=(0.6, 1.5))  # some draws leave a shard no room
    gaps = optimum_gaps([GreedyForecast()], seeds=3, cluster=tight, skipped=skipped)
    assert len(gaps["greedy"]) == 3 and skipped and min(gaps["greedy"]) >= -1e-9
    with pytest.raises(PlacementError) as err:
        optimum_gaps([GreedyForecast()], seeds=2, cluster=HeteroModel(memory_shards=(0.0,), disk_shards=(0.4,)))
    assert str(err.value) == ("only 0 of 2 small instances of this cluster model fit; give the model more capacity "
                              "or ask for fewer instances")
