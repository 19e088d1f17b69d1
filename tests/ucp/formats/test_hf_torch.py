"""Hugging Face PyTorch-weights folders (pytorch_model.bin, sharded with an index) convert in.

Transformers 5 no longer writes .bin folders, so the folders are made here the way
``save_pretrained(safe_serialization=False)`` wrote them (torch.save of state-dict shards, the
index's ``metadata.total_size`` and ``weight_map``); tied weights share one storage as they did.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import ucp
from ucp.errors import FormatError, UnsafePickleError
from ucp.formats import detect_format
from ucp.formats.hf_torch import HfTorchReader


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    embed = torch.randn(11, 4)
    return {"model.embed_tokens.weight": embed, "model.layers.0.mlp.up_proj.weight": torch.randn(6, 4),
            "model.layers.0.input_layernorm.weight": torch.ones(4, dtype=torch.bfloat16),
            "model.norm.weight": torch.rand(4), "lm_head.weight": embed}  # tied: one storage, two names


def _save_sharded(folder, state, groups: list[list[str]]) -> None:
    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    for i, names in enumerate(groups):
        file = f"pytorch_model-{i + 1:05d}-of-{len(groups):05d}.bin"
        torch.save({n: state[n] for n in names}, os.path.join(folder, file))
        weight_map.update({n: file for n in names})
    index = {"metadata": {"total_size": sum(t.nbytes for t in state.values())}, "weight_map": weight_map}
    with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as fh:
        json.dump(index, fh)


GROUPS = [["model.embed_tokens.weight", "lm_head.weight"], ["model.layers.0.mlp.up_proj.weight",
                                                             "model.layers.0.input_layernorm.weight"],
          ["model.norm.weight"]]


def _read_all(path) -> dict[str, torch.Tensor]:
    return {n: t for n, t in ucp.load(path).items()}


def test_a_sharded_folder_converts_to_safetensors_bitwise(tmp_path):
    state = _state()
    _save_sharded(tmp_path / "hf", state, GROUPS)
    assert detect_format(tmp_path / "hf").name == "hf-torch"
    ucp.convert(tmp_path / "hf", tmp_path / "st", dst_format="safetensors")
    from safetensors.torch import load_file

    back = {}
    for file in sorted(os.listdir(tmp_path / "st")):
        if file.endswith(".safetensors"):
            back.update(load_file(tmp_path / "st" / file))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[n], state[n]) and back[n].dtype == state[n].dtype for n in state)
    assert ucp.diff(tmp_path / "hf", tmp_path / "st").equal


def test_a_single_file_folder_converts_to_ucp(tmp_path):
    state = _state()
    os.makedirs(tmp_path / "hf")
    torch.save(state, tmp_path / "hf" / "pytorch_model.bin")
    ucp.convert(tmp_path / "hf", tmp_path / "ckpt")
    loaded = _read_all(tmp_path / "ckpt")
    assert sorted(loaded) == sorted(state) and all(torch.equal(loaded[n], state[n]) for n in state)


@pytest.mark.parametrize("damage, message", [
    (lambda f: os.remove(f / "pytorch_model-00003-of-00003.bin"),
     "shard 'pytorch_model-00003-of-00003.bin' named by pytorch_model.bin.index.json is missing"),
    (lambda f: _rewrite_index(f, lambda m: m.pop("model.norm.weight")),
     "pytorch_model-00003-of-00003.bin is not named by pytorch_model.bin.index.json; the index does not match the shards"),
    (lambda f: _rewrite_index(f, lambda m: m.pop("lm_head.weight")),
     "pytorch_model-00001-of-00003.bin holds 'lm_head.weight', which pytorch_model.bin.index.json does not list; "
     "the index does not match the shards"),
    (lambda f: _rewrite_index(f, lambda m: m.update({"lm_head.weight": "pytorch_model-00002-of-00003.bin"})),
     "pytorch_model-00001-of-00003.bin holds 'lm_head.weight', which pytorch_model.bin.index.json puts in "
     "'pytorch_model-00002-of-00003.bin'; the index does not match the shards"),
    (lambda f: _rewrite_index(f, lambda m: m.update({"extra.weight": "pytorch_model-00003-of-00003.bin"})),
     "pytorch_model.bin.index.json lists 1 tensors no shard holds (first: 'extra.weight'); "
     "the index does not match the shards"),
    (lambda f: _rewrite_index(f, lambda m: m.update({"model.norm.weight": "../elsewhere.bin"})),
     "weight_map puts 'model.norm.weight' in '../elsewhere.bin', which is not a file name in the folder"),
])
def test_an_index_that_does_not_match_its_shards_is_refused(tmp_path, damage, message):
    _save_sharded(tmp_path / "hf", _state(), GROUPS)
    damage(tmp_path / "hf")
    with pytest.raises(FormatError) as err:
        HfTorchReader(str(tmp_path / "hf"))
    assert message in str(err.value)


def _rewrite_index(folder, change) -> None:
    path = folder / "pytorch_model.bin.index.json"
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))


class _Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_hostile_shard_is_refused_and_nothing_runs(tmp_path):
    state = _state()
    _save_sharded(tmp_path / "hf", state, GROUPS)
    torch.save({"model.norm.weight": state["model.norm.weight"], "x": _Hostile()},
               tmp_path / "hf" / "pytorch_model-00003-of-00003.bin")
    with pytest.raises(UnsafePickleError, match="os.system|posix.system"):
        ucp.convert(tmp_path / "hf", tmp_path / "out", dst_format="safetensors")
    assert not (tmp_path / "out").exists()
