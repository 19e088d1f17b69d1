"""Planning replication across ranks: ranks onto placement nodes, a policy's sites onto ranks, transfers.

Pure functions over what every rank reported (:class:`RankInfo`), so rank 0 plans
and the plan is testable without processes. A placement policy works on *nodes*
(:mod:`ucp.replication.placement`); several ranks may share a node (a copy on another
rank of the owner's node dies with the owner's node, so it is not a replica).
When every rank reports the same node (one machine, tests), each rank stands for
a node of its own.

The policy sees what the live cluster reports, as the simulator's policies do: each
node's free bytes per tier (its capacity left), its forecast, its ``speed`` (1: the
cluster's nominal node; 0.25 serves reads four times slower), and read times from
``io``, a measured I/O cost model (:class:`~ucp.replication.io_cost.IoCostModel`),
over the bandwidths of ``spec``; ``io=None`` keeps the spec's constants.

Each array gets a local copy on its owner (memory, else disk, if there is room:
a survivor restarts from it without any transfer) and the peer replicas the policy
places; ranks already holding the array are not sent it again (re-replication after
a recovery moves only what was lost).

Example::

    >>> from ucp.replication.policies import GroupPlacement
    >>> from ucp.replication.replica_map import ArrayRecord, FileRecord
    >>> infos = [RankInfo(rank=r, node=f"n{r}", rack=r, free={"memory": 100, "disk": 0}) for r in range(4)]
    >>> records = {"r0/a": ArrayRecord("r0/a", 0, "d", (FileRecord("zarr.json", 10, "d"),))}
    >>> holders, transfers = plan_replication(records, infos, policy=GroupPlacement(), replicas=1)
    >>> [(h.rank, h.tier) for h in holders["r0/a"]]
    [(0, 'memory'), (1, 'memory')]
    >>> [(t.source, t.dest) for t in transfers]
    [(0, 0), (0, 1)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ucp.replication.errors import PlacementError
from ucp.replication.cluster import DISK, MEMORY, TIERS, ClusterSpec
from ucp.replication.placement import (ClusterView, FragmentRequest, NodeState, PlacementPolicy, PlacementRequest,
                                   validate_placement)
from ucp.replication.replica_map import ArrayRecord, Holder
from ucp.replication.replica_transfer import Transfer


@dataclass(frozen=True)
class RankInfo:
    """What one rank reports: its node and rack, free bytes per tier, arrays of this checkpoint it holds."""

    rank: int
    node: str
    rack: int | None = None
    free: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, str] = field(default_factory=dict)  # array key -> tier holding it
    failure_probability: float = 0.0
    speed: float = 1.0  # relative read rate of this rank's node (1: nominal)


def node_ranks(infos: Sequence[RankInfo]) -> list[list[int]]:
    """Ranks of each placement node, in order of first appearance (one node per rank on a single machine)."""
    names = list(dict.fromkeys(i.node for i in infos))
    if len(names) == 1:
        return [[i.rank] for i in infos]
    return [[i.rank for i in infos if i.node == name] for name in names]


def plan_replication(records: Mapping[str, ArrayRecord], infos: Sequence[RankInfo], *, policy: PlacementPolicy,
                     replicas: int, io=None, spec: ClusterSpec | None = None,
                     ) -> tuple[dict[str, tuple[Holder, ...]], list[Transfer]]:
    """Holders per array (the owner's local copy first, then peers) and the transfers that make them so.

    ``io``: the cost model the policy's read times come from (None: ``spec``'s bandwidths);
    ``spec``: the network's bandwidths and timings (default :class:`ClusterSpec`'s).
    """
    world = len(infos)
    free = {i.rank: {t: int(i.free.get(t, 0)) for t in TIERS} for i in infos}
    holders: dict[str, list[Holder]] = {}
    transfers: list[Transfer] = []
    for key, rec in records.items():
        owner = rec.owner % world
        have = infos[owner].held.get(key)
        tier = have or next((t for t in (MEMORY, DISK) if free[owner][t] >= rec.nbytes), None)
        holders[key] = []
        if tier is not None:
            holders[key].append(Holder(owner, tier))
            if have is None:
                free[owner][tier] -= rec.nbytes
                transfers.append(Transfer(owner, owner, key, rec.nbytes, tier))
    groups = node_ranks(infos)
    if len(groups) >= 2 and replicas > 0 and records:
        for key, rank, tier in _peer_sites(records, infos, groups, free, policy=policy, replicas=replicas,
                                           io=io, spec=spec or ClusterSpec()):
            holders[key].append(Holder(rank, tier))
            if infos[rank].held.get(key) is None:
                transfers.append(Transfer(records[key].owner % world, rank, key, records[key].nbytes, tier))
    return {k: tuple(v) for k, v in holders.items()}, transfers


def _peer_sites(records, infos, groups, free, *, policy, replicas, io, spec):
    """``(key, rank, tier)`` for every peer replica the policy places (ranks already holding one count)."""
    node_of = {r: n for n, ranks in enumerate(groups) for r in ranks}
    world = len(infos)
    racks = [infos[ranks[0]].rack for ranks in groups]
    view = ClusterView(tuple(
        NodeState(node=n, rack=n if racks[n] is None else racks[n], alive=True,
                  memory_free_bytes=float(sum(free[r][MEMORY] for r in ranks)),
                  disk_free_bytes=float(sum(free[r][DISK] for r in ranks)),
                  failure_probability=max(infos[r].failure_probability for r in ranks),
                  speed=min(infos[r].speed for r in ranks))  # a node serves at its slowest rank's rate
        for n, ranks in enumerate(groups)),
        dataclasses.replace(spec, nodes=len(groups), rack_size=1,
                            shard_bytes=max(1.0, sum(r.nbytes for r in records.values()) / len(groups))), io)
    request = PlacementRequest(tuple(FragmentRequest(key, node_of[rec.owner % world], float(rec.nbytes))
                                     for key, rec in records.items()),
                               replicas=replicas, min_replicas=1, max_replicas=max(replicas, 3))
    placement = policy.place(request, view)
    validate_placement(request, view, placement)
    # The simulator lets a full cluster leave a fragment under-replicated (its penalty is a
    # recovery from the remote store); a live job that asked for copies is told it has none.
    bare = sorted(f.fragment_id for f in request.fragments if len(placement.sites.get(f.fragment_id, ())) < 1)
    if bare and replicas > 0:
        raise PlacementError(
            f"no node has room for a replica of {', '.join(bare[:3])}{' ...' if len(bare) > 3 else ''}; "
            "free memory or disk on the peers, or lower replicas="
        )
    for key, sites in placement.sites.items():
        nbytes = records[key].nbytes
        for site in sites:
            ranks = groups[site.node]
            # a rank of that node that already holds the array, else the one with most room in the tier
            rank = next((r for r in ranks if infos[r].held.get(key)), None)
            if rank is None:
                rank = max(ranks, key=lambda r: (free[r][site.tier], -r))
                free[rank][site.tier] -= nbytes
                yield key, rank, site.tier
            else:
                yield key, rank, infos[rank].held[key]
