"""The baseline policies do what their names promise, on scenarios built to show it."""

from __future__ import annotations

import numpy as np
import pytest

from ucp.replication.cluster import MEMORY, ClusterSpec
from ucp.replication.failures import CHANNELS, Trace
from ucp.replication.placement import ClusterView, PlacementRequest, validate_placement
from ucp.replication.policies import GreedyForecast, GroupPlacement, RackAware, StaticRandom, allocate_counts
from ucp.replication.simulator import Scenario, simulate

SPEC = ClusterSpec()  # 16 nodes, racks of 4


def _rack_zero_fails_every_interval(intervals=120):
    spec = ClusterSpec(nodes=8, rack_size=4)
    failures = tuple((frozenset(range(4)),) for _ in range(intervals))
    monitor = np.zeros((intervals, 8, len(CHANNELS)), dtype=np.int32)
    return Scenario.without_forecasts(Trace("rack-test", spec, failures, monitor))


def test_rack_aware_survives_rack_failures_that_static_random_does_not():
    scenario = _rack_zero_fails_every_interval()
    random = simulate(StaticRandom(seed=0), scenario).summary()
    rack = simulate(RackAware(seed=0), scenario).summary()
    group = simulate(GroupPlacement(seed=0), scenario).summary()
    assert random["data_loss_events"] > 10  # about 1 in 2 stale intervals loses a shard
    assert rack["data_loss_events"] == 0 and group["data_loss_events"] == 0
    assert rack["remote_share"] == 0 and rack["mean_recovery_s"] < random["mean_recovery_s"] / 3
    assert rack["storage_bytes"] == random["storage_bytes"]  # same budget, spent differently


def test_every_policy_spends_at_most_the_budget_under_any_forecast():
    rng = np.random.default_rng(0)
    for trial in range(10):
        view = ClusterView.uniform(SPEC, rng.uniform(0, 0.3, SPEC.nodes) ** 3)
        request = PlacementRequest.one_per_node(SPEC, intervals_since_remote=trial % 6)
        for policy in (StaticRandom(seed=trial), RackAware(seed=trial), GroupPlacement(), GreedyForecast()):
            placement = policy.place(request, view)
            validate_placement(request, view, placement)
            assert placement.replica_bytes(request) <= request.budget_bytes


def test_group_placement_spans_racks_and_gives_every_shard_a_memory_copy():
    request, view = PlacementRequest.one_per_node(SPEC), ClusterView.uniform(SPEC)
    policy = GroupPlacement()
    groups = policy.groups(view, 3)
    assert sorted(n for g in groups for n in g) == list(range(16))
    assert all(len({SPEC.rack_of(n) for n in g}) == len(g) for g in groups)
    placement = policy.place(request, view)
    for frag in request.fragments:
        sites = placement.sites[frag.fragment_id]
        group = next(g for g in groups if frag.owner in g)
        assert {s.node for s in sites} <= set(group)
        assert any(s.tier == MEMORY for s in sites)


def test_greedy_moves_replicas_to_risky_owners_and_off_risky_holders():
    probs = np.full(SPEC.nodes, 0.002)
    probs[5] = 0.3  # degraded: likely to fail soon
    view = ClusterView.uniform(SPEC, probs)
    request = PlacementRequest.one_per_node(SPEC, intervals_since_remote=3)
    placement = GreedyForecast().place(request, view)
    assert len(placement.sites["shard-5"]) == 3
    assert all(s.node != 5 for sites in placement.sites.values() for s in sites)
    assert placement.sites["shard-5"][0].tier == MEMORY
    assert len({SPEC.rack_of(s.node) for s in placement.sites["shard-5"]} | {SPEC.rack_of(5)}) == 4


def test_flat_forecasts_give_everyone_the_same_count():
    request = PlacementRequest.one_per_node(SPEC)
    counts = allocate_counts(request, {f.fragment_id: 0.01 for f in request.fragments})
    assert set(counts.values()) == {2}
    skewed = allocate_counts(request, {f.fragment_id: (0.5 if f.owner == 0 else 0.01) for f in request.fragments})
    assert skewed["shard-0"] == 3 and sum(skewed.values()) == 32


@pytest.mark.parametrize("policy", [StaticRandom(seed=1), RackAware(seed=1)])
def test_random_policies_are_reproducible(policy):
    request, view = PlacementRequest.one_per_node(SPEC), ClusterView.uniform(SPEC)
    again = type(policy)(seed=1)
    assert policy.place(request, view) == again.place(request, view)


def _view_with(spec, **changes):
    """A uniform view with node 3 changed (``speed``, ``memory_free_bytes``, ``alive`` ...)."""
    import dataclasses

    view = ClusterView.uniform(spec)
    nodes = tuple(dataclasses.replace(s, **changes) if s.node == 3 else s for s in view.nodes)
    return dataclasses.replace(view, nodes=nodes)


@pytest.mark.parametrize("changes, chosen, reason", [
    ({}, "group", None),
    ({"speed": 1.2}, "group", None),  # within the spread a live job's nodes show
    ({"speed": 0.25}, "greedy", "node speeds range from 0.25 to 1"),
    ({"memory_free_bytes": 0.0}, "greedy", "free memory ranges from 0 to"),
    ({"alive": False, "memory_free_bytes": 0.0, "speed": 0.25}, "group", None),  # a dead node is not the cluster
])
def test_auto_picks_what_measured_best_for_the_cluster_it_sees(changes, chosen, reason):
    from ucp.replication.policies import MeasuredBest, is_heterogeneous

    spec = ClusterSpec(nodes=8, rack_size=2)
    request, view = PlacementRequest.one_per_node(spec), _view_with(spec, **changes)
    why = is_heterogeneous(view)
    assert (why is None) if reason is None else why.startswith(reason)
    policy = MeasuredBest(seed=3)
    assert policy.choose(request, view).name == chosen
    expected = (GroupPlacement if chosen == "group" else GreedyForecast)(seed=3).place(request, view)
    assert policy.place(request, view) == expected
    validate_placement(request, view, expected)


def test_the_live_default_policy_is_auto():
    from ucp.replication.replica_tiers import MemoryTier
    from ucp.replication.replicas import ReplicaManager

    assert ReplicaManager(tiers=[MemoryTier(capacity_bytes=1 << 20)]).policy.name == "auto"
