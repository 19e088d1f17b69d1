"""In-memory snapshots of the training state every N steps, independent of the persistent checkpoint.

A persistent checkpoint every few hundred steps bounds what a restart loses; between two of
them a failure costs every step since the last one. :class:`Snapshots` keeps a host copy of
the state every ``every`` steps: a ucp checkpoint written to a host-memory directory (tmpfs,
``/dev/shm`` by default: no disk write) and replicated into peers' memory by a
:class:`~ucp.replication.replicas.ReplicaManager` (the placement policy decides where), so a
hot recovery (:func:`ucp.replication.hot_reshard.reshard_from_memory`) can resume from it and a
failure costs at most ``every`` steps. Snapshots keep tiers of their own, so they never evict
the persistent checkpoint's replicas, and vice versa.

A snapshot counts only once it is *complete*: committed and replicated on every rank
(:meth:`Snapshots.save` returns after the replication's closing barrier, which no rank passes
before all have delivered). :attr:`Snapshots.complete` lists them; a recovery passes it on
(``complete=``) so that a snapshot half made when a rank died is never used. The tmpfs
directory is node-local: on several nodes each rank's arrays are still in its own node's
memory and its peers' tiers, which is what a hot recovery reads; the directory is only its
fallback, as storage is for a checkpoint.

    snapshots = Snapshots(SnapshotOptions(every=2), save_options=options, process_group=pg)
    for step in range(1, steps + 1):
        train_step()
        snapshots.maybe_save(step, state)
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

from ucp.errors import InvalidArgumentError

__all__ = ["SnapshotOptions", "Snapshots", "default_snapshot_directory"]


def default_snapshot_directory() -> str:
    """A fresh directory in host memory (``/dev/shm`` where it exists, else the temp directory)."""
    import tempfile

    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(root, f"ucp-snapshots-{uuid.uuid4().hex[:12]}")


@dataclass(frozen=True)
class SnapshotOptions:
    """Every ``every`` steps, into ``directory`` (host memory), ``replicas`` peer copies of each
    rank's arrays, at most ``capacity_bytes`` of them held per process; the newest ``keep`` kept
    (in the directory and in the tiers)."""

    every: int
    directory: str = ""
    replicas: int = 1
    keep: int = 2
    capacity_bytes: int = 16 << 30

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise InvalidArgumentError(f"snapshot every must be a whole number of steps >= 1, got {self.every!r}")
        if self.keep < 1:
            raise InvalidArgumentError(f"snapshots keep must be >= 1 (the newest is what a recovery needs), "
                                       f"got {self.keep!r}")


class Snapshots:
    """The snapshots of one rank (see the module doc); ``save``/``maybe_save`` are collectives."""

    def __init__(self, options: SnapshotOptions, *, save_options: dict, process_group=None, policy=None,
                 tiers=None) -> None:
        from ucp.manager import CheckpointManager
        from ucp.policies import EveryNSteps, KeepLast
        from ucp.replication.replica_tiers import MemoryTier
        from ucp.replication.replicas import ReplicaManager

        self.options = options
        self.directory = options.directory or default_snapshot_directory()
        # tiers given: they outlive this object (a hot recovery re-creates it under the new group)
        self.tiers = list(tiers) if tiers is not None else [MemoryTier(capacity_bytes=options.capacity_bytes)]
        # keep=2 by default: the last complete snapshot stays held while the next one is replicated,
        # so a failure in that window still finds one (with keep=1, the persistent checkpoint's)
        replicas = ReplicaManager(tiers=self.tiers, policy=policy, replicas=options.replicas, keep=options.keep,
                                  process_group=process_group)
        self.manager = CheckpointManager(self.directory, save_policy=EveryNSteps(options.every),
                                         retention=KeepLast(options.keep), process_group=process_group,
                                         save_options=save_options, replicas=replicas)
        self.complete: set[str] = set()

    def due(self, step: int) -> bool:
        return step % self.options.every == 0

    def save(self, step: int, state: Any) -> str:
        """Snapshot ``state`` as step ``step`` now; returns its path, once it is complete on every rank."""
        path = self.manager.save(step, state)
        self.complete.add(path)
        return path

    def maybe_save(self, step: int, state: Any) -> str | None:
        """:meth:`save` when ``step`` is due (every ``every`` steps), else None."""
        return self.save(step, state) if self.due(step) else None
