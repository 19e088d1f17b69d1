"""Stores: where checkpoint bytes live, behind one small protocol (docs/STORES.md).

>>> from ucp.stores import open_store, StoreOptions
>>> store = open_store("memory://doc-example", options=StoreOptions(chunk_bytes=1 << 20))
>>> store.write_bytes("a.json", b"{}")
>>> store.listdir(), store.strategy
(['a.json'], 'marker')
"""

from ucp.stores.local import LocalStore
from ucp.stores.options import DEFAULT_OPTIONS, StoreOptions
from ucp.stores.protocol import Store
from ucp.stores.registry import open_store, register_store

__all__ = [
    "Store",
    "StoreOptions",
    "DEFAULT_OPTIONS",
    "open_store",
    "register_store",
    "LocalStore",
    "FsspecStore",
    "MemoryStore",
    "S3Store",
]

# The stores over fsspec import fsspec and tensorstore (~0.5 s): only when one is asked for,
# so a process that saves and loads on local disk never pays for them.
_LAZY = {"FsspecStore": "ucp.stores.fsspec_store", "MemoryStore": "ucp.stores.memory", "S3Store": "ucp.stores.s3"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ucp.stores' has no attribute {name!r}")
