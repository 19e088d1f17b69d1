"""Where bytes live: fsspec paths, and zarr v3 arrays (plain files, or tensorstore).

On a local disk every array is written as its plain files (``zarr.json`` and
the raw chunk files, the same bytes tensorstore writes) straight from the
tensor's memory by a few threads, each chunk hashed piece by piece right
before it is written and fsynced right after; packs of small tensors are
written the same way, from the tensors themselves. Local chunk files are read
with plain reads too (docs/FORMAT.md, section 8, says why).

tensorstore's ``zarr3`` driver remains the writer for other stores and the
reference the plain writer is tested against. It cannot see fsspec
filesystems (``memory://``, ``s3://`` through fsspec, ...), so there a
fragment is written into a private tensorstore ``memory`` kvstore and its keys
(``zarr.json`` and the chunk files) are then copied through fsspec; reads copy
just the keys they need (the metadata and the chunks a read touches) the other
way. Either way the bytes on the store are the same plain zarr v3 arrays
(docs/FORMAT.md).

Example::

    store = Storage("memory://ckpt")
    store.write_bytes("manifest.json", b"{}")
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import shutil
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import fsspec
import numpy as np
import tensorstore as ts
from fsspec.implementations.local import LocalFileSystem

from ucp import confined
from ucp.errors import (IncompleteCheckpointError, StorageURLError, TensorTooLargeError, TruncatedDataError, UcpError,
                        UnsafePathError)
from ucp.file_io import done_future, fsync_path, hexdigests, little_endian, write_all
from ucp.zarr_array import ZARR_JSON_LIMIT, array_metadata, chunk_count, chunk_key  # noqa: F401 - re-exported

# Arrays of one chunk up to this size are written and read as plain files, without
# tensorstore: opening a tensorstore costs ~0.3 ms, which dominates for the
# thousands of biases and norms of a model. The bytes on disk are identical.
SMALL_ARRAY_BYTES = 4 << 20

# Target bytes per chunk: large, so a partial read touches few chunk files,
# and bounded, so a read buffer (one chunk) stays small next to a shard.
CHUNK_BYTES = 32 << 20

# Threads that write and read plain chunk files (and fsync): I/O overlaps, and hashing with it.
IO_THREADS = 4

# Plain chunk writes go in pieces this big, each hashed right before it is written.
WRITE_PIECE_BYTES = 1 << 20

# Bytes of packs a reader keeps (least recently used dropped first; the newest is always kept).
# A rank loading under another layout takes each tensor's pieces from several source ranks'
# packs in turn: with one pack kept, every switch re-read a whole pack (~16 MiB) for one small
# tensor. Four packs of the writer's 16 MiB target fit.
PACK_CACHE_BYTES = 64 << 20


def chunk_rows_for(shape: tuple[int, ...], itemsize: int, *, chunk_bytes: int | None = None) -> int:
    """Rows (along dim 0) per chunk for an array of ``shape``."""
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if not shape:
        return 1
    row_bytes = math.prod(shape[1:]) * itemsize
    rows = chunk_bytes // row_bytes if row_bytes else shape[0]
    return max(1, min(rows, shape[0]))


@dataclass
class _PendingWrite:
    rel: str
    opening: Any  # Future[TensorStore]
    array: np.ndarray
    writing: Any = None  # WriteFutures


class Storage:
    """One checkpoint root: a local directory or an fsspec URL."""

    def __init__(self, url: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        self.url = os.fspath(url)
        if not self.url or "\0" in self.url:
            raise StorageURLError(f"{self.url!r} is not a checkpoint path; give a directory or an fsspec URL")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        except (ValueError, ImportError) as err:  # an unknown protocol, a backend that is not installed
            raise StorageURLError(f"cannot open {self.url}: {err}; give a local path or an fsspec URL whose "
                                  "backend is installed (memory://, file://, s3:// with s3fs, ...)") from None
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.local else root.rstrip("/")
        # No fsync per file: one sync() of the whole save before its commit is far cheaper
        # than thousands of fsyncs, and just as durable for the commit rule.
        self.context = ts.Context({"file_io_sync": False})
        self._threads: ThreadPoolExecutor | None = None
        self._pack_cache: OrderedDict[str, bytes] = OrderedDict()  # pack -> its bytes, least recent first
        self._synced: set[str] = set()  # chunk files already fsynced by their writer thread
        self.reused = False  # set when the location may hold arrays of an earlier, killed save
        self._memory = None if self.local else ts.KvStore.open({"driver": "memory"}, context=self.context).result()
        self._real_root: str | None = None  # the resolved root, once a read needs it (see ucp.confined)

    # -- plain files -------------------------------------------------------
    def path(self, *parts: str) -> str:
        if self.local:
            return os.path.join(self.root, *parts)
        return posixpath.join(self.root, *parts)

    def display(self, *parts: str) -> str:
        """A path as the user should see it in messages."""
        path = self.path(*parts)
        return path if self.local else f"{self.fs.unstrip_protocol(path)}"

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes:
        return self.fs.cat_file(self.path(*parts))

    # -- bounded reads of checkpoint files (ucp.confined says why) ------------
    def read_file(self, rel: str, *, limit: int, allowed: str) -> bytes:
        """A whole file of at most ``limit`` bytes; larger ones are refused before reading.

        Local files must be regular and inside the root (UnsafePathError). ``allowed`` ends the
        refusal: "... more than the N that {allowed}".
        """
        if self.local:
            return confined.read_inside(self.root, rel, limit=limit, size_limit=limit, real=self._real(),
                                        allowed=allowed)[0]
        path = self.path(rel)
        info = self.fs.info(path)
        if info.get("type") != "file" or (info.get("size") or 0) > limit:
            raise UnsafePathError(
                f"{self.display(rel)} is not a file of at most {limit} bytes ({info.get('type')}, "
                f"{info.get('size')} bytes), the most that {allowed}; refusing to read it"
            )
        return self.fs.cat_file(path, start=0, end=limit)

    def read_range(self, rel: str, start: int, length: int, *, what: str | None = None) -> tuple[bytes, int | None]:
        """Bytes ``[start, start + length)`` of a file (fewer at its end) and, locally, its size."""
        if self.local:
            return confined.read_inside(self.root, rel, limit=length, start=start, real=self._real(), what=what)
        return self.fs.cat_file(self.path(rel), start=start, end=start + length), None

    def file_size(self, rel: str, *, what: str | None = None) -> int:
        """The size of a file that may be read (locally: regular, inside the root, else UnsafePathError)."""
        if not self.local:
            return self.fs.size(self.path(rel))
        fd, info = confined.open_inside(self.root, rel, real=self._real(), what=what)
        os.close(fd)
        return info.st_size

    def _real(self) -> str:
        if self._real_root is None:
            self._real_root = confined.real_root(self.root)
        return self._real_root

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a small file durably; on a local disk atomically (temp file + rename)."""
        target = self.path(rel)
        if not self.local:
            self.fs.pipe_file(target, data)
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)

    def remove(self, *parts: str) -> None:
        path = self.path(*parts)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def listdir(self, *parts: str) -> list[str]:
        path = self.path(*parts)
        if not self.fs.exists(path):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False))

    # -- zarr arrays -------------------------------------------------------
    def _kvstore(self, rel: str) -> Any:
        if self.local:
            return {"driver": "file", "path": self.path(rel) + "/"}
        return {"driver": "memory", "path": rel.strip("/") + "/"}

    def start_write(self, rel: str, array: np.ndarray, *, dtype: str, chunk_rows: int, attributes: dict) -> _PendingWrite:
        """Begin creating the zarr array ``rel`` holding ``array``; finish with :meth:`finish_write`.

        ``array`` is referenced, not copied: it must stay unchanged until then.
        """
        spec = {
            "driver": "zarr3",
            "kvstore": self._kvstore(rel),
            "metadata": array_metadata(tuple(array.shape), dtype, chunk_rows, attributes),
            # Every chunk must exist on disk: a missing chunk then always means damage.
            "store_data_equal_to_fill_value": True,
        }
        opening = ts.open(spec, create=True, delete_existing=self.reused, context=self.context)
        return _PendingWrite(rel, opening, array)

    def write_plain(self, rel: str, array: np.ndarray, *, dtype: str, chunk_rows: int, attributes: dict,
                    hasher: Callable[[], Any] | None = None) -> list[Future]:
        """Write the zarr array ``rel`` as its plain files (the bytes tensorstore would write).

        Returns one future per chunk, resolving to the hex digest of the chunk's valid
        elements by a streaming hasher from ``hasher()`` (None without ``hasher``). On a
        local disk each chunk file is written straight from ``array``'s memory by a few
        threads and fsynced there (no copy; an edge chunk gets its zero fill by extending
        the file): ``array`` must stay unchanged until its futures are done. Elsewhere the
        files are put through fsspec before this returns.
        """
        shape = tuple(array.shape)
        array = little_endian(array)
        rest = math.prod(max(1, s) for s in shape[1:]) if shape else 1
        full = chunk_rows * rest * array.itemsize if shape else array.itemsize
        chunks = [(chunk_key(shape, i), array[i * chunk_rows : (i + 1) * chunk_rows] if shape else array)
                  for i in range(chunk_count(shape, chunk_rows))]
        directory = self._create_array(rel, array_metadata(shape, dtype, chunk_rows, attributes))
        if directory is None:
            self.fs.pipe({self.path(rel, name): part.tobytes() + bytes(full - part.nbytes) for name, part in chunks})
            return [done_future(hexdigests(hasher, [part])[0]) for _, part in chunks]
        pool = self._pool()
        return [pool.submit(self._write_file, os.path.join(directory, name), [part], 1, full, hasher)
                for name, part in chunks]

    def write_pack(self, rel: str, arrays: list[np.ndarray], *, align: int,
                   hasher: Callable[[], Any] | None = None) -> Future:
        """Write a pack (docs/FORMAT.md, "Packs"): ``arrays``' bytes back to back, each at a multiple of ``align``.

        The bytes go straight from the arrays' memory (as :meth:`write_plain`); returns a
        future of the list of the arrays' hex digests (Nones without ``hasher``).
        """
        arrays = [little_endian(a) for a in arrays]
        total = sum(a.nbytes + (-a.nbytes % align) for a in arrays)
        directory = self._create_array(rel, array_metadata((total,), "uint8", total, {"ucp": {"pack": True}}))
        name = chunk_key((total,), 0)
        if directory is None:
            data = b"".join(a.tobytes() + bytes(-a.nbytes % align) for a in arrays)
            self.fs.pipe_file(self.path(rel, name), data)
            return done_future(hexdigests(hasher, arrays))
        return self._pool().submit(self._write_file, os.path.join(directory, name), arrays, align, total, hasher,
                                   every=True)

    def _create_array(self, rel: str, metadata: dict) -> str | None:
        """Write an array's ``zarr.json``; its local directory, or None for an fsspec store."""
        meta = json.dumps({"zarr_format": 3, "node_type": "array", **metadata}).encode()
        if not self.local:
            self.fs.pipe_file(self.path(rel, "zarr.json"), meta)
            return None
        directory = self.path(rel)
        if self.reused and os.path.isdir(directory):
            shutil.rmtree(directory)  # a killed earlier attempt's files must not linger
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "zarr.json"), "wb") as fh:
            fh.write(meta)
        return directory

    def _write_file(self, path: str, arrays: list[np.ndarray], align: int, size: int,
                    hasher: Callable | None, *, every: bool = False) -> Any:
        """Write ``arrays`` into one file (each padded to ``align``), zero-filled up to ``size``; fsync it.

        Each piece is hashed right before it is written, so the write reads it from cache.
        Returns the digest of every array (``every``) or of the first.
        """
        found = []
        zeros = bytes(align)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for array in arrays:
                digest = hasher() if hasher is not None else None
                view = memoryview(array.reshape(-1).view(np.uint8))
                for start in range(0, view.nbytes, WRITE_PIECE_BYTES):
                    piece = view[start : start + WRITE_PIECE_BYTES]
                    if digest is not None:
                        digest.update(piece)
                    write_all(fd, piece)
                if view.nbytes % align:
                    write_all(fd, memoryview(zeros)[: -view.nbytes % align])
                found.append(digest.hexdigest() if digest is not None else None)
            if size > os.lseek(fd, 0, os.SEEK_CUR):
                os.ftruncate(fd, size)  # an edge chunk's fill: zeros, as tensorstore writes it
            # Synced here, while other files are still being written, not all at the end.
            os.fsync(fd)
        finally:
            os.close(fd)
        self._synced.add(path)
        return found if every else found[0]

    def close(self) -> None:
        """Let this storage's I/O threads go (it stays usable; a later read starts new ones)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        self._pack_cache.clear()

    def _pool(self) -> ThreadPoolExecutor:
        # File creation is latency-bound (metadata ops); a few threads overlap it.
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="ucp-io")
        return self._threads

    def read_small(self, rel: str, shape: tuple[int, ...], dtype: str, *, what: str) -> np.ndarray:
        """Read the only chunk of a small array as plain bytes; errors as for tensorstore reads."""
        name = chunk_key(shape, 0)
        where = self.display(rel, name)
        np_dtype = np.dtype(dtype).newbyteorder("<")
        expected = math.prod(shape) * np_dtype.itemsize
        try:
            data, size = self.read_range(posixpath.join(rel, name), 0, expected + 1, what=what)
        except FileNotFoundError:
            raise _missing(what, where) from None
        if len(data) != expected:
            raise TruncatedDataError(
                f"{what}: {where} is shorter or longer than the manifest says ({size or len(data)} bytes, expected "
                f"{expected}); the file is damaged - restore it from a replica or load an older checkpoint"
            )
        return np.frombuffer(bytearray(data), dtype=np_dtype).reshape(shape)

    def read_packed(self, rel: str, offset: int, shape: tuple[int, ...], dtype: str, *, what: str,
                    extent: int) -> np.ndarray:
        """Read one packed fragment: a byte range of a pack array's only chunk.

        The first ``extent`` bytes of the packs read last (as far as the manifest's fragments of
        each reach; packs are ~16 MiB) are kept, up to ``PACK_CACHE_BYTES``, so the many small
        tensors of a pack cost one file read, not one each, even when a load takes turns
        between the packs of several source ranks.
        """
        name = chunk_key((0,), 0)
        where = self.display(rel, name)
        np_dtype = np.dtype(dtype).newbyteorder("<")
        nbytes = math.prod(shape) * np_dtype.itemsize
        pack = self._pack_cache.get(rel)
        if pack is None:
            try:
                pack = self.read_range(posixpath.join(rel, name), 0, extent, what=what)[0]
            except FileNotFoundError:
                raise _missing(what, where) from None
            self._pack_cache[rel] = pack
            held = sum(len(b) for b in self._pack_cache.values())
            while held > PACK_CACHE_BYTES and len(self._pack_cache) > 1:
                held -= len(self._pack_cache.popitem(last=False)[1])
        self._pack_cache.move_to_end(rel)
        data = pack[offset : offset + nbytes]
        if len(data) != nbytes:
            raise TruncatedDataError(
                f"{what}: {where} is shorter than the manifest says (bytes {offset}..{offset + nbytes} wanted, "
                f"{len(data)} found); the file is damaged - restore it from a replica or load an older checkpoint"
            )
        return np.frombuffer(bytearray(data), dtype=np_dtype).reshape(shape)

    def issue_write(self, pending: _PendingWrite) -> None:
        store = pending.opening.result()
        if pending.array.size:
            pending.writing = store.write(pending.array, can_reference_source_data_indefinitely=True)

    def finish_write(self, pending: _PendingWrite) -> None:
        if pending.writing is None:
            self.issue_write(pending)
        if pending.writing is not None:
            pending.writing.result()
        pending.array = None  # drop the reference to the caller's tensor
        if not self.local:
            self._flush_memory(pending.rel)

    def sync(self, under: str = "") -> None:
        """Make everything written under ``root/under`` durable (before a commit depends on it).

        Each file (and directory, up to the root) is fsynced, a few at a time: with small
        fragments packed there are few files, and unlike syncfs(2) this never waits for other
        processes' writes. Ranks sharing one staging root each pass their own ``under``: the
        other ranks' directories are still being written (temporary files come and go).
        """
        top = os.path.join(self.root, under) if under else self.root
        if not self.local or not os.path.isdir(top):
            return
        paths = []
        for dirpath, _, files in os.walk(top):
            paths.append(dirpath)
            paths.extend(p for p in (os.path.join(dirpath, name) for name in files) if p not in self._synced)
        parent = top
        while os.path.normpath(parent) != os.path.normpath(self.root):  # the new entries' directories
            parent = os.path.dirname(parent)
            paths.append(parent)
        list(self._pool().map(fsync_path, paths))

    def _flush_memory(self, rel: str) -> None:
        prefix = rel.strip("/") + "/"
        keys = [k.decode() for k in self._memory.list(ts.KvStore.KeyRange(prefix, prefix[:-1] + "0")).result()]
        self.fs.pipe({self.path(k): self._memory.read(k).result().value for k in keys})
        for k in keys:
            self._memory.delete_range(ts.KvStore.KeyRange(k, k + "\0")).result()

    def open_array(self, rel: str, *, what: str) -> Any:
        """Open an existing array for reading; ``what`` names it in errors."""
        if not self.local:
            self._fetch(rel, "zarr.json", what=what, limit=ZARR_JSON_LIMIT)
        else:
            self._check_local(rel, "zarr.json", what=what)
        spec = {"driver": "zarr3", "kvstore": self._kvstore(rel), "fill_missing_data_reads": False}
        try:
            return ts.open(spec, open=True, read=True, context=self.context).result()
        except ValueError as err:
            raise _read_error(err, what, self.display(rel)) from None

    def read_chunk(self, rel: str, store: Any, index: int, chunk_rows: int, *, what: str) -> Any:
        """Start reading chunk ``index`` (along dim 0); returns a future of the numpy array."""
        shape = tuple(store.shape)
        full = (chunk_rows * math.prod(max(1, s) for s in shape[1:]) if shape else 1) * store.dtype.numpy_dtype.itemsize
        if not self.local:
            self._fetch(rel, chunk_key(shape, index), what=what, limit=full)
        else:
            self._check_local(rel, chunk_key(shape, index), what=what)
        view = store if not shape else store[index * chunk_rows : min((index + 1) * chunk_rows, shape[0])]
        return view.read()

    def read_chunk_direct(self, rel: str, shape: tuple[int, ...], dtype: str, index: int, chunk_rows: int,
                          *, what: str) -> Any:
        """Start reading chunk ``index`` of a local array as plain bytes; a future of the numpy array.

        Only the chunk's valid rows are read (an edge chunk is stored full-size); the file's
        size is checked against the full chunk, so a truncated or padded file is reported.
        """
        return self._pool().submit(self._read_direct, rel, shape, dtype, index, chunk_rows, what)

    def read_chunk_into(self, rel: str, shape: tuple[int, ...], index: int, chunk_rows: int, out: np.ndarray,
                        *, what: str, digest: Any = None) -> Any:
        """Start reading chunk ``index`` of a local array straight into ``out`` (its valid rows, C order).

        Returns a future of ``digest(out)`` (None without ``digest``), computed in the reading thread.
        """
        def job():
            self._read_direct(rel, shape, out.dtype.str, index, chunk_rows, what, out=out)
            return digest(out) if digest is not None else None

        return self._pool().submit(job)

    def _read_direct(self, rel: str, shape: tuple[int, ...], dtype: str, index: int, chunk_rows: int,
                     what: str, out: np.ndarray | None = None) -> np.ndarray:
        np_dtype = np.dtype(dtype).newbyteorder("<")
        rest = tuple(shape[1:])
        rows = min(chunk_rows, shape[0] - index * chunk_rows) if shape else 1
        if out is None:
            try:
                out = np.empty((rows,) + rest if shape else (), dtype=np_dtype)
            except MemoryError:  # a chunk the manifest says is larger than this host's memory
                raise TensorTooLargeError(f"{what}: cannot hold chunk {index} ({rows} rows of {list(rest)} "
                                          f"{np_dtype.name}) in memory") from None
        full = (chunk_rows * math.prod(max(1, s) for s in rest) if shape else 1) * np_dtype.itemsize
        path = self.path(rel, chunk_key(shape, index))
        try:
            size, got = confined.read_exact_into(self.root, os.path.join(rel, chunk_key(shape, index)),
                                                 memoryview(out.reshape(-1)).cast("B"), size=full,
                                                 real=self._real(), what=what)
        except FileNotFoundError:
            raise _missing(what, path) from None
        if size != full or got != out.nbytes:
            raise TruncatedDataError(
                f"{what}: {path} is shorter or longer than the manifest says ({size} bytes, expected {full}); "
                "the file is damaged - restore it from a replica or load an older checkpoint"
            )
        return out

    def wait_chunk(self, future: Any, rel: str, index: int, shape: tuple[int, ...], *, what: str) -> np.ndarray:
        try:
            return future.result()
        except ValueError as err:
            if isinstance(err, UcpError):
                raise
            raise _read_error(err, what, self.display(rel, chunk_key(shape, index))) from None
        finally:
            if not self.local:  # the fetched copy is no longer needed
                key = posixpath.join(rel.strip("/"), chunk_key(shape, index))
                self._memory.delete_range(ts.KvStore.KeyRange(key, key + "\0")).result()

    def _fetch(self, rel: str, name: str, *, what: str, limit: int) -> None:
        """Copy one key of a remote array into the private memory store (at most ``limit`` bytes of it)."""
        try:
            data = self.fs.cat_file(self.path(rel, name), start=0, end=limit + 1)
        except FileNotFoundError:
            raise _missing(what, f"file {self.display(rel, name)}") from None
        if len(data) > limit:
            raise TruncatedDataError(
                f"{what}: {self.display(rel, name)} is longer than the manifest says (more than {limit} bytes); "
                "the file is damaged - restore it from a replica or load an older checkpoint"
            )
        self._memory.write(posixpath.join(rel.strip("/"), name), data).result()

    def _check_local(self, rel: str, name: str, *, what: str) -> None:
        """Before tensorstore opens a local file itself: it must be one ucp.confined would read."""
        try:
            self.file_size(os.path.join(rel, name), what=what)
        except FileNotFoundError:
            pass  # tensorstore reports it, as for any missing key


def _read_error(err: ValueError, what: str, where: str) -> Exception:
    text = str(err)
    if text.startswith("NOT_FOUND"):
        return _missing(what, where)
    return TruncatedDataError(
        f"{what}: {where} is shorter or longer than the manifest says ({text.split('[')[0].strip()}); "
        "the file is damaged - restore it from a replica or load an older checkpoint"
    )


def _missing(what: str, where: str) -> IncompleteCheckpointError:
    return IncompleteCheckpointError(f"{what}: {where} is missing; the checkpoint is incomplete - load an older checkpoint")
