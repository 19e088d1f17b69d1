"""Spreading a replicated piece over its replicas: written once, in parts of at least SPREAD_MIN_BYTES.

At dp=128 a 20 MiB weight used to become 128 fragments of 160 KiB (each a manifest entry, a
file and a checksum); now it is 5 parts of 4 MiB, on 5 of the replicas, and no piece is more
than 16 parts, whatever dp is.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.geometry import Box, FlatRange
from ucp.spec import SPREAD_MAX_PARTS, SPREAD_MIN_BYTES, ShardPiece, TensorSpec
from ucp.write_units import write_plan


def _parts(piece: ShardPiece, nbytes: int, replicas: int) -> list[tuple[int, object, object]]:
    out = []
    for replica in range(replicas):
        spec = TensorSpec("k", (piece,), replica=replica, replicas=replicas)
        units = write_plan(piece, nbytes, spec)
        assert len(units) <= 1  # a replica writes at most one part of a piece
        out += [(replica, local, target) for local, target in units]
    return out


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 5), replicas=st.integers(2, 200),
       units=st.integers(0, 100), flat=st.booleans(), off=st.integers(0, 3))
def test_parts_tile_the_piece_once_and_are_at_least_the_minimum(rows, cols, replicas, units, flat, off):
    nbytes = units * SPREAD_MIN_BYTES + 7  # the piece's size in bytes (its dtype does not matter here)
    if flat:
        piece = ShardPiece("w", FlatRange(5, 5 + rows * cols), FlatRange(off, off + rows * cols))
    else:
        piece = ShardPiece("w", FlatRange(5, 5 + rows * cols), Box((off, 0), (rows, cols)))
    parts = _parts(piece, nbytes, replicas)
    size = rows * cols if flat else rows
    # parts average >= SPREAD_MIN_BYTES, and their number does not grow with the replicas
    assert len(parts) == max(1, min(replicas, SPREAD_MAX_PARTS, units, size))
    covered = torch.zeros(rows * cols, dtype=torch.int32)
    for _, local, target in parts:
        assert local.numel == target.numel
        assert isinstance(local, FlatRange)
        start = target.start - off if flat else (target.offsets[0] - off) * cols
        assert local.start == start  # the part's run of the piece's data holds exactly its target
        covered[start : start + target.numel] += 1
    assert bool((covered == 1).all())
    sizes = [t.numel for _, _, t in parts]
    assert max(sizes) - min(sizes) <= (cols if not flat else 1)  # even parts: one row apart at most


def test_a_20_mib_weight_over_128_replicas_is_5_parts_on_consecutive_replicas():
    piece = ShardPiece("w", Box((0, 0), (1280, 8192)), Box((0, 0), (1280, 8192)))
    parts = _parts(piece, 1280 * 8192 * 2, 128)
    assert SPREAD_MIN_BYTES == 4 << 20 and len(parts) == 5
    writers = [r for r, _, _ in parts]
    first = writers[[t.offsets[0] for _, _, t in parts].index(0)]
    assert sorted(writers) == sorted((first + i) % 128 for i in range(5))
    huge = ShardPiece("w", Box((0, 0), (8192, 8192)), Box((0, 0), (8192, 8192)))
    assert SPREAD_MAX_PARTS == 16 and len(_parts(huge, 8192 * 8192 * 4, 128)) == 16  # 256 MiB: 16 parts of 16 MiB
    small = ShardPiece("b", Box((0,), (100,)), Box((0,), (100,)))
    assert len(_parts(small, 400, 128)) == 1  # below the minimum: whole, by one replica
