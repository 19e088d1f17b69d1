"""Which store serves a URL: local paths and ``file://`` the local store, then by fsspec protocol.

``open_store`` is how the rest of ucp gets a store; ``register_store`` adds a
protocol (docs/STORES.md)::

    >>> type(open_store("memory://ckpt")).__name__
    'MemoryStore'
    >>> type(open_store("/tmp/ckpt")).__name__
    'LocalStore'
"""

from __future__ import annotations

import os
from typing import Callable

from ucp.errors import InvalidArgumentError, StorageURLError
from ucp.stores.local import LocalStore
from ucp.stores.options import StoreOptions
from ucp.stores.protocol import Store

__all__ = ["open_store", "register_store", "StoreFactory"]

# factory(url, storage_options=..., options=...) -> Store
StoreFactory = Callable[..., Store]


def _lazy(module: str, name: str) -> StoreFactory:
    """A factory that imports its store (and fsspec, tensorstore) when a URL first needs it."""

    def factory(url: str, **kwargs) -> Store:
        import importlib

        return getattr(importlib.import_module(module), name)(url, **kwargs)

    return factory


_S3 = _lazy("ucp.stores.s3", "S3Store")
_FACTORIES: dict[str, StoreFactory] = {"memory": _lazy("ucp.stores.memory", "MemoryStore"), "s3": _S3, "s3a": _S3}


def register_store(protocol: str, factory: StoreFactory) -> None:
    """Serve URLs ``protocol://...`` with ``factory(url, storage_options=..., options=...)``."""
    if not protocol or not protocol.isidentifier():
        raise InvalidArgumentError(f"store protocol must be a name such as 'gs', got {protocol!r}")
    _FACTORIES[protocol] = factory


def open_store(
    url: str | os.PathLike, *, storage_options: dict | None = None, options: StoreOptions | None = None
) -> Store:
    """The store for a local path or an fsspec URL (StorageURLError when there is none)."""
    url = os.fspath(url)
    if not url or "\0" in url:
        raise StorageURLError(f"{url!r} is not a checkpoint path; give a directory or an fsspec URL")
    protocol, sep, rest = url.partition("://")
    if not sep or (protocol == "file" and not storage_options):
        return LocalStore(rest if sep else url, options=options)
    factory = _FACTORIES.get(protocol)
    if factory is not None:
        return factory(url, storage_options=storage_options, options=options)
    from fsspec.implementations.local import LocalFileSystem

    from ucp.stores.fsspec_store import FsspecStore

    store = FsspecStore(url, storage_options=storage_options, options=options)
    if isinstance(store.fs, LocalFileSystem):
        return LocalStore(store.root, options=options)  # e.g. file:// with options: still the local disk
    return store
