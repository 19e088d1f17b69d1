"""How long a restore reads: from a peer's tier, or from the remote store.

Recovery (:mod:`ucp.replication.recovery`), the forecast-aware placer and the RL
environment ask one object for transfer times, so that a measured cost model
(:mod:`ucp.replication.io_cost`) replaces the bandwidth constants of
:class:`~ucp.replication.cluster.ClusterSpec` everywhere at once. A peer's time is
the tier's time for that many bytes divided by the node's ``speed`` (1: the
cluster's nominal NIC and devices; 0.25: a node four times slower). The tier's time
is the spec's bandwidth for it (the network path) or, with a measured cost model,
the slower of that path and the store's predicted restore time.

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> spec = ClusterSpec(memory_bandwidth_bps=10e9)
    >>> times = TransferTimes(spec, speed=(1.0, 0.5))
    >>> times.peer_seconds(0, "memory", 10e9), times.peer_seconds(1, "memory", 10e9)
    (1.0, 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from ucp.replication.cluster import REMOTE, ClusterSpec


@dataclass(frozen=True)
class TransferTimes:
    """Restore times per node and tier: the spec's constants, or ``io``'s measured predictions."""

    spec: ClusterSpec
    speed: tuple[float, ...] = ()  # per node; empty: every node at 1
    io: object | None = None  # an IoCostModel (``seconds(op, tier, nbytes)``); None: the spec's bandwidths

    def tier_seconds(self, tier: str, nbytes: float) -> float:
        """Seconds to restore ``nbytes`` from ``tier`` at nominal speed.

        With a cost model the slower of two pipelined stages sets the time: the store's own
        measured restore (``io``) and the path to the reader at the spec's bandwidth for
        that tier (the network for a peer's memory or disk, the per-reader share of the
        remote store).
        """
        path = nbytes / self.spec.bandwidth(tier)
        return path if self.io is None else max(path, self.io.seconds("restore", tier, nbytes))

    def peer_seconds(self, node: int, tier: str, nbytes: float) -> float:
        return self.tier_seconds(tier, nbytes) / (self.speed[node] if self.speed else 1.0)

    def remote_seconds(self, largest: float, total: float) -> float:
        """Every reader fetches its own fragment (the largest sets the time), under the store's aggregate cap."""
        return max(self.tier_seconds(REMOTE, largest) if largest else 0.0, total / self.spec.remote_aggregate_bps)
