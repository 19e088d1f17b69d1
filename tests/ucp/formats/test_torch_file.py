"""torch.save files: read lazily through the restricted unpickler, written in place with valid CRCs."""

from __future__ import annotations

import pickle
import zipfile

import pytest
import torch

import ucp
from ucp.errors import FormatError, UnsafePickleError
from ucp.formats import TrainingState, detect_format
from ucp.formats.torch_file import TorchFileReader, TorchFileWriter
from ucp.geometry import Box, FlatRange
from ucp.spec import LogicalTensor


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=g)
    model = {"module.fc.weight": torch.nn.Parameter(w), "module.fc.bias": torch.randn(6, generator=g).bfloat16(),
             "module.tied.weight": w, "module.t": torch.randn(4, 6, generator=g).t(),
             "module.part": torch.arange(20.0)[5:11], "module.u16": torch.tensor([1, 2, 3]).to(torch.uint16)}
    opt = {"state": {0: {"exp_avg": torch.ones(6, 4), "step": torch.tensor(2.0)}},
           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0, 1]}]}
    return {"model": model, "optimizer": opt, "step": 11, "rng_state": torch.arange(5, dtype=torch.uint8)}


def test_reads_names_values_and_state_without_reading_tensors(tmp_path):
    torch.save(_state(), tmp_path / "m.pt")
    assert detect_format(tmp_path / "m.pt").name == "torch"
    reader = TorchFileReader(tmp_path / "m.pt")
    infos = {t.name: t for t in reader.tensors()}
    src = _state()
    assert set(infos) == {"fc.weight", "fc.bias", "tied.weight", "t", "part", "u16", "0/exp_avg", "0/step",
                          "rng_state"}
    for name, t in src["model"].items():
        assert torch.equal(infos[name[len("module."):]].read(), t.detach()), name
    assert torch.equal(infos["t"].read(Box((1, 2), (2, 3))), src["model"]["module.t"][1:3, 2:5])
    assert torch.equal(infos["fc.weight"].read(FlatRange(3, 17)), src["model"]["module.fc.weight"].detach().reshape(-1)[3:17])
    assert torch.equal(infos["part"].read(Box((2,), (3,))), torch.arange(7.0, 10.0))
    state = reader.state()
    assert state.step == 11
    assert state.param_groups == ({"lr": 0.1, "betas": {"$tuple": [0.9, 0.99]}, "params": ["0", "1"]},)
    reader.close()


def test_reading_a_block_reads_only_its_rows(tmp_path, monkeypatch):
    import os

    torch.save({"w": torch.randn(1000, 64)}, tmp_path / "w.pt")
    reads = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: reads.append(sum(len(b) for b in bufs)) or real(fd, bufs, off))
    with TorchFileReader(tmp_path / "w.pt") as reader:
        block = next(reader.tensors()).read(Box((100, 0), (10, 64)))
    assert block.shape == (10, 64) and sum(reads) == 10 * 64 * 4


def test_legacy_format_files_are_read_whole(tmp_path):
    torch.save({"w": torch.arange(4.0), "step": 3}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert detect_format(tmp_path / "old.pt").name == "torch"
    with TorchFileReader(tmp_path / "old.pt") as reader:
        (info,) = reader.tensors()
        assert (info.name, info.read().tolist(), reader.state().step) == ("w", [0.0, 1.0, 2.0, 3.0], 3)


def test_written_file_is_an_ordinary_torch_save_file(tmp_path):
    torch.save(_state(), tmp_path / "m.pt")
    ucp.convert(tmp_path / "m.pt", tmp_path / "copy.pt", memory_budget="1MiB")
    with zipfile.ZipFile(tmp_path / "copy.pt") as archive:
        assert archive.testzip() is None  # every record's CRC-32 is right
    src = _state()
    for mmap in (False, True):
        back = torch.load(tmp_path / "copy.pt", weights_only=True, mmap=mmap)
        assert torch.equal(back["model"]["fc.weight"], src["model"]["module.fc.weight"].detach())
        assert torch.equal(back["model"]["t"], src["model"]["module.t"])
        assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], torch.ones(6, 4))  # int ids stay ints
        assert back["optimizer"]["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0, 1]}]
        assert back["step"] == 11 and torch.equal(back["rng_state"], torch.arange(5, dtype=torch.uint8))
    assert ucp.diff(tmp_path / "m.pt", tmp_path / "copy.pt").equal


def test_a_model_only_file_stays_a_flat_state_dict(tmp_path):
    model = torch.nn.Linear(3, 2)
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    ucp.convert(tmp_path / "sd.pt", tmp_path / "st.safetensors")
    ucp.convert(tmp_path / "st.safetensors", tmp_path / "back.pt")
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(torch.load(tmp_path / "back.pt", weights_only=True))
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)


def test_big_tensor_written_in_blocks(tmp_path):
    big = torch.randn(300, 7)
    writer = TorchFileWriter(str(tmp_path / "b.pt"), tensors=[LogicalTensor("big", (300, 7), "float32")])
    for start in range(0, 300, 128):
        box = Box((start, 0), (min(128, 300 - start), 7))
        writer.add_region("big", box, big[box.slices()].clone())
    writer.set_state(TrainingState())
    writer.close()
    assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=True)["big"], big)
    with zipfile.ZipFile(tmp_path / "b.pt") as archive:
        assert archive.testzip() is None


def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, hostile):
    torch.save({"w": torch.ones(2), "evil": hostile}, tmp_path / "evil.pt")
    with pytest.raises(UnsafePickleError, match=r"the pickle calls posix\.system, which can run code; refused "
                                                r"\(nothing was executed\)"):
        TorchFileReader(tmp_path / "evil.pt")
    (tmp_path / "evil_legacy.pt").write_bytes(pickle.dumps(hostile, protocol=2))
    with pytest.raises(UnsafePickleError, match=r"posix\.system"):
        TorchFileReader(tmp_path / "evil_legacy.pt")
    assert not hostile.path.exists()


def test_foreign_classes_become_inert_records(tmp_path, monkeypatch):
    import argparse
    import sys
    import types

    # A DeepSpeed-like class, importable only while saving: loading never imports it.
    module = types.ModuleType("deepspeed_like.loss_scaler")

    class LossScaler:
        def __init__(self):
            self.cur_scale = 4.0

    LossScaler.__module__ = module.__name__
    LossScaler.__qualname__ = "LossScaler"
    module.LossScaler = LossScaler
    monkeypatch.setitem(sys.modules, "deepspeed_like", types.ModuleType("deepspeed_like"))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    torch.save({"w": torch.ones(1), "scaler": LossScaler(), "args": argparse.Namespace(lr=0.1)}, tmp_path / "ds.pt")
    monkeypatch.delitem(sys.modules, module.__name__)
    monkeypatch.delitem(sys.modules, "deepspeed_like")
    with TorchFileReader(tmp_path / "ds.pt") as reader:
        extra = reader.state().extra
    assert extra["args"] == {"lr": 0.1}
    assert extra["scaler"] == {"$inert": "deepspeed_like.loss_scaler.LossScaler", "args": [],
                               "state": {"cur_scale": 4.0}}


def test_damaged_files_say_what_is_wrong(tmp_path):
    torch.save({"w": torch.randn(1000)}, tmp_path / "m.pt")
    raw = (tmp_path / "m.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(FormatError, match=r"cut\.pt is not a readable torch\.save file: File is not a zip file"):
        TorchFileReader(tmp_path / "cut.pt")
    with zipfile.ZipFile(tmp_path / "m.pt") as src, zipfile.ZipFile(tmp_path / "short.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info, data[:100] if info.filename.endswith("data/0") else data)
    with pytest.raises(FormatError, match=r"tensor 'w' needs 4000 bytes of storage record '0', which holds 100"):
        TorchFileReader(tmp_path / "short.pt")
