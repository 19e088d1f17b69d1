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
from ucp.zarr_array import chunk_count, chunk_key  # re-exported

__all__ = ["Storage", "chunk_rows_for", "chunk_count", "chunk_key"]


def chunk_rows_for(shape: tuple[int, ...], itemsize: int, *, chunk_bytes: int | None = None) -> int:
    """Rows (along dim 0) per chunk for an array of ``shape`` (``chunk_bytes``: StoreOptions.chunk_bytes).

    As few chunks as ``chunk_bytes`` allows, with the rows spread evenly over them: zarr
    stores every chunk whole, so a last chunk of a few rows would be stored (and written)
    as a full one, padding included (5376 rows at 4096 per chunk: 52% more bytes)."""
    chunk_bytes = DEFAULT_OPTIONS.chunk_bytes if chunk_bytes is None else chunk_bytes
    if not shape or not shape[0]:
        return 1
    row_bytes = math.prod(shape[1:]) * itemsize
    rows = chunk_bytes // row_bytes if row_bytes else shape[0]
    most = max(1, min(rows, shape[0]))
    chunks = -(-shape[0] // most)
    return max(1, -(-shape[0] // chunks))


def Storage(url: str | os.PathLike, *, storage_options: dict | None = None,  # noqa: N802 - the old class name
            options: StoreOptions | None = None) -> Store:
    """The store for ``url`` (:func:`ucp.stores.open_store`)."""
    return open_store(url, storage_options=storage_options, options=options)
