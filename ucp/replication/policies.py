"""The baseline placement policies, each one frozen dataclass behind :class:`PlacementPolicy`.

- ``static-random``: ``replicas`` distinct random peers per fragment.
- ``rack-aware`` (HDFS): the first replica on a random node of another rack, the
  second on another node of that same rack, further ones on yet other racks.
- ``group`` (Gemini, SOSP'23): nodes form fixed groups of ``replicas + 1``, each
  group drawn from different racks; a node's replicas go to the other members.
- ``greedy``: forecast-aware. Replica counts follow the owners' failure
  forecasts (the budget moves from safe owners to risky ones), risky owners
  choose first, and each replica goes to the site with the least expected
  restore time, never sharing a rack with the owner or another replica if any
  other rack has room.

Every policy spends at most the request's budget and fills a holder's memory
before its disk (``memory`` is the faster tier); the static ones place in rounds
(every fragment's first replica, then every second one), so first replicas get
the memory slots.

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> from ucp.replication.placement import ClusterView, PlacementRequest, validate_placement
    >>> spec = ClusterSpec(nodes=8, rack_size=2)
    >>> request, view = PlacementRequest.one_per_node(spec), ClusterView.uniform(spec)
    >>> for policy in baseline_policies(seed=0):
    ...     validate_placement(request, view, policy.place(request, view))
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ucp.replication.cluster import DISK, MEMORY
from ucp.replication.placement import ClusterView, FragmentRequest, Placement, PlacementRequest, ReplicaSite


class _Free:
    """Free bytes per (node, tier) while a placement is being built."""

    def __init__(self, view: ClusterView):
        self.free = {(s.node, MEMORY): s.memory_free_bytes for s in view.nodes if s.alive}
        self.free.update({(s.node, DISK): s.disk_free_bytes for s in view.nodes if s.alive})

    def tier(self, node: int, nbytes: float) -> str | None:
        """Memory if it has room, else disk if it has room, else None."""
        for tier in (MEMORY, DISK):
            if self.free.get((node, tier), 0.0) >= nbytes:
                return tier
        return None

    def take(self, node: int, tier: str, nbytes: float) -> ReplicaSite:
        self.free[(node, tier)] -= nbytes
        return ReplicaSite(node, tier)


def _candidates(view: ClusterView, free: _Free, frag: FragmentRequest, taken: list[ReplicaSite]) -> list[int]:
    holders = {s.node for s in taken}
    return [s.node for s in view.nodes
            if s.alive and s.node != frag.owner and s.node not in holders and free.tier(s.node, frag.nbytes)]


def _fill_minimum(request, view, free, sites, rng) -> None:
    """Top every fragment up to ``min_replicas`` with random sites (capacity ran out for the policy's rule)."""
    for frag in request.fragments:
        chosen = sites.setdefault(frag.fragment_id, [])
        while len(chosen) < request.min_replicas:
            nodes = _candidates(view, free, frag, chosen)
            if not nodes:
                break  # validate_placement will name the fragment
            node = int(rng.choice(nodes))
            chosen.append(free.take(node, free.tier(node, frag.nbytes), frag.nbytes))


@dataclass(frozen=True)
class _RandomRounds:
    """Random choice among the nodes a rule allows, in rounds (every fragment's 1st replica, then 2nd ...)."""

    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rng", np.random.default_rng(self.seed))

    def _pool(self, k: int, frag: FragmentRequest, chosen: list[ReplicaSite], nodes: list[int],
              rack: dict[int, int]) -> list[int]:
        return nodes

    def place(self, request: PlacementRequest, view: ClusterView) -> Placement:
        free, sites = _Free(view), {f.fragment_id: [] for f in request.fragments}
        rack = {s.node: s.rack for s in view.nodes}
        for k in range(request.replicas):
            for frag in request.fragments:
                chosen = sites[frag.fragment_id]
                pool = self._pool(k, frag, chosen, _candidates(view, free, frag, chosen), rack)
                if pool:
                    node = int(self._rng.choice(pool))
                    chosen.append(free.take(node, free.tier(node, frag.nbytes), frag.nbytes))
        _fill_minimum(request, view, free, sites, self._rng)
        return Placement(sites)


@dataclass(frozen=True)
class StaticRandom(_RandomRounds):
    """``replicas`` distinct random peers per fragment, drawn anew each checkpoint."""

    name: str = "static-random"


@dataclass(frozen=True)
class RackAware(_RandomRounds):
    """HDFS's rule: remote rack first, second replica in that same remote rack, then other racks."""

    name: str = "rack-aware"

    def _pool(self, k, frag, chosen, nodes, rack):
        used_racks = {rack[frag.owner]} | {rack[s.node] for s in chosen}
        if k == 1 and chosen:
            preferred = [n for n in nodes if rack[n] == rack[chosen[0].node]]
        else:
            preferred = [n for n in nodes if rack[n] not in used_racks]
        return preferred or [n for n in nodes if rack[n] != rack[frag.owner]] or nodes


@dataclass(frozen=True)
class GroupPlacement:
    """Gemini's group placement: fixed groups of ``replicas + 1`` nodes, each from different racks.

    Nodes are ordered rack by rack in turn (rack 0's first node, rack 1's first,
    ...) and cut into groups, so a group spans racks when there are enough. A
    remainder joins the last group, whose members then replicate to the next
    ``replicas`` members around it (Gemini's mixed ring).
    """

    seed: int = 0
    name: str = "group"

    def groups(self, view: ClusterView, size: int) -> list[list[int]]:
        by_rack: dict[int, list[int]] = {}
        for s in view.nodes:
            if s.alive:
                by_rack.setdefault(s.rack, []).append(s.node)
        order, depth = [], max((len(v) for v in by_rack.values()), default=0)
        for level in range(depth):
            order += [members[level] for _, members in sorted(by_rack.items()) if level < len(members)]
        groups = [order[i:i + size] for i in range(0, len(order) - len(order) % size, size)]
        rest = order[len(groups) * size:]
        if groups:
            groups[-1] += rest
        elif rest:
            groups = [rest]
        return groups

    def place(self, request: PlacementRequest, view: ClusterView) -> Placement:
        free, sites = _Free(view), {}
        ring = {}
        for group in self.groups(view, request.replicas + 1):
            for pos, node in enumerate(group):
                ring[node] = [group[(pos + j) % len(group)] for j in range(1, len(group))]
        for k in range(request.replicas):  # in rounds: each node's ring successor first, in memory
            for frag in request.fragments:
                chosen = sites.setdefault(frag.fragment_id, [])
                members = ring.get(frag.owner, [])
                tier = free.tier(members[k], frag.nbytes) if k < len(members) else None
                if tier:
                    chosen.append(free.take(members[k], tier, frag.nbytes))
        _fill_minimum(request, view, free, sites, np.random.default_rng(self.seed))
        return Placement(sites)


# Diminishing value of a fragment's 1st, 2nd, 3rd ... replica: a 2nd copy matters only if the
# 1st is lost with the owner, a 3rd if both are. Flat forecasts give every fragment `replicas`.
_REPLICA_VALUE = (1.0, 0.3, 0.1, 0.03, 0.01)


def allocate_counts(request: PlacementRequest, risk: dict[str, float]) -> dict[str, int]:
    """Replica counts within the budget: the next replica goes to the highest ``risk * value``."""
    counts = {f.fragment_id: request.min_replicas for f in request.fragments}
    budget = request.budget_bytes - sum(f.nbytes * request.min_replicas for f in request.fragments)
    heap = [(-risk[f.fragment_id] * _REPLICA_VALUE[min(request.min_replicas, 4)], i, f)
            for i, f in enumerate(request.fragments)]
    heapq.heapify(heap)
    while heap:
        _, i, frag = heapq.heappop(heap)
        # relative slack: the budget is a float sum of unequal sizes (validate_placement allows 1e-9 too)
        if frag.nbytes > budget + 1e-9 * request.budget_bytes or counts[frag.fragment_id] >= request.max_replicas:
            continue
        counts[frag.fragment_id] += 1
        budget -= frag.nbytes
        nxt = counts[frag.fragment_id]
        heapq.heappush(heap, (-risk[frag.fragment_id] * _REPLICA_VALUE[min(nxt, 4)], i, frag))
    return counts


@dataclass(frozen=True)
class GreedyForecast:
    """Forecast-aware greedy placement (see the module docstring)."""

    seed: int = 0
    name: str = "greedy"

    def place(self, request: PlacementRequest, view: ClusterView) -> Placement:
        spec, times = view.spec, view.times
        prob = {s.node: s.failure_probability for s in view.nodes}
        rack = {s.node: s.rack for s in view.nodes}
        # equal forecasts must not favour low node ids: ties break by fragment order
        risk = {f.fragment_id: max(prob[f.owner], 1e-9) for f in request.fragments}
        counts = allocate_counts(request, risk)
        free, sites, held = _Free(view), {f.fragment_id: [] for f in request.fragments}, {}
        by_risk = sorted(request.fragments, key=lambda f: -risk[f.fragment_id])
        # in rounds: every fragment's first replica before any second one, so a risky fragment's
        # spare copies never take the memory slot that another fragment's only copy needs
        for frag in (f for k in range(request.max_replicas) for f in by_risk if counts[f.fragment_id] > k):
            chosen = sites[frag.fragment_id]
            # what a lost replica costs: the remote store, or the rework back to its stale copy
            fallback = times.remote_seconds(frag.nbytes, frag.nbytes) + request.intervals_since_remote * spec.interval_s
            used_racks = {rack[frag.owner]} | {rack[s.node] for s in chosen}
            options = []
            for node in _candidates(view, free, frag, chosen):
                tier = free.tier(node, frag.nbytes)
                p = prob[node]
                expected = (1 - p) * times.peer_seconds(node, tier, frag.nbytes) + p * fallback
                # fewer replicas held first: two lost owners never queue on one source. Rounded relative
                # to the fallback, not to a fixed 1e-6 s, which tied every site of a fragment of a few MB.
                options.append((rack[node] in used_racks, round(expected / (fallback or 1.0), 12), held.get(node, 0),
                                node, tier))
            if not options:
                continue
            *_, node, tier = min(options)
            held[node] = held.get(node, 0) + 1
            chosen.append(free.take(node, tier, frag.nbytes))
        _fill_minimum(request, view, free, sites, np.random.default_rng(self.seed))
        return Placement(sites)


def baseline_policies(*, seed: int = 0) -> list:
    """The four heuristic policies, seeded."""
    return [StaticRandom(seed=seed), RackAware(seed=seed), GroupPlacement(seed=seed), GreedyForecast(seed=seed)]
