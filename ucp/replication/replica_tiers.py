"""Replica tiers: where a peer keeps copies of other ranks' checkpoint arrays, within a byte capacity.

A tier holds *blobs* (an array's files back to back, :mod:`ucp.replication.replica_files`)
and, per checkpoint, its *metadata* (the manifest and the replica map, so a checkpoint
whose remote store is gone can still be rebuilt). Everything a tier holds counts
against ``capacity_bytes``; a put that does not fit evicts whole older checkpoints,
oldest ``generation`` first, never the checkpoint being written, and raises
:class:`~ucp.replication.errors.ReplicaCapacityError` when even that is not enough.

A tier is built on a :class:`~ucp.stores.Store`: the blobs are files
``<checkpoint>/<quoted key>.blob`` and ``<checkpoint>/meta.bin`` in it, written and read
by the store (atomic writes, confined reads), so any store can hold replicas:

- :class:`MemoryTier`: host memory of the process (a private ``memory://`` store; lost with it).
- :class:`DiskTier`: a local directory (a :class:`~ucp.stores.LocalStore`); a new process
  opening the same directory sees what the previous one held.
- ``ReplicaTier(open_store(url), tier="disk", capacity_bytes=...)``: any other store.

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
import uuid
import weakref
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ucp.errors import ManifestError
from ucp.fragment_checks import is_safe_key
from ucp.manifest import MAX_MANIFEST_BYTES
from ucp.replication.cluster import DISK, MEMORY, TIERS
from ucp.replication.errors import PlacementInputError, ReplicaCapacityError
from ucp.stores import LocalStore, Store


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


class ReplicaTier:
    """A bounded place for replica blobs in a :class:`~ucp.stores.Store` (see the module docstring).

    ``tier`` is a placement tier name (``memory`` or ``disk``). Opening a store that an earlier
    tier filled picks up what it held. Every byte goes in and out through the store's own
    reads and writes: atomic, confined to its root, never more than the tier recorded.
    """

    def __init__(self, store: Store, *, tier: str, capacity_bytes: int) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise PlacementInputError(f"capacity_bytes must be an integer >= 0, got {capacity_bytes!r}")
        if tier not in TIERS:
            raise PlacementInputError(f"replica tier must be one of {', '.join(TIERS)}, got {tier!r}")
        self.store, self.tier, self.capacity_bytes = store, tier, capacity_bytes
        self._sizes: dict[str, dict[str, int]] = {}  # checkpoint -> key -> blob bytes
        self._metas: dict[str, CheckpointMeta] = {}
        for checkpoint in store.listdir():
            try:
                raw = store.read_file(f"{checkpoint}/{_META_FILE}", limit=_META_LIMIT,
                                      allowed="replica metadata may hold")
            except (FileNotFoundError, NotADirectoryError):
                continue  # a checkpoint whose metadata never landed is not usable: ignored
            self._metas[checkpoint] = _parse_meta(raw, where=store.display(checkpoint, _META_FILE))
            self._sizes[checkpoint] = {
                _blob_key(store.display(checkpoint, name), name): store.file_size(f"{checkpoint}/{name}")
                for name in store.listdir(checkpoint) if name.endswith(".blob")}

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
        size = self._sizes.get(checkpoint, {}).get(key)
        if size is None:
            return None
        try:
            return self.store.read_file(self._file(checkpoint, key), limit=size,
                                        allowed="the replica tier recorded for it")
        except FileNotFoundError:
            return None  # gone behind the tier's back: no copy here

    def get_meta(self, checkpoint: str) -> CheckpointMeta | None:
        return self._metas.get(checkpoint)

    def put_meta(self, checkpoint: str, meta: CheckpointMeta) -> None:
        if not checkpoint or "/" in checkpoint or checkpoint in (".", ".."):
            raise PlacementInputError(f"replica tier: checkpoint id {checkpoint[:80]!r} must be one plain name")
        old = self._metas.get(checkpoint)
        self._make_room(checkpoint, meta.nbytes - (old.nbytes if old else 0), generation=meta.generation)
        head = json.dumps({"path": meta.path, "generation": meta.generation, "manifest_bytes": len(meta.manifest)})
        self.store.write_bytes(self._file(checkpoint, None), head.encode() + b"\n" + meta.manifest + meta.replica_map)
        self._metas[checkpoint] = meta
        self._sizes.setdefault(checkpoint, {})

    def put(self, checkpoint: str, key: str, blob: bytes) -> None:
        """Keep ``blob``; the checkpoint's metadata must be put first (it orders eviction)."""
        meta = self._metas.get(checkpoint)
        if meta is None:
            raise PlacementInputError(f"replica tier: put_meta({checkpoint!r}) must come before its arrays")
        old = self._sizes[checkpoint].get(key, 0)
        self._make_room(checkpoint, len(blob) - old, generation=meta.generation)
        self.store.write_bytes(self._file(checkpoint, key), blob)
        self._sizes[checkpoint][key] = len(blob)

    def checkpoint_bytes(self, checkpoint: str) -> int:
        """Bytes held for one checkpoint (its blobs and metadata)."""
        meta = self._metas.get(checkpoint)
        return sum(self._sizes.get(checkpoint, {}).values()) + (meta.nbytes if meta else 0)

    def discard(self, checkpoint: str, key: str) -> None:
        """Drop one blob (a copy that failed its checksum)."""
        if self._sizes.get(checkpoint, {}).pop(key, None) is not None:
            self.store.remove(self._file(checkpoint, key))

    def evict(self, checkpoint: str) -> int:
        """Drop everything held for ``checkpoint``; return the bytes freed."""
        freed = sum(self._sizes.pop(checkpoint, {}).values())
        meta = self._metas.pop(checkpoint, None)
        freed += meta.nbytes if meta else 0
        self.store.remove(checkpoint)
        return freed

    def _file(self, checkpoint: str, key: str | None) -> str:
        return f"{checkpoint}/{_META_FILE if key is None else quote(key, safe='') + '.blob'}"

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


class MemoryTier(ReplicaTier):
    """Replicas in this process's host memory (a private ``memory://`` store), at most ``capacity_bytes``."""

    def __init__(self, *, capacity_bytes: int) -> None:
        from ucp.stores import MemoryStore

        store = MemoryStore(f"memory://ucp-replica-tier-{uuid.uuid4().hex}")
        super().__init__(store, tier=MEMORY, capacity_bytes=capacity_bytes)
        # The memory filesystem is shared by the whole process: the bytes go when the tier does.
        weakref.finalize(self, store.remove)

    def corrupt(self, checkpoint: str, key: str) -> None:
        """Flip the first byte of a held blob (fault injection for tests and drills)."""
        held = self.get(checkpoint, key)
        if held is None:
            raise KeyError(f"replica tier holds no blob {key!r} of checkpoint {checkpoint}")
        blob = bytearray(held)
        blob[0] ^= 0xFF
        self.store.write_bytes(self._file(checkpoint, key), bytes(blob))


_META_FILE = "meta.bin"
_META_LIMIT = 2 * MAX_MANIFEST_BYTES + (1 << 16)  # the head, a manifest and a replica map


class DiskTier(ReplicaTier):
    """Replicas in a local directory (``root/<checkpoint>/<quoted key>.blob``), at most ``capacity_bytes``.

    Opening a directory that a previous process filled picks up what it held, so
    replicas on local disk outlive the process that received them.
    """

    def __init__(self, root: str | os.PathLike, *, capacity_bytes: int) -> None:
        self.root = os.fspath(root)
        super().__init__(LocalStore(self.root), tier=DISK, capacity_bytes=capacity_bytes)


def _blob_key(where: str, name: str) -> str:
    """The array key a blob file stands for, checked as a manifest's keys are (it is read back from a store)."""
    key = unquote(name[:-5])
    if not is_safe_key(key) or quote(key, safe="") + ".blob" != name:
        raise ManifestError(f"{where}: replica blob for array key {key[:200]!r}, which is not a "
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
