"""inspect and verify for every readable format: summaries from readers, every tensor read back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ucp
from ucp.formats.inspection import describe_format, verify_format


@pytest.fixture
def checkpoints(tmp_path) -> dict[str, str]:
    sd = {"w": torch.randn(300, 40), "b": torch.ones(40).bfloat16()}
    torch.save({"model": sd, "step": 5}, tmp_path / "m.pt")
    save_file(sd, tmp_path / "m.safetensors")
    ucp.convert(tmp_path / "m.pt", tmp_path / "d", dst_format="dcp")
    ucp.convert(tmp_path / "m.pt", tmp_path / "u")
    return {"torch": str(tmp_path / "m.pt"), "safetensors": str(tmp_path / "m.safetensors"),
            "dcp": str(tmp_path / "d"), "ucp": str(tmp_path / "u")}


def test_describe_every_format(checkpoints):
    for fmt, path in checkpoints.items():
        summary = describe_format(path)
        assert summary.format == fmt
        assert {(t.name, t.dtype, t.shape) for t in summary.tensors} == {("w", "float32", (300, 40)),
                                                                         ("b", "bfloat16", (40,))}
        assert summary.total_bytes == 300 * 40 * 4 + 80
        assert summary.step == (None if fmt == "safetensors" else 5)


def test_verify_reads_every_block(checkpoints):
    for fmt, path in checkpoints.items():
        seen = []
        report = verify_format(path, memory_budget="4MiB", progress=seen.append)
        assert report.ok and report.tensors == 2 and report.bytes_checked == 300 * 40 * 4 + 80, fmt
        assert sum(seen) == report.bytes_checked


def test_verify_reports_damage_instead_of_raising(checkpoints, tmp_path):
    raw = Path(checkpoints["safetensors"]).read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-100])
    report = verify_format(tmp_path / "cut.safetensors")
    assert not report.ok and report.problems[0].kind == "FormatError"
    assert "but the file holds only" in report.problems[0].message

    chunk = next(p for p in (tmp_path / "u" / "data").rglob("c.0*") if p.stat().st_size > 1000)
    data = bytearray(chunk.read_bytes())
    data[10] ^= 1
    chunk.write_bytes(bytes(data))
    report = verify_format(tmp_path / "u")
    assert not report.ok and [(p.tensor, p.kind) for p in report.problems] == [("w", "ChecksumError")]
