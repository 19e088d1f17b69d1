"""The megatron reader merges Megatron-LM legacy shards (tp=2 x pp=2 and tp=2) into logical tensors.

The fixtures (tests/fixtures/megatron) are written by ucp/tools/fixtures/gen_megatron.py,
which reproduces the files Megatron-LM's checkpointing.py writes (real Megatron needs
CUDA): sharded from a known logical model, which the reader must give back exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ucp.errors import FormatError
from ucp.formats import detect_format, get_format
from ucp.formats.deepspeed.pt import load_pt
from ucp.geometry import Box, FlatRange

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "megatron"
CASES = [FIXTURES / "gpt-tp2-pp2", FIXTURES / "gpt-tp2-pp1"]


@pytest.mark.parametrize("root", CASES, ids=lambda p: p.name)
def test_shards_merge_into_the_logical_model(root):
    logical = torch.load(root / "logical.pt", weights_only=True)
    fmt = detect_format(root)
    assert fmt.name == "megatron"
    with fmt.open_reader(root) as reader:
        infos = {i.name: i for i in reader.tensors()}
        assert {n for n in infos if "/" not in n} == set(logical)
        for name, tensor in logical.items():
            assert torch.equal(infos[name].read(), tensor), name
        q = infos["decoder.layers.3.self_attention.linear_q.weight"]
        assert torch.equal(q.read(Box((3, 1), (9, 7))), logical[q.name][3:12, 1:8])
        assert torch.equal(q.read(FlatRange(5, 70)), logical[q.name].reshape(-1)[5:70])


def test_optimizer_states_are_matched_to_their_parameters():
    root = CASES[0]
    with detect_format(root).open_reader(root) as reader:
        infos = {i.name: i for i in reader.tensors()}
        for name in [n for n in infos if "/" not in n]:
            master = infos[f"{name}/fp32"].read()  # the generator's masters: weights + 1e-3 noise
            assert master.dtype == torch.float32 and (master - infos[name].read().float()).abs().max() < 0.02, name
        # linear_proj is split on dim 1 over tp: its exp_avg is the two shards side by side
        shards = [load_pt(root / "iter_0000007" / f"mp_rank_{t:02d}_001" / "model_optim_rng.pt") for t in range(2)]
        model = shards[0]["model"]
        classes = list(dict.fromkeys(t.dim() > 1 for t in model.values()))  # groups in order of first appearance
        order = [k for c in classes for k, t in model.items() if (t.dim() > 1) == c]  # optimizer indices
        index = order.index("decoder.layers.0.self_attention.linear_proj.weight")
        expected = torch.cat([s["optimizer"]["optimizer"]["state"][index]["exp_avg"] for s in shards], dim=1)
        assert torch.equal(infos["decoder.layers.2.self_attention.linear_proj.weight/exp_avg"].read(), expected)


def test_state_has_the_iteration_groups_args_and_rng():
    with detect_format(CASES[0]).open_reader(CASES[0]) as reader:
        state = reader.state()
    assert state.step == 7
    assert [(g["weight_decay"], g["wd_mult"]) for g in state.param_groups] == [(0.1, 1.0), (0.0, 0.0)]
    assert "decoder.layers.3.self_attention.linear_q.weight" in state.param_groups[0]["params"]
    assert "decoder.final_layernorm.weight" in state.param_groups[1]["params"]
    args = state.extra["megatron"]["args"]["@namespace"]
    assert (args["num_layers"], args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"]) == (4, 2, 2)
    assert state.extra["program"].startswith("megatron-gpt:num_layers=4,heads=4,kv_heads=2,vocab_size=50")
    assert set(state.rng) == {"tp0_pp0", "tp1_pp0", "tp0_pp1", "tp1_pp1"}


def test_a_missing_rank_is_named(tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(CASES[0], root)
    shutil.rmtree(root / "iter_0000007" / "mp_rank_01_001")
    with pytest.raises(FormatError) as err:
        get_format("megatron").open_reader(root)
    assert str(err.value) == f"{root}/iter_0000007: the files of tensor/pipeline rank(s) [(1, 1)] are missing"


def test_the_distributed_optimizer_is_refused_with_the_way_out(tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(CASES[1], root)
    (root / "iter_0000007" / "mp_rank_00" / "distrib_optim.pt").write_bytes(b"")
    with pytest.raises(FormatError, match="distrib_optim.pt: the distributed optimizer's flat buffers are not "
                                          "supported"):
        get_format("megatron").open_reader(root)


def test_a_tracker_naming_no_folder(tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(CASES[1], root)
    (root / "latest_checkpointed_iteration.txt").write_text("9")
    with pytest.raises(FormatError, match="holds '9', which names no iteration folder"):
        get_format("megatron").open_reader(root)
