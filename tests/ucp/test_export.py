"""Export that other tools open: a Hugging Face folder keeps its side files, a training checkpoint
exports weights only, and ``transformers.from_pretrained`` opens the result (a tiny Llama built here)."""

from __future__ import annotations

import json
import os

import pytest
import torch

import ucp
from ucp.conversion import ConversionError
from ucp.formats import get_format
from ucp.formats.selection import SelectionError

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("export")

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CONFIG = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=32)


def _tokenizer():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(61)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Llama saved by save_pretrained (with a tokenizer), and a ucp training checkpoint of it after 2 AdamW steps."""
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    model.save_pretrained(root / "hf")
    _tokenizer().save_pretrained(root / "hf")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        ids = torch.randint(0, 64, (2, 8))
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    ucp.save({"model": model.state_dict(), "optim": opt.state_dict(), "ema": {"lm_head.weight": torch.ones(64, 16)},
              "step": 2}, root / "ckpt")
    return root, {k: v.clone() for k, v in model.state_dict().items()}


def test_hf_folder_to_safetensors_keeps_config_generation_config_and_tokenizer(trained, tmp_path):
    root, _ = trained
    result = ucp.convert(root / "hf", tmp_path / "out", dst_format="safetensors")
    assert set(result.files) >= {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert set(result.files) <= set(os.listdir(tmp_path / "out"))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    original = transformers.AutoModelForCausalLM.from_pretrained(root / "hf")
    for (name, a), (_, b) in zip(model.state_dict().items(), original.state_dict().items()):
        assert torch.equal(a, b), name
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok("w1 w2")["input_ids"] == [4, 5]


def test_training_checkpoint_exports_weights_only_that_from_pretrained_opens(trained, tmp_path):
    root, weights = trained
    out = tmp_path / "export"
    result = ucp.convert(root / "ckpt", out, dst_format="safetensors", only="model", hf_files=root / "hf")
    assert result.tensors == len(weights) == 21
    assert len(result.left_out) == 63 + 1  # AdamW's step, exp_avg, exp_avg_sq of 21 parameters; the EMA copy
    assert "20/exp_avg" in result.left_out and "ema/lm_head.weight" in result.left_out
    assert not os.path.exists(out / "model.safetensors.index.json")  # no training state to carry
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    assert ucp.diff(root / "ckpt", out, only="model").equal
    assert {d.kind for d in ucp.diff(root / "ckpt", out).differences} == {"missing", "state"}


def test_only_a_root_strips_its_prefix(trained, tmp_path):
    root, _ = trained
    result = ucp.convert(root / "ckpt", tmp_path / "ema.safetensors", only="ema")
    assert result.tensors == 1
    assert ucp.diff(root / "ckpt", tmp_path / "ema.safetensors", only="ema", b_whole=True).equal
    with get_format("safetensors").open_reader(str(tmp_path / "ema.safetensors")) as reader:
        assert [t.name for t in reader.tensors()] == ["lm_head.weight"]


def test_only_a_part_that_is_not_there_lists_the_parts(trained, tmp_path):
    root, _ = trained
    with pytest.raises(SelectionError) as err:
        ucp.convert(root / "ckpt", tmp_path / "x", dst_format="safetensors", only="teacher")
    assert str(err.value).startswith(f"{root / 'ckpt'} has no tensors in part 'teacher'; its parts: "
                                     "model (21 tensors), 0 (3 tensors), 1 (3 tensors)")
    assert not os.path.exists(tmp_path / "x")


def test_side_files_asked_for_into_a_single_file_are_refused(trained, tmp_path):
    root, _ = trained
    with pytest.raises(ConversionError, match="has no room for them"):
        ucp.convert(root / "ckpt", tmp_path / "m.safetensors", only="model", hf_files=root / "hf")
    assert not os.path.exists(tmp_path / "m.safetensors")


def test_program_parameters_come_from_the_config_beside_the_source(trained, tmp_path):
    root, _ = trained
    src = tmp_path / "hf"
    ucp.convert(root / "hf", src, dst_format="safetensors")  # a folder with config.json
    result = ucp.convert(src, tmp_path / "sharded", program="hf-llama", layout="tp=1,dp=2")
    assert "num_key_value_heads=1" in result.program and "vocab_size=64" in result.program
    manifest = json.loads((tmp_path / "sharded" / "manifest.json").read_text())
    assert manifest["program"]["params"]["num_attention_heads"] == 2


def test_missing_program_parameters_are_all_named_with_a_flag_that_exists(trained, tmp_path):
    root, _ = trained
    src = tmp_path / "bare.safetensors"
    ucp.convert(root / "hf", src)
    with pytest.raises(ucp.UcpError) as err:
        ucp.convert(src, tmp_path / "out", program="hf-llama", layout="tp=2", params={"vocab_size": 64})
    assert str(err.value) == (
        f"hf-llama.ucl: 4 program parameter(s) without a value: hidden_size, intermediate_size, num_hidden_layers, "
        f"num_attention_heads (no config.json beside {src}); give each as params={{NAME: VALUE}} (--param "
        "NAME=VALUE on the command line), or put the model's config.json beside the source")


def test_cli_export_checks_itself_and_reports_what_it_left_out(trained, tmp_path, capsys):
    from ucp.tools.cli import main

    root, _ = trained
    code = main(["convert", str(root / "ckpt"), str(tmp_path / "e"), "--to", "safetensors", "--only", "ema",
                 "--check", "--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["check"]["equal"] and report["tensors"] == 1 and len(report["left_out"]) == 84
    assert main(["diff", str(root / "ckpt"), str(tmp_path / "e"), "--only", "model"]) == 1  # 20 tensors missing
    assert main(["convert", str(root / "ckpt"), str(tmp_path / "m"), "--to", "safetensors", "--only", "model",
                 "--hf-files", str(root / "hf")]) == 0
    out = capsys.readouterr().out
    assert "left out (--only model): 64 tensors (ema/lm_head.weight, 0/step, 0/exp_avg, ...) and the training state" in out
    assert main(["diff", str(root / "ckpt"), str(tmp_path / "m"), "--only", "model"]) == 0
    capsys.readouterr()
    assert main(["convert", str(root / "ckpt"), str(tmp_path / "all"), "--to", "safetensors"]) == 0
    assert ("64 of the tensors written are not the model's (optimizer state, other roots): from_pretrained reports "
            "them as unexpected; --only model writes the weights alone") in capsys.readouterr().out
