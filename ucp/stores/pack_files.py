"""Writing a pack as it fills: fragments land at their offsets while the save goes on, the file closes once.

A pack (docs/FORMAT.md, "Packs") holds a rank's fragments back to back in one file. The writer
learns its fragments one at a time, so a store hands out a pack writer: ``write`` puts one
fragment's chunks at their offsets (hashed piece by piece right before each piece is written)
and ``close`` sizes the file, makes it durable once, and writes the pack's ``zarr.json``::

    pack = store.open_pack("data/r0/pack-000000")
    digests = [f.result() for f in pack.write(0, array, chunk_rows=4, hasher=checksum.hasher)]
    pack.close(array.nbytes).result()

:class:`LocalPackWriter` writes with ``pwrite`` from the store's I/O threads straight from the
tensor's memory (one open file, one ``fsync``; on a disk, ``O_DIRECT`` through a bounce buffer);
:class:`StreamingPackWriter` streams the fragments, in offset order, into one file of an fsspec
store (object stores: one object, uploaded in parts as it fills).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import numpy as np

from ucp.file_io import BounceBuffers, done_future, little_endian, open_direct, write_hashed
from ucp.zarr_array import array_metadata, chunk_count, chunk_key

__all__ = ["LocalPackWriter", "PackWriter", "StreamingPackWriter", "chunk_spans", "pack_metadata"]


def pack_metadata(nbytes: int) -> dict:
    """The ``zarr.json`` members of a pack of ``nbytes`` bytes: a 1-d ``uint8`` array of one chunk."""
    return array_metadata((nbytes,), "uint8", max(1, nbytes), {"ucp": {"pack": True}})


def chunk_spans(shape: tuple[int, ...], itemsize: int, chunk_rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` byte ranges of a packed fragment's chunks, relative to its ``pack_offset``.

    A packed fragment's chunks are its rows cut every ``chunk_rows``, back to back, the last
    one short (no fill inside a pack)::

        >>> chunk_spans((5, 2), 4, 2)
        [(0, 16), (16, 32), (32, 40)]
    """
    row = math.prod(shape[1:]) * itemsize if shape else itemsize
    rows = shape[0] if shape else 1
    step = chunk_rows * row if shape else itemsize
    return [(i * step, min((i + 1) * step, rows * row)) for i in range(chunk_count(shape, chunk_rows))]


class PackWriter(Protocol):
    """An open pack (see the module docstring); every future a store returns may raise the write's error."""

    def write(
        self, offset: int, array: np.ndarray, *, chunk_rows: int, hasher: Callable[[], Any] | None
    ) -> list[Future]: ...
    def close(self, nbytes: int) -> Future: ...
    def abandon(self) -> None: ...


def _chunk_views(array: np.ndarray, chunk_rows: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    flat = little_endian(array).reshape(-1).view(np.uint8)
    return flat, chunk_spans(tuple(array.shape), array.itemsize, chunk_rows)


class LocalPackWriter:
    """A pack in a local directory, written by ``pool``'s threads with ``pwrite`` (see the module docstring).

    ``on_synced(path)`` is told about each file already made durable, so the store's
    ``sync`` does not fsync it again. With ``bounce`` (:class:`~ucp.file_io.BounceBuffers`; a
    store on a disk passes them) the aligned middle of every chunk is written with ``O_DIRECT``
    from a bounce buffer (:func:`~ucp.file_io.write_hashed`): no copy into the page cache.
    """

    def __init__(
        self,
        directory: str,
        pool: ThreadPoolExecutor,
        *,
        piece_bytes: int,
        fresh: bool,
        on_synced: Callable[[str], None],
        bounce: BounceBuffers | None = None,
    ) -> None:
        if fresh and os.path.isdir(directory):
            shutil.rmtree(directory)  # a killed earlier attempt's files must not linger
        os.makedirs(directory, exist_ok=True)
        self._directory, self._pool, self._piece = directory, pool, piece_bytes
        self._on_synced = on_synced
        self._path = os.path.join(directory, chunk_key((1,), 0))
        self._fd: int | None = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        # With ``bounce``, whole blocks bypass the page cache through a second, O_DIRECT descriptor.
        self._direct_fd = open_direct(self._path) if bounce is not None else None
        self._bounce = bounce if self._direct_fd is not None else None
        self._extent = 0  # the file's size so far (grown ahead of unbuffered writes)
        self._writes: list[Future] = []

    def write(
        self, offset: int, array: np.ndarray, *, chunk_rows: int, hasher: Callable[[], Any] | None
    ) -> list[Future]:
        """Put ``array``'s chunks at ``offset``: one future per chunk, of its hex digest (None without ``hasher``)."""
        flat, spans = _chunk_views(array, chunk_rows)
        if self._bounce is not None and offset + flat.nbytes > self._extent:
            # Grown before its writes: an O_DIRECT write past the end of a file is serialized and
            # journaled by ext4 (the file's size changes with it); one inside it is not.
            assert self._fd is not None, "the pack is open"
            self._extent = offset + flat.nbytes
            os.ftruncate(self._fd, self._extent)
        found = [self._pool.submit(self._put, offset + a, flat[a:b], hasher) for a, b in spans]
        self._writes.extend(found)
        return found

    def _put(self, offset: int, data: np.ndarray, hasher: Callable[[], Any] | None) -> str | None:
        assert self._fd is not None, "the pack is open"
        digest = hasher() if hasher is not None else None
        direct = self._direct_fd if self._bounce is not None else None
        if not write_hashed(
            self._fd, offset, data.data, digest=digest, piece_bytes=self._piece, direct_fd=direct, bounce=self._bounce
        ):
            self._bounce = None  # the file system refused O_DIRECT: the rest of the pack goes buffered
        return digest.hexdigest() if digest is not None else None

    def close(self, nbytes: int) -> Future:
        """Once every write is done: the file cut to ``nbytes`` (alignment fill), fsynced, ``zarr.json`` written."""
        writes, self._writes = self._writes, []
        return self._pool.submit(self._finish, writes, nbytes)

    def _finish(self, writes: list[Future], nbytes: int) -> None:
        # Submitted after its writes, so they are running or done on other threads: no deadlock.
        try:
            for future in writes:
                future.result()
            assert self._fd is not None, "the pack is open"
            os.ftruncate(self._fd, nbytes)
            os.fsync(self._fd)  # the pack's one fsync
        finally:
            self._release()
        self._on_synced(self._path)
        meta = os.path.join(self._directory, "zarr.json")
        with open(meta, "wb") as fh:
            fh.write(json.dumps({"zarr_format": 3, "node_type": "array", **pack_metadata(nbytes)}).encode())

    def abandon(self) -> None:
        """The save is thrown away: wait for the writes in flight, then let the file go."""
        for future in self._writes:
            future.exception()
        self._writes = []
        self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None


class StreamingPackWriter:
    """A pack streamed to an object store as it fills (see the module docstring).

    The writer puts fragments at increasing offsets, so each goes straight into one open
    file of the store (``open_file()``; s3fs uploads it in parts as they fill, and the object
    appears whole at ``close``), hashed piece by piece as it goes: a save holds no copy of the
    pack. ``put_metadata(nbytes)`` writes the pack's ``zarr.json`` once the file is closed.
    """

    def __init__(
        self,
        open_file: Callable[[], Any],
        put_metadata: Callable[[int], None],
        *,
        remove: Callable[[], None] = lambda: None,
        piece_bytes: int = 1 << 20,
    ) -> None:
        self._open, self._put_metadata, self._remove = open_file, put_metadata, remove
        self._piece = piece_bytes
        self._fh: Any = None
        self._at = 0  # bytes of the file written so far

    def write(
        self, offset: int, array: np.ndarray, *, chunk_rows: int, hasher: Callable[[], Any] | None
    ) -> list[Future]:
        """Append ``array``'s chunks at ``offset`` (after a zero fill up to it): futures of their digests, done."""
        assert offset >= self._at, f"pack fragments are written in offset order: {offset} after {self._at}"
        flat, spans = _chunk_views(array, chunk_rows)
        if self._fh is None:
            self._fh = self._open()
        self._fill(offset)
        found = []
        for a, b in spans:
            digest = hasher() if hasher is not None else None
            view = flat[a:b].data
            for start in range(0, view.nbytes, self._piece):
                piece = view[start : start + self._piece]
                if digest is not None:
                    digest.update(piece)
                self._fh.write(piece)
            found.append(done_future(digest.hexdigest() if digest is not None else None))
        self._at = offset + flat.nbytes
        return found

    def _fill(self, upto: int) -> None:
        while self._at < upto:
            step = min(upto - self._at, self._piece)
            self._fh.write(bytes(step))
            self._at += step

    def close(self, nbytes: int) -> Future:
        """The file filled up to ``nbytes`` and closed (the object appears whole), then its ``zarr.json``."""
        if self._fh is None:
            self._fh = self._open()
        self._fill(nbytes)
        fh, self._fh = self._fh, None
        fh.close()
        self._put_metadata(nbytes)
        return done_future(None)

    def abandon(self) -> None:
        """The save is thrown away: an unfinished upload is cancelled, never completed; what the
        store shows already (the memory filesystem's file exists from its opening) is removed."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        discard = getattr(fh, "discard", None)
        if discard is not None:
            discard()  # fsspec's buffered files (s3fs: abort the multipart upload)
        else:
            fh.close()
        self._remove()
