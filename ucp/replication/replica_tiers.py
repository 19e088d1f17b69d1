"""Replica tiers: where a peer keeps copies of other ranks' checkpoint arrays, within a byte capacity.

A tier holds *blobs* (an array's files back to back, :mod:`ucp.replication.replica_files`)
and, per checkpoint, its *metadata* (the manifest and the replica map, so a checkpoint
whose remote store is gone can still be rebuilt). Everything a tier holds counts
against ``capacity_bytes``; a put that does not fit evicts whole older checkpoints,
oldest ``generation`` first, never the checkpoint being written, and raises
:class:`~ucp.replication.errors.ReplicaCapacityError` when even that is not enough.

- :class:`MemoryTier`: host memory of the process (lost with it).
- :class:`DiskTier`: a local directory; a new process opening the same directory
  sees what the previous one held (each file written atomically: temporary + rename).

Both satisfy :class:`ReplicaTier`, a small interface (put/get/has/evict/bytes_held)
that a later store protocol can adapt.

Example::

    >>> tier = MemoryTier(capacity_bytes=100)
    >>> tier.put_meta("ck1", CheckpointMeta(path="/c/step_1", generation=1, manifest=b"{}", replica_map=b"{}"))
    >>> tier.put("ck1", "r0/a", b"x" * 40)
    >>> tier.has("ck1", "r0/a"), tier.bytes_held()
    (True, 53)
    >>> tier.put_meta("ck2", CheckpointMeta(path="/c/step_2", generation=2, manifest=b"{}", replica_map=b"{}"))
    >>> tier.put("ck2", "r0/a", b"y" * 60)   # evicts ck1, the older checkpoint
    >>> tier.checkpoints()
    ['ck2']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import quote, unquote

from ucp.replication.cluster import DISK, MEMORY
from ucp.replication.errors import PlacementInputError, ReplicaCapacityError
from ucp.errors import ManifestError
from ucp.file_io import write_atomic
from ucp.fragment_checks import is_safe_key


@dataclass(frozen=True)
class CheckpointMeta:
    """What a tier keeps about one checkpoint besides its blobs: enough to rebuild it without the store."""

    path: str  # the checkpoint's path or URL as the job names it
    generation: int  # orders checkpoints for eviction (rank 0's clock at replication, ns)
    manifest: bytes  # manifest.json, byte for byte
    replica_map: bytes  # replicas.json, byte for byte

    @property
    def nbytes(self) -> int:
        return len(self.manifest) + len(self.replica_map) + len(self.path)


@runtime_checkable
class ReplicaTier(Protocol):
    """A bounded place for replica blobs. ``tier`` is a placement tier name (``memory`` or ``disk``)."""

    tier: str
    capacity_bytes: int

    def put(self, checkpoint: str, key: str, blob: bytes) -> None: ...
    def get(self, checkpoint: str, key: str) -> bytes | None: ...
    def has(self, checkpoint: str, key: str) -> bool: ...
    def evict(self, checkpoint: str) -> int: ...
    def discard(self, checkpoint: str, key: str) -> None: ...
    def checkpoint_bytes(self, checkpoint: str) -> int: ...
    def bytes_held(self) -> int: ...
    def put_meta(self, checkpoint: str, meta: CheckpointMeta) -> None: ...
    def get_meta(self, checkpoint: str) -> CheckpointMeta | None: ...
    def checkpoints(self) -> list[str]: ...
    def keys(self, checkpoint: str) -> list[str]: ...


class _BoundedTier:
    """Capacity and eviction over a backend that stores ``(checkpoint, key) -> bytes``."""

    tier = MEMORY

    def __init__(self, *, capacity_bytes: int) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise PlacementInputError(f"capacity_bytes must be an integer >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self._sizes: dict[str, dict[str, int]] = {}  # checkpoint -> key -> blob bytes
        self._metas: dict[str, CheckpointMeta] = {}

    # Subclasses store the bytes: _write(checkpoint, key, data), _read(checkpoint, key) -> bytes | None,
    # _drop(checkpoint, key); key None is the checkpoint's metadata (for _drop: everything of it).

    # -- the interface
    def bytes_held(self) -> int:
        return sum(sum(keys.values()) for keys in self._sizes.values()) + sum(m.nbytes for m in self._metas.values())

    def checkpoints(self) -> list[str]:
        """Held checkpoints, oldest generation first."""
        return sorted(self._metas, key=lambda c: (self._metas[c].generation, c))

    def keys(self, checkpoint: str) -> list[str]:
        return sorted(self._sizes.get(checkpoint, {}))

    def has(self, checkpoint: str, key: str) -> bool:
        return key in self._sizes.get(checkpoint, {})

    def get(self, checkpoint: str, key: str) -> bytes | None:
        return self._read(checkpoint, key) if self.has(checkpoint, key) else None

    def get_meta(self, checkpoint: str) -> CheckpointMeta | None:
        return self._metas.get(checkpoint)

    def put_meta(self, checkpoint: str, meta: CheckpointMeta) -> None:
        old = self._metas.get(checkpoint)
        self._make_room(checkpoint, meta.nbytes - (old.nbytes if old else 0), generation=meta.generation)
        head = json.dumps({"path": meta.path, "generation": meta.generation, "manifest_bytes": len(meta.manifest)})
        self._write(checkpoint, None, head.encode() + b"\n" + meta.manifest + meta.replica_map)
        self._metas[checkpoint] = meta
        self._sizes.setdefault(checkpoint, {})

    def put(self, checkpoint: str, key: str, blob: bytes) -> None:
        """Keep ``blob``; the checkpoint's metadata must be put first (it orders eviction)."""
        meta = self._metas.get(checkpoint)
        if meta is None:
            raise PlacementInputError(f"replica tier: put_meta({checkpoint!r}) must come before its arrays")
        old = self._sizes[checkpoint].get(key, 0)
        self._make_room(checkpoint, len(blob) - old, generation=meta.generation)
        self._write(checkpoint, key, bytes(blob))
        self._sizes[checkpoint][key] = len(blob)

    def checkpoint_bytes(self, checkpoint: str) -> int:
        """Bytes held for one checkpoint (its blobs and metadata)."""
        meta = self._metas.get(checkpoint)
        return sum(self._sizes.get(checkpoint, {}).values()) + (meta.nbytes if meta else 0)

    def discard(self, checkpoint: str, key: str) -> None:
        """Drop one blob (a copy that failed its checksum)."""
        if self._sizes.get(checkpoint, {}).pop(key, None) is not None:
            self._drop(checkpoint, key)

    def evict(self, checkpoint: str) -> int:
        """Drop everything held for ``checkpoint``; return the bytes freed."""
        freed = sum(self._sizes.pop(checkpoint, {}).values())
        meta = self._metas.pop(checkpoint, None)
        freed += meta.nbytes if meta else 0
        self._drop(checkpoint, None)
        return freed

    def _make_room(self, checkpoint: str, needed: int, *, generation: int) -> None:
        # Older checkpoints go first: the newest one is what a restart needs.
        for victim in self.checkpoints():
            if self.bytes_held() + needed <= self.capacity_bytes:
                return
            if victim != checkpoint and self._metas[victim].generation <= generation:
                self.evict(victim)
        if self.bytes_held() + needed > self.capacity_bytes:
            raise ReplicaCapacityError(
                f"{self.tier} replica tier: {needed} more bytes for checkpoint {checkpoint} do not fit in "
                f"{self.capacity_bytes} bytes ({self.bytes_held()} held after evicting older checkpoints); "
                "raise capacity_bytes or place fewer replicas here")


class MemoryTier(_BoundedTier):
    """Replicas in this process's host memory (a dict of bytes), at most ``capacity_bytes``."""

    tier = MEMORY

    def __init__(self, *, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes=capacity_bytes)
        self._data: dict[tuple[str, str | None], bytes] = {}

    def _write(self, checkpoint, key, data):
        self._data[(checkpoint, key)] = data

    def _read(self, checkpoint, key):
        return self._data.get((checkpoint, key))

    def _drop(self, checkpoint, key):
        for item in [k for k in self._data if k[0] == checkpoint and key in (None, k[1])]:
            del self._data[item]

    def corrupt(self, checkpoint: str, key: str) -> None:
        """Flip the first byte of a held blob (fault injection for tests and drills)."""
        blob = bytearray(self._data[(checkpoint, key)])
        blob[0] ^= 0xFF
        self._data[(checkpoint, key)] = bytes(blob)


_META_FILE = "meta.bin"


class DiskTier(_BoundedTier):
    """Replicas in a local directory (``root/<checkpoint>/<quoted key>.blob``), at most ``capacity_bytes``.

    Opening a directory that a previous process filled picks up what it held, so
    replicas on local disk outlive the process that received them.
    """

    tier = DISK

    def __init__(self, root: str | os.PathLike, *, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes=capacity_bytes)
        self.root = os.fspath(root)
        os.makedirs(self.root, exist_ok=True)
        for checkpoint in sorted(os.listdir(self.root)):
            folder = os.path.join(self.root, checkpoint)
            raw = self._read(checkpoint, None) if os.path.isdir(folder) else None
            if raw is None:
                continue  # a checkpoint whose metadata never landed is not usable: ignored
            self._metas[checkpoint] = _parse_meta(raw, where=os.path.join(folder, _META_FILE))
            self._sizes[checkpoint] = {
                _blob_key(folder, name): os.path.getsize(os.path.join(folder, name))
                for name in os.listdir(folder) if name.endswith(".blob")}

    def _file(self, checkpoint: str, key: str | None) -> str:
        return os.path.join(self.root, checkpoint, _META_FILE if key is None else quote(key, safe="") + ".blob")

    def _write(self, checkpoint, key, data):
        final = self._file(checkpoint, key)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        # No fsync: a copy torn by a power cut fails its digest and is dropped, never used.
        write_atomic(final, data, durable=False)

    def _read(self, checkpoint, key):
        try:
            with open(self._file(checkpoint, key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def _drop(self, checkpoint, key):
        folder = os.path.join(self.root, checkpoint)
        if key is not None:
            os.unlink(self._file(checkpoint, key))
        elif os.path.isdir(folder):
            for name in os.listdir(folder):
                os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


def _blob_key(folder: str, name: str) -> str:
    """The array key a blob file stands for, checked as a manifest's keys are (it is read back from disk)."""
    key = unquote(name[:-5])
    if not is_safe_key(key) or quote(key, safe="") + ".blob" != name:
        raise ManifestError(f"{os.path.join(folder, name)}: replica blob for array key {key[:200]!r}, which is not a "
                            "relative path of plain names under data/; the replica tier is damaged - remove that "
                            "file (or the tier's folder) and replicate again")
    return key


def _parse_meta(raw: bytes, *, where: str = _META_FILE) -> CheckpointMeta:
    # The head is one line of JSON; manifest and map follow, unescaped.
    try:
        head, rest = raw.split(b"\n", 1)
        facts = json.loads(head)
        path, generation, cut = facts["path"], facts["generation"], facts["manifest_bytes"]
        if not isinstance(path, str) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                            for v in (generation, cut)) or cut > len(rest):
            raise ValueError("path must be a string, generation and manifest_bytes integers within the file")
    except (ValueError, KeyError, TypeError) as err:
        raise ManifestError(f"{where}: not replica metadata this version reads ({err}); the replica tier is "
                            "damaged - remove its folder and replicate again") from None
    return CheckpointMeta(path=path, generation=generation, manifest=rest[:cut], replica_map=rest[cut:])
