"""Declared logical shapes: save refuses shards that do not fit, load refuses checkpoints of another
model, and the checker lists the logical tensors from the program alone."""

from __future__ import annotations

import json

import pytest
import torch

from ucp import ucl
import ucp
from ucp.tools.cli import main
from ucp.ucl.errors import DeclaredShapeError
from ucp.layout import Layout
from ucp.spec import LogicalTensor

ROW_PARALLEL_AS_DIM_0 = """ucl 1
param hidden
tensor fc.weight -> fc.weight
  split dim 0 over tp
  shape [hidden, hidden]
"""


def test_a_row_parallel_weight_declared_split_dim_0_is_refused_by_save(tmp_path):
    # rank r of tp=2 holds columns [32r, 32r+32) of a 64x64 row-parallel weight: [64, 32]. Under
    # 'split dim 0' that shard would be rows of a [128, 32] logical tensor, and save committed it.
    weight = torch.randn(64, 64)
    path = str(tmp_path / "ckpt")
    prog = ucl.load_program(ROW_PARALLEL_AS_DIM_0, hidden=64)
    with pytest.raises(DeclaredShapeError) as info:
        ucp.save({"fc.weight": weight[:, 32:]}, path, program=prog, layout="tp=2", rank=1, world_size=2)
    assert str(info.value) == (
        "<ucl>:3: local tensor 'fc.weight' of shape (64, 32) on rank 1 of tp=2 makes logical 'fc.weight' (128, 32) "
        "under the rule's clauses, but the program declares 'fc.weight' [hidden, hidden] = (64, 64), of which this "
        "rank would hold (32, 64); check the rule's split, pad and fuse clauses (a row-parallel weight splits dim 1) "
        "or the parameters")
    assert not (tmp_path / "ckpt").exists() or not (tmp_path / "ckpt" / "manifest.json").exists()
    right = ucl.load_program(ROW_PARALLEL_AS_DIM_0.replace("dim 0", "dim 1"), hidden=64)
    for rank in range(2):
        ucp.save({"fc.weight": weight[:, 32 * rank:32 * rank + 32]}, path, program=right, layout="tp=2", rank=rank,
                 world_size=2)
    ucp.finalize(path, world_size=2)
    assert torch.equal(ucp.load(path)["fc.weight"], weight)


def test_a_declared_shape_sizes_uneven_and_padded_dims_without_size_clauses():
    prog = "ucl 1\nparam vocab\ntensor e -> e\n  split dim 0 over tp\n  pad dim 0 to multiple of 8\n  shape [vocab, 4]\n"
    fmap = ucl.spec_for_save(prog, "tp=2", 1, {"e": ((8, 4), "float32")}, params={"vocab": 13})
    assert fmap.logical["e"].shape == (13, 4)
    assert fmap.tensors["e"].pieces[0].target.sizes == (5, 4)  # rows 8..12 of the padded 16: 5 real ones


def test_a_checkpoint_of_another_model_is_refused_by_load(models):
    # heads=2 (of 2 rows) where the model has 4: the fused QKV would be cut into the wrong groups, silently,
    # before. (With the head size left to its default hidden_size // heads the shapes agree: the manifest's
    # program catches that case, tests/ucl/test_program_record.py.)
    tensors = models.megatron(layers=2, hidden=8, heads=4, kv_heads=4, vocab=50, ffn=8, states=())
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in tensors.items()}
    params = dict(num_layers=2, hidden_size=8, ffn_hidden_size=8, heads=4, kv_heads=4, vocab_size=50, states=())
    assert ucl.spec_for_load("megatron-gpt", "tp=2", 0, meta, params=params).tensors
    with pytest.raises(DeclaredShapeError) as info:
        ucl.spec_for_load("megatron-gpt", "tp=2", 0, meta,
                          params={**params, "heads": 2, "kv_heads": 2, "kv_channels": 2})
    assert str(info.value) == (
        "megatron-gpt.ucl:70: logical tensor 'decoder.layers.0.self_attention.linear_q.weight' has shape (8, 8), but "
        "the program declares [heads * kv_channels, hidden_size] = (4, 8) (with heads=2, hidden_size=8, "
        "kv_channels=2); check the program's parameters")


def test_hf_llama_refuses_a_wrong_vocab_size_and_tp_sizes_that_split_a_head(models):
    tensors = models.hf_llama(vocab=50, kv_heads=2, states=())
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in tensors.items()}
    params = models.hf_llama_params(vocab=50, kv_heads=2)
    assert ucl.spec_for_load("hf-llama", "tp=2", 0, meta, params=params).tensors
    with pytest.raises(DeclaredShapeError, match=r"logical tensor 'model.embed_tokens.weight' has shape \(50, 8\), "
                                                 r"but the program declares \[vocab_size, hidden_size\] = \(49, 8\)"):
        ucl.spec_for_load("hf-llama", "tp=2", 0, meta, params={**params, "vocab_size": 49})
    with pytest.raises(ucl.UclError) as info:
        ucl.spec_for_load("hf-llama", "tp=4", 0, meta, params=params)
    assert str(info.value) == (
        "tp=4 is not a layout this program supports: hf-llama.ucl:26: Hugging Face tensor parallelism gives each tp "
        "rank whole key/value heads: num_key_value_heads (2) must be divisible by the tensor parallel size (4)")
    report = ucl.check_program("hf-llama", "tp=3", meta, params=params)
    assert [f.message for f in report.findings] == [
        "hf-llama.ucl:25: Hugging Face tensor parallelism gives each tp rank whole query heads: num_attention_heads "
        "(4) must be divisible by the tensor parallel size (3)",
        "hf-llama.ucl:26: Hugging Face tensor parallelism gives each tp rank whole key/value heads: "
        "num_key_value_heads (2) must be divisible by the tensor parallel size (3)"]


def test_size_clauses_are_checked_on_load():
    prog = "ucl 1\nparam n\ntensor e -> e\n  split dim 0 over tp\n  size dim 0 = n\n"
    meta = {"e": LogicalTensor("e", (10, 2), "float32")}
    assert ucl.spec_for_load(prog, "tp=2", 0, meta, params={"n": 10}).tensors
    with pytest.raises(DeclaredShapeError) as info:
        ucl.spec_for_load(prog, "tp=2", 0, meta, params={"n": 12})
    assert str(info.value) == ("<ucl>:3: logical tensor 'e' has 10 elements along dim 0, but the program declares "
                               "'size dim 0 = n' = 12 (with n=12); check the program's parameters")


MEGATRON = dict(num_layers=3, hidden_size=8, ffn_hidden_size=12, heads=4, kv_heads=2, vocab_size=50)


@pytest.mark.parametrize("layout, extra", [
    ("tp=2,pp=3", {}),
    ("tp=2,pp=2,vpp=2,dp=4,ep=2,zero=1", {"num_layers": 4, "num_experts": 4}),
    ("pp=2,zero=1", {"num_layers": 4, "tie_embeddings": 1}),
])
def test_a_preset_lists_its_logical_tensors_from_its_parameters(models, layout, extra):
    params = {**MEGATRON, **extra}
    want = models.megatron(layers=params["num_layers"], hidden=8, heads=4, kv_heads=2, vocab=50, ffn=12,
                           experts=params.get("num_experts", 0), tie=params.get("tie_embeddings", 0))
    if Layout.parse(layout).zero:
        want["optim/step"] = torch.zeros(())
    else:  # Adam's step beside every local parameter (`also ... scalar`): a fused one's under its first part
        fused_tail = ("linear_k.weight", "linear_v.weight", "up.weight")
        want.update({f"{n}/step": torch.zeros(()) for n in list(want) if "/" not in n and not n.endswith(fused_tail)})
    got = ucl.declared_logical("megatron-gpt", layout, params=params)
    assert {n: t.shape for n, t in got.items()} == {n: tuple(t.shape) for n, t in want.items()}


def test_hf_llama_lists_its_logical_tensors(models):
    got = ucl.declared_logical("hf-llama", "tp=2", params=models.hf_llama_params())
    assert {n: t.shape for n, t in got.items()} == {n: tuple(t.shape) for n, t in models.hf_llama().items()}


def test_declarations_must_be_complete_to_list_tensors():
    with pytest.raises(ucl.UclError) as info:
        ucl.declared_logical("deepspeed-zero", "dp=2,zero=1")
    assert str(info.value) == ("deepspeed-zero.ucl:35: rule 'module/{name*}' captures {name*}, names only a model "
                               "has; give the logical shapes (--shapes, --against, --model or --hf-config)")
    with pytest.raises(ucl.UclError, match=r"does not bound \{i\} \('where i < EXPR'\)"):
        ucl.declared_logical("ucl 1\ntensor l.{i} -> l.{i}\n  shape [2]\n", "tp=1")
    with pytest.raises(ucl.UclError, match="rule 'w' declares no logical shape; add 'shape"):
        ucl.declared_logical("ucl 1\ntensor w -> w\n", "tp=1")


def test_check_without_shapes_as_the_readme_shows_it(tmp_path, capsys):
    argv = ["ucl", "check", "megatron-gpt", "--layout", "tp=2,pp=3,dp=2,zero=1",
            "--param", "num_layers=3,hidden_size=8,ffn_hidden_size=12,heads=4,kv_heads=2,vocab_size=50"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "covers every element of 121 logical tensors exactly once on tp=2,pp=3,dp=2,zero=1 (12 ranks" in out
    assert main(argv[:-2]) == 2  # without the parameters there is nothing to list
    assert "megatron-gpt.ucl:44: 'vocab_size' has no value in 'vocab_size'" in capsys.readouterr().err
    prog = tmp_path / "m.ucl"
    source = "ucl 1\nparam n\ntensor l.{i}.w -> l.{i}.w\n  where i < n\n  split dim 1 over tp\n  shape [3, 10]\n"
    prog.write_text(source)  # 10 columns over tp=4: uneven, the declared shape sizes them
    assert main(["ucl", "check", str(prog), "--layout", "tp=4", "--param", "n=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["logical_tensors"] == 2
    prog.write_text(source + "tensor m.{i}.w -> l.{i}.w\n  where i < n\n  shape [3, 10]\n")  # a second writer
    assert main(["ucl", "check", str(prog), "--layout", "tp=4", "--param", "n=2", "--json"]) == 1
    assert {f["kind"] for f in json.loads(capsys.readouterr().out)["findings"]} == {"overlap"}
