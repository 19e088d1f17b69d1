"""A checkpoint describes itself: the manifest holds the program's text and parameters, and a load
under a new layout uses it, or checks a given program against it."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch

from ucp import ucl
import ucp
from ucp.ucl.errors import ProgramMismatchError, UclError
from ucp.errors import LayoutError, ManifestError
from ucp.manifest import Manifest
from ucp.program_record import ProgramRecord
from ucp.state import set_path

SPLIT = "ucl 1\nparam n = 1\ntensor w -> w\n  split dim 0 over tp\n"


def _save_tp2(path, program, tensor=None):
    tensor = torch.arange(8.0).view(4, 2) if tensor is None else tensor
    for rank in range(2):
        ucp.save({"w": tensor.chunk(2)[rank].clone()}, path, program=program, layout="tp=2", rank=rank, world_size=2)
    ucp.finalize(path, world_size=2)
    with open(os.path.join(path, "manifest.json")) as fh:
        return json.load(fh)["program"]


@pytest.mark.parametrize("given", ["path str", "Path", "BoundProgram", "str(BoundProgram)"])
def test_the_manifest_holds_the_programs_full_text_however_it_was_given(tmp_path, given):
    file = tmp_path / "neox.ucl"
    file.write_text(SPLIT)
    program = {"path str": str(file), "Path": pathlib.Path(file), "BoundProgram": ucl.load_program(file, n=3),
               "str(BoundProgram)": str(ucl.load_program(file, n=3))}[given]
    recorded = _save_tp2(str(tmp_path / "ckpt"), program)
    params = {} if given in ("path str", "Path") else {"n": 3}
    assert recorded == {"text": SPLIT, "params": params, "name": "neox.ucl", "preset": None}


def test_a_preset_is_recorded_with_its_text_parameters_and_name(tmp_path, models):
    params = models.hf_llama_params()
    path = str(tmp_path / "ckpt")
    prog = ucl.load_program("hf-llama", **params, states=["exp_avg"])
    tensors = models.hf_llama(states=("exp_avg",))
    state: dict = {}
    for name, t in tensors.items():  # whole tensors at tp=1: local keys are the logical names (states under optim/)
        base, _, st = name.partition("/")
        set_path(state, f"optim/{st}/{base}" if st else name, t)
    ucp.save(state, path, program=prog, layout="tp=1")
    recorded = Manifest.from_json(pathlib.Path(path, "manifest.json").read_text()).program
    assert recorded.preset == "hf-llama" and recorded.name == "hf-llama.ucl"
    assert recorded.params == {**params, "states": ["exp_avg"]}
    assert recorded.text.startswith("# Hugging Face Llama-family names")
    assert ucl.load_program(recorded).to_dict() == prog.to_dict()  # the record round-trips


def test_load_under_a_new_layout_uses_the_manifests_program(tmp_path):
    path = str(tmp_path / "ckpt")
    _save_tp2(path, SPLIT)
    whole = torch.arange(8.0).view(4, 2)
    assert torch.equal(ucp.load(path, layout="tp=4", rank=3)["w"], whole[3:])  # the whole tensor before
    assert torch.equal(ucp.load(path, rank=1)["w"], whole[2:])  # rank 1 of the saved layout, tp=2
    assert torch.equal(ucp.load(path)["w"], whole)  # no layout, no rank: whole tensors, as always


def test_a_checkpoint_without_a_program_says_so(tmp_path):
    path = str(tmp_path / "ckpt")
    ucp.save({"w": torch.ones(4, 2)}, path)
    with pytest.raises(UclError) as info:
        ucp.load(path, layout="tp=2", rank=0)
    assert str(info.value) == (f"checkpoint {path} records no UCL program, so it cannot be loaded under layout tp=2 "
                               "by itself: pass program= (the program it was saved with) or spec=")
    with pytest.raises(LayoutError, match=r"needs layout= \(e.g. 'tp=2,dp=2'\) and rank="):
        ucp.load(path, program=SPLIT, layout="tp=2")


def test_a_given_program_must_agree_with_the_saved_one(tmp_path, models):
    # heads=2 for a checkpoint saved with heads=4 cut the fused QKV into the wrong groups, silently
    params = dict(num_layers=2, hidden_size=8, ffn_hidden_size=8, heads=4, kv_heads=4, vocab_size=50,
                  vocab_multiple=4, states=())
    tensors = models.megatron(layers=2, hidden=8, heads=4, kv_heads=4, vocab=50, ffn=8, states=())
    from ucp.ucl.simulate import place

    path = str(tmp_path / "ckpt")
    prog = ucl.load_program("megatron-gpt", **params)
    _, locals_ = place(prog, "tp=2", tensors)
    for rank, local in enumerate(locals_):
        state: dict = {}
        for key, t in local.items():
            set_path(state, key, t)
        ucp.save(state, path, program=prog, layout="tp=2", rank=rank, world_size=2)
    ucp.finalize(path, world_size=2)
    wrong = ucl.load_program("megatron-gpt", **{**params, "heads": 2, "kv_heads": 2})
    with pytest.raises(ProgramMismatchError) as info:
        ucp.load(path, program=wrong, layout="tp=1", rank=0)
    assert str(info.value) == (
        f"the program given disagrees with the one checkpoint {path} was saved with: heads=2 given, heads=4 saved; "
        "kv_heads=2 given, kv_heads=4 saved; kv_channels=4 given, kv_channels=2 saved. These parameters describe the "
        "model, and another value maps its tensors wrongly; leave the program out to use the checkpoint's own, or "
        "give the saved values")
    # a setting may differ (this run pads the vocabulary to 8), and what the program leaves out comes from the save
    mine = ucp.load(path, program="megatron-gpt:vocab_multiple=8,states=|", layout="tp=1", rank=0)
    qkv = mine["model"]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == (24, 8) and mine["model"]["embedding.word_embeddings.weight"].shape == (56, 8)


def test_spec_and_program_together_are_refused(tmp_path):
    path = str(tmp_path / "ckpt")
    _save_tp2(path, SPLIT)
    fmap = ucl.spec_for_load(SPLIT, "tp=2", 0, ucp.CheckpointReader(path).logical())
    with pytest.raises(UclError, match=r"^pass spec= or program= to load, not both"):
        ucp.load(path, spec=fmap, program=SPLIT, layout="tp=2", rank=0)
    with pytest.raises(UclError, match=r"^pass spec= or program= to save, not both"):
        ucp.save({"w": torch.ones(2, 2)}, str(tmp_path / "other"), spec=fmap, program=SPLIT, layout="tp=2")


def _manifest_with_program(tmp_path, value) -> str:
    path = str(tmp_path / "ckpt")
    ucp.save({"w": torch.arange(8.0).view(4, 2)}, path)
    manifest = os.path.join(path, "manifest.json")
    with open(manifest) as fh:
        data = json.load(fh)
    data["program"] = value
    with open(manifest, "w") as fh:
        json.dump(data, fh)
    return path


@pytest.mark.parametrize("text", [SPLIT, "hf-llama:vocab_size=4"], ids=["text", "preset reference"])
def test_older_manifests_with_a_plain_string_stay_readable(tmp_path, text):
    path = _manifest_with_program(tmp_path, text)
    assert ucp.CheckpointReader(path).manifest.program == ProgramRecord(text=text, name="<manifest>")
    if text == SPLIT:
        assert torch.equal(ucp.load(path, layout="tp=2", rank=1)["w"], torch.arange(8.0).view(4, 2)[2:])
    else:
        assert ucl.load_program(ucp.CheckpointReader(path).manifest.program).params == {"vocab_size": 4}


def test_a_recorded_path_is_never_followed(tmp_path):
    (tmp_path / "evil.ucl").write_text(SPLIT)
    path = _manifest_with_program(tmp_path, str(tmp_path / "evil.ucl"))
    with pytest.raises(UclError, match="which is neither UCL text nor a preset reference; pass program="):
        ucp.load(path, layout="tp=2", rank=0)


@pytest.mark.parametrize("value, message", [
    (5, "program must be an object with the program's text, got int"),
    ({"text": 3}, "program.text must be the program's source text, got int"),
    ({"text": SPLIT, "params": {"n": 1.5}}, "program.params must map names to integers, words or lists of those"),
    ({"text": SPLIT, "code": "x"}, "program has unknown field(s) ['code']"),
])
def test_a_damaged_program_field_is_a_manifest_error(tmp_path, value, message):
    path = _manifest_with_program(tmp_path, value)
    with pytest.raises(ManifestError) as info:
        ucp.CheckpointReader(path)
    assert str(info.value).endswith(message)


def test_the_checker_uses_and_checks_the_checkpoints_program(tmp_path, capsys):
    from ucp.tools.cli import main

    path = str(tmp_path / "ckpt")
    _save_tp2(path, ucl.load_program(SPLIT, n=3))
    assert main(["ucl", "check", "--layout", "tp=4,dp=3", "--against", path]) == 0  # no program named: its own
    assert "<manifest>" not in capsys.readouterr().out
    program = tmp_path / "m.ucl"
    program.write_text(SPLIT)
    assert main(["ucl", "check", str(program), "--layout", "tp=4", "--against", path, "--param", "n=2"]) == 2
    assert "n=2 given, n=3 saved" in capsys.readouterr().err
    plain = str(tmp_path / "plain")
    ucp.save({"w": torch.ones(4, 2)}, plain)
    assert main(["ucl", "check", "--layout", "tp=2", "--against", plain]) == 2
    assert f"checkpoint {plain} records no UCL program: name the program to check it with" in capsys.readouterr().err


def test_a_rank_part_with_a_damaged_program_record_is_refused_by_finalize(tmp_path):
    path = tmp_path / "c"
    for rank in range(2):
        ucp.save({"w": torch.arange(8.0).view(4, 2).chunk(2)[rank].clone()}, path, program=SPLIT, layout="tp=2",
                 rank=rank, world_size=2)
    part = tmp_path / ".c.ucp-staging-shared" / "parts" / "rank-00001.json"
    data = json.loads(part.read_text())
    assert data["program"]["text"] == SPLIT  # each rank's part carries the record finalize commits
    part.write_text(json.dumps({**data, "program": {"text": SPLIT, "params": {"n": [1.5]}}}))
    with pytest.raises(ManifestError) as info:
        ucp.finalize(path, world_size=2)
    assert str(info.value) == (
        f"{part}: member 'program' is not a UCL program record (the part: program.params must map names to "
        "integers, words or lists of those); the rank's save is damaged - save that rank again")
