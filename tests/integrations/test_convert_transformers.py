"""A tiny Transformers model (built from a config, no hub) round-trips to identical logits through conversions.

safetensors (``save_pretrained``, sharded) -> ucp -> safetensors -> ``from_pretrained``, and
safetensors -> DCP -> ``dcp.load`` into a fresh model and DCP -> safetensors -> ``from_pretrained``.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")

import ucp
from transformers import LlamaConfig, LlamaForCausalLM


def _model(tie: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tie)
    return LlamaForCausalLM(config).eval()


def _logits(model: LlamaForCausalLM) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(3, 40).view(1, -1)).logits


@pytest.mark.parametrize("tie", [False, True])
def test_safetensors_to_ucp_and_back_gives_identical_logits(tmp_path, tie):
    model = _model(tie)
    model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")  # several shards + index
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    ucp.convert(tmp_path / "hf", tmp_path / "ckpt", memory_budget="1MiB")
    ucp.convert(tmp_path / "ckpt", tmp_path / "back", dst_format="safetensors", options={"shard_size": "60KB"})
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    shutil.copy(tmp_path / "hf" / "config.json", tmp_path / "back" / "config.json")
    back = LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert torch.equal(_logits(back), _logits(model))
    assert ucp.diff(tmp_path / "hf", tmp_path / "back").equal


def test_through_dcp_gives_identical_logits(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = _model(False)
    model.save_pretrained(tmp_path / "hf")
    ucp.convert(tmp_path / "hf", tmp_path / "dcp", dst_format="dcp")
    fresh = _model(False)
    for p in fresh.parameters():
        p.data.zero_()
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    fresh.load_state_dict(state["model"])
    assert torch.equal(_logits(fresh), _logits(model))
    ucp.convert(tmp_path / "dcp", tmp_path / "back", dst_format="safetensors")
    shutil.copy(tmp_path / "hf" / "config.json", tmp_path / "back" / "config.json")
    assert torch.equal(_logits(LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()), _logits(model))
