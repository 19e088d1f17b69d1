"""The conversion engine: every format chain, unusual tensors, blocks, read-ahead, aborts."""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import pytest
import torch

import ucp
import ucp.conversion as conversion
import ucp.formats.base as base
from ucp.conversion import ConversionError
from ucp.formats import Format, TrainingState, get_format, register_format

REPO = Path(__file__).resolve().parents[2]


def _odd_tensors() -> dict[str, torch.Tensor]:
    return {"empty": torch.zeros(0, 3), "scalar": torch.tensor(3.5), "mask": torch.tensor([True, False]),
            "cplx": torch.randn(2).to(torch.complex64), "ids": torch.arange(5), "half": torch.randn(4, 2).half()}


def test_unusual_tensors_survive_every_chain(tmp_path):
    # Before the fix the ucp writer dropped the zero-element tensor silently (it had no fragment).
    torch.save(_odd_tensors(), tmp_path / "m.pt")
    prev = tmp_path / "m.pt"
    for i, fmt in enumerate(["ucp", "dcp", "safetensors", "torch", "ucp"]):
        out = tmp_path / f"{i}-{fmt}{'.pt' if fmt == 'torch' else ''}"
        ucp.convert(prev, out, dst_format=fmt)
        report = ucp.diff(tmp_path / "m.pt", out, compare_state=False)
        assert report.equal, (fmt, report.differences)
        prev = out


def test_big_tensors_go_in_blocks_small_ones_whole(tmp_path, monkeypatch):
    torch.save({"big": torch.randn(1024, 1024), "small": torch.ones(10)}, tmp_path / "m.pt")  # 4 MiB, 40 B
    calls = []
    writer_cls = get_format("safetensors").open_writer
    real_add, real_region = writer_cls.add, writer_cls.add_region
    monkeypatch.setattr(writer_cls, "add", lambda self, n, t: calls.append((n, None)) or real_add(self, n, t))
    monkeypatch.setattr(writer_cls, "add_region",
                        lambda self, n, box, t: calls.append((n, str(box))) or real_region(self, n, box, t))
    result = ucp.convert(tmp_path / "m.pt", tmp_path / "o.safetensors", memory_budget="4MiB")
    assert result.block_bytes == 1 << 20 and result.largest_tensor == 4 << 20
    assert [c for c in calls if c[0] == "big"] == [("big", f"[{r}:{r + 256}, 0:1024]") for r in range(0, 1024, 256)]
    assert ("small", None) in calls
    assert ucp.diff(tmp_path / "m.pt", tmp_path / "o.safetensors").equal


def test_progress_reports_every_byte(tmp_path):
    torch.save({"a": torch.randn(600, 1024), "b": torch.ones(3)}, tmp_path / "m.pt")
    seen = []
    ucp.convert(tmp_path / "m.pt", tmp_path / "u", memory_budget="4MiB", progress=lambda d, t, n: seen.append((d, t)))
    assert seen[-1] == (600 * 1024 * 4 + 12,) * 2 and [d for d, _ in seen] == sorted(d for d, _ in seen)


class _WholeOnly:
    """A writer without add_region (like a format that needs whole tensors)."""

    format = "whole"

    def __init__(self, path, *, tensors, overwrite=False, block_bytes=None, state=None):
        self.path, self.got = path, {}

    def add(self, name, tensor):
        self.got[name] = tuple(tensor.shape)

    def set_state(self, state):
        self.state = state

    def close(self):
        _WholeOnly.last = self

    def abort(self):
        pass


def test_writers_without_add_region_get_whole_tensors(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_format(Format("whole", "test", lambda p: False, lambda p: None, _WholeOnly))
    torch.save({"big": torch.randn(1024, 1024)}, tmp_path / "m.pt")
    ucp.convert(tmp_path / "m.pt", tmp_path / "x", dst_format="whole", memory_budget="4MiB")
    assert _WholeOnly.last.got == {"big": (1024, 1024)}


def test_a_failing_read_aborts_and_leaves_nothing(tmp_path, monkeypatch):
    torch.save({"a": torch.ones(4), "b": torch.ones(4)}, tmp_path / "m.pt")
    from ucp.formats import torch_file

    real = torch_file.TorchFileReader._lazy_reader

    def failing(self, name, t):
        read = real(self, name, t)
        return (lambda box: (_ for _ in ()).throw(OSError("disk went away"))) if name == "b" else read

    monkeypatch.setattr(torch_file.TorchFileReader, "_lazy_reader", failing)
    for fmt in ("ucp", "dcp", "safetensors", "torch"):
        with pytest.raises(OSError, match="disk went away"):
            ucp.convert(tmp_path / "m.pt", tmp_path / f"out-{fmt}", dst_format=fmt)
    assert sorted(os.listdir(tmp_path)) == ["m.pt"]


def test_refusals_before_anything_is_written(tmp_path):
    torch.save({"a": torch.ones(4)}, tmp_path / "m.pt")
    with pytest.raises(ConversionError, match=r"source and destination are the same path"):
        ucp.convert(tmp_path / "m.pt", tmp_path / "m.pt", dst_format="torch")
    with pytest.raises(ConversionError, match=r"--program/--layout describe how a ucp checkpoint is sharded; they "
                                              r"do not apply to --to safetensors"):
        ucp.convert(tmp_path / "m.pt", tmp_path / "o", dst_format="safetensors", layout="tp=2")
    with pytest.raises(ValueError, match="program and layout go together"):
        ucp.convert(tmp_path / "m.pt", tmp_path / "o", layout="tp=2")
    assert sorted(os.listdir(tmp_path)) == ["m.pt"]


def test_state_travels_through_every_format(tmp_path):
    state = {"model": {"w": torch.ones(2)}, "optimizer": {"state": {0: {"exp_avg": torch.ones(2)}},
             "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]}, "step": 12, "epoch": 3}
    torch.save(state, tmp_path / "m.pt")
    prev = tmp_path / "m.pt"
    for i, fmt in enumerate(["safetensors", "dcp", "ucp", "torch"]):
        out = tmp_path / f"{i}-{fmt}{'.pt' if fmt == 'torch' else ''}"
        ucp.convert(prev, out, dst_format=fmt)
        prev = out
    assert ucp.diff(tmp_path / "m.pt", prev).equal
    back = torch.load(prev, weights_only=True)
    assert back["optimizer"]["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]
    assert (back["step"], back["epoch"]) == (12, 3)
    assert isinstance(TrainingState().to_dict(), dict)


def test_doctests():
    assert doctest.testmod(conversion).failed == 0


def test_empty_containers_in_the_state_survive_dcp(tmp_path):
    # DCP's flattening drops empty dicts; the writer keeps them (found converting DeepSpeed folders,
    # whose foreign-object records carry empty kwargs).
    torch.save({"w": torch.ones(2), "cfg": {"kwargs": {}, "names": [], "n": 1}}, tmp_path / "m.pt")
    ucp.convert(tmp_path / "m.pt", tmp_path / "d", dst_format="dcp")
    assert ucp.diff(tmp_path / "m.pt", tmp_path / "d").equal


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(p.name for p in (REPO / "tests" / "fixtures" / "deepspeed").iterdir() if p.is_dir()))
def test_deepspeed_checkpoints_convert_to_every_format_and_back_equal(tmp_path, case):
    src = REPO / "tests" / "fixtures" / "deepspeed" / case  # written by real DeepSpeed (see its README)
    for fmt in ("ucp", "dcp", "safetensors", "torch"):
        out = tmp_path / f"{fmt}{'.pt' if fmt == 'torch' else ''}"
        ucp.convert(src, out, dst_format=fmt)
        report = ucp.diff(src, out)
        assert report.equal, (fmt, report.differences[:3])
