"""Local arrays are written as plain chunk files straight from tensor memory; the bytes must
equal tensorstore's (docs/FORMAT.md, section 8). Also the writer's flush() and ucp.api.open_writer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import ucp
from ucp.api import open_writer
from ucp.dtypes import UnsupportedDtypeError
from ucp.errors import CheckpointExistsError
from ucp.stores import StoreOptions


def _state() -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        # 10 rows of 4 KiB with 3-row chunks (below): chunks of 3, 3, 3 and an edge chunk of 1 row.
        "f32": torch.randn(10, 1024, generator=gen),
        "bf16": torch.randn(7, 2048, generator=gen).to(torch.bfloat16),
        "i64": torch.arange(5 * 512, dtype=torch.int64).view(5, 512),
        "mask": torch.rand(9, 4096, generator=gen) > 0.5,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(1024, 8, generator=gen).t(),  # non-contiguous: copied for writing
    }


def _save(path, state, *, direct: bool) -> None:
    # Every array is "large": written chunk by chunk, directly or by tensorstore.
    options = StoreOptions(chunk_bytes=3 * 4096, small_array_bytes=-1, direct_writes=direct)
    with ucp.CheckpointWriter(str(path), pack_max_bytes=0, store_options=options) as writer:
        for key, tensor in state.items():
            writer.add(key, tensor)
        writer.set_state({key: {"$tensor": key} for key in state})


def _files(root) -> dict[str, object]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name.endswith(".json"):
                data = json.loads(data)
                if p.name == "manifest.json":
                    data.pop("created")
            out[str(p.relative_to(root))] = data
    return out


def test_direct_and_tensorstore_writes_give_identical_files(tmp_path):
    state = _state()
    _save(tmp_path / "direct", state, direct=True)
    _save(tmp_path / "ts", state, direct=False)
    direct, ts = _files(tmp_path / "direct"), _files(tmp_path / "ts")
    assert list(direct) == list(ts)
    assert "data/r0/000000-f32/c.3.0" in direct  # several chunks, the last one an edge chunk
    assert len(direct["data/r0/000000-f32/c.3.0"]) == 3 * 4096  # stored full-size, zero-filled
    assert direct["data/r0/000000-f32/c.3.0"][4096:] == bytes(2 * 4096)
    bytes_codec = [{"name": "bytes", "configuration": {"endian": "little"}}]
    for name in direct:
        if name.endswith("zarr.json"):
            assert direct[name]["codecs"] == bytes_codec, name  # exactly as docs/FORMAT.md 4.1 says
            if direct[name]["data_type"] in ("bool", "uint8", "int8"):
                # tensorstore drops "endian" for one-byte types (valid zarr v3, but not FORMAT.md's
                # exact codec list); the direct writer, the one used for local disks, keeps it.
                assert ts[name]["codecs"] == [{"name": "bytes"}]
                ts[name]["codecs"] = bytes_codec
        assert direct[name] == ts[name], name
    loaded = ucp.load(tmp_path / "direct")
    for key, tensor in state.items():
        assert torch.equal(loaded[key], tensor), key


def test_pack_is_written_from_tensor_memory_with_zero_padding(tmp_path):
    a = torch.arange(5, dtype=torch.float32)  # 20 bytes -> padded to 64
    b = torch.tensor([1, 2, 3], dtype=torch.int16)
    ucp.save({"a": a, "b": b}, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    fa, fb = manifest["tensors"]["a"]["fragments"][0], manifest["tensors"]["b"]["fragments"][0]
    assert fa["key"] == fb["key"] and (fa["pack_offset"], fb["pack_offset"]) == (0, 64)
    raw = (tmp_path / "c" / "data" / fa["key"] / "c.0").read_bytes()
    assert raw == a.numpy().tobytes() + bytes(44) + b.numpy().tobytes() + bytes(58)
    meta = json.loads((tmp_path / "c" / "data" / fa["key"] / "zarr.json").read_text())
    assert meta["shape"] == [128] and meta["chunk_grid"]["configuration"]["chunk_shape"] == [128]


def test_every_in_flight_byte_is_bounded(tmp_path):
    options = StoreOptions(chunk_bytes=64 << 10, max_inflight_bytes=128 << 10)
    seen = []
    with ucp.CheckpointWriter(str(tmp_path / "c"), store_options=options) as writer:
        for i in range(6):
            writer.add(f"t{i}", torch.full((64, 1024), float(i)))  # 256 KiB, 4 chunks, contiguous
            seen.append(writer._inflight_bytes)
        writer.set_state({})
    assert max(seen) <= 128 << 10
    assert torch.equal(ucp.load(tmp_path / "c")["t5"], torch.full((64, 1024), 5.0))


def test_flush_lets_the_caller_reuse_tensor_memory(tmp_path):
    big, small = torch.full((256, 1024), 1.0), torch.full((8,), 2.0)  # one own array, one packed
    with ucp.CheckpointWriter(str(tmp_path / "c")) as writer:
        writer.add("big", big)
        writer.add("small", small)
        writer.flush()
        big.fill_(-1.0)
        small.fill_(-2.0)
        writer.add("later", small)
        writer.set_state({})
    loaded = ucp.load(tmp_path / "c")
    assert torch.equal(loaded["big"], torch.full((256, 1024), 1.0))
    assert torch.equal(loaded["small"], torch.full((8,), 2.0))
    assert torch.equal(loaded["later"], torch.full((8,), -2.0))


def test_flush_after_close_is_refused(tmp_path):
    writer = ucp.CheckpointWriter(str(tmp_path / "c"))
    writer.close()
    with pytest.raises(ucp.UcpError, match=r"^the writer for .*c is already closed$"):
        writer.flush()


def test_open_writer_writes_what_save_writes(tmp_path):
    state = {"model": {"w": torch.arange(6.0).view(2, 3)}, "step": 4, "tags": ("a", None)}
    ucp.save(state, tmp_path / "saved")
    flat, writer = open_writer(state, tmp_path / "opened")
    assert sorted(flat.tensors) == ["model/w"]
    for key, tensor in flat.tensors.items():
        writer.add(key, tensor)
    writer.set_state(flat.tree)
    assert writer.close().committed
    assert _files(tmp_path / "saved") == _files(tmp_path / "opened")


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_open_writer_refuses_bad_input_before_writing(tmp_path):
    with pytest.raises(UnsupportedDtypeError, match="'q'"):
        open_writer({"q": torch.zeros(2, dtype=torch.complex32)}, tmp_path / "c")
    assert list(tmp_path.iterdir()) == []
    ucp.save({"w": torch.ones(1)}, tmp_path / "c")
    with pytest.raises(CheckpointExistsError, match="pass overwrite=True"):
        open_writer({"w": torch.ones(1)}, tmp_path / "c")
    flat, writer = open_writer({"w": torch.ones(1)}, tmp_path / "c", overwrite=True)
    writer.abort()
    np.testing.assert_array_equal(ucp.load(tmp_path / "c")["w"].numpy(), [1.0])
