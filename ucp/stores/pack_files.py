"""Writing a pack as it fills: fragments land at their offsets while the save goes on, the file closes once.

A pack (docs/FORMAT.md, "Packs") holds a rank's fragments back to back in one file. The writer
learns its fragments one at a time, so a store hands out a pack writer: ``write`` puts one
fragment's chunks at their offsets (hashed piece by piece right before each piece is written)
and ``close`` sizes the file, makes it durable once, and writes the pack's ``zarr.json``::

    pack = store.open_pack("data/r0/pack-000000")
    digests = [f.result() for f in pack.write(0, array, chunk_rows=4, hasher=checksum.hasher)]
    pack.close(array.nbytes).result()

:class:`LocalPackWriter` writes with ``pwrite`` from the store's I/O threads straight from the
tensor's memory (one open file, one ``fsync``); :class:`BufferedPackWriter` gathers the bytes
and hands the whole pack to the store's ``write_pack`` (object stores write whole objects).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import numpy as np

from ucp.file_io import done_future, hexdigests, little_endian
from ucp.zarr_array import array_metadata, chunk_count, chunk_key

__all__ = ["BufferedPackWriter", "LocalPackWriter", "PackWriter", "chunk_spans", "pack_metadata"]


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
    ``sync`` does not fsync it again.
    """

    def __init__(
        self,
        directory: str,
        pool: ThreadPoolExecutor,
        *,
        piece_bytes: int,
        fresh: bool,
        on_synced: Callable[[str], None],
    ) -> None:
        if fresh and os.path.isdir(directory):
            shutil.rmtree(directory)  # a killed earlier attempt's files must not linger
        os.makedirs(directory, exist_ok=True)
        self._directory, self._pool, self._piece = directory, pool, piece_bytes
        self._on_synced = on_synced
        self._path = os.path.join(directory, chunk_key((1,), 0))
        self._fd: int | None = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._writes: list[Future] = []

    def write(
        self, offset: int, array: np.ndarray, *, chunk_rows: int, hasher: Callable[[], Any] | None
    ) -> list[Future]:
        """Put ``array``'s chunks at ``offset``: one future per chunk, of its hex digest (None without ``hasher``)."""
        flat, spans = _chunk_views(array, chunk_rows)
        found = [self._pool.submit(self._put, offset + a, flat[a:b], hasher) for a, b in spans]
        self._writes.extend(found)
        return found

    def _put(self, offset: int, data: np.ndarray, hasher: Callable[[], Any] | None) -> str | None:
        assert self._fd is not None, "the pack is open"
        digest = hasher() if hasher is not None else None
        view = data.data
        for start in range(0, view.nbytes, self._piece):
            piece = view[start : start + self._piece]
            if digest is not None:
                digest.update(piece)  # right before the write: the write then reads it from cache
            at = offset + start
            while piece.nbytes:
                written = os.pwrite(self._fd, piece, at)
                piece, at = piece[written:], at + written
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


class BufferedPackWriter:
    """A pack gathered in memory and handed whole to ``write_pack(rel, [bytes], align=1)`` at close."""

    def __init__(self, rel: str, write_pack: Callable[..., Future]) -> None:
        self._rel, self._write_pack = rel, write_pack
        self._buffer = bytearray()

    def write(
        self, offset: int, array: np.ndarray, *, chunk_rows: int, hasher: Callable[[], Any] | None
    ) -> list[Future]:
        flat, spans = _chunk_views(array, chunk_rows)
        end = offset + flat.nbytes
        if len(self._buffer) < end:
            self._buffer.extend(bytes(end - len(self._buffer)))
        self._buffer[offset:end] = flat.data
        return [done_future(d) for d in hexdigests(hasher, [flat[a:b] for a, b in spans])]

    def close(self, nbytes: int) -> Future:
        data = np.frombuffer(bytes(self._buffer[:nbytes].ljust(nbytes, b"\0")), dtype=np.uint8)
        self._buffer = bytearray()
        return self._write_pack(self._rel, [data], align=1)

    def abandon(self) -> None:
        self._buffer = bytearray()
