"""Format 3: a rank's fragments, large ones too, go into a few pack files written once and fsynced once.

The pack layout must stay open (zarr-python returns the same bytes), keep a checksum per chunk,
and be read as carefully as chunk files: a truncated pack, a manifest pointing at the wrong
bytes and a flipped byte are each refused with a message naming the file.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import zarr

import ucp
from ucp.stores import StoreOptions

# Small chunks, so that a few tensors give packed fragments of several chunks and two packs.
OPTIONS = StoreOptions(chunk_bytes=4096, pack_target_bytes=32 << 10)


def _state() -> dict:
    gen = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(300, 64, generator=gen).to(torch.bfloat16),  # 38 KiB: 10 chunks
        "fc": torch.randn(40, 50, generator=gen),
        "bias": torch.randn(50, generator=gen),
        "step": torch.tensor(3),
        "flat": torch.arange(5000, dtype=torch.int16),
    }


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _files(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_a_save_writes_a_few_pack_files_with_a_checksum_per_chunk(tmp_path):
    state = _state()
    ucp.save(state, tmp_path / "c", store_options=OPTIONS)
    manifest = _manifest(tmp_path / "c")
    assert manifest["format_version"] == 3
    frags = {name: t["fragments"] for name, t in manifest["tensors"].items()}
    assert all(len(f) == 1 and f[0]["pack_offset"] % 64 == 0 for f in frags.values())
    embed = frags["embed"][0]
    assert embed["chunk_rows"] == 30 and len(embed["checksums"]) == 10  # 300 rows of 128 bytes, <= 4 KiB chunks
    assert _files(tmp_path / "c") == [
        "data/r0/pack-000000/c.0",
        "data/r0/pack-000000/zarr.json",
        "data/r0/pack-000001/c.0",
        "data/r0/pack-000001/zarr.json",
        "manifest.json",
    ]
    out = ucp.load(tmp_path / "c")
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_zarr_python_reads_every_packed_fragment(tmp_path):
    state = _state()
    ucp.save(state, tmp_path / "c", store_options=OPTIONS)
    for name, entry in _manifest(tmp_path / "c")["tensors"].items():
        frag = entry["fragments"][0]
        pack = zarr.open_array(str(tmp_path / "c" / "data" / frag["key"]), mode="r")[:]
        assert pack.dtype == np.uint8
        raw = pack[frag["pack_offset"] : frag["pack_offset"] + frag["nbytes"]]
        assert raw.tobytes() == state[name].reshape(-1).view(torch.uint8).numpy().tobytes(), name


def test_a_save_fsyncs_each_pack_once(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def counting(fd):  # a spy: counts, changes nothing
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    ucp.save({f"layer{i}": torch.full((256, 64), float(i)) for i in range(40)}, tmp_path / "c")
    assert [os.path.basename(p) for p in synced].count("c.0") == 1, synced
    assert len(synced) <= 10, synced  # the pack, its zarr.json, the manifest and the directories


def _pack_file(path) -> str:
    frag = _manifest(path)["tensors"]["embed"]["fragments"][0]
    return str(path / "data" / frag["key"] / "c.0")


def test_a_truncated_pack_is_refused_before_it_is_read(tmp_path):
    ucp.save(_state(), tmp_path / "c", store_options=OPTIONS)
    frag = _manifest(tmp_path / "c")["tensors"]["embed"]["fragments"][0]
    pack = _pack_file(tmp_path / "c")
    os.truncate(pack, frag["pack_offset"] + 100)
    with pytest.raises(ucp.TruncatedDataError) as err:
        ucp.load(tmp_path / "c")
    start = frag["pack_offset"]
    assert str(err.value) == (
        f"tensor 'embed' (fragment 'r0/pack-000000' of rank 0): {pack} is shorter than the manifest says "
        f"(bytes {start}..{start + 3840} wanted, 100 found); the file is damaged - restore it from a replica or load an older checkpoint"
    )


def test_a_pack_offset_past_the_file_is_refused(tmp_path):
    ucp.save(_state(), tmp_path / "c", store_options=OPTIONS)
    manifest = _manifest(tmp_path / "c")
    manifest["tensors"]["embed"]["fragments"][0]["pack_offset"] = 1 << 40  # a wrong index
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ucp.TruncatedDataError, match=r"is shorter than the manifest says \(bytes 1099511627776\.\."):
        ucp.load(tmp_path / "c")


def test_a_pack_offset_naming_other_bytes_fails_the_checksum(tmp_path):
    ucp.save(_state(), tmp_path / "c", store_options=OPTIONS)
    manifest = _manifest(tmp_path / "c")
    frag = manifest["tensors"]["embed"]["fragments"][0]
    frag["pack_offset"] += 64  # a wrong index inside the file: the bytes of another chunk
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ucp.ChecksumError, match=r"checksum mismatch in tensor 'embed': file .*pack-000000/c\.0 "):
        ucp.load(tmp_path / "c")


def test_a_flipped_byte_in_a_packed_chunk_is_reported_with_its_chunk(tmp_path):
    ucp.save(_state(), tmp_path / "c", store_options=OPTIONS)
    frag = _manifest(tmp_path / "c")["tensors"]["embed"]["fragments"][0]
    pack = _pack_file(tmp_path / "c")
    at = frag["pack_offset"] + 3 * 3840 + 17  # inside chunk 3 (chunks of 30 rows of 128 bytes)
    with open(pack, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(ucp.ChecksumError) as err:
        ucp.load(tmp_path / "c")
    assert f"expected {frag['checksums'][3]}" in str(err.value) and pack in str(err.value)
    report = ucp.verify(str(tmp_path / "c"))
    assert [p.kind for p in report.problems] == ["ChecksumError"]


def test_partial_reads_of_a_packed_fragment_read_only_its_chunks(tmp_path):
    state = _state()
    ucp.save(state, tmp_path / "c", store_options=OPTIONS)
    with ucp.CheckpointReader(str(tmp_path / "c")) as reader:
        from ucp.geometry import Box

        part = reader.read_tensor("embed", Box((70, 8), (100, 20)))
        assert torch.equal(part, state["embed"][70:170, 8:28])
        flat = reader.read_tensor("flat", ucp.geometry.FlatRange(1000, 4100))
        assert torch.equal(flat, state["flat"][1000:4100])


def test_a_memory_store_writes_the_same_packs(tmp_path):
    state = _state()
    ucp.save(state, tmp_path / "c", store_options=OPTIONS)
    ucp.save(state, "memory://packs-same/c", store_options=OPTIONS)
    out = ucp.load("memory://packs-same/c")
    assert all(torch.equal(out[k], v) for k, v in state.items())
    local = _manifest(tmp_path / "c")
    import fsspec

    remote = json.loads(fsspec.filesystem("memory").cat_file("/packs-same/c/manifest.json"))
    def digests(manifest):
        return {n: [(f["pack_offset"], f["checksums"]) for f in t["fragments"]] for n, t in manifest["tensors"].items()}

    assert digests(local) == digests(remote)


def test_coalesced_pack_reads_in_flight_are_bounded(tmp_path, monkeypatch):
    from tests.ucp.test_confined_reads import count_in_flight
    from ucp.stores import LocalStore

    options = StoreOptions(chunk_bytes=64, slab_bytes=256, reads_in_flight=3)  # chunks of 4 rows, runs of 256 bytes
    big = torch.arange(4000.0).view(1000, 4)
    ucp.save({"w": big}, tmp_path / "c", store_options=options)
    live = count_in_flight(monkeypatch, LocalStore, "read_packed_into")
    assert torch.equal(ucp.load(tmp_path / "c", store_options=options)["w"], big)
    assert live["calls"] == -(-16000 // 256) and live["most"] <= 3  # 250 chunks of 64 bytes in runs of 4
