"""The replica map: which ranks hold a copy of which checkpoint array, with the bytes' digests.

It is ``replicas.json`` beside ``manifest.json`` (docs/REPLICATION.md, "The replica map"), and
every replica tier keeps a copy with the manifest, so a checkpoint whose store is gone can be
rebuilt. ``ucp verify`` and ``ucp.load`` ignore it (readers follow the manifest only).

The unit of replication is an *array*: ``data/<key>/`` with its ``zarr.json`` and chunk files
(a fragment's own array, or a pack of one rank's small fragments), sent as one *blob*: the
files back to back in the order listed. The digests are xxh3-64 (as the manifest's), of each
file and of the whole blob.

Example::

    >>> record = ArrayRecord(key="r0/000001-w", owner=0, digest="0" * 16,
    ...                      files=(FileRecord("zarr.json", 2, "a" * 16),),
    ...                      holders=(Holder(rank=0, tier="memory"),))
    >>> rmap = ReplicaMap(checkpoint="c0ffee", path="/ck/step_1", generation=7, policy="group",
    ...                   nodes=("n0", "n1"), arrays={record.key: record})
    >>> ReplicaMap.from_json(rmap.to_json()) == rmap
    True
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ucp.replication.cluster import TIERS
from ucp.errors import ManifestError
from ucp.fragment_checks import is_safe_key

REPLICA_MAP_NAME = "replicas.json"
REPLICA_MAP_VERSION = 1
_DIGEST = re.compile(r"[0-9a-f]{16}")


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
        """One record read back from a file: every key, name and number is checked before it is used."""
        if not is_safe_key(key):
            raise ValueError(f"array key {key[:200]!r} is not a relative path of plain names under data/")
        files = tuple(FileRecord(_name(n, key), _count(s, f"size of {key}/{n}"), _hex(d, f"digest of {key}/{n}"))
                      for n, s, d in data["files"])
        if len({f.name for f in files}) != len(files):
            raise ValueError(f"array {key!r} lists a file twice")
        holders = tuple(Holder(_count(h["rank"], f"holder rank of {key}"), _tier(h["tier"], key))
                        for h in data["holders"])
        return cls(key=key, owner=_count(data["owner"], f"owner of {key}"), digest=_hex(data["digest"], key),
                   files=files, holders=holders)


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r:.40}")
    return value


def _hex(value, what: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise ValueError(f"{what}: digest must be 16 hex digits, got {value!r:.40}")
    return value


def _name(value, key: str) -> str:
    """A file of an array directory: one plain name (``zarr.json``, a chunk), never a path."""
    if not is_safe_key(value) or "/" in value:
        raise ValueError(f"array {key!r} names file {str(value)[:200]!r}; a file name must be one plain name")
    return value


def _tier(value, key: str) -> str:
    if value not in TIERS:
        raise ValueError(f"array {key!r}: holder tier {value!r:.40} is not one of {', '.join(TIERS)}")
    return value


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
