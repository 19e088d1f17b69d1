"""`ucp verify` checks everything `ucp.load` relies on and reports every problem (issue 8, item 14)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import ucp
from ucp.stores import StoreOptions
from ucp.tools.cli import main as ucp_main

STATE = {"a": torch.arange(12.0).view(3, 4), "b": torch.ones(5, dtype=torch.int64), "c": torch.zeros(2, 2),
         "d": torch.full((4,), 7, dtype=torch.int16), "step": 3}


@pytest.fixture()
def checkpoint(tmp_path) -> Path:
    path = tmp_path / "c"
    ucp.save(STATE, path, store_options=StoreOptions(pack_max_bytes=0))  # each tensor its own array
    return path


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _edit(path: Path, change) -> None:
    manifest = _manifest(path)
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _array(path: Path, name: str) -> Path:
    return path / "data" / _manifest(path)["tensors"][name]["fragments"][0]["key"]


def _report(path: Path, capsys) -> dict:
    assert ucp_main(["verify", str(path), "--json"]) == 1
    return json.loads(capsys.readouterr().out)


def test_a_clean_checkpoint_verifies(checkpoint, capsys):
    assert ucp_main(["verify", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["tensors"] == 4 and report["fragments"] == 4 and report["problems"] == []


def test_edited_chunk_rows_fail_load_and_verify_alike(checkpoint, capsys):
    _edit(checkpoint, lambda m: m["tensors"]["a"]["fragments"][0].update(chunk_rows=6))
    message = (f"{checkpoint / 'manifest.json'}: tensor 'a' fragment {_manifest(checkpoint)['tensors']['a']['fragments'][0]['key']!r}: "
               "chunk_rows must be between 1 and 3 (the rows it stores), got 6")
    with pytest.raises(ucp.ManifestError) as err:
        ucp.load(checkpoint)
    assert str(err.value) == message
    report = _report(checkpoint, capsys)
    assert [(p["tensor"], p["kind"], p["message"]) for p in report["problems"]] == [("a", "ManifestError", message)]
    assert report["tensors"] == 4 and report["fragments"] == 3  # the other tensors were still checked


@pytest.mark.parametrize("tree, message", [
    ({"x": {"$tuple": 5}}, "bad $tuple at 'x': expected a list"),
    ({"x": {"$dict": [[1]]}}, "bad $dict at 'x': expected a list of [key, value] pairs"),
    ({"x": [{"$float": "1.5"}]}, "bad {'$float': '1.5'} at 'x/0': expected \"nan\", \"inf\" or \"-inf\""),
    ({"x": {"$tensor": 3}}, "bad $tensor at 'x': expected a tensor key (a string)"),
    ({"x": {"$pickle": "gASV"}}, "unknown tag '$pickle' at 'x' (a newer format?)"),
    ({"x": json.loads("[" * 900 + "]" * 900)}, "nested deeper than 256 levels at "
                                               f"'x/{'0/' * 29}...'; flatten that part of the state"),
], ids=["tuple-int", "dict-item", "float-text", "tensor-int", "unknown-tag", "900-deep"])
def test_a_bad_state_tree_fails_load_and_verify_alike(checkpoint, capsys, tree, message):
    _edit(checkpoint, lambda m: m["states"].update({"0": tree}))
    message = f"state tree of {checkpoint}: {message}"
    with pytest.raises(ucp.ManifestError) as err:
        ucp.load(checkpoint)
    assert str(err.value) == message
    report = _report(checkpoint, capsys)
    assert [(p["tensor"], p["kind"], p["message"]) for p in report["problems"]] == [
        ("states[0]", "ManifestError", message)]
    assert report["bytes_checked"] == sum(t.numel() * t.element_size() for t in STATE.values() if torch.is_tensor(t))


def test_a_deep_state_tree_is_refused_at_save(tmp_path):
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ucp.UcpError, match="deeper than 256 levels"):
        ucp.save({"w": torch.ones(1), "deep": deep}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_the_manifest_writer_refuses_a_tree_no_reader_loads():
    from ucp.manifest import Manifest

    with pytest.raises(ucp.ManifestError) as err:
        Manifest(tensors={}, states={0: {"x": {"$tuple": 3}}}).to_json()
    assert str(err.value) == "state tree of rank 0: bad $tuple at 'x': expected a list"


def test_zarr_json_is_checked_against_the_manifest(checkpoint, capsys):
    (_array(checkpoint, "a") / "zarr.json").unlink()
    (_array(checkpoint, "b") / "zarr.json").write_text("{not json")
    meta = json.loads((_array(checkpoint, "c") / "zarr.json").read_text())
    meta.update(shape=[4, 1], data_type="float64")
    (_array(checkpoint, "c") / "zarr.json").write_text(json.dumps(meta))
    report = _report(checkpoint, capsys)
    found = [(p["tensor"], p["kind"], p["message"].split(": ", 2)[-1]) for p in report["problems"]]
    zarr = {name: _array(checkpoint, name) / "zarr.json" for name in "abc"}
    assert found == [
        ("a", "IncompleteCheckpointError", f"{zarr['a']} is missing; a zarr reader cannot open the array - restore it "
                                           "from a replica or load an older checkpoint"),
        ("b", "FormatError", "zarr.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 "
                             "column 2 (char 1)); a zarr reader cannot open the array - the checkpoint is damaged"),
        ("c", "FormatError", "shape is [4, 1], the manifest says [2, 2]; a zarr reader would not read the bytes the "
                             "manifest points at - the checkpoint is damaged"),
        ("c", "FormatError", "data_type is \"float64\", the manifest says \"float32\"; a zarr reader would not read the "
                             "bytes the manifest points at - the checkpoint is damaged"),
    ]
    assert report["problems"][1]["message"].startswith("tensor 'b' (fragment ")


def test_every_problem_is_reported(checkpoint, capsys):
    a = _array(checkpoint, "a") / "c.0.0"
    data = bytearray(a.read_bytes())
    data[3] ^= 1
    a.write_bytes(bytes(data))  # a: checksum mismatch
    (_array(checkpoint, "b") / "c.0").unlink()  # b: chunk missing
    c = _array(checkpoint, "c") / "c.0.0"
    c.unlink()
    os.symlink(c.name, c)  # c: a link to itself, unreadable (ELOOP) - once exit 2 with no report
    _edit(checkpoint, lambda m: m["states"].update({"0": {"step": {"$tuple": 1}}}))
    report = _report(checkpoint, capsys)
    assert [(p["tensor"], p["kind"]) for p in report["problems"]] == [
        ("states[0]", "ManifestError"), ("a", "ChecksumError"), ("b", "IncompleteCheckpointError"), ("c", "OSError")]
    assert report["ok"] is False and report["fragments"] == 4 and report["bytes_checked"] == 8
    assert ucp_main(["verify", str(checkpoint)]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "ChecksumError" in out and "states[0]" in out
    assert report["problems"][3]["message"] == f"tensor 'c' (fragment 'r0/{c.parent.name}' of rank 0): cannot read it: " \
        f"[Errno 40] Too many levels of symbolic links: {str(c)!r}"


def test_an_unreadable_manifest_is_a_report_too(checkpoint, capsys):
    (checkpoint / "manifest.json").write_text('{"format_version": 1, "tensors": 1e400}')
    report = _report(checkpoint, capsys)
    assert report["problems"] == [{
        "tensor": "", "file": str(checkpoint / "manifest.json"), "kind": "ManifestError",
        "message": f"{checkpoint / 'manifest.json'} holds the number 1e400, which is out of range; the manifest is "
                   "damaged - load an older checkpoint"}]
    assert ucp_main(["verify", str(checkpoint)]) == 1
    assert "(manifest)" in capsys.readouterr().out


def test_verify_checks_fsspec_stores_too(tmp_path, monkeypatch, capsys):
    import fsspec

    url = f"memory://verify-{tmp_path.name}/c"
    ucp.save(STATE, url)
    assert ucp.verify(url).ok
    fs = fsspec.filesystem("memory")
    root = f"/verify-{tmp_path.name}/c"
    key = json.loads(fs.cat_file(f"{root}/manifest.json"))["tensors"]["a"]["fragments"][0]["key"]
    fs.rm(f"{root}/data/{key}/zarr.json")
    report = ucp.verify(url)
    assert [(p.tensor, p.kind) for p in report.problems] == [("a", "IncompleteCheckpointError")]
    assert report.problems[0].message.endswith("is missing; a zarr reader cannot open the array - restore it from "
                                               "a replica or load an older checkpoint")


def test_a_recorded_program_that_parses_verifies(tmp_path):
    program = "ucl 1\ntensor params/0 -> a\ntensor params/1 -> b\n"
    ucp.save({"params": [torch.arange(3.0), torch.arange(4.0)], "step": 2}, tmp_path / "c", program=program,
             layout="dp=1")
    assert ucp.verify(tmp_path / "c").ok


def test_a_recorded_program_that_does_not_parse_is_a_problem(checkpoint, capsys):
    _edit(checkpoint, lambda m: m.update(program={"text": "ucl 1\nthis is not ucl\n", "params": {}, "name": "m.ucl",
                                                  "preset": None}))
    report = _report(checkpoint, capsys)
    assert [(p["tensor"], p["kind"]) for p in report["problems"]] == [("program", "UclSyntaxError")]
    assert report["problems"][0]["message"].startswith(
        f"{checkpoint / 'manifest.json'}: the recorded UCL program cannot be used to load under another layout: ")
