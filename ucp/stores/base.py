"""What every store shares: the root, its options and I/O threads, and reads built on ``read_range``.

Subclasses (:mod:`ucp.stores.local`, :mod:`ucp.stores.fsspec_store`) supply the
primitives - plain bytes in and out, arrays, and the commit strategy - and
inherit the rest. Small, one-chunk arrays and packs are read as byte ranges
here; multi-chunk arrays are the subclasses' business.

Example::

    store = open_store("memory://ckpt")            # a subclass of BaseStore
    store.read_small("data/r0/b", (2,), "float32", what="tensor 'b'")
"""

from __future__ import annotations

import math
import operator
import posixpath
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ucp.file_io import hexdigests
from ucp.manifest_json import DATA_DIR, MANIFEST_NAME
from ucp.stores import errors
from ucp.stores.occupancy import PARTS_DIR
from ucp.stores.options import DEFAULT_OPTIONS, StoreOptions
from ucp.zarr_array import chunk_count, chunk_key


class BaseStore:
    """State and reads common to every store; see :class:`ucp.stores.protocol.Store` for the contract."""

    strategy = "marker"

    def __init__(self, url: str, fs: Any, root: str, *, options: StoreOptions | None = None) -> None:
        self.url, self._fs, self.root = url, fs, root  # fs: an fsspec filesystem (None: made when first used)
        self.options = options or DEFAULT_OPTIONS
        self.reused = False
        self._threads: ThreadPoolExecutor | None = None
        # (pack, start) -> a window of its bytes, least recent first
        self._pack_cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._context: Any = None
        self._arrays: Any = None  # a TensorstoreArrays, made when an array first goes through tensorstore

    if TYPE_CHECKING:  # each store defines these (see Store); the shared code below calls them

        def kind(self) -> str | None: ...
        def read_range(
            self, rel: str, start: int, length: int, *, what: str | None = None
        ) -> tuple[bytes, int | None]: ...
        def write_pack(
            self, rel: str, arrays: list[np.ndarray], *, align: int, hasher: Callable[[], Any] | None = None
        ) -> Future: ...
        def _write_plain(
            self,
            rel: str,
            array: np.ndarray,
            *,
            dtype: str,
            chunk_rows: int,
            attributes: dict,
            hasher: Callable[[], Any] | None,
        ) -> list[Future]: ...

    @property
    def fs(self) -> Any:
        return self._fs

    @property
    def context(self) -> Any:
        """The tensorstore context, made (and tensorstore imported: ~0.5 s) only when an array needs it."""
        if self._context is None:
            import tensorstore as ts

            # No fsync per file: one sync() of the whole save before its commit is far cheaper
            # than thousands of fsyncs, and just as durable for the commit rule.
            self._context = ts.Context({"file_io_sync": False})
        return self._context

    @property
    def _ts(self) -> Any:
        """How multi-chunk arrays go through tensorstore here (a TensorstoreArrays, made on first use)."""
        if self._arrays is None:
            self._arrays = self._tensorstore_arrays()
        return self._arrays

    def _tensorstore_arrays(self) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display()!r})"

    # -- names and plain bytes ------------------------------------------------------
    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def display(self, *parts: str) -> str:
        """A path as the user should see it in messages."""
        return self.fs.unstrip_protocol(self.path(*parts))

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes:
        return self.fs.cat_file(self.path(*parts))

    def remove(self, *parts: str) -> None:
        path = self.path(*parts)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def listdir(self, *parts: str) -> list[str]:
        path = self.path(*parts)
        if not self.fs.exists(path):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False))

    # -- arrays ---------------------------------------------------------------------
    def write_array(
        self,
        rel: str,
        array: np.ndarray,
        *,
        dtype: str,
        chunk_rows: int,
        attributes: dict,
        hasher: Callable[[], Any] | None = None,
    ) -> list[Future]:
        """Write the zarr array ``rel`` holding ``array``: one future per chunk, of its hex digest.

        The digest is of the chunk's valid elements, by a streaming hasher from ``hasher()``
        (None without one). ``array`` is referenced, not copied: leave it unchanged until
        every future is done.
        """
        shape = tuple(array.shape)
        if self._writes_plain(array, shape, chunk_rows):
            return self._write_plain(
                rel, array, dtype=dtype, chunk_rows=chunk_rows, attributes=attributes, hasher=hasher
            )
        pieces = [
            array[i * chunk_rows : (i + 1) * chunk_rows] if shape else array
            for i in range(chunk_count(shape, chunk_rows))
        ]

        def job() -> list:
            digests = hexdigests(hasher, pieces)
            self._ts.write(
                rel, array, dtype=dtype, chunk_rows=chunk_rows, attributes=attributes, delete_existing=self.reused
            )
            return digests

        done = self._pool().submit(job)
        return [_then(done, operator.itemgetter(i)) for i in range(len(pieces))]

    def _writes_plain(self, array: np.ndarray, shape: tuple[int, ...], chunk_rows: int) -> bool:
        """Small one-chunk arrays skip tensorstore everywhere (opening one costs ~0.3 ms)."""
        return array.nbytes <= self.options.small_array_bytes and chunk_count(shape, chunk_rows) <= 1

    def read_chunk(
        self, rel: str, shape: tuple[int, ...], dtype: str, index: int, chunk_rows: int, *, what: str
    ) -> Future:
        """Start reading chunk ``index`` (along dim 0); a future of its valid rows as a numpy array."""
        from ucp.zarr_array import ZARR_JSON_LIMIT

        return self._pool().submit(
            self._ts.read_chunk, rel, shape, dtype, index, chunk_rows, what=what, zarr_json_limit=ZARR_JSON_LIMIT
        )

    def read_chunk_into(
        self,
        rel: str,
        shape: tuple[int, ...],
        dtype: str,
        index: int,
        chunk_rows: int,
        out: np.ndarray,
        *,
        what: str,
        digest: Callable[[np.ndarray], str] | None = None,
    ) -> Future:
        """Start reading chunk ``index`` into ``out`` (its valid rows, C order); a future of ``digest(out)``."""
        from ucp.zarr_array import ZARR_JSON_LIMIT

        def job() -> str | None:
            chunk = self._ts.read_chunk(
                rel, shape, dtype, index, chunk_rows, what=what, zarr_json_limit=ZARR_JSON_LIMIT
            )
            # Bytes, not values: ``out`` may view the destination under another dtype of the same size.
            out.reshape(-1).view(np.uint8)[:] = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
            return digest(out) if digest is not None else None

        return self._pool().submit(job)

    def read_small(self, rel: str, shape: tuple[int, ...], dtype: str, *, what: str) -> np.ndarray:
        """Read the only chunk of a small array as plain bytes."""
        name = chunk_key(shape, 0)
        np_dtype = np.dtype(dtype).newbyteorder("<")
        expected = math.prod(shape) * np_dtype.itemsize
        try:
            data, size = self.read_range(posixpath.join(rel, name), 0, expected + 1, what=what)
        except FileNotFoundError:
            raise errors.missing(what, self.display(rel, name)) from None
        if len(data) != expected:
            raise errors.wrong_size(what, self.display(rel, name), size or len(data), expected)
        return np.frombuffer(bytearray(data), dtype=np_dtype).reshape(shape)

    def read_packed(
        self, rel: str, offset: int, shape: tuple[int, ...], dtype: str, *, what: str, extent: int
    ) -> np.ndarray:
        """Read one small packed fragment: a byte range of a pack array's only chunk.

        A window of the pack from the fragment on is read (a quarter of
        ``options.pack_cache_bytes``, never past ``extent``: as far as the manifest's fragments
        of the pack reach) and the windows read last are kept, up to ``options.pack_cache_bytes``,
        so the many small tensors of a pack cost one read, not one each, even when a load takes
        turns between the packs of several source ranks.
        """
        name = chunk_key((1,), 0)
        np_dtype = np.dtype(dtype).newbyteorder("<")
        nbytes = math.prod(shape) * np_dtype.itemsize
        held = next(
            (
                (key, data)
                for key, data in reversed(self._pack_cache.items())
                if key[0] == rel and key[1] <= offset and offset + nbytes <= key[1] + len(data)
            ),
            None,
        )
        if held is None:
            length = max(nbytes, min(extent - offset, self.options.pack_cache_bytes // 4))
            try:
                window = self.read_range(posixpath.join(rel, name), offset, length, what=what)[0]
            except FileNotFoundError:
                raise errors.missing(what, self.display(rel, name)) from None
            if len(window) < nbytes:
                raise errors.short_pack(what, self.display(rel, name), offset, offset + nbytes, len(window))
            held = ((rel, offset), window)
            self._pack_cache[held[0]] = window
            total = sum(len(b) for b in self._pack_cache.values())
            while total > self.options.pack_cache_bytes and len(self._pack_cache) > 1:
                total -= len(self._pack_cache.popitem(last=False)[1])
        (key, data) = held
        self._pack_cache.move_to_end(key)
        start = offset - key[1]
        return np.frombuffer(bytearray(data[start : start + nbytes]), dtype=np_dtype).reshape(shape)

    def read_packed_into(
        self,
        rel: str,
        start: int,
        outs: list[np.ndarray],
        *,
        what: str,
        digest: Callable[[np.ndarray], str] | None = None,
    ) -> Future:
        """Start reading pack bytes from ``start`` into ``outs``, back to back; a future of ``[digest(out)]``.

        Nothing is read unless the pack holds every byte asked for (TruncatedDataError otherwise).
        """
        return self._pool().submit(self._read_packed_into, rel, start, outs, what, digest)

    def _read_packed_into(
        self, rel: str, start: int, outs: list[np.ndarray], what: str, digest: Callable[[np.ndarray], str] | None
    ) -> list[str | None]:
        name = chunk_key((1,), 0)
        nbytes = sum(o.nbytes for o in outs)
        try:
            data, size = self.read_range(posixpath.join(rel, name), start, nbytes, what=what)
        except FileNotFoundError:
            raise errors.missing(what, self.display(rel, name)) from None
        if len(data) != nbytes:
            raise errors.short_pack(what, self.display(rel, name), start, start + nbytes, len(data))
        at = 0
        for out in outs:
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8, out.nbytes, at)
            at += out.nbytes
        return [digest(o) if digest is not None else None for o in outs]

    def close(self) -> None:
        """Let this store's I/O threads go (it stays usable; a later call starts new ones)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        self._pack_cache.clear()
        if self._arrays is not None:
            self._arrays.forget()

    def _pool(self) -> ThreadPoolExecutor:
        # File creation is latency-bound (metadata ops); a few threads overlap it.
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=self.options.threads, thread_name_prefix="ucp-io")
        return self._threads

    # -- commit helpers every strategy shares ----------------------------------------------
    def _has_save_traces(self) -> bool:
        """Whether a ucp save wrote into this root (marker stores write into the target itself)."""
        return self.kind() == "directory" and (self.exists(PARTS_DIR) or self.exists(DATA_DIR))

    def _never_committed(self) -> str:
        return (
            f"{self.display()} has no committed {MANIFEST_NAME}: a save was started but never committed "
            "(crashed or still running); load an older checkpoint"
        )


def _then(future: Future, pick: Callable[[Any], Any]) -> Future:
    """A future of ``pick(future.result())`` (or of its exception)."""
    out: Future = Future()

    def done(f: Future) -> None:
        err = f.exception()
        if err is not None:
            out.set_exception(err)
        else:
            out.set_result(pick(f.result()))

    future.add_done_callback(done)
    return out
