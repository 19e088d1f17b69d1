"""DeepSpeed's pickled objects as plain JSON and back, byte for byte; the streaming .pt writer."""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np
import pytest
import torch

from ucp.errors import FormatError
from ucp.formats.deepspeed.plain import ForeignObject, from_plain, to_plain
from ucp.formats.deepspeed.pt import StreamingPtWriter, load_pt, save_pt


def test_a_real_deepspeed_object_survives_json_and_is_pickled_back_to_the_same_bytes(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    betas = (0.9, 0.999)
    scaler = DynamicLossScaler(init_scale=2.0 ** 8, scale_window=1000, min_scale=1, delayed_shift=2,
                               consecutive_hysteresis=False)
    obj = {"loss_scaler": scaler, "zero_stage": ZeroStageEnum.gradients,
           "param_groups": [{"betas": betas, "lr": 1e-3}, {"betas": betas, "lr": float("inf")}],
           "partition_count": [2, 2], "ds_version": "0.19.8", "shapes": collections.OrderedDict(w=torch.Size([2]))}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    torch.save(obj, tmp_path / "a" / "optimizer_state.pt")
    plain = json.loads(json.dumps(to_plain(load_pt(tmp_path / "a" / "optimizer_state.pt"))))
    assert "@ref" in plain["param_groups"][1]["betas"]  # one tuple, shared, as in the pickle
    save_pt(from_plain(plain), tmp_path / "b" / "optimizer_state.pt")
    assert (tmp_path / "a" / "optimizer_state.pt").read_bytes() == (tmp_path / "b" / "optimizer_state.pt").read_bytes()
    back = torch.load(tmp_path / "b" / "optimizer_state.pt", weights_only=False)  # DeepSpeed itself reads it
    assert isinstance(back["loss_scaler"], DynamicLossScaler) and back["loss_scaler"].cur_scale == 256.0
    assert back["zero_stage"] is ZeroStageEnum.gradients


@pytest.mark.parametrize("value", [
    {"a": (1, (2.5, "x")), "b": [None, True], "@odd": 1, "$dollar": 2},
    {1: "int key", (2, 3): "tuple key"},
    collections.OrderedDict(x=torch.Size([3, 4]), y=float("nan")),
    argparse.Namespace(num_layers=2, tokenizer="gpt2", lr=None),
    {"rng": ("MT19937", np.arange(5, dtype=np.uint32), 3, 0, 0.0), "np": np.float64(2.5), "bytes": b"\x00\x01"},
    {"dtype": torch.bfloat16, "set": {3, 1}},
])
def test_plain_round_trip(value):
    back = from_plain(json.loads(json.dumps(to_plain(value))))
    assert type(back) is type(value)
    assert repr(back) == repr(value)


def test_a_foreign_object_is_a_record_not_a_class():
    rec = from_plain({"@foreign": {"class": "deepspeed.X", "new": True, "args": [], "kwargs": {}, "state": {"a": 1}}})
    assert rec == rec and isinstance(rec, ForeignObject) and rec.origin == "deepspeed.X" and rec.state == {"a": 1}


def test_what_is_not_data_is_named():
    with pytest.raises(FormatError, match="builtins.object at x/0 is not plain data"):
        to_plain({"x": [object()]})
    with pytest.raises(FormatError, match="unknown tag '@nope'"):
        from_plain({"@nope": 1})
    with pytest.raises(FormatError, match="bad reference"):
        from_plain([{"@ref": 0}])


def test_the_streaming_writer_makes_files_torch_loads_even_weights_only(tmp_path):
    path = tmp_path / "model_states.pt"
    writer = StreamingPtWriter(path)
    w = writer.add(torch.arange(12.0).view(3, 4)[1:])  # a view: only its own bytes are written
    b = writer.add(torch.ones(2, dtype=torch.bfloat16))
    writer.finish({"module": collections.OrderedDict(w=w, tied=w, b=b), "step": 3})
    loaded = torch.load(path, weights_only=True)
    assert loaded["module"]["w"].equal(torch.arange(4.0, 12.0).view(2, 4))
    assert loaded["module"]["tied"].data_ptr() == loaded["module"]["w"].data_ptr()  # one storage, like torch.save
    assert loaded["module"]["b"].dtype == torch.bfloat16 and loaded["step"] == 3
