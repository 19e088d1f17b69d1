"""safetensors files made by the safetensors library, read with checked headers; written files it loads."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ucp.dtypes import UnsupportedDtypeError
from ucp.errors import CheckpointExistsError, FormatError
from ucp.formats import TrainingState, detect_format
from ucp.formats.safetensors_format import SafetensorsReader, SafetensorsWriter
from ucp.geometry import Box, FlatRange
from ucp.spec import LogicalTensor


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(9, 4, generator=g),
        "norm.weight": torch.randn(4, generator=g).to(torch.bfloat16),
        "head.weight": torch.randn(5, 4, generator=g).half(),
        "mask": torch.tensor([True, False, True]),
        "ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "fp8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal (float8 has no ==; -0.0 and NaN compare by bits)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def _write(path, tensors, **options):
    writer = SafetensorsWriter(str(path), tensors=[LogicalTensor(n, tuple(t.shape), str(t.dtype)[6:])
                                                   for n, t in tensors.items()], **options)
    for name, t in tensors.items():
        writer.add(name, t)
    writer.set_state(options.get("state") or TrainingState())
    writer.close()


def test_reads_a_file_written_by_safetensors(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt", "note": "x"})
    assert detect_format(tmp_path / "m.safetensors").name == "safetensors"
    with SafetensorsReader(tmp_path / "m.safetensors") as reader:
        infos = {t.name: t for t in reader.tensors()}
        assert set(infos) == set(tensors)
        for name, t in tensors.items():
            assert (infos[name].dtype, infos[name].shape) == (str(t.dtype)[6:], tuple(t.shape))
            assert _same(infos[name].read(), t), name
        emb = tensors["embed.weight"]
        assert torch.equal(infos["embed.weight"].read(Box((2, 1), (4, 2))), emb[2:6, 1:3])
        assert torch.equal(infos["embed.weight"].read(FlatRange(5, 23)), emb.reshape(-1)[5:23])
        assert reader.state().extra == {"safetensors_metadata": {"note": "x"}}


def test_written_file_loads_in_safetensors_with_the_state(tmp_path):
    tensors = _tensors()
    state = TrainingState(step=7, param_groups=({"lr": 0.1, "params": ["embed.weight"]},))
    _write(tmp_path / "out.safetensors", tensors, state=state)
    loaded = load_file(tmp_path / "out.safetensors")
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert _same(loaded[name], t), name
    with safe_open(tmp_path / "out.safetensors", framework="pt") as fh:
        assert fh.metadata()["format"] == "pt"
    with SafetensorsReader(tmp_path / "out.safetensors") as reader:
        assert reader.state() == state
    raw = (tmp_path / "out.safetensors").read_bytes()
    assert (8 + struct.unpack("<Q", raw[:8])[0]) % 8 == 0  # data 8-byte aligned, like the library's own files


def test_shards_and_index_load_through_the_index(tmp_path):
    tensors = {f"layers.{i}.weight": torch.full((64, 16), float(i)) for i in range(5)}  # 4 KiB each
    _write(tmp_path / "out", tensors, shard_size=9000, state=TrainingState(step=3))
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors"]
    assert index["metadata"]["total_size"] == 5 * 4096
    merged = {}
    for file in files:
        merged.update(load_file(tmp_path / "out" / file))
    assert all(torch.equal(merged[n], t) for n, t in tensors.items())
    assert detect_format(tmp_path / "out").name == "safetensors"
    with SafetensorsReader(tmp_path / "out") as reader:
        assert [t.name for t in reader.tensors()] == list(tensors)
        assert reader.state().step == 3


def test_blocks_go_to_their_offsets(tmp_path):
    big = torch.randn(10, 3)
    writer = SafetensorsWriter(str(tmp_path / "b.safetensors"), tensors=[LogicalTensor("big", (10, 3), "float32")])
    for box in (Box((0, 0), (4, 3)), Box((4, 0), (4, 3)), Box((8, 0), (2, 3))):
        writer.add_region("big", box, big[box.slices()].clone())
    writer.set_state(TrainingState())
    writer.close()
    assert torch.equal(load_file(tmp_path / "b.safetensors")["big"], big)


def test_writer_refuses_before_writing(tmp_path):
    with pytest.raises(UnsupportedDtypeError, match=r"tensor 'w' has dtype complex128, which safetensors cannot "
                                                    r"store \(it stores bfloat16, bool, complex64"):
        SafetensorsWriter(str(tmp_path / "x.safetensors"), tensors=[LogicalTensor("w", (2,), "complex128")])
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "y.safetensors").write_bytes(b"old")
    with pytest.raises(CheckpointExistsError, match=r"y\.safetensors already exists; choose another destination"):
        SafetensorsWriter(str(tmp_path / "y.safetensors"), tensors=[])


def test_an_aborted_write_leaves_nothing(tmp_path):
    writer = SafetensorsWriter(str(tmp_path / "out"), tensors=[LogicalTensor("w", (2,), "float32")])
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    writer = SafetensorsWriter(str(tmp_path / "out"), tensors=[LogicalTensor("w", (2,), "float32")])
    with pytest.raises(ValueError, match="tensors never written completely: w"):
        writer.close()
    assert list(tmp_path.iterdir()) == []


def _header_file(path, header: dict, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("header, data, message", [
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4,
     r"tensor 'w' ends at byte 8 of the data, but the file holds only 4 bytes of data \(truncated\)"),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8,
     r"tensor 'w' is float32\[3\] \(12 bytes\) but its data_offsets span 8"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8,
     r"tensor 'b' at data bytes 4\.\.8 overlaps the previous tensor"),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 12,
     "8 bytes after the last tensor are not described by the header"),
    ({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4,
     "tensor 'w' has an unknown dtype or lacks 'Q9' in the header"),
])
def test_headers_that_do_not_describe_the_file_are_refused(tmp_path, header, data, message):
    _header_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(FormatError, match=message):
        SafetensorsReader(tmp_path / "bad.safetensors")


def test_truncated_and_garbage_files(tmp_path):
    save_file({"w": torch.ones(100)}, tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "t.safetensors").write_bytes(raw[:60])
    with pytest.raises(FormatError, match=r"t\.safetensors: header length \d+ does not fit in the file's 60 bytes"):
        SafetensorsReader(tmp_path / "t.safetensors")
    (tmp_path / "t.safetensors").write_bytes(raw[:-8])
    with pytest.raises(FormatError, match=r"tensor 'w' ends at byte 400 of the data, but the file holds only 392"):
        SafetensorsReader(tmp_path / "t.safetensors")
    (tmp_path / "g.safetensors").write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(FormatError, match=r"g\.safetensors: the safetensors header is not valid JSON"):
        SafetensorsReader(tmp_path / "g.safetensors")


def test_index_that_does_not_match_its_shards(tmp_path):
    _write(tmp_path / "out", {f"w{i}": torch.ones(300) for i in range(2)}, shard_size=1500)
    index_path = tmp_path / "out" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["w0"], index["weight_map"]["w1"] = index["weight_map"]["w1"], index["weight_map"]["w0"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(FormatError, match=r"weight_map puts 'w0' in model-00002-of-00002\.safetensors, but that file "
                                          r"does not hold it"):
        SafetensorsReader(tmp_path / "out")
    index["weight_map"]["w0"] = "../elsewhere.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(FormatError, match=r"names shard '\.\./elsewhere\.safetensors', which is not in"):
        SafetensorsReader(tmp_path / "out")
