"""Stores: where checkpoint bytes live, behind one small protocol (docs/STORES.md).

>>> from ucp.stores import open_store, StoreOptions
>>> store = open_store("memory://doc-example", options=StoreOptions(chunk_bytes=1 << 20))
>>> store.write_bytes("a.json", b"{}")
>>> store.listdir(), store.strategy
(['a.json'], 'marker')
"""

from ucp.stores.fsspec_store import FsspecStore
from ucp.stores.local import LocalStore
from ucp.stores.memory import MemoryStore
from ucp.stores.options import DEFAULT_OPTIONS, StoreOptions
from ucp.stores.protocol import Store
from ucp.stores.registry import open_store, register_store
from ucp.stores.s3 import S3Store

__all__ = ["Store", "StoreOptions", "DEFAULT_OPTIONS", "open_store", "register_store", "LocalStore", "FsspecStore",
           "MemoryStore", "S3Store"]
