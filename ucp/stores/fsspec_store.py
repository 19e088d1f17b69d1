"""Any fsspec filesystem as a store; commits by writing the manifest last, as the marker.

tensorstore cannot see fsspec filesystems, so a multi-chunk array is written
into a private tensorstore ``memory`` kvstore and its keys (``zarr.json`` and the
chunk files) are then put through fsspec; reads copy just the keys they need
(the metadata and the chunks a read touches) the other way. Small one-chunk
arrays and packs are put and read as plain bytes. The bytes on the store are the
same plain zarr v3 arrays as on a local disk (docs/FORMAT.md).

Commit (strategy "marker"): a save writes straight into the target, its arrays
under a prefix of their own (its token), and ``manifest.json`` is written last,
with an exclusive create where the filesystem offers one
(:meth:`FsspecStore.create_exclusive`). Readers never look at a root without a
manifest.

Example::

    store = FsspecStore("memory://ckpt")
    store.write_bytes("manifest.json", b"{}")
"""

from __future__ import annotations

import json
import math
import posixpath
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

import fsspec
import numpy as np
import tensorstore as ts

from ucp.confined import relative_parts
from ucp.errors import InvalidArgumentError, StorageURLError, UnsafePathError
from ucp.file_io import done_future, hexdigests, little_endian
from ucp.manifest_json import DATA_DIR, MANIFEST_NAME, MAX_MANIFEST_BYTES
from ucp.stores import errors
from ucp.stores.base import BaseStore
from ucp.stores.occupancy import PARTS_DIR, array_entries, exists_error
from ucp.stores.options import StoreOptions
from ucp.stores.tensorstore_arrays import TensorstoreArrays
from ucp.zarr_array import array_metadata, chunk_count, chunk_key

if TYPE_CHECKING:
    from typing_extensions import Self


class FsspecStore(BaseStore):
    """A root on any fsspec filesystem (``memory://``, ``gs://``, ``az://``, ...)."""

    strategy = "marker"

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict | None = None,
        options: StoreOptions | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        root: str | None = None,
    ) -> None:
        if fs is None:
            fs, root = _url_to_fs(url, storage_options)
        elif root is None:
            raise InvalidArgumentError(f"FsspecStore({url!r}, fs=...): give root= too, the checkpoint's path inside fs")
        super().__init__(url, fs, root.rstrip("/"), options=options)
        self.storage_options = storage_options
        self._memory = ts.KvStore.open({"driver": "memory"}, context=self.context).result()

    def _tensorstore_arrays(self) -> TensorstoreArrays:
        return TensorstoreArrays(
            self.context,
            lambda rel: {"driver": "memory", "path": rel.strip("/") + "/"},
            display=self.display,
            after_write=self._flush_memory,
            before_read=self._fetch,
            after_read=self._drop_fetched,
        )

    # -- names and plain bytes ------------------------------------------------------
    def kind(self) -> str | None:
        try:
            info = self.fs.info(self.root)
        except FileNotFoundError:
            return None
        return "directory" if info.get("type") == "directory" else "file"

    def makedirs(self) -> None:
        """Nothing to do: object keys need no parent directories."""

    def read_file(self, rel: str, *, limit: int, allowed: str) -> bytes:
        relative_parts(rel, self.display(), verb="read")  # an absolute name would leave the root
        path = self.path(rel)
        info = self.fs.info(path)
        if info.get("type") != "file" or (info.get("size") or 0) > limit:
            raise UnsafePathError(
                f"{self.display(rel)} is not a file of at most {limit} bytes ({info.get('type')}, "
                f"{info.get('size')} bytes), the most that {allowed}; refusing to read it"
            )
        return self.fs.cat_file(path, start=0, end=limit)

    def read_range(self, rel: str, start: int, length: int, *, what: str | None = None) -> tuple[bytes, int | None]:
        """Bytes ``[start, start + length)`` of a file (fewer at its end); the size is not known (None)."""
        relative_parts(rel, self.display(), verb="read")
        return self.fs.cat_file(self.path(rel), start=start, end=start + length), None

    def file_size(self, rel: str, *, what: str | None = None) -> int:
        relative_parts(rel, self.display(), verb="read")
        return self.fs.size(self.path(rel))

    def write_bytes(self, rel: str, data: bytes | memoryview) -> None:
        """One object put: readers see the old bytes or the new, never part; never outside the root."""
        relative_parts(rel, self.display())
        self.fs.pipe_file(self.path(rel), bytes(data))

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Write ``rel`` only if it does not exist (FileExistsError); False where the filesystem cannot.

        fsspec's ``open(..., "xb")`` is the generic exclusive create; stores override this
        with their backend's own (an S3 conditional put, a lock around the memory filesystem).
        """
        try:
            with self.fs.open(self.path(rel), "xb") as fh:
                fh.write(data)
            return True
        except (ValueError, NotImplementedError, TypeError):
            return False  # no exclusive create here

    # -- arrays ---------------------------------------------------------------------
    def _write_plain(
        self,
        rel: str,
        array: np.ndarray,
        *,
        dtype: str,
        chunk_rows: int,
        attributes: dict,
        hasher: Callable[[], Any] | None,
    ) -> list[Future]:
        shape = tuple(array.shape)
        array = little_endian(array)
        full = array.itemsize * (chunk_rows * math.prod(max(1, s) for s in shape[1:]) if shape else 1)
        parts = [
            (chunk_key(shape, i), array[i * chunk_rows : (i + 1) * chunk_rows] if shape else array)
            for i in range(chunk_count(shape, chunk_rows))
        ]
        self._put_zarr_json(rel, array_metadata(shape, dtype, chunk_rows, attributes))
        self.fs.pipe({self.path(rel, name): part.tobytes() + bytes(full - part.nbytes) for name, part in parts})
        return [done_future(digest) for digest in hexdigests(hasher, [part for _, part in parts])]

    def write_pack(
        self, rel: str, arrays: list[np.ndarray], *, align: int, hasher: Callable[[], Any] | None = None
    ) -> Future:
        arrays = [little_endian(a) for a in arrays]
        total = sum(a.nbytes + (-a.nbytes % align) for a in arrays)
        self._put_zarr_json(rel, array_metadata((total,), "uint8", total, {"ucp": {"pack": True}}))
        data = b"".join(a.tobytes() + bytes(-a.nbytes % align) for a in arrays)
        self.fs.pipe_file(self.path(rel, chunk_key((total,), 0)), data)
        return done_future(hexdigests(hasher, arrays))

    def open_pack(self, rel: str) -> Any:
        """A writer of the pack ``rel`` that streams its fragments into one object as they come
        (:class:`~ucp.stores.pack_files.StreamingPackWriter`): no copy of the pack is held."""
        from ucp.stores.pack_files import StreamingPackWriter, pack_metadata

        relative_parts(rel, self.display())
        path = self.path(rel, chunk_key((1,), 0))
        return StreamingPackWriter(
            lambda: self.fs.open(path, "wb"),
            lambda nbytes: self._put_zarr_json(rel, pack_metadata(nbytes)),
            remove=lambda: self.fs.rm(path) if self.fs.exists(path) else None,
            piece_bytes=self.options.write_piece_bytes,
        )

    def _put_zarr_json(self, rel: str, metadata: dict) -> None:
        self.fs.pipe_file(
            self.path(rel, "zarr.json"), json.dumps({"zarr_format": 3, "node_type": "array", **metadata}).encode()
        )

    def sync(self, under: str = "") -> None:
        """Nothing to do: every put above returned once the store had the bytes."""

    def _flush_memory(self, rel: str) -> None:
        prefix = rel.strip("/") + "/"
        keys = [k.decode() for k in self._memory.list(ts.KvStore.KeyRange(prefix, prefix[:-1] + "0")).result()]
        self.fs.pipe({self.path(k): self._memory.read(k).result().value for k in keys})
        for k in keys:
            self._memory.delete_range(ts.KvStore.KeyRange(k, k + "\0")).result()

    def _fetch(self, rel: str, name: str, limit: int, what: str) -> None:
        """Copy one key of an array into the private memory store (at most ``limit`` bytes of it)."""
        try:
            data = self.fs.cat_file(self.path(rel, name), start=0, end=limit + 1)
        except FileNotFoundError:
            raise errors.missing(what, f"file {self.display(rel, name)}") from None
        if len(data) > limit:
            raise errors.too_long(what, self.display(rel, name), limit)
        self._memory.write(posixpath.join(rel.strip("/"), name), data).result()

    def _drop_fetched(self, rel: str, name: str) -> None:
        key = posixpath.join(rel.strip("/"), name)
        self._memory.delete_range(ts.KvStore.KeyRange(key, key + "\0")).result()

    # -- the commit strategy: the manifest, written last, is the marker -----------------
    def staging(self, token: str) -> tuple[Self, str]:
        """The target itself; each save's arrays under their own prefix (a concurrent save never writes over them)."""
        from ucp.stores.occupancy import SHARED_TOKEN

        return self, "" if token == SHARED_TOKEN else f"{token}/"

    def prepare_staging(self, staged: "FsspecStore", *, shared: bool, overwrite: bool) -> None:
        # The old checkpoint stays whole (its arrays have other keys than this save's) until
        # the new manifest replaces it; commit then deletes the old arrays. Ranks sharing one
        # staging area write under the same keys: the old checkpoint is un-committed first.
        if shared and overwrite:
            self.remove(MANIFEST_NAME)

    def commit(self, staged: "FsspecStore", manifest: bytes, *, overwrite: bool, key_prefix: str) -> None:
        """Write the manifest (the commit marker); without overwrite, only if none is there yet."""
        if overwrite:
            # Only the arrays of the checkpoint this manifest replaces become garbage; any other
            # prefix under data/ may be a concurrent save that has not committed yet.
            replaced = self._committed_entries() - {key_prefix.rstrip("/")} if key_prefix else set()
            self.write_bytes(MANIFEST_NAME, manifest)  # one object replaced: old or new, never neither
            for entry in sorted(replaced):
                try:
                    self.remove(DATA_DIR, entry)
                except OSError:
                    pass  # left as garbage; readers only follow the manifest
            return
        try:  # atomic against a concurrent commit where the store offers it
            if self.create_exclusive(MANIFEST_NAME, manifest):
                return
        except FileExistsError:
            raise exists_error(self) from None
        if self.exists(MANIFEST_NAME):  # check, then write: not atomic
            raise exists_error(self)
        self.write_bytes(MANIFEST_NAME, manifest)

    def _committed_entries(self) -> set[str]:
        """The entries of ``data/`` the committed manifest's arrays live in (none without one)."""
        try:
            data = self.read_file(MANIFEST_NAME, limit=MAX_MANIFEST_BYTES, allowed="a manifest may hold")
        except (FileNotFoundError, UnsafePathError):
            return set()
        return array_entries(data)

    def discard(self, staged: "FsspecStore", key_prefix: str) -> None:
        if key_prefix:
            staged.remove(DATA_DIR, key_prefix.rstrip("/"))

    def delete(self) -> None:
        """The manifest goes first: a failure part-way never leaves something that looks complete.

        Then only the arrays that manifest names: another save to this path may be writing under
        its own prefix. The root goes once nothing else is left in it (or when the manifest
        named nothing readable, as before).
        """
        entries = self._committed_entries()
        self.remove(MANIFEST_NAME)
        for entry in sorted(entries):
            self.remove(DATA_DIR, entry)
        if not entries or not (self.listdir(DATA_DIR) or self.listdir(PARTS_DIR)):
            self.remove()

    def unfinished_save(self) -> str | None:
        return self._never_committed() if self._has_save_traces() else None

    def sweep(self, *, child: Callable[[str], bool], skip: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """Nothing to sweep: marker commits leave no staging areas."""
        return [], []


def _url_to_fs(url: str, storage_options: dict | None) -> tuple[fsspec.AbstractFileSystem, str]:
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ValueError, ImportError) as err:  # an unknown protocol, a backend that is not installed
        raise StorageURLError(
            f"cannot open {url}: {err}; give a local path or an fsspec URL whose "
            "backend is installed (memory://, file://, s3:// with s3fs, ...)"
        ) from None
