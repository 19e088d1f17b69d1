"""The replica map: which ranks hold a copy of which checkpoint array, with the bytes' digests.

It is ``replicas.json`` beside ``manifest.json`` (docs/REPLICATION.md, "The replica map"), and
every replica tier keeps a copy with the manifest, so a checkpoint whose store is gone can be
rebuilt. ``ucp verify`` and ``ucp.load`` ignore it (readers follow the manifest only).

The unit of replication is an *array*: ``data/<key>/`` with its ``zarr.json`` and chunk files
(a fragment's own array, or a pack of one rank's small fragments), sent as one *blob*: the
files back to back in the order listed. The digests are xxh3-64 (as the manifest's), of each
file and of the whole blob.

Example::

    >>> record = ArrayRecord(key="r0/000001-w", owner=0, digest="00", files=(FileRecord("zarr.json", 2, "aa"),),
    ...                      holders=(Holder(rank=0, tier="memory"),))
    >>> rmap = ReplicaMap(checkpoint="c0ffee", path="/ck/step_1", generation=7, policy="group",
    ...                   nodes=("n0", "n1"), arrays={record.key: record})
    >>> ReplicaMap.from_json(rmap.to_json()) == rmap
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ucp.errors import ManifestError

REPLICA_MAP_NAME = "replicas.json"
REPLICA_MAP_VERSION = 1


@dataclass(frozen=True)
class FileRecord:
    """One file of an array directory: its name, size and xxh3-64 digest."""

    name: str
    size: int
    digest: str


@dataclass(frozen=True)
class Holder:
    """A rank holding a copy of an array, and in which of its tiers."""

    rank: int
    tier: str


@dataclass(frozen=True)
class ArrayRecord:
    """One array: its key (``data/<key>/``), the rank that wrote it, its files, who holds copies."""

    key: str
    owner: int
    digest: str  # of the blob: the files back to back, in order
    files: tuple[FileRecord, ...]
    holders: tuple[Holder, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict:
        return {"owner": self.owner, "bytes": self.nbytes, "digest": self.digest,
                "files": [[f.name, f.size, f.digest] for f in self.files],
                "holders": [{"rank": h.rank, "tier": h.tier} for h in self.holders]}

    @classmethod
    def from_dict(cls, key: str, data: dict) -> "ArrayRecord":
        return cls(key=key, owner=int(data["owner"]), digest=str(data["digest"]),
                   files=tuple(FileRecord(str(n), int(s), str(d)) for n, s, d in data["files"]),
                   holders=tuple(Holder(int(h["rank"]), str(h["tier"])) for h in data["holders"]))


@dataclass(frozen=True)
class ReplicaMap:
    """The replica map of one checkpoint (identified by the digest of its manifest bytes)."""

    checkpoint: str
    path: str
    generation: int
    policy: str
    nodes: tuple[str, ...]  # node name of each rank at replication time
    arrays: Mapping[str, ArrayRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrays", MappingProxyType(dict(sorted(self.arrays.items()))))
        object.__setattr__(self, "nodes", tuple(self.nodes))

    def with_holders(self, holders: Mapping[str, tuple[Holder, ...]]) -> "ReplicaMap":
        """The same map with the holders of the named arrays replaced."""
        arrays = {key: replace(rec, holders=tuple(holders.get(key, rec.holders))) for key, rec in self.arrays.items()}
        return replace(self, arrays=arrays)

    def to_json(self) -> str:
        return json.dumps({
            "replica_map_version": REPLICA_MAP_VERSION, "checkpoint": self.checkpoint, "path": self.path,
            "generation": self.generation, "checksum_algorithm": "xxh3_64", "policy": self.policy,
            "nodes": list(self.nodes), "arrays": {k: r.to_dict() for k, r in self.arrays.items()},
        }, indent=1, sort_keys=False)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = REPLICA_MAP_NAME) -> "ReplicaMap":
        """Parse a replica map; a damaged one is a :class:`~ucp.errors.ManifestError` naming ``source``."""
        try:
            data = json.loads(text)
            if data.get("replica_map_version") != REPLICA_MAP_VERSION:
                raise ValueError(f"replica_map_version must be {REPLICA_MAP_VERSION}, "
                                 f"got {data.get('replica_map_version')!r}")
            return cls(checkpoint=str(data["checkpoint"]), path=str(data["path"]),
                       generation=int(data["generation"]), policy=str(data["policy"]),
                       nodes=tuple(str(n) for n in data["nodes"]),
                       arrays={k: ArrayRecord.from_dict(k, v) for k, v in data["arrays"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ManifestError(f"{source}: not a replica map this version reads ({err}); "
                                "replicate the checkpoint again") from None
