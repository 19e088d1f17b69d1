"""An array's files in a checkpoint, as one blob: read, check, write back, scan for damage.

Paths go through the checkpoint's store (a local directory or any URL), with the
same confined reads and writes as ``ucp.load``. An array is the directory
``data/<key>/`` (docs/FORMAT.md, section 4); its blob is its files back to back,
``zarr.json`` first, then the chunk files in name order.

Example::

    >>> import os, tempfile, torch, ucp
    >>> path = os.path.join(tempfile.mkdtemp(), "ck")
    >>> _ = ucp.save({"w": torch.arange(4.0)}, path)
    >>> files = CheckpointFiles(path)
    >>> (key, owner), = array_owners(Manifest.from_json(files.read(MANIFEST_NAME))).items()
    >>> record, blob = files.read_array(key, owner=owner)
    >>> [f.name for f in record.files][0], record.nbytes == len(blob)
    ('zarr.json', True)
    >>> files.damage(record, digests=True) is None
    True
"""

from __future__ import annotations

import os
import posixpath

from ucp.checksum import digest
from ucp.errors import UnsafePathError
from ucp.manifest import DATA_DIR, MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest  # noqa: F401 - the example uses MANIFEST_NAME
from ucp.replication.replica_map import ArrayRecord, FileRecord
from ucp.sharded_manifest import MAX_SHARD_BYTES
from ucp.stores import open_store
from ucp.zarr_array import ZARR_JSON_LIMIT


def array_owners(manifest: Manifest) -> dict[str, int]:
    """Array key -> the rank that wrote it (a pack's fragments all come from one rank)."""
    owners: dict[str, int] = {}
    for entry in manifest.tensors.values():
        for frag in entry.fragments:
            owners.setdefault(frag.key, frag.rank)
    return dict(sorted(owners.items()))


def array_tensors(manifest: Manifest) -> dict[str, list[str]]:
    """Array key -> the logical tensors with a fragment in it (for messages)."""
    names: dict[str, list[str]] = {}
    for name, entry in manifest.tensors.items():
        for frag in entry.fragments:
            names.setdefault(frag.key, []).append(name)
    return names


def fragment_bytes(manifest: Manifest) -> dict[str, int]:
    """Array key -> the bytes of the fragments the manifest places in it."""
    raw: dict[str, int] = {}
    for entry in manifest.tensors.values():
        for frag in entry.fragments:
            raw[frag.key] = raw.get(frag.key, 0) + frag.nbytes
    return raw


def array_limit(raw: int, files: int) -> int:
    """The most bytes an array's ``files`` may hold for fragments of ``raw`` bytes.

    ``zarr.json`` plus chunks: an edge chunk is stored whole, so at most twice the fragments' bytes.
    """
    return 2 * raw + ZARR_JSON_LIMIT + 64 * files


def split_blob(record: ArrayRecord, blob: bytes) -> list[tuple[str, memoryview]]:
    """The files of a blob, by the record's sizes."""
    out, at, view = [], 0, memoryview(blob)
    for f in record.files:
        out.append((f.name, view[at:at + f.size]))  # views: a large chunk is not copied
        at += f.size
    return out


class CheckpointFiles:
    """The files of one checkpoint through its store (:func:`ucp.stores.open_store`): arrays as blobs,
    the manifest, side files.

    Every read and write goes through the store, so replication is held to the same rules as
    ``ucp.load``: on a local disk nothing is read or written through a link out of the checkpoint,
    nothing but regular files is read (never a FIFO or a device), and no read is larger than the
    file may be (:mod:`ucp.confined`).
    """

    def __init__(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        self.path = os.fspath(path)
        self.store = open_store(self.path, storage_options=storage_options)

    def read(self, name: str) -> bytes | None:
        """A file at the checkpoint root (``manifest.json``, ``replicas.json``), or None if absent."""
        try:
            return self.store.read_file(name, limit=MAX_MANIFEST_BYTES,
                                        allowed="a manifest or replica map may hold (ucp.manifest.MAX_MANIFEST_BYTES)")
        except FileNotFoundError:
            return None

    def read_shard(self, key: str) -> bytes:
        """A metadata shard of a sharded manifest (docs/FORMAT.md, section 9); FileNotFoundError if absent."""
        return self.store.read_file(key, limit=MAX_SHARD_BYTES,
                                    allowed="a metadata shard may hold (ucp.sharded_manifest.MAX_SHARD_BYTES)")

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Write a file so that a reader sees the old or the new bytes, never a part (the store's write)."""
        self.store.write_bytes(name, data)

    def read_array(self, key: str, *, owner: int, raw: int | None = None) -> tuple[ArrayRecord, bytes]:
        """The array ``data/<key>/`` as a record (sizes, digests) and its blob.

        ``raw``: the bytes of the manifest's fragments in it; files holding more than
        :func:`array_limit` allows are refused (UnsafePathError) before they are read.
        """
        names = [n for n in self.store.listdir(DATA_DIR, key)
                 if not n.startswith(".")]  # a temporary file of an interrupted write is not the array
        names.sort(key=lambda n: (n != "zarr.json", n))  # metadata first, then chunks in name order
        limit = array_limit(raw, len(names)) if raw is not None else None
        parts, total = [], 0
        for name in names:
            rel = posixpath.join(DATA_DIR, key, name)
            size = self.store.file_size(rel, what=f"array {key!r}")
            total += size
            if limit is not None and total > limit:
                raise UnsafePathError(f"array {key!r}: the files of {self.store.display(DATA_DIR, key)} hold more than "
                                      f"the {limit} bytes its fragments can take; refusing to read them - the "
                                      "checkpoint is damaged")
            parts.append(self.store.read_range(rel, 0, size, what=f"array {key!r}")[0])
        files = tuple(FileRecord(n, len(b), digest(b)) for n, b in zip(names, parts))
        blob = b"".join(parts)
        return ArrayRecord(key=key, owner=owner, digest=digest(blob), files=files), blob

    def read_blob(self, record: ArrayRecord) -> bytes:
        """The blob of an array whose files the record lists (no check: the receiver checks the digest)."""
        return b"".join(self.store.read_range(posixpath.join(DATA_DIR, record.key, f.name), 0, f.size,
                                              what=f"array {record.key!r}")[0] for f in record.files)

    def write_array(self, record: ArrayRecord, blob: bytes) -> None:
        for name, data in split_blob(record, blob):
            self.write(posixpath.join(DATA_DIR, record.key, name), data)

    def damage(self, record: ArrayRecord, *, digests: bool) -> str | None:
        """Why the checkpoint's copy of the array is unusable (missing, wrong size, wrong digest), or None."""
        for f in record.files:
            rel = posixpath.join(DATA_DIR, record.key, f.name)
            where = self.store.display(DATA_DIR, record.key, f.name)
            try:
                size = self.store.file_size(rel)
            except FileNotFoundError:
                return f"{where} is missing"
            except UnsafePathError as err:  # a link out of the checkpoint, a FIFO: written over by the repair
                return str(err)
            if size != f.size:
                return f"{where} holds {size} bytes, the replica map says {f.size}"
            if digests and digest(self.store.read_range(rel, 0, f.size)[0]) != f.digest:
                return f"{where} does not match its checksum"
        return None
