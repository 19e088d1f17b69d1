"""Resharding from memory, in one process: held fragments are read in place and checked once.

One process in a world of one (a gloo group over an in-memory store), as in test_snapshots.py;
the multi-process runs are in stacks/test_hot_recovery.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ucp.replication.hot_reshard as hot_reshard
from ucp.errors import ChecksumError
from ucp.geometry import Box
from ucp.integrations.snapshots import SnapshotOptions, Snapshots
from ucp.manifest import Manifest
from ucp.reader import CheckpointReader
from ucp.replication.hot_reshard import _copy_bytes, _HeldFragments, held_arrays, reshard_from_memory
from ucp.replication.replica_map import ReplicaMap
from ucp.spec import FragmentMap, ShardPiece, TensorSpec
from ucp.stores import StoreOptions

STATE = {"w": torch.arange(24.0).view(6, 4), "h": (torch.arange(7.0) / 3).to(torch.bfloat16),
         "b": torch.arange(5, dtype=torch.int64), "step": 3}


def _held(tmp_path, **save_options):
    snapshots = Snapshots(SnapshotOptions(every=1, directory=str(tmp_path / "snap")), save_options=save_options)
    path = snapshots.save(3, STATE)
    tier = snapshots.tiers[0]
    (ck,) = tier.checkpoints()
    meta = tier.get_meta(ck)
    rmap = ReplicaMap.from_json(meta.replica_map, source="test")
    blobs, corrupt = held_arrays(snapshots.tiers, ck, rmap)
    assert not corrupt
    return path, Manifest.from_json(meta.manifest, source="test", checkpoint=path), rmap, blobs


def _each_fragment(manifest):
    for name, entry in manifest.tensors.items():
        for index, frag in enumerate(entry.fragments):
            yield name, index, frag


@pytest.mark.parametrize("options", [{}, {"store_options": StoreOptions(pack_max_bytes=0)}], ids=["packs", "chunk-files"])
def test_held_fragments_equal_the_saved_ones_bit_for_bit(world_of_one, tmp_path, options):
    path, manifest, rmap, blobs = _held(tmp_path, **options)
    memory = _HeldFragments(manifest, rmap, blobs)
    assert bool(memory.packs) == (not options)
    with CheckpointReader(path) as reader:
        for name, index, frag in _each_fragment(manifest):
            held, saved = memory.fragment(name, index), reader.read_fragment(name, frag)
            assert held.dtype == saved.dtype and torch.equal(held.view(torch.uint8), saved.view(torch.uint8))
    memory.close()


def test_a_packed_fragment_is_a_view_of_the_held_bytes_checked_once(world_of_one, tmp_path, monkeypatch):
    _, manifest, rmap, blobs = _held(tmp_path)
    calls = []
    monkeypatch.setattr(hot_reshard, "digest", lambda data: calls.append(len(data)) or _digest(data))
    memory = _HeldFragments(manifest, rmap, blobs)
    frag = manifest.tensors["w"].fragments[0]
    top, bottom = memory.read("w", 0, Box((0, 0), (3, 4))), memory.read("w", 0, Box((3, 1), (3, 2)))
    assert torch.equal(top, STATE["w"][:3]) and torch.equal(bottom, STATE["w"][3:, 1:3])
    assert calls == [frag.nbytes]  # two regions, one check of the fragment's one chunk
    (blob,) = (b for k, b in blobs.items() if k == frag.key)
    base = np.frombuffer(blob, dtype=np.uint8).ctypes.data
    assert base <= top.data_ptr() < base + len(blob)  # no copy of the held bytes


def _digest(data):
    from ucp.checksum import digest

    return digest(data)


def test_a_held_fragment_whose_bytes_differ_from_its_checksum_is_refused(world_of_one, tmp_path):
    path, manifest, rmap, blobs = _held(tmp_path)
    frag = manifest.tensors["w"].fragments[0]
    key = frag.key
    damaged = bytearray(blobs[key])
    at = len(damaged) - len(hot_reshard.split_blob(rmap.arrays[key], blobs[key])[-1][1]) + frag.pack_offset + 5
    damaged[at] ^= 0xFF
    memory = _HeldFragments(manifest, rmap, {**blobs, key: bytes(damaged)})
    assert torch.equal(memory.read("b", 0, Box((0,), (5,))), STATE["b"])  # the pack's other fragments are fine
    with pytest.raises(ChecksumError) as err:
        memory.read("w", 0, Box((0, 0), (1, 4)))
    chunk = frag.checksums[0]
    found = str(err.value).split(" has ")[1].split(",")[0]
    assert str(err.value) == (
        f"checksum mismatch in tensor 'w': the held copy of array {key!r} bytes {frag.pack_offset}.."
        f"{frag.pack_offset + frag.nbytes} (fragment of rank 0, chunk 0) has {found}, expected {chunk}; the copy "
        "is corrupt: restore from storage (ucp.load) or an older checkpoint")
    assert found != chunk


def test_message_packing_round_trips_mixed_dtypes_at_any_byte_offset():
    w, h = torch.arange(12.0).view(3, 4), (torch.arange(5.0) / 7).to(torch.bfloat16)  # 10 bytes: misaligns w
    regions = [h, w[:, 1:3], h[1:4]]
    sizes = [r.numel() * r.element_size() for r in regions]
    message = torch.empty(sum(sizes), dtype=torch.uint8)
    at = 0
    for region, nbytes in zip(regions, sizes):
        _copy_bytes(message[at:at + nbytes], region)
        at += nbytes
    at = 0
    for region, nbytes in zip(regions, sizes):
        out = torch.full_like(region, -1)
        _copy_bytes(out, message[at:at + nbytes])
        assert torch.equal(out, region)
        at += nbytes


def test_a_bf16_tensor_is_resharded_from_memory_bit_for_bit(world_of_one, tmp_path):
    snapshots = Snapshots(SnapshotOptions(every=1, directory=str(tmp_path / "snap")), save_options={})
    snapshots.save(3, STATE)

    def target(logical):
        spec = TensorSpec("h", (ShardPiece("h", Box((0,), (5,)), Box((2,), (5,))),))
        return FragmentMap(rank=0, logical={"h": logical["h"]}, tensors={"h": spec}), {
            "h": torch.zeros(5, dtype=torch.bfloat16)}

    tree, into, _, report = reshard_from_memory(snapshots.tiers, target, complete=snapshots.complete)
    assert tree["step"] == 3 and torch.equal(into["h"].view(torch.int16), STATE["h"][2:].view(torch.int16))
    assert report.elements == {"own": 5, "peer": 0, "storage": 0}


def test_a_large_ask_moves_alone_and_small_ones_share_a_message_per_pair():
    from ucp.spec import LogicalTensor

    logical = {"w": LogicalTensor("w", (64, 4), "float32")}
    # (holder, logical, fragment, offsets, sizes) per rank: rank 1 asks rank 0 for 3 regions
    everyone = [[], [(0, "w", 0, (0, 0), (32, 4)), (0, "w", 0, (32, 0), (2, 4)), (0, "w", 0, (34, 0), (1, 4))]]
    transfers, parts = hot_reshard._coalesce(everyone, logical, round_bytes=1 << 20, alone_bytes=512)
    assert [(t.source, t.dest, t.nbytes) for t in transfers] == [(0, 1, 512), (0, 1, 48)]
    assert [[i for i, _, _ in parts[t.key]] for t in transfers] == [[0], [1, 2]]
    transfers, _ = hot_reshard._coalesce(everyone, logical, round_bytes=1 << 20, alone_bytes=1 << 20)
    assert [t.nbytes for t in transfers] == [560]  # nothing that large: one message
