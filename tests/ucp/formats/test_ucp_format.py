"""The ucp format behind the protocol: names of plain and program saves; blocks and layout shards as fragments."""

from __future__ import annotations

import math

import pytest
import torch

import ucp
from ucp.errors import FormatError
from ucp.formats import TrainingState, detect_format
from ucp.formats.ucp_format import UcpReader, UcpWriter
from ucp.geometry import Box
from ucp.spec import LogicalTensor

PROGRAM = "ucl 1\ntensor model/w -> weight\n  split dim 0 over tp\ntensor model/b -> bias\n"


def test_plain_save_of_nested_state_gets_logical_names(tmp_path):
    w = torch.randn(4, 3)
    ucp.save({"model": {"module.fc.weight": w, "tied": w},
              "optim": {"state": {0: {"exp_avg": torch.ones(4, 3)}}, "param_groups": [{"lr": 0.5, "params": [0]}]},
              "step": 6}, tmp_path / "c")
    assert detect_format(tmp_path / "c").name == "ucp"
    with UcpReader(tmp_path / "c") as reader:
        infos = {t.name: t for t in reader.tensors()}
        assert set(infos) == {"fc.weight", "tied", "0/exp_avg"}  # the tie comes out as two logical tensors
        assert torch.equal(infos["tied"].read(), w) and torch.equal(infos["fc.weight"].read(Box((1, 0), (2, 3))), w[1:3])
        assert reader.state().step == 6 and reader.state().param_groups == ({"lr": 0.5, "params": ["0"]},)


def test_program_saves_keep_their_logical_names(tmp_path):
    for rank in range(2):
        ucp.save({"model": {"w": torch.full((2, 3), float(rank)), "b": torch.ones(3)}, "step": 1}, tmp_path / "c",
                 program=PROGRAM, layout="tp=2", rank=rank, world_size=2)
    ucp.finalize(tmp_path / "c", world_size=2)
    with UcpReader(tmp_path / "c") as reader:
        infos = {t.name: t for t in reader.tensors()}
        assert set(infos) == {"weight", "bias"}
        assert infos["weight"].read().tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2
        assert reader.state().step == 1


def test_written_checkpoint_loads_as_nested_state_with_blocks_as_fragments(tmp_path):
    big = torch.randn(40, 5)
    state = TrainingState(step=9, param_groups=({"lr": 0.1, "betas": {"$tuple": [0.9, 0.99]}, "params": ["big"]},),
                          extra={"note": {"$float": "nan"}, "obj": {"$inert": "x.Y", "args": [], "state": None}})
    writer = UcpWriter(str(tmp_path / "c"), tensors=[LogicalTensor("big", (40, 5), "float32"),
                                                     LogicalTensor("big/exp_avg", (40, 5), "float32")],
                       block_bytes=300, state=state)
    for name, t in (("big", big), ("big/exp_avg", -big)):
        for start in range(0, 40, 15):
            box = Box((start, 0), (min(15, 40 - start), 5))
            writer.add_region(name, box, t[box.slices()].clone())
    writer.set_state(state)
    writer.close()
    with UcpReader(tmp_path / "c") as reader:
        assert [len(e.fragments) for e in reader.manifest.tensors.values()] == [3, 3]
        back = reader.state().to_dict()
        assert back["extra"].pop("$roots") == {"model": "model", "optimizer": "optim"}  # the tree's shape
        assert back == state.to_dict()
    loaded = ucp.load(tmp_path / "c")
    assert torch.equal(loaded["model"]["big"], big) and torch.equal(loaded["optim"]["state"]["big"]["exp_avg"], -big)
    assert loaded["optim"]["param_groups"][0]["betas"] == (0.9, 0.99) and loaded["step"] == 9
    assert math.isnan(loaded["note"])


def test_layout_shards_become_fragments_and_the_program_is_recorded(tmp_path):
    ucp.save({"model": {"weight": torch.arange(24.0).view(8, 3), "bias": torch.ones(3)}}, tmp_path / "plain")
    ucp.convert(tmp_path / "plain", tmp_path / "c", program=PROGRAM, layout="tp=2")
    with pytest.raises(FormatError, match=r"the UCL program does not describe this checkpoint at tp=2: it does "
                                          r"not map 1 tensor\(s\) of the source: weight; fix the program"):
        ucp.convert(tmp_path / "plain", tmp_path / "bad", program=PROGRAM.replace("weight", "wq"), layout="tp=2")
    assert not (tmp_path / "bad").exists()
    with UcpReader(tmp_path / "c") as reader:
        assert [str(f.region) for f in reader.manifest.tensors["weight"].fragments] == ["[0:4, 0:3]", "[4:8, 0:3]"]
        assert reader.manifest.layout["tp"] == 2 and "split dim 0 over tp" in reader.manifest.program.text
    shard = ucp.load(tmp_path / "c", program=PROGRAM, layout="tp=2", rank=1)
    assert torch.equal(shard["model"]["w"], torch.arange(12.0, 24.0).view(4, 3))


def test_program_and_layout_go_together(tmp_path):
    with pytest.raises(ValueError, match="program and layout go together"):
        UcpWriter(str(tmp_path / "c"), tensors=[], program=PROGRAM)
