"""Cluster spec string form, the placement protocol's rules, and the recovery-time model."""

from __future__ import annotations

import pytest

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementError, PlacementInputError
from ucp.replication.placement import (ClusterView, NodeState, Placement, PlacementRequest, ReplicaSite,
                                   validate_placement)
from ucp.replication.recovery import recover

GB = 1e9


def test_spec_string_round_trip_and_units():
    spec = ClusterSpec.parse("nodes=8,rack_size=2,shard_gb=10,memory_gbps=5,remote_every=3")
    assert (spec.nodes, spec.racks, spec.shard_bytes, spec.memory_bandwidth_bps) == (8, 4, 10 * GB, 5 * GB)
    assert ClusterSpec.parse(str(spec)) == spec
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert [spec.rack_of(i) for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("text, message", [
    ("nodes", "cluster spec 'nodes': bad item 'nodes'; expected key=value with key one of nodes, rack_size, "
              "shard_gb, memory_slots, disk_slots, memory_gbps, disk_gbps, remote_gbps, remote_total_gbps, "
              "restart_s, interval_s, remote_every"),
    ("nodes=2.5", "cluster spec 'nodes=2.5': nodes must be an integer, got '2.5'"),
    ("shard_gb=big", "cluster spec 'shard_gb=big': shard_gb needs a number, got 'big'"),
])
def test_spec_parse_errors(text, message):
    with pytest.raises(PlacementInputError) as err:
        ClusterSpec.parse(text)
    assert str(err.value) == message
    assert isinstance(err.value, ValueError)


def test_spec_rejects_impossible_values():
    with pytest.raises(PlacementInputError, match=r"nodes must be >= 2; rack_size must be between 1 and nodes"):
        ClusterSpec(nodes=1, rack_size=4)


SPEC = ClusterSpec(nodes=4, rack_size=2, shard_bytes=10 * GB, memory_slots=1, disk_slots=1)


def _request(**kw):
    return PlacementRequest.one_per_node(SPEC, replicas=1, **kw)


def _ok_sites():
    return {f"shard-{i}": (ReplicaSite((i + 2) % 4, "memory"),) for i in range(4)}


@pytest.mark.parametrize("change, message", [
    ({"shard-0": (ReplicaSite(0, "memory"),)}, "shard-0: a replica on its owner node 0"),
    ({"shard-0": (ReplicaSite(2, "memory"), ReplicaSite(2, "disk"))}, "shard-0: two replicas on one node ([2, 2])"),
    ({"shard-0": ()}, "shard-0: 0 replicas, the request allows 1..3, and node 1 disk still has room for it"),
    ({"shard-0": (ReplicaSite(9, "memory"),)}, "shard-0: node 9 is not in the cluster"),
    ({"shard-0": (ReplicaSite(2, "tape"),)}, "shard-0: unknown tier 'tape' (use memory, disk)"),
    ({"shard-1": (ReplicaSite(2, "memory"),)}, "node 2 memory: 20000000000 bytes placed, 10000000000 free"),
    ({"shard-9": (ReplicaSite(2, "memory"),)}, "placement names fragments not in the request: shard-9"),
])
def test_validate_names_the_broken_rule(change, message):
    request = PlacementRequest.one_per_node(SPEC, replicas=1, max_replicas=3)
    with pytest.raises(PlacementError) as err:
        validate_placement(request, ClusterView.uniform(SPEC), Placement({**_ok_sites(), **change}))
    assert str(err.value) == message


def test_validate_budget_and_dead_nodes():
    request = PlacementRequest.one_per_node(SPEC, replicas=1, max_replicas=2)
    sites = {**_ok_sites(), "shard-0": (ReplicaSite(2, "memory"), ReplicaSite(3, "disk"))}
    with pytest.raises(PlacementError, match=r"^placement uses 50000000000 replica bytes, the budget is 40000000000$"):
        validate_placement(request, ClusterView.uniform(SPEC), Placement(sites))
    view = ClusterView.uniform(SPEC)
    dead = ClusterView(tuple(NodeState(**{**vars(n), "alive": n.node != 2}) for n in view.nodes), SPEC)
    with pytest.raises(PlacementError, match=r"^shard-0: node 2 is down$"):
        validate_placement(_request(), dead, Placement(_ok_sites()))


def test_request_checks_its_limits():
    expected = r"need 0 <= min_replicas \(1\) <= replicas \(4\) <= max_replicas \(3\)"
    with pytest.raises(PlacementInputError, match=expected):
        PlacementRequest.one_per_node(SPEC, replicas=4)


# -- recovery model -------------------------------------------------------------------------
RSPEC = ClusterSpec(nodes=4, rack_size=2, shard_bytes=10 * GB, memory_bandwidth_bps=10 * GB, disk_bandwidth_bps=2 * GB,
                    remote_bandwidth_bps=1 * GB, remote_aggregate_bps=2 * GB, restart_s=60, interval_s=600)


def _recover(sites, lost, gone=None, stale=0):
    request = PlacementRequest.one_per_node(RSPEC, replicas=1, intervals_since_remote=stale)
    return recover(request, Placement(sites), spec=RSPEC, lost=frozenset(lost), unavailable=frozenset(gone or lost))


def test_recovery_time_by_tier_contention_remote_and_loss():
    mem = {f"shard-{i}": (ReplicaSite((i + 2) % 4, "memory"),) for i in range(4)}
    disk = {f"shard-{i}": (ReplicaSite((i + 2) % 4, "disk"),) for i in range(4)}
    assert _recover(mem, {0}).seconds == pytest.approx(61.0)
    assert _recover(disk, {0}).seconds == pytest.approx(65.0)
    # both lost shards read from node 2: its reads queue (2 x 1 s), not in parallel
    both_on_2 = {"shard-0": (ReplicaSite(2, "memory"),), "shard-1": (ReplicaSite(2, "disk"),),
                 "shard-2": (ReplicaSite(0, "memory"),), "shard-3": (ReplicaSite(0, "disk"),)}
    assert _recover(both_on_2, {0, 1}).seconds == pytest.approx(60 + 1 + 5)
    # replica gone, remote copy is this checkpoint: slow but no loss (10 GB at 1 GB/s)
    fresh = _recover(mem, {0}, gone={0, 2}, stale=0)
    assert (fresh.seconds, fresh.remote, fresh.data_loss, fresh.useful_bytes) == (pytest.approx(70.0), True, False, 0.0)
    # remote copy two intervals old: every node reloads (40 GB at 2 GB/s aggregate) and redoes 2 intervals
    lost = _recover(mem, {0}, gone={0, 2}, stale=2)
    assert (lost.seconds, lost.remote, lost.data_loss) == (pytest.approx(60 + 20 + 1200), True, True)
    assert _recover(mem, {0}).useful_bytes == 10 * GB
