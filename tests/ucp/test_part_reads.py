"""Parts of packed fragments are read straight into their destinations, and still checked whole.

A resharding load (zero=1 8 -> 6 ranks) takes a run of each source rank's flat partition. Each
chunk it touches is read whole, since its checksum covers all of it: the wanted bytes straight
into the destination, the rest into scratch, hashed in order (ucp.reader._read_parts). These
tests check the values, that no chunk buffer is used, and that a flipped byte anywhere in a
touched chunk, wanted or not, refuses the load with the same error the chunk buffer gave.
"""

from __future__ import annotations

import json

import pytest
import torch

import ucp
from ucp.geometry import Box, FlatRange
from ucp.reader import CheckpointReader
from ucp.stores import StoreOptions

# Small chunks, so that parts span several chunks and start and stop inside them;
# small_array_bytes=-1: no fragment takes the small-fragment (pack window) path.
OPTIONS = StoreOptions(chunk_bytes=256, small_array_bytes=-1)
W = torch.arange(37 * 5, dtype=torch.float32).reshape(37, 5) * 0.5
V = torch.arange(301, dtype=torch.int16)


def _save(path) -> None:
    ucp.save({"w": W, "v": V}, path, store_options=OPTIONS)


def _no_chunk_buffer(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a part of a packed fragment went through the chunk buffer")

    monkeypatch.setattr(CheckpointReader, "_start_chunk", refuse)


@pytest.mark.parametrize(
    "region",
    [Box((3, 0), (10, 5)), Box((4, 2), (1, 3)), Box((0, 0), (37, 5)), Box((36, 0), (1, 5)), Box((12, 1), (1, 1))],
    ids=str,
)
def test_a_run_of_rows_or_of_one_row_is_read_straight_in(tmp_path, monkeypatch, region):
    _save(tmp_path / "c")
    _no_chunk_buffer(monkeypatch)
    with CheckpointReader(str(tmp_path / "c"), store_options=OPTIONS) as reader:
        assert torch.equal(reader.read_tensor("w", region), W[region.slices()])


def test_a_column_block_still_goes_through_the_chunk_buffer(tmp_path):
    _save(tmp_path / "c")
    with CheckpointReader(str(tmp_path / "c"), store_options=OPTIONS) as reader:
        assert torch.equal(reader.read_tensor("w", Box((5, 1), (7, 2))), W[5:12, 1:3])


def test_flat_ranges_and_the_same_bytes_twice_in_one_batch(tmp_path, monkeypatch):
    _save(tmp_path / "c")
    _no_chunk_buffer(monkeypatch)
    a, b, c = torch.empty(200, dtype=torch.int16), torch.empty(200, dtype=torch.int16), torch.empty(10, 5)
    d = torch.empty(10, 5)
    with CheckpointReader(str(tmp_path / "c"), store_options=OPTIONS) as reader:
        # a and b want the same bytes; c and d overlap rows of w: chunks read into scratch, copied out once checked
        reader.read_many(
            [
                ("v", Box((7,), (200,)), a),
                ("v", Box((7,), (200,)), b),
                ("w", Box((3, 0), (10, 5)), c),
                ("w", Box((8, 0), (10, 5)), d),
            ]
        )
        flat = torch.empty(33)
        reader.read_into("w", FlatRange(11, 44), flat)
    assert torch.equal(a, V[7:207]) and torch.equal(b, V[7:207])
    assert torch.equal(c, W[3:13]) and torch.equal(d, W[8:18])
    assert torch.equal(flat, W.reshape(-1)[11:44])


def _pack(path) -> tuple:
    manifest = json.loads((path / "manifest.json").read_text())
    frag = manifest["tensors"]["w"]["fragments"][0]
    return path / "data" / frag["key"] / "c.0", frag


def _flip(pack, at: int) -> None:
    data = bytearray(pack.read_bytes())
    data[at] ^= 0xFF
    pack.write_bytes(bytes(data))


@pytest.mark.parametrize("row", [4, 6], ids=["byte-wanted", "byte-of-the-chunk-not-wanted"])
def test_a_flipped_byte_in_a_touched_chunk_refuses_with_the_chunk_buffers_error(tmp_path, row):
    _save(tmp_path / "c")
    pack, frag = _pack(tmp_path / "c")
    assert 7 <= frag["chunk_rows"] < 37  # small chunks: rows 3..6 lie in chunk 0, which does not hold all rows
    _flip(pack, frag["pack_offset"] + row * 5 * 4 + 1)
    with CheckpointReader(str(tmp_path / "c"), store_options=OPTIONS) as reader:
        with pytest.raises(ucp.ChecksumError) as whole:
            reader.check_fragment("w", reader.entry("w").fragments[0])  # the chunk buffer's check
    with CheckpointReader(str(tmp_path / "c"), store_options=OPTIONS) as reader:
        with pytest.raises(ucp.ChecksumError) as part:
            reader.read_tensor("w", Box((3, 0), (2, 5)))  # rows 3..4 only: row 6 is read, never used
    assert str(part.value) == str(whole.value)
    assert "checksum mismatch in tensor 'w': file " in str(part.value)
    with CheckpointReader(str(tmp_path / "c"), verify=False, store_options=OPTIONS) as reader:
        got = reader.read_tensor("w", Box((3, 0), (2, 5)))  # verify=False: the only way past the check
    assert torch.equal(got, W[3:5]) == (row == 6)


def test_a_pack_cut_short_names_the_tensor_whose_part_it_lacks(tmp_path):
    _save(tmp_path / "c")
    pack, frag = _pack(tmp_path / "c")
    pack.write_bytes(pack.read_bytes()[: frag["pack_offset"] + 100])
    with CheckpointReader(str(tmp_path / "c"), store_options=OPTIONS) as reader:
        with pytest.raises(ucp.TruncatedDataError, match=r"tensor 'w' \(fragment '.*' of rank 0\): .* is shorter"):
            reader.read_tensor("w", Box((3, 0), (2, 5)))
