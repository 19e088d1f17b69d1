"""The exact best placement of a small instance, by exhaustive search, and each policy's gap to it.

The objective is what ETTR loses to recoveries: the expected recovery seconds of one
checkpoint interval, ``sum over failure cases of P(case) * recover(case).seconds``
(:mod:`ucp.replication.recovery`: restart, reads from the fastest surviving copies with
per-source queueing, the remote store, rollbacks), where the cases are each node
alone (at its forecast) and each rack (at Llama 3's switch/cable share of the node
events, :mod:`ucp.replication.published_rates`). Every placement the request allows is
tried, so the optimum is exact for that model; instances stay small (4 nodes in 2
racks, one replica per shard, one memory and one disk slot per node: 1,296 placements).

Example::

    >>> instance = small_instance(seed=0)
    >>> best, cost = optimum(instance)
    >>> from ucp.replication.policies import GroupPlacement
    >>> expected_seconds(instance, GroupPlacement().place(instance.request, instance.view)) >= cost
    True
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from ucp.replication.cluster import TIERS, ClusterSpec
from ucp.replication.placement import (ClusterView, FragmentRequest, Placement, PlacementRequest, ReplicaSite,
                                       validate_placement)
from ucp.replication.published_rates import LLAMA3_SWITCH_CABLE, LLAMA3_UNEXPECTED
from ucp.replication.recovery import recover
from ucp.replication.errors import PlacementError

SMALL_SPEC = ClusterSpec(nodes=4, rack_size=2, memory_slots=1, disk_slots=1)


@dataclass(frozen=True)
class Instance:
    """A request, the view a policy is shown, and the failure cases with their probabilities."""

    request: PlacementRequest
    view: ClusterView
    cases: tuple[tuple[frozenset, float], ...]


def small_instance(*, seed: int, spec: ClusterSpec = SMALL_SPEC, hetero: bool = False, io=None,
                   cluster=None) -> Instance:
    """Heterogeneous forecasts (log-uniform 1e-4..1e-1 per node), a random remote staleness.

    ``hetero``: also shard sizes (x0.5..x2), capacities (memory 0.5..2.5 shards, disk 1..3),
    one slow node (speed 0.25) and ``io`` (default: the shipped measured cost model).
    ``cluster``: instead, a :class:`~ucp.replication.heterogeneity.HeteroModel` to draw speeds,
    capacities and shard sizes from (a family's cluster model), with read times from ``io``.
    Without either, every node and shard is alike and ``io`` (default None: the constants) applies.
    """
    rng = np.random.default_rng(seed)
    probs = 10.0 ** rng.uniform(-4, -1, spec.nodes)
    stale = int(rng.integers(0, spec.remote_every))
    view = ClusterView(ClusterView.uniform(spec, probs).nodes, spec, io)
    request = PlacementRequest.one_per_node(spec, replicas=1, max_replicas=1, intervals_since_remote=stale)
    if hetero or cluster is not None:
        from ucp.replication.io_cost import IoCostModel

        if cluster is not None:
            drawn = cluster.draw(spec, intervals=1, seed=seed)
            shard, memory, disk, speed = drawn.shard_bytes, drawn.memory_bytes, drawn.disk_bytes, drawn.speed
        else:
            shard = spec.shard_bytes * np.exp(rng.uniform(np.log(0.5), np.log(2.0), spec.nodes))
            memory = spec.shard_bytes * rng.uniform(0.5, 2.5, spec.nodes)
            disk = spec.shard_bytes * rng.uniform(1.0, 3.0, spec.nodes)
            speed = np.ones(spec.nodes)
            speed[rng.integers(spec.nodes)] = 0.25
            io = io or IoCostModel.shipped()
        view = ClusterView(tuple(dataclasses.replace(s, memory_free_bytes=float(memory[i]),
                                                     disk_free_bytes=float(disk[i]), speed=float(speed[i]))
                                 for i, s in enumerate(view.nodes)), spec, io)
        request = PlacementRequest(tuple(FragmentRequest(f"shard-{i}", i, float(shard[i])) for i in range(spec.nodes)),
                                   replicas=1, max_replicas=1, intervals_since_remote=stale)
    share = LLAMA3_SWITCH_CABLE / LLAMA3_UNEXPECTED
    rack_p = share / (1 - share) * float(probs.sum()) / spec.racks
    cases = [(frozenset([i]), float(p)) for i, p in enumerate(probs)]
    cases += [(frozenset(n for n in range(spec.nodes) if spec.rack_of(n) == r), rack_p) for r in range(spec.racks)]
    return Instance(request, view, tuple(cases))


def expected_seconds(instance: Instance, placement: Placement) -> float:
    """Expected recovery seconds of one interval under the instance's failure cases."""
    spec, times = instance.view.spec, instance.view.times
    return sum(p * recover(instance.request, placement, spec=spec, lost=lost, unavailable=lost, times=times).seconds
               for lost, p in instance.cases)


def optimum(instance: Instance) -> tuple[Placement, float]:
    """The placement with the least expected recovery seconds (every allowed placement is tried)."""
    request, view = instance.request, instance.view
    if request.min_replicas != 1 or request.max_replicas != 1 or len(request.fragments) > 6:
        raise PlacementError("exhaustive search is for small instances with exactly one replica per shard")
    choices = [[ReplicaSite(n, tier) for n in range(len(view.nodes)) if n != frag.owner for tier in TIERS
                if frag.nbytes <= view.free_bytes(n, tier) * (1 + 1e-9)]
               for frag in request.fragments]
    best, best_cost = None, float("inf")
    for combo in itertools.product(*choices):
        used: dict = {}
        for frag, site in zip(request.fragments, combo):
            used[(site.node, site.tier)] = used.get((site.node, site.tier), 0.0) + frag.nbytes
        if any(nbytes > view.free_bytes(*where) * (1 + 1e-9) for where, nbytes in used.items()):
            continue  # capacity binds: the placement does not fit
        placement = Placement({f.fragment_id: (site,) for f, site in zip(request.fragments, combo)})
        cost = expected_seconds(instance, placement)
        if cost < best_cost - 1e-12:
            best, best_cost = placement, cost
    if best is None:
        raise PlacementError("no placement of this instance fits the nodes' capacity (every shard needs one replica)")
    validate_placement(request, view, best)
    return best, best_cost


def optimum_gaps(policies, *, seeds: int, hetero: bool = False, io=None, cluster=None,
                 skipped: list | None = None) -> dict[str, list[float]]:
    """Per policy, ``expected_seconds(policy) / optimum - 1`` on ``seeds`` small instances.

    With ``cluster`` (a family's :class:`~ucp.replication.heterogeneity.HeteroModel`) a drawn
    instance can leave some shard no room anywhere; such instances have no optimum, so they are
    passed over for the next seed, and their seeds are appended to ``skipped`` (at most
    ``10 * seeds`` draws, then :class:`PlacementError`).
    """
    gaps: dict[str, list[float]] = {p.name: [] for p in policies}
    seed, done = 0, 0
    while done < seeds:
        if seed >= 10 * seeds:
            raise PlacementError(f"only {done} of {seeds} small instances of this cluster model fit; "
                                 "give the model more capacity or ask for fewer instances")
        instance = small_instance(seed=seed, hetero=hetero, io=io, cluster=cluster)
        seed += 1
        try:
            _, best = optimum(instance)
        except PlacementError:
            if cluster is None:
                raise
            if skipped is not None:
                skipped.append(seed - 1)
            continue
        done += 1
        for policy in policies:
            placement = policy.place(instance.request, instance.view)
            validate_placement(instance.request, instance.view, placement)
            gaps[policy.name].append(expected_seconds(instance, placement) / best - 1.0)
    return gaps
