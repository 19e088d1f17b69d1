"""The store protocol: everything ucp's reader, writer, commit, manager and verify ask of a storage location.

A store is one checkpoint root (a local directory, an fsspec URL, a bucket
prefix). Paths inside it are relative, ``/``-separated (``data/r0/pack-000001``).
Implementations: :class:`~ucp.stores.local.LocalStore`,
:class:`~ucp.stores.fsspec_store.FsspecStore`,
:class:`~ucp.stores.memory.MemoryStore`, :class:`~ucp.stores.s3.S3Store`;
:func:`ucp.stores.open_store` picks one for a URL. docs/STORES.md tells how to add one.

Example::

    store = open_store("memory://ckpt")
    store.write_bytes("a/b.json", b"{}")
    assert store.listdir("a") == ["b.json"] and store.read_range("a/b.json", 0, 1)[0] == b"{"
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

import numpy as np

from ucp.stores.options import StoreOptions

if TYPE_CHECKING:
    from typing_extensions import Self


@runtime_checkable
class Store(Protocol):
    """One checkpoint root and how bytes get in and out of it (see the module docstring)."""

    url: str
    root: str
    options: StoreOptions
    strategy: str  # the commit strategy's name: "rename" or "marker"
    reused: bool  # set by a writer when the location may hold arrays of an earlier, killed save

    # -- names and plain bytes -------------------------------------------------------
    def display(self, *parts: str) -> str: ...
    def kind(self) -> str | None: ...  # "directory", "file", another phrase ("a FIFO"), or None: nothing there
    def exists(self, *parts: str) -> bool: ...
    def listdir(self, *parts: str) -> list[str]: ...
    def remove(self, *parts: str) -> None: ...
    def write_bytes(self, rel: str, data: bytes | memoryview) -> None: ...
    def read_bytes(self, *parts: str) -> bytes: ...
    def read_file(self, rel: str, *, limit: int, allowed: str) -> bytes: ...
    def read_range(self, rel: str, start: int, length: int, *, what: str | None = None) -> tuple[bytes, int | None]: ...
    def file_size(self, rel: str, *, what: str | None = None) -> int: ...
    def makedirs(self) -> None: ...

    # -- zarr arrays ----------------------------------------------------------------
    def write_array(
        self,
        rel: str,
        array: np.ndarray,
        *,
        dtype: str,
        chunk_rows: int,
        attributes: dict,
        hasher: Callable[[], Any] | None = None,
    ) -> list[Future]: ...
    def write_pack(
        self, rel: str, arrays: list[np.ndarray], *, align: int, hasher: Callable[[], Any] | None = None
    ) -> Future: ...
    def read_chunk(
        self, rel: str, shape: tuple[int, ...], dtype: str, index: int, chunk_rows: int, *, what: str
    ) -> Future: ...
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
    ) -> Future: ...
    def open_pack(self, rel: str) -> Any: ...  # a ucp.stores.pack_files.PackWriter
    def read_packed_into(
        self,
        rel: str,
        start: int,
        outs: list[np.ndarray],
        *,
        what: str,
        digest: Callable[[np.ndarray], str] | None = None,
    ) -> Future: ...
    def read_small(self, rel: str, shape: tuple[int, ...], dtype: str, *, what: str) -> np.ndarray: ...
    def read_packed(
        self, rel: str, offset: int, shape: tuple[int, ...], dtype: str, *, what: str, extent: int
    ) -> np.ndarray: ...
    def sync(self, under: str = "") -> None: ...
    def close(self) -> None: ...

    # -- the commit strategy ----------------------------------------------------------
    # A store commits and discards only what its own staging() made (a store of its own kind): Self.
    def staging(self, token: str) -> tuple[Self, str]: ...  # (where a save writes, its array key prefix)
    def prepare_staging(self, staged: Self, *, shared: bool, overwrite: bool) -> None: ...
    def commit(self, staged: Self, manifest: bytes, *, overwrite: bool, key_prefix: str) -> None: ...
    def discard(self, staged: Self, key_prefix: str) -> None: ...
    def delete(self) -> None: ...
    def unfinished_save(self) -> str | None: ...  # why a root without a manifest is an interrupted save
    def sweep(self, *, child: Callable[[str], bool], skip: set[str]) -> tuple[list[str], list[tuple[str, str]]]: ...
