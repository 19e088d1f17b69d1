"""The recovery-time model: how long a restart takes given where replicas survived.

When the nodes in ``lost`` fail, their replacements restore the lost nodes'
fragments. Each fragment is read from a surviving replica (not on any node lost
so far in this interval), choosing the source that finishes earliest: a peer
serves its reads one after another, memory at the memory bandwidth, disk at the
disk bandwidth. A fragment with no surviving replica is read from the remote
store (per-reader and aggregate bandwidth) if the remote copy is this very
checkpoint; if the remote copy is older, it is a *data-loss* event: every node
rolls back to the remote checkpoint (all fragments read from the remote store)
and the intervals since then are trained again.

    recovery seconds = restart + max(peer source times, remote time) [+ rework]

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> from ucp.replication.placement import PlacementRequest, Placement, ReplicaSite
    >>> spec = ClusterSpec(nodes=4, rack_size=2, shard_bytes=10e9, restart_s=60, memory_bandwidth_bps=10e9)
    >>> request = PlacementRequest.one_per_node(spec, replicas=1)
    >>> placement = Placement({f"shard-{i}": (ReplicaSite((i + 2) % 4, "memory"),) for i in range(4)})
    >>> recover(request, placement, spec=spec, lost=frozenset({0}), unavailable=frozenset({0})).seconds
    61.0
    >>> recover(request, placement, spec=spec, lost=frozenset({0}), unavailable=frozenset({0, 2}),
    ...         intervals_since_remote=2).data_loss
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from ucp.replication.cluster import ClusterSpec
from ucp.replication.placement import Placement, PlacementRequest
from ucp.replication.transfer_times import TransferTimes


@dataclass(frozen=True)
class Recovery:
    """One recovery: its downtime, whether it read the remote store, lost data, and replica use."""

    seconds: float
    remote: bool
    data_loss: bool
    useful_bytes: float  # replica bytes of the lost fragments that survived (read, or ready to be)
    rework_s: float = 0.0  # of ``seconds``: the intervals trained again after a rollback (data loss)


def recover(request: PlacementRequest, placement: Placement, *, spec: ClusterSpec, lost: frozenset,
            unavailable: frozenset, intervals_since_remote: int | None = None,
            times: TransferTimes | None = None) -> Recovery:
    """Recovery after ``lost`` fail; replicas on ``unavailable`` (a superset of ``lost``) are gone.

    ``times`` gives per-node and per-tier read times (a view's ``times``: node speeds, the
    measured cost model); None: every node at the spec's bandwidth constants.
    """
    times = times or TransferTimes(spec)
    stale = request.intervals_since_remote if intervals_since_remote is None else intervals_since_remote
    needed = [f for f in request.fragments if f.owner in lost]
    options = []
    useful = 0.0
    for frag in needed:
        survivors = [s for s in placement.sites.get(frag.fragment_id, ()) if s.node not in unavailable]
        useful += frag.nbytes * len(survivors)
        options.append((frag, survivors))
    # fragments with the fewest surviving sources choose first, so they are not crowded out
    options.sort(key=lambda item: len(item[1]))
    busy: dict[int, float] = {}
    remote_bytes, remote_largest, missing = 0.0, 0.0, False
    for frag, survivors in options:
        if not survivors:
            missing = True
            remote_bytes += frag.nbytes
            remote_largest = max(remote_largest, frag.nbytes)
            continue
        cost = {s: times.peer_seconds(s.node, s.tier, frag.nbytes) for s in survivors}
        best = min(survivors, key=lambda s: (busy.get(s.node, 0.0) + cost[s], s.node))
        busy[best.node] = busy.get(best.node, 0.0) + cost[best]
    if missing and stale > 0:
        every = [f.nbytes for f in request.fragments]
        reload = times.remote_seconds(max(every), sum(every))
        return Recovery(spec.restart_s + reload + stale * spec.interval_s, True, True, useful, stale * spec.interval_s)
    remote_s = times.remote_seconds(remote_largest, remote_bytes)
    return Recovery(spec.restart_s + max([remote_s, *busy.values()]), missing, False, useful)
