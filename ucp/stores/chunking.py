"""How many rows go into each chunk of an array ucp writes (tuned by ``StoreOptions.chunk_bytes``).

>>> chunk_rows_for((1000, 4), 4, chunk_bytes=64)
4
"""

from __future__ import annotations

import math

from ucp.stores.options import DEFAULT_OPTIONS

__all__ = ["chunk_rows_for"]


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
