"""Replica placement for checkpoint fragments: where copies live, chosen by a policy.

Copies of each node's checkpoint shard go to peers' host memory or local disks
(the remote store holds the occasional persisted checkpoint). A policy behind
one protocol (:mod:`ucp.replication.placement`) chooses where, from a view of the
cluster that includes per-node failure forecasts (:mod:`ucp.replication.forecast`).
Policies: static random, HDFS rack-aware, Gemini groups, a forecast-aware
greedy (:mod:`ucp.replication.policies`) and a MaskablePPO placer
(:mod:`ucp.replication.rl_policy`). :mod:`ucp.replication.simulator` replays failure
scenarios (:mod:`ucp.replication.failures`, :mod:`ucp.replication.replay`) under a
recovery-time model (:mod:`ucp.replication.recovery`); ``ucp place eval`` compares
them (docs/REPLICATION.md).

The mechanism: :class:`ucp.replication.replicas.ReplicaManager` sends each rank's
checkpoint arrays over torch.distributed to the peers a policy places, keeps them
in bounded tiers (:mod:`ucp.replication.replica_tiers`), writes the replica map
(:mod:`ucp.replication.replica_map`) beside the manifest, and after lost ranks or a
lost store rebuilds the checkpoint from the fastest surviving good copies;
``CheckpointManager(replicas=...)`` uses it on every save and restore.

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> from ucp.replication.placement import ClusterView, PlacementRequest
    >>> from ucp.replication.policies import GroupPlacement
    >>> spec = ClusterSpec()
    >>> placement = GroupPlacement().place(PlacementRequest.one_per_node(spec), ClusterView.uniform(spec))
    >>> len(placement.sites["shard-0"])
    2
"""
