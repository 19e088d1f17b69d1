"""Chunk rows: as even as possible, so a fragment's last chunk is not mostly padding on disk."""

import os

import torch
from hypothesis import given
from hypothesis import strategies as st

import ucp
from ucp.stores.chunking import chunk_rows_for
from ucp.stores import StoreOptions


@given(rows=st.integers(1, 10_000), cols=st.integers(0, 50), itemsize=st.sampled_from([1, 2, 4, 8]),
       chunk_bytes=st.integers(1, 1 << 16))
def test_fewest_chunks_and_at_most_one_padding_row_per_chunk(rows, cols, itemsize, chunk_bytes):
    shape = (rows, cols) if cols else (rows,)
    got = chunk_rows_for(shape, itemsize, chunk_bytes=chunk_bytes)
    row_bytes = (cols or 1) * itemsize
    most = max(1, min(rows, chunk_bytes // row_bytes))  # the rows a chunk may hold
    chunks = -(-rows // got)
    assert 1 <= got <= most
    assert chunks == -(-rows // most)  # no more chunks than the budget needs
    assert chunks * got - rows < chunks  # zarr stores every chunk whole: padding < one row per chunk


def test_empty_and_scalar_arrays():
    assert chunk_rows_for((0, 8), 4, chunk_bytes=64) == chunk_rows_for((0,), 4) == chunk_rows_for((), 4) == 1
    assert chunk_rows_for((5, 0), 4) == 5  # rows of no bytes: one chunk


def test_a_tensor_just_over_one_chunk_is_not_stored_twice(tmp_path):
    """5376 rows at 4096 rows per chunk were stored as 2 x 4096 rows (52% padding on disk)."""
    path = tmp_path / "c"
    w = torch.arange(5376 * 4, dtype=torch.float32).reshape(5376, 4)  # rows of 16 bytes
    ucp.save({"w": w}, path, store_options=StoreOptions(chunk_bytes=4096 * 16, pack_max_bytes=0))
    chunks = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.startswith("c.")]
    assert len(chunks) == 2 and sum(chunks) == w.numel() * 4
    assert torch.equal(ucp.load(path)["w"], w)
