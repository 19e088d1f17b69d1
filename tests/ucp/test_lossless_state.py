"""Nothing a save writes is dropped by a load: flat logical names, ties under a fragment map, list entries."""

from __future__ import annotations

import json

import pytest
import torch

import ucp
from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec


def _zero_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"module": {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)},
            "optim": {s: {"group0": torch.randn(16, generator=g)} for s in ("fp32", "exp_avg", "exp_avg_sq")}
            | {"step": torch.tensor(3)}}


def test_a_whole_load_returns_a_parameter_and_its_optimizer_states(tmp_path):
    # deepspeed-zero names states <param>/<state>: "w" is also the prefix of "w/fp32".
    state = _zero_state()
    path = tmp_path / "ds"
    ucp.save(state, path, program="deepspeed-zero", layout="dp=1")
    out = ucp.load(path)
    logical = dict(ucp.iter_tensors(path))
    assert sorted(logical) == ["b", "b/exp_avg", "b/exp_avg_sq", "b/fp32", "optim/step",
                               "w", "w/exp_avg", "w/exp_avg_sq", "w/fp32"]
    for name, tensor in logical.items():
        got = out["optim"]["step"] if name == "optim/step" else out[name]  # the tree places optim/step
        assert torch.equal(got, tensor), name
    assert torch.equal(out["w"], state["module"]["w"]) and torch.equal(out["b"], state["module"]["b"])
    # the local flat partitions were mapped away: their references leave empty dicts, not stand-ins
    assert out["module"] == {} and out["optim"]["fp32"] == {}


def test_mapped_list_entries_are_removed_not_left_as_placeholders(tmp_path):
    a, b = torch.arange(3.0), torch.arange(4.0)
    program = "ucl 1\ntensor params/0 -> a\ntensor params/1 -> b\n"
    ucp.save({"params": [a, b], "step": 2}, tmp_path / "c", program=program, layout="dp=1")
    out = ucp.load(tmp_path / "c")
    assert out["params"] == [] and out["step"] == 2
    assert torch.equal(out["a"], a) and torch.equal(out["b"], b)


def test_a_logical_name_that_is_also_a_top_level_key_is_refused_at_save(tmp_path):
    program = "ucl 1\ntensor model/w -> model\n"
    with pytest.raises(ucp.NameConflictError) as err:
        ucp.save({"model": {"w": torch.ones(2)}}, tmp_path / "c", program=program, layout="dp=1")
    assert str(err.value) == (
        "logical tensor 'model' is not placed by the state tree of rank 0, which also has a top-level key "
        "'model': ucp.load(path) could not return both; rename the logical tensor (spec or program) or the "
        "state key"
    )
    assert not (tmp_path / "c").exists()


def test_a_checkpoint_whose_names_collide_is_refused_at_load_never_dropped(tmp_path):
    # Written before the rule existed: edit the tree of a good checkpoint to collide.
    program = "ucl 1\ntensor params/w -> w\n"
    ucp.save({"params": {"w": torch.ones(2)}}, tmp_path / "c", program=program, layout="dp=1")
    manifest = tmp_path / "c" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["states"]["0"]["w"] = "a note"
    manifest.write_text(json.dumps(data))
    with pytest.raises(ucp.NameConflictError) as err:
        ucp.load(tmp_path / "c")
    assert str(err.value) == (
        f"cannot load {tmp_path / 'c'} whole: logical tensor 'w' would replace the state's top-level key 'w'; "
        "read the tensors with ucp.iter_tensors or ucp.read_tensor, or load with a spec"
    )
    assert torch.equal(dict(ucp.iter_tensors(tmp_path / "c"))["w"], torch.ones(2))


def test_a_spec_load_whose_keys_nest_into_each_other_is_refused(tmp_path):
    ucp.save({"w": torch.arange(4.0)}, tmp_path / "c")
    box = Box((0,), (2,))
    target = FragmentMap(rank=0, logical={"w": LogicalTensor("w", (4,), "float32")}, tensors={
        "x": TensorSpec("x", (ShardPiece("w", box, box),)),
        "x/y": TensorSpec("x/y", (ShardPiece("w", box, Box((2,), (2,))),)),
    })
    with pytest.raises(ucp.NameConflictError) as err:
        ucp.load(tmp_path / "c", spec=target)
    assert str(err.value) == ("cannot place 'x/y' in the loaded state: 'x' is already a tensor; load with into= or "
                              "read the tensors with ucp.read_tensor")


# ----------------------------------------------------------------------------- ties


def test_one_tensor_at_two_keys_mapped_to_two_logical_tensors_writes_both(tmp_path):
    t = torch.arange(4.0)
    program = "ucl 1\ntensor params/flat -> weights\ntensor master/flat -> master_weights\n"
    ucp.save({"params": {"flat": t}, "master": {"flat": t}}, tmp_path / "c", program=program, layout="dp=1")
    logical = dict(ucp.iter_tensors(tmp_path / "c"))
    assert sorted(logical) == ["master_weights", "weights"]
    assert all(torch.equal(v, t) for v in logical.values())
    assert ucp.verify(tmp_path / "c").ok
    out = ucp.load(tmp_path / "c", program=program, layout="dp=1", rank=0)
    assert torch.equal(out["params"]["flat"], t) and torch.equal(out["master"]["flat"], t)


def test_a_tie_between_a_mapped_and_an_unmapped_key_keeps_both(tmp_path):
    t = torch.arange(6.0)
    spec = FragmentMap(rank=0, logical={"emb": LogicalTensor("emb", (6,), "float32")}, tensors={
        "embed": TensorSpec("embed", (ShardPiece("emb", Box((0,), (6,)), Box((0,), (6,))),)),
    })
    ucp.save({"embed": t, "head": t}, tmp_path / "c", spec=spec)
    assert sorted(n for n, _ in ucp.iter_tensors(tmp_path / "c")) == ["emb", "head"]


def test_ties_mapped_alike_are_still_written_once(tmp_path):
    t = torch.arange(6.0)
    piece = ShardPiece("emb", Box((0,), (6,)), Box((0,), (6,)))
    spec = FragmentMap(rank=0, logical={"emb": LogicalTensor("emb", (6,), "float32")}, tensors={
        "embed": TensorSpec("embed", (piece,)), "head": TensorSpec("head", (piece,)),
    })
    result = ucp.save({"embed": t, "head": t}, tmp_path / "c", spec=spec)
    assert result.fragments == 1
    out = ucp.load(tmp_path / "c", spec=spec)
    assert torch.equal(out["embed"], t) and torch.equal(out["head"], t)


def test_ties_without_a_spec_keep_the_documented_form(tmp_path):
    t = torch.arange(3.0)
    ucp.save({"a": t, "b": t}, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert list(manifest["tensors"]) == ["a"]
    assert manifest["states"]["0"] == {"a": {"$tensor": "a"}, "b": {"$tensor": "a"}}
    out = ucp.load(tmp_path / "c")
    assert out["a"] is out["b"]


def test_loading_into_a_state_with_objects_that_cannot_be_pickled(tmp_path):
    import threading

    ucp.save({"w": torch.arange(3.0)}, tmp_path / "c")
    into = {"w": torch.zeros(3), "lock": threading.Lock()}
    out = ucp.load(tmp_path / "c", into=into, strict=False)
    assert torch.equal(into["w"], torch.arange(3.0)) and out["w"] is into["w"]


def test_tuple_entries_mapped_away_are_removed_too(tmp_path):
    program = "ucl 1\ntensor pair/0 -> a\n"
    ucp.save({"pair": (torch.ones(1), 5)}, tmp_path / "c", spec=None, program=program, layout="dp=1")
    out = ucp.load(tmp_path / "c")
    assert out["pair"] == (5,) and torch.equal(out["a"], torch.ones(1))
