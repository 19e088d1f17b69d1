"""Object stores stream a pack to the store as its fragments arrive, instead of gathering it in memory.

A rank's pack is up to ``pack_target_bytes`` (1 GiB): gathered, then joined and copied for the
put, a save to S3 held several times that on top of the state.
"""

from __future__ import annotations

import tracemalloc

import fsspec
import numpy as np
import pytest
import torch

import ucp
from ucp.stores import StoreOptions, open_store
from ucp.stores.pack_files import StreamingPackWriter
from ucp import checksum


def test_a_save_to_an_object_store_holds_little_more_than_the_stored_object():
    fs = fsspec.filesystem("memory")
    state = {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB, one pack
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    tracemalloc.start()
    try:
        ucp.save(state, "memory://streamed/c")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The memory filesystem keeps the object itself in this process (1x, grown by doubling).
    assert peak < 2.2 * nbytes, peak / nbytes
    out = ucp.load("memory://streamed/c")
    assert all(torch.equal(out[k], v) for k, v in state.items())
    fs.rm("/streamed", recursive=True)


def test_fragments_go_out_in_offset_order_with_the_alignment_fill_between():
    fs = fsspec.filesystem("memory")
    store = open_store("memory://streamed-order/c")
    pack = store.open_pack("data/r0/pack-000000")
    a, b = np.arange(10, dtype=np.uint8), np.arange(5, dtype=np.float32)
    found = [f.result() for f in pack.write(0, a, chunk_rows=4, hasher=checksum.hasher)]
    assert found == [checksum.digest(a[:4]), checksum.digest(a[4:8]), checksum.digest(a[8:])]
    pack.write(64, b, chunk_rows=5, hasher=None)
    pack.close(128).result()
    data = fs.cat_file("/streamed-order/c/data/r0/pack-000000/c.0")
    assert data == a.tobytes() + bytes(54) + b.tobytes() + bytes(44)
    fs.rm("/streamed-order", recursive=True)


def test_a_fragment_before_the_last_one_is_refused():
    fs = fsspec.filesystem("memory")
    pack = StreamingPackWriter(lambda: fs.open("/streamed-back/c.0", "wb"), lambda nbytes: None)
    pack.write(64, np.ones(8, dtype=np.uint8), chunk_rows=8, hasher=None)
    with pytest.raises(AssertionError, match=r"^pack fragments are written in offset order: 0 after 72$"):
        pack.write(0, np.ones(8, dtype=np.uint8), chunk_rows=8, hasher=None)
    pack.abandon()


def test_an_abandoned_pack_leaves_no_object():
    fs = fsspec.filesystem("memory")
    store = open_store("memory://streamed-abandon/c", options=StoreOptions())
    pack = store.open_pack("data/r0/pack-000000")
    pack.write(0, np.ones(100, dtype=np.uint8), chunk_rows=100, hasher=None)
    pack.abandon()
    assert not fs.exists("/streamed-abandon/c/data/r0/pack-000000/c.0")
