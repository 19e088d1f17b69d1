"""The placement protocol: what a policy is asked, what it sees, what it answers.

A *request* lists checkpoint fragments (owner node, bytes) and a replica budget;
a *view* is the cluster as the policy may see it (racks, free slots per tier,
liveness, failure forecasts); a *placement* maps each fragment to replica sites.
The same types drive the simulator and a real replica manager: node ids are
indices into ``view.nodes`` (a manager keeps its own index -> host/rank map).

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> spec = ClusterSpec(nodes=4, rack_size=2)
    >>> view = ClusterView.uniform(spec)
    >>> request = PlacementRequest.one_per_node(spec, replicas=1)
    >>> placement = Placement({f.fragment_id: (ReplicaSite(node=(f.owner + 2) % 4, tier="memory"),)
    ...                        for f in request.fragments})
    >>> validate_placement(request, view, placement)
    >>> placement.replica_bytes(request)
    256000000000.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from ucp.replication.cluster import MEMORY, TIERS, ClusterSpec
from ucp.replication.errors import PlacementError, PlacementInputError
from ucp.replication.transfer_times import TransferTimes


@dataclass(frozen=True)
class FragmentRequest:
    """One fragment to replicate: its id, the node holding its primary copy, its size."""

    fragment_id: str
    owner: int
    nbytes: float


@dataclass(frozen=True)
class PlacementRequest:
    """Fragments to replicate under a budget of ``replicas`` copies per fragment *on average*.

    Every fragment gets between ``min_replicas`` and ``max_replicas`` copies; the
    total replica bytes may not exceed ``budget_bytes`` (``replicas`` times the
    fragments' bytes), so every policy spends the same storage at most.
    ``intervals_since_remote`` says how stale the remote store's copy of this
    checkpoint would be (0: this checkpoint is also persisted remotely).
    """

    fragments: tuple[FragmentRequest, ...]
    replicas: int = 2
    min_replicas: int = 1
    max_replicas: int = 3
    intervals_since_remote: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.replicas <= self.max_replicas:
            raise PlacementInputError(
                f"placement request: need 0 <= min_replicas ({self.min_replicas}) <= replicas "
                f"({self.replicas}) <= max_replicas ({self.max_replicas})")
        ids = [f.fragment_id for f in self.fragments]
        if len(set(ids)) != len(ids):
            raise PlacementInputError("placement request: fragment ids must be unique")

    @property
    def budget_bytes(self) -> float:
        return self.replicas * sum(f.nbytes for f in self.fragments)

    @classmethod
    def one_per_node(cls, spec: ClusterSpec, *, replicas: int = 2, intervals_since_remote: int = 0,
                     min_replicas: int = 1, max_replicas: int = 3) -> "PlacementRequest":
        """The simulator's request: node ``i`` owns fragment ``shard-i`` of ``spec.shard_bytes``."""
        fragments = tuple(FragmentRequest(f"shard-{i}", i, spec.shard_bytes) for i in range(spec.nodes))
        return cls(fragments, replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                   intervals_since_remote=intervals_since_remote)


@dataclass(frozen=True)
class NodeState:
    """One node as a policy sees it. ``failure_probability``: forecast for the next interval.

    ``speed`` scales the node's transfer rates (its NIC and devices): 1 is the cluster's
    nominal node, 0.25 one that serves reads four times slower. ``alive`` is False for a
    node that failed or has left the job (churn): it holds nothing and gets nothing.
    """

    node: int
    rack: int
    alive: bool = True
    memory_free_bytes: float = 0.0
    disk_free_bytes: float = 0.0
    failure_probability: float = 0.0
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise PlacementInputError(f"node {self.node}: speed must be > 0, got {self.speed}")


@dataclass(frozen=True)
class ClusterView:
    """The cluster at placement time: nodes, the recovery timing constants, how long reads take.

    ``io``: a measured cost model (:class:`~ucp.replication.io_cost.IoCostModel`) whose
    predictions replace the spec's bandwidth constants; None keeps the constants.
    """

    nodes: tuple[NodeState, ...]
    spec: ClusterSpec
    io: object | None = None

    @property
    def times(self) -> TransferTimes:
        """Restore times per node and tier (:mod:`ucp.replication.transfer_times`)."""
        return TransferTimes(self.spec, tuple(s.speed for s in self.nodes), self.io)

    def free_bytes(self, node: int, tier: str) -> float:
        state = self.nodes[node]
        return state.memory_free_bytes if tier == MEMORY else state.disk_free_bytes

    @classmethod
    def uniform(cls, spec: ClusterSpec, probabilities=None) -> "ClusterView":
        """Every node alive with empty replica slots; forecasts from ``probabilities`` (default 0)."""
        probs = [0.0] * spec.nodes if probabilities is None else [float(p) for p in probabilities]
        return cls(tuple(
            NodeState(node=i, rack=spec.rack_of(i), alive=True,
                      memory_free_bytes=spec.memory_slots * spec.shard_bytes,
                      disk_free_bytes=spec.disk_slots * spec.shard_bytes, failure_probability=probs[i])
            for i in range(spec.nodes)), spec)


@dataclass(frozen=True)
class ReplicaSite:
    node: int
    tier: str


@dataclass(frozen=True)
class Placement:
    """Fragment id -> the replica sites chosen for it (read-only mapping)."""

    sites: Mapping[str, tuple[ReplicaSite, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", MappingProxyType({k: tuple(v) for k, v in self.sites.items()}))

    def replica_bytes(self, request: PlacementRequest) -> float:
        return sum(f.nbytes * len(self.sites.get(f.fragment_id, ())) for f in request.fragments)

    def to_dict(self) -> dict:
        return {fid: [{"node": s.node, "tier": s.tier} for s in sites] for fid, sites in self.sites.items()}


@runtime_checkable
class PlacementPolicy(Protocol):
    """Chooses replica sites. ``name`` is the policy's report name (``static-random``, ``rl`` ...)."""

    name: str

    def place(self, request: PlacementRequest, view: ClusterView) -> Placement: ...


@runtime_checkable
class LearningPolicy(PlacementPolicy, Protocol):
    """A policy that also learns from what happened after it placed (closed loop)."""

    def observe(self, outcome) -> None: ...


def validate_placement(request: PlacementRequest, view: ClusterView, placement: Placement) -> None:
    """Raise :class:`PlacementError` unless the placement obeys every rule of the request and view.

    Capacity binds: a fragment may stay below ``min_replicas`` only when no allowed site
    has room left for it once the placement is made (a heterogeneous cluster can run out);
    it then recovers from the remote store, or loses data, which is the placement's penalty.
    """
    known = {f.fragment_id for f in request.fragments}
    extra = sorted(set(placement.sites) - known)
    if extra:
        raise PlacementError(f"placement names fragments not in the request: {', '.join(extra)}")
    used: dict[tuple[int, str], float] = {}
    for frag in request.fragments:
        sites = placement.sites.get(frag.fragment_id, ())
        if len(sites) > request.max_replicas:
            raise PlacementError(
                f"{frag.fragment_id}: {len(sites)} replicas, the request allows "
                f"{request.min_replicas}..{request.max_replicas}")
        holders = [s.node for s in sites]
        if len(set(holders)) != len(holders):
            raise PlacementError(f"{frag.fragment_id}: two replicas on one node ({holders})")
        for site in sites:
            if not 0 <= site.node < len(view.nodes):
                raise PlacementError(f"{frag.fragment_id}: node {site.node} is not in the cluster")
            if site.node == frag.owner:
                raise PlacementError(f"{frag.fragment_id}: a replica on its owner node {frag.owner}")
            if not view.nodes[site.node].alive:
                raise PlacementError(f"{frag.fragment_id}: node {site.node} is down")
            if site.tier not in TIERS:
                raise PlacementError(f"{frag.fragment_id}: unknown tier '{site.tier}' (use {', '.join(TIERS)})")
            used[(site.node, site.tier)] = used.get((site.node, site.tier), 0.0) + frag.nbytes
    for (node, tier), nbytes in sorted(used.items()):
        if nbytes > view.free_bytes(node, tier) * (1 + 1e-9):
            free = view.free_bytes(node, tier)
            raise PlacementError(f"node {node} {tier}: {nbytes:.0f} bytes placed, {free:.0f} free")
    total = placement.replica_bytes(request)
    if total > request.budget_bytes * (1 + 1e-9):
        raise PlacementError(f"placement uses {total:.0f} replica bytes, the budget is {request.budget_bytes:.0f}")
    for frag in request.fragments:
        sites = placement.sites.get(frag.fragment_id, ())
        if len(sites) >= request.min_replicas:
            continue
        held = {s.node for s in sites}
        room = [(s.node, tier) for s in view.nodes if s.alive and s.node != frag.owner and s.node not in held
                for tier in TIERS if view.free_bytes(s.node, tier) - used.get((s.node, tier), 0.0)
                >= frag.nbytes * (1 - 1e-9)]
        if room:
            node, tier = room[0]
            raise PlacementError(
                f"{frag.fragment_id}: {len(sites)} replicas, the request allows "
                f"{request.min_replicas}..{request.max_replicas}, and node {node} {tier} still has room for it")
