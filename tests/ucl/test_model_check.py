"""``ucp ucl check --model / --hf-config``: a wrong mapping fails against a real model before any save.

The models are real torch modules and a real transformers Llama, built on the meta device.
"""

from __future__ import annotations

import json

import pytest

from ucp.tools.cli import main
from ucp.ucl.model_check import check_model, hf_config, model_from_factory

# A two-layer tensor-parallel block as Megatron writes one: the factory builds the whole model, or
# (given layout and rank) the shard that rank holds.
TP_MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden, tp):
        super().__init__()
        self.up = nn.Linear(hidden, hidden // tp, bias=False)     # column parallel: its rows are split
        self.down = nn.Linear(hidden // tp, hidden, bias=False)   # row parallel: its columns are split
        self.norm = nn.LayerNorm(hidden)


def build(layout=None, rank=None):
    return Block(64, 1 if layout is None else layout.tp)


def whole_only():
    return Block(64, 1)
'''

RIGHT = """ucl 1
param hidden = 64
tensor model/up.weight -> up.weight
  split dim 0 over tp
  shape [hidden, hidden]
tensor model/down.weight -> down.weight
  split dim 1 over tp
tensor model/norm.{p*} -> norm.{p}
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "tp_model.py").write_text(TP_MODEL)
    (tmp_path / "right.ucl").write_text(RIGHT)
    (tmp_path / "wrong.ucl").write_text(RIGHT.replace("split dim 1", "split dim 0"))
    return tmp_path


def test_a_row_parallel_weight_declared_split_dim_0_fails_against_the_models_own_shards(files, capsys):
    model = f"{files}/tp_model.py:build"
    argv = ["ucl", "check", str(files / "right.ucl"), "--layout", "tp=2,dp=2", "--model", model, "--key-prefix", "model/"]
    assert main(argv) == 0
    assert "covers every element of 4 logical tensors exactly once on tp=2,dp=2" in capsys.readouterr().out
    argv[2] = str(files / "wrong.ucl")
    assert main(argv + ["--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["kind"], f["rank"]) for f in findings] == [("model", r) for r in range(4)]
    assert findings[1]["message"] == (
        "rank 1: the model's own shard of 'down.weight' makes it (128, 32) under the program, the model has (64, 64) "
        "(the program splits it differently from the model)")


def test_the_whole_model_alone_checks_names_and_declared_shapes(files):
    whole = model_from_factory(f"{files}/tp_model.py:whole_only")
    assert whole.rank_local is None  # no layout/rank keywords: only the whole model
    assert check_model(str(files / "right.ucl"), "tp=2", whole, prefix="model/").ok
    report = check_model(str(files / "right.ucl"), "tp=2", whole, prefix="model/", params={"hidden": 32})
    assert [(f.kind, f.message) for f in report.findings] == [("shape", (
        f"the whole model: {files}/right.ucl:3: local tensor 'model/up.weight' of shape (64, 64) on rank 0 of tp=1 "
        "makes logical 'up.weight' (64, 64) under the rule's clauses, but the program declares 'up.weight' "
        "[hidden, hidden] = (32, 32), of which this rank would hold (32, 32); check the rule's split, pad and fuse "
        "clauses (a row-parallel weight splits dim 1) or the parameters"))]
    missing = check_model(str(files / "right.ucl"), "tp=2", whole)  # without the prefix no key is mapped
    assert missing.findings[0].kind == "model"
    assert "no rule maps local tensor 'up.weight' on rank 0 of tp=1" in missing.findings[0].message


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2).save_pretrained(path)
    return str(path / "config.json")


def test_hf_llama_against_a_transformers_model(llama_config, tmp_path, capsys):
    # the preset's parameters come from the config; its splits are compared with the model's tp_plan
    assert main(["ucl", "check", "hf-llama", "--layout", "tp=2,dp=2", "--hf-config", llama_config]) == 0
    assert "covers every element of 21 logical tensors exactly once on tp=2,dp=2" in capsys.readouterr().out
    from importlib import resources

    text = resources.files("ucp.ucl").joinpath("presets", "hf-llama.ucl").read_text()
    wrong = tmp_path / "wrong-llama.ucl"  # o_proj is row parallel in the tp_plan
    wrong.write_text(text.replace("self_attn.o_proj.weight\n  where i < num_hidden_layers\n  split dim 1",
                                  "self_attn.o_proj.weight\n  where i < num_hidden_layers\n  split dim 0"))
    assert main(["ucl", "check", str(wrong), "--layout", "tp=2", "--hf-config", llama_config, "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["kind"], f["rank"]) for f in findings] == [("shape", 0), ("shape", 1)]  # the declared shape refuses it
    assert findings[1]["message"].startswith(
        f"rank 1: the model's own shards: {wrong}:50: local tensor 'model.layers.0.self_attn.o_proj.weight' of shape "
        "(64, 32) on rank 1 of tp=2 makes logical 'model.layers.0.self_attn.o_proj.weight' (128, 32) under the rule's "
        "clauses, but the program declares")
    assert main(["ucl", "check", "hf-llama", "--layout", "tp=4", "--hf-config", llama_config, "--json"]) == 1
    assert [f["kind"] for f in json.loads(capsys.readouterr().out)["findings"]] == ["layout"]


def test_hf_config_gives_the_models_shapes_and_tp_shards(llama_config):
    from ucp.layout import Layout

    model = hf_config(llama_config)
    assert model.whole["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert model.config["num_key_value_heads"] == 2 and model.config["head_dim"] == 16
    rank1 = model.rank_local(Layout(tp=2), 1)
    assert rank1["model.layers.0.self_attn.o_proj.weight"].shape == (64, 32)  # rowwise: the last dim
    assert rank1["model.layers.0.mlp.gate_proj.weight"].shape == (48, 64)   # colwise: dim 0
    assert rank1["model.embed_tokens.weight"].shape == (50, 64)             # embedding_rowwise: dim 0
    assert rank1["model.norm.weight"].shape == (64,)                        # not in the plan: whole


@pytest.mark.parametrize("argv, message", [
    (["--model", "no_such_module_xyz:build"], "importing 'no_such_module_xyz' failed: ModuleNotFoundError"),
    (["--model", "build"], "--model 'build': expected MODULE:FACTORY"),
    (["--hf-config", "/nonexistent/config.json"], "--hf-config '/nonexistent/config.json' does not exist"),
])
def test_bad_model_arguments_exit_2(files, capsys, argv, message):
    assert main(["ucl", "check", str(files / "right.ucl"), "--layout", "tp=2"] + argv) == 2
    assert message in capsys.readouterr().err
