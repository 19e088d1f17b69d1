"""Heterogeneous clusters: per-node speed and capacity, shards of different sizes, churn.

The homogeneous model (every node alike, every shard ``shard_bytes``, nobody leaves)
has an optimum that a fixed rule reaches. A :class:`Heterogeneity` breaks that on
purpose, in the ways production clusters differ:

- ``speed``: a share of nodes serve reads slower (older NICs, a shared uplink,
  throttled disks): their replicas take ``1 / speed`` times as long to restore;
- ``memory_bytes`` / ``disk_bytes``: replica capacity differs per node (host memory
  left over by the training process, disk size), so large shards do not fit
  everywhere and a fixed rule's preferred holder can be full;
- ``shard_bytes``: shards differ in size (pipeline stages with embeddings, uneven
  ZeRO partitions), so one lost node can cost much more than another;
- ``present``: nodes leave the job (preemption, maintenance) and come back: an
  absent slot owns no shard, holds no replica and cannot fail.

Capacity binds: :func:`~ucp.replication.placement.validate_placement` refuses a
placement that overflows a node, so every policy has to fit. A
:class:`HeteroModel` draws one :class:`Heterogeneity` reproducibly from a seed.

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> spec = ClusterSpec(nodes=8, rack_size=2)
    >>> het = HeteroModel(churn_mtbl_intervals=50).draw(spec, intervals=100, seed=1)
    >>> request = het.request(spec, 0, replicas=2, intervals_since_remote=0)
    >>> len(request.fragments) == int(het.present[0].sum())
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementInputError
from ucp.replication.placement import ClusterView, FragmentRequest, NodeState, PlacementRequest


@dataclass(frozen=True)
class HeteroModel:
    """How a heterogeneous cluster is drawn; sizes are in units of the spec's ``shard_bytes``.

    ``slow_fraction`` of the nodes run at ``slow_speed``; memory capacity per node is drawn
    from ``memory_shards``, disk from ``disk_shards``; shard sizes are log-uniform within a
    factor ``shard_spread`` of ``shard_bytes`` either way; a present node leaves after a
    geometric time of mean ``churn_mtbl_intervals`` (0: never) and stays away for a mean
    ``away_intervals``.
    """

    slow_fraction: float = 0.25
    slow_speed: float = 0.25
    memory_shards: tuple[float, ...] = (0.0, 1.0, 1.0, 2.0)
    disk_shards: tuple[float, ...] = (1.0, 2.0, 4.0)
    shard_spread: float = 2.0
    churn_mtbl_intervals: float = 0.0
    away_intervals: float = 30.0

    def __post_init__(self) -> None:
        if not (0 <= self.slow_fraction <= 1 and 0 < self.slow_speed <= 1 and self.shard_spread >= 1
                and self.churn_mtbl_intervals >= 0 and self.away_intervals >= 1
                and self.memory_shards and self.disk_shards
                and min(self.memory_shards + self.disk_shards) >= 0):
            raise PlacementInputError(f"hetero model {self}: need 0 <= slow_fraction <= 1, 0 < slow_speed <= 1, "
                                      "shard_spread >= 1, churn >= 0, away_intervals >= 1, capacities >= 0")

    def draw(self, spec: ClusterSpec, *, intervals: int, seed: int) -> "Heterogeneity":
        rng = np.random.default_rng(seed)
        n = spec.nodes
        speed = np.ones(n)
        speed[rng.permutation(n)[: int(round(self.slow_fraction * n))]] = self.slow_speed
        memory = rng.choice(self.memory_shards, size=n) * spec.shard_bytes
        disk = rng.choice(self.disk_shards, size=n) * spec.shard_bytes
        spread = np.log(self.shard_spread)
        shard = spec.shard_bytes * np.exp(rng.uniform(-spread, spread, size=n))
        present = np.ones((intervals, n), dtype=bool)
        if self.churn_mtbl_intervals:
            here = np.ones(n, dtype=bool)
            leave, back = 1.0 / self.churn_mtbl_intervals, 1.0 / self.away_intervals
            for t in range(intervals):
                present[t] = here
                flip = rng.random(n) < np.where(here, leave, back)
                here = here ^ flip
                if here.sum() < 2:  # a job needs two nodes to replicate at all
                    here[rng.permutation(n)[:2]] = True
        for a in (speed, memory, disk, shard, present):
            a.flags.writeable = False
        return Heterogeneity(speed, memory, disk, shard, present)


@dataclass(frozen=True, eq=False)
class Heterogeneity:
    """One drawn cluster: per-node ``speed``, capacities and shard bytes, and ``present[t, node]``."""

    speed: np.ndarray
    memory_bytes: np.ndarray
    disk_bytes: np.ndarray
    shard_bytes: np.ndarray
    present: np.ndarray

    def request(self, spec: ClusterSpec, t: int, *, replicas: int, intervals_since_remote: int,
                min_replicas: int = 1, max_replicas: int = 3) -> PlacementRequest:
        """The shards of the nodes present in interval ``t``, each of its own size."""
        fragments = tuple(FragmentRequest(f"shard-{i}", i, float(self.shard_bytes[i]))
                          for i in range(spec.nodes) if self.present[t, i])
        return PlacementRequest(fragments, replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                                intervals_since_remote=intervals_since_remote)

    def view(self, spec: ClusterSpec, t: int, probabilities, *, io=None) -> ClusterView:
        """Present nodes alive with their own capacity and speed; absent ones down."""
        return ClusterView(tuple(
            NodeState(node=i, rack=spec.rack_of(i), alive=bool(self.present[t, i]),
                      memory_free_bytes=float(self.memory_bytes[i]), disk_free_bytes=float(self.disk_bytes[i]),
                      failure_probability=float(probabilities[i]), speed=float(self.speed[i]))
            for i in range(spec.nodes)), spec, io)

    def restrict(self, trace):
        """``trace`` with absent nodes unable to fail: dropped from events and zeroed in the hazards."""
        if trace.intervals != len(self.present):
            raise PlacementInputError(f"trace of {trace.intervals} intervals, heterogeneity of {len(self.present)}")
        failures = []
        for t, events in enumerate(trace.failures):
            here = set(np.flatnonzero(self.present[t]).tolist())
            failures.append(tuple(e & here for e in events if e & here))
        node_hazard = None if trace.node_hazard is None else trace.node_hazard * self.present
        return dataclasses.replace(trace, failures=tuple(failures), node_hazard=node_hazard)
