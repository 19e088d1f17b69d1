"""Chunk geometry of the arrays ucp writes, and ``Storage``, the name older code opens a store by.

The stores themselves live in :mod:`ucp.stores` (docs/STORES.md); their tuning
is one :class:`~ucp.stores.options.StoreOptions` value::

    >>> chunk_rows_for((1000, 4), 4, chunk_bytes=64)
    4
    >>> Storage("memory://storage-doc").strategy
    'marker'
"""

from __future__ import annotations

import math
import os

from ucp.stores import DEFAULT_OPTIONS, Store, StoreOptions, open_store
from ucp.zarr_array import chunk_count, chunk_key  # noqa: F401 - re-exported

__all__ = ["Storage", "chunk_rows_for", "chunk_count", "chunk_key"]


def chunk_rows_for(shape: tuple[int, ...], itemsize: int, *, chunk_bytes: int | None = None) -> int:
    """Rows (along dim 0) per chunk for an array of ``shape`` (``chunk_bytes``: StoreOptions.chunk_bytes)."""
    chunk_bytes = DEFAULT_OPTIONS.chunk_bytes if chunk_bytes is None else chunk_bytes
    if not shape:
        return 1
    row_bytes = math.prod(shape[1:]) * itemsize
    rows = chunk_bytes // row_bytes if row_bytes else shape[0]
    return max(1, min(rows, shape[0]))


def Storage(url: str | os.PathLike, *, storage_options: dict | None = None,  # noqa: N802 - the old class name
            options: StoreOptions | None = None) -> Store:
    """The store for ``url`` (:func:`ucp.stores.open_store`)."""
    return open_store(url, storage_options=storage_options, options=options)
