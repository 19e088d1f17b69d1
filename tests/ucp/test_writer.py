"""The streaming writer, remote stores through tensorstore, and saves/loads driven by a UCL program."""

from __future__ import annotations

import json

import pytest
import torch

import ucp
from ucp.state import flatten_state


def test_streaming_writer_round_trip(tmp_path):
    path = str(tmp_path / "c")
    with ucp.CheckpointWriter(path) as writer:
        writer.add("model/w", torch.arange(6.0).view(2, 3))
        writer.add("model/b", torch.ones(2))
        writer.set_state({"model": {"w": {"$tensor": "model/w"}, "b": {"$tensor": "model/b"}}, "step": 4})
        with pytest.raises(ValueError, match="tensor 'model/b' was already added to this checkpoint"):
            writer.add("model/b", torch.ones(2))
    out = ucp.load(path)
    assert out["step"] == 4 and torch.equal(out["model"]["w"], torch.arange(6.0).view(2, 3))
    with pytest.raises(ucp.UcpError, match=f"the writer for {path} is already closed"):
        writer.add("x", torch.ones(1))


def test_exception_inside_writer_aborts_without_a_checkpoint(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with ucp.CheckpointWriter(str(tmp_path / "c")) as writer:
            writer.add("w", torch.ones(1000))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # staging removed
    with pytest.raises(ucp.CheckpointNotFoundError):
        ucp.load(tmp_path / "c")


def test_state_tree_must_be_json(tmp_path):
    writer = ucp.CheckpointWriter(str(tmp_path / "c"))
    with pytest.raises(ucp.UcpError, match=r"state tree is not JSON \(Object of type set is not JSON serializable\)"):
        writer.set_state({"bad": {1, 2}})
    writer.abort()


def test_remote_store_multi_chunk_through_tensorstore(tmp_path):
    from ucp.stores import StoreOptions

    url = f"memory://writer-{tmp_path.name}/c"
    w = torch.randn(37, 5)
    ucp.save({"w": w, "s": torch.tensor(2)}, url, store_options=StoreOptions(pack_max_bytes=0, small_array_bytes=-1,
                                                                            chunk_bytes=64))
    import fsspec

    files = fsspec.filesystem("memory").find(f"/writer-{tmp_path.name}/c")
    names = [f.rsplit("/", 1)[-1] for f in files]
    assert sum(n.startswith("c.") for n in names) == 13 and names.count("c") == 1  # 3 rows per chunk; 0-d: "c"
    out = ucp.load(url)
    assert torch.equal(out["w"], w) and out["s"].item() == 2
    assert torch.equal(ucp.read_tensor(url, "w", ucp.Box((10, 1), (9, 3))), w[10:19, 1:4])
    assert ucp.verify(url).ok


def test_overwrite_on_a_remote_store(tmp_path):
    url = f"memory://ow-{tmp_path.name}/c"
    ucp.save({"a": torch.zeros(3)}, url)
    with pytest.raises(ucp.CheckpointExistsError):
        ucp.save({"a": torch.ones(3)}, url)
    ucp.save({"b": torch.ones(3)}, url, overwrite=True)
    assert list(ucp.load(url)) == ["b"]


UCL = "ucl 1\ntensor w -> w\n  split dim 0 over tp\ntensor b -> b\n  replicate over tp\n"


def test_ucl_program_save_and_reshard(tmp_path):
    full_w, b = torch.arange(24.0).view(8, 3), torch.ones(3)
    for rank in range(2):  # tp=2, each rank without a process group, then finalize
        local = {"w": full_w[rank * 4 : rank * 4 + 4].clone(), "b": b.clone(), "step": 9}
        ucp.save(local, tmp_path / "c", program=UCL, layout="tp=2", rank=rank, world_size=2)
    ucp.finalize(tmp_path / "c", world_size=2)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["program"]["text"] == UCL and manifest["layout"]["tp"] == 2
    assert len(manifest["tensors"]["b"]["fragments"]) == 1  # replicated: written once
    out = ucp.load(tmp_path / "c", program=UCL, layout="tp=4", rank=3)
    assert torch.equal(out["w"], full_w[6:8]) and torch.equal(out["b"], b) and out["step"] == 9
    assert ucp.describe(tmp_path / "c").layout == "tp=2"


def test_flatten_state_keys_and_ties():
    w = torch.zeros(2)
    flat = flatten_state({"opt": {"state": {0: {"m": w}}}, "lst": [w, torch.ones(1)], "$odd": 1})
    assert list(flat.tensors) == ["opt/state/0/m", "lst/1"]
    assert flat.tree["$dict"][1] == ["lst", [{"$tensor": "opt/state/0/m"}, {"$tensor": "lst/1"}]]
