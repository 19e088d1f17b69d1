"""An array's files in a checkpoint, as one blob: read, check, write back, scan for damage.

Paths go through fsspec (a local directory or any URL). An array is the directory
``data/<key>/`` (docs/FORMAT.md, section 4); its blob is its files back to back,
``zarr.json`` first, then the chunk files in name order.

Example::

    >>> import os, tempfile, torch, ucp, fsspec
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

import fsspec

from ucp.replication.replica_map import ArrayRecord, FileRecord
from ucp.checksum import digest
from ucp.file_io import write_atomic
from ucp.manifest import DATA_DIR, MANIFEST_NAME, Manifest


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


def split_blob(record: ArrayRecord, blob: bytes) -> list[tuple[str, memoryview]]:
    """The files of a blob, by the record's sizes."""
    out, at, view = [], 0, memoryview(blob)
    for f in record.files:
        out.append((f.name, view[at:at + f.size]))  # views: a large chunk is not copied
        at += f.size
    return out


class CheckpointFiles:
    """The files of one checkpoint through fsspec: arrays as blobs, the manifest, side files."""

    def __init__(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        self.path = os.fspath(path)
        self.fs, root = fsspec.core.url_to_fs(self.path, **(storage_options or {}))
        self.root = root.rstrip("/")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def read(self, name: str) -> bytes | None:
        """A file at the checkpoint root (``manifest.json``, ``replicas.json``), or None if absent."""
        try:
            return self.fs.cat_file(self._path(name))
        except FileNotFoundError:
            return None

    def read_shard(self, key: str) -> bytes:
        """A metadata shard of a sharded manifest (docs/FORMAT.md, section 9); FileNotFoundError if absent."""
        return self.fs.cat_file(self._path(key))

    def has_manifest(self) -> bool:
        return self.fs.exists(self._path(MANIFEST_NAME))

    def write(self, name: str, data: bytes) -> None:
        """Write a file so that a reader sees the old or the new bytes, never a part (rename where local)."""
        target = self._path(name)
        if not self.local:
            self.fs.pipe_file(target, data)  # object stores replace an object whole
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_atomic(target, data)

    def read_array(self, key: str, *, owner: int) -> tuple[ArrayRecord, bytes]:
        """The array ``data/<key>/`` as a record (sizes, digests) and its blob."""
        folder = self._path(DATA_DIR, key)
        names = sorted(n for n in (posixpath.basename(p) for p in self.fs.ls(folder, detail=False))
                       if not n.startswith("."))  # a temporary file of an interrupted write is not the array
        names.sort(key=lambda n: n != "zarr.json")  # metadata first, then chunks in name order
        parts = [self.fs.cat_file(posixpath.join(folder, n)) for n in names]
        files = tuple(FileRecord(n, len(b), digest(b)) for n, b in zip(names, parts))
        blob = b"".join(parts)
        return ArrayRecord(key=key, owner=owner, digest=digest(blob), files=files), blob

    def read_blob(self, record: ArrayRecord) -> bytes:
        """The blob of an array whose files the record lists (no check: the receiver checks the digest)."""
        return b"".join(self.fs.cat_file(self._path(DATA_DIR, record.key, f.name)) for f in record.files)

    def write_array(self, record: ArrayRecord, blob: bytes) -> None:
        for name, data in split_blob(record, blob):
            self.write(posixpath.join(DATA_DIR, record.key, name), data)

    def damage(self, record: ArrayRecord, *, digests: bool) -> str | None:
        """Why the checkpoint's copy of the array is unusable (missing, wrong size, wrong digest), or None."""
        for f in record.files:
            where = self._path(DATA_DIR, record.key, f.name)
            try:
                size = self.fs.size(where)
            except FileNotFoundError:
                return f"{where} is missing"
            if size != f.size:
                return f"{where} holds {size} bytes, the replica map says {f.size}"
            if digests and digest(self.fs.cat_file(where)) != f.digest:
                return f"{where} does not match its checksum"
        return None
