"""Commit and integrity: corruption is detected with errors that name the tensor and file; ``ucp verify``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ucp
from ucp.stores import StoreOptions
from ucp.tools.cli import main as ucp_main


# Each I/O path as the options that pick it: small fragments packed (the default), one-chunk arrays
# as plain files, multi-chunk arrays written and read directly (big local tensors), and arrays
# written and read by tensorstore (as on remote stores).
IO = {
    "packed": StoreOptions(),
    "plain-files": StoreOptions(pack_max_bytes=0),
    "direct": StoreOptions(pack_max_bytes=0, small_array_bytes=-1),
    "tensorstore": StoreOptions(pack_max_bytes=0, small_array_bytes=-1, direct_writes=False, direct_reads=False),
}


@pytest.fixture(params=list(IO))
def io_path(request):
    """Run a test through each I/O path (IO)."""
    return request.param


def _save(path, store_options: StoreOptions | None = None) -> dict:
    state = {"model": {"w": torch.arange(12.0).view(3, 4), "b": torch.ones(2, dtype=torch.bfloat16)}, "step": 1}
    ucp.save(state, path, store_options=store_options)
    return state


def _chunk(path: Path, name: str) -> Path:
    entry = json.loads((path / "manifest.json").read_text())["tensors"][name]
    ndim = 1 if "pack_offset" in entry["fragments"][0] else len(entry["shape"])
    return path / "data" / entry["fragments"][0]["key"] / ".".join(["c"] + ["0"] * ndim)


def _offset(path: Path, name: str) -> int:
    frag = json.loads((path / "manifest.json").read_text())["tensors"][name]["fragments"][0]
    return frag.get("pack_offset", 0)


def test_flipped_byte_is_a_checksum_error(tmp_path, io_path):
    path = tmp_path / "c"
    state = _save(path, store_options=IO[io_path])
    chunk = _chunk(path, "model/w")
    data = bytearray(chunk.read_bytes())
    offset = _offset(path, "model/w")
    data[offset + 5] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(ucp.ChecksumError) as err:
        ucp.load(path, store_options=IO[io_path])
    frag_key = chunk.parent.relative_to(path / "data")
    where = f"{chunk} bytes {offset}..{offset + 48}" if io_path == "packed" else str(chunk)
    assert str(err.value).startswith(
        f"checksum mismatch in tensor 'model/w': file {where} (fragment '{frag_key}' of rank 0) has xxh3_64 "
    )
    assert str(err.value).endswith(
        "the file is corrupt - restore it from a replica or load an older checkpoint (verify=False skips the check)"
    )
    assert not torch.equal(ucp.load(path, verify=False, store_options=IO[io_path])["model"]["w"], state["model"]["w"])
    assert torch.equal(ucp.load(path, verify=False, store_options=IO[io_path])["model"]["b"], state["model"]["b"])


def test_truncated_chunk_is_truncated_data(tmp_path, io_path):
    path = tmp_path / "c"
    _save(path, store_options=IO[io_path])
    chunk = _chunk(path, "model/w")
    offset = _offset(path, "model/w")
    chunk.write_bytes(chunk.read_bytes()[: offset + 44])
    with pytest.raises(ucp.TruncatedDataError) as err:
        ucp.load(path, verify=False, store_options=IO[io_path])
    key = chunk.parent.relative_to(path / "data")
    detail = {
        "packed": f"is shorter than the manifest says (bytes {offset}..{offset + 48} wanted, 44 found)",
        "plain-files": "is shorter or longer than the manifest says (44 bytes, expected 48)",
        "direct": "is shorter or longer than the manifest says (44 bytes, expected 48)",
        "tensorstore": "is shorter or longer than the manifest says (FAILED_PRECONDITION: Error reading local file "
        f"\"{chunk}\": Not enough data: expected at least 48 or 4 more; at byte 44)",
    }[io_path]
    assert str(err.value) == (
        f"tensor 'model/w' (fragment '{key}' of rank 0): {chunk} {detail}; "
        "the file is damaged - restore it from a replica or load an older checkpoint"
    )


def test_deleted_fragment_or_chunk_is_incomplete(tmp_path, io_path):
    path = tmp_path / "c"
    _save(path, store_options=IO[io_path])
    chunk = _chunk(path, "model/w")
    chunk.unlink()
    with pytest.raises(ucp.IncompleteCheckpointError) as err:
        ucp.load(path, store_options=IO[io_path])
    key = chunk.parent.relative_to(path / "data")
    assert str(err.value) == (
        f"tensor 'model/w' (fragment '{key}' of rank 0): {chunk} is missing; the checkpoint is incomplete - "
        "load an older checkpoint"
    )
    import shutil

    shutil.rmtree(chunk.parent)
    missing = chunk.parent if io_path == "tensorstore" else chunk
    with pytest.raises(ucp.IncompleteCheckpointError) as err:
        ucp.load(path, store_options=IO[io_path])
    assert str(err.value) == (
        f"tensor 'model/w' (fragment '{key}' of rank 0): {missing} is missing; the checkpoint is incomplete - "
        "load an older checkpoint"
    )


@pytest.mark.parametrize(
    "edit,error,message",
    [
        (lambda m: "{not json", ucp.ManifestError, "manifest.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); the checkpoint is damaged - load an older checkpoint"),
        (lambda m: json.dumps({**m, "format_version": 999}), ucp.FormatVersionError, "manifest.json has format_version 999; this reader understands 1, 2, 3, 4 (upgrade ucp-middleware to read newer checkpoints)"),
        (lambda m: json.dumps({**m, "tensors": {**m["tensors"], "model/w": {**m["tensors"]["model/w"], "shape": [2, 6]}}}),
         ucp.ManifestError, "manifest.json: tensor 'model/w' fragment 'r0/pack-000000': region does not fit shape [2, 6] (box [0:3, 0:4] does not fit in shape (2, 6))"),
        (lambda m: json.dumps({**m, "tensors": {**m["tensors"], "model/w": {**m["tensors"]["model/w"], "shape": [4, 4]}}}),
         ucp.ManifestError, "manifest.json: tensor 'model/w' has shape [4, 4] (16 elements) but its fragments hold 12 elements; the manifest is damaged - load an older checkpoint"),
        (lambda m: json.dumps({k: v for k, v in m.items() if k != "tensors"}), ucp.ManifestError, "manifest.json: missing field 'tensors'"),
    ],
    ids=["bad-json", "version-999", "shape-misfit", "shape-count", "missing-field"],
)
def test_edited_manifest_gives_the_right_error(tmp_path, edit, error, message):
    path = tmp_path / "c"
    _save(path)
    manifest_path = path / "manifest.json"
    manifest_path.write_text(edit(json.loads(manifest_path.read_text())))
    with pytest.raises(error) as err:
        ucp.load(path)
    assert str(err.value).startswith(f"{manifest_path}{message.removeprefix('manifest.json')}")
    assert ucp_main(["verify", str(path)]) == 1


def test_missing_and_uncommitted_checkpoints(tmp_path):
    with pytest.raises(ucp.CheckpointNotFoundError) as err:
        ucp.load(tmp_path / "nothing")
    assert str(err.value) == f"no checkpoint at {tmp_path / 'nothing'} (no manifest.json); check the path"
    assert isinstance(err.value, FileNotFoundError)
    path = tmp_path / "c"
    _save(path)
    (path / "manifest.json").unlink()
    with pytest.raises(ucp.IncompleteCheckpointError) as err:
        ucp.load(path)
    assert str(err.value) == (
        f"{path} has no committed manifest.json: a save was started but never committed (crashed or still running); "
        "load an older checkpoint"
    )


def test_memory_store_corruption_is_detected(tmp_path, io_path):
    import fsspec

    url = f"memory://integrity-{tmp_path.name}/c"
    _save(url, store_options=IO[io_path])
    fs = fsspec.filesystem("memory")
    manifest = json.loads(fs.cat_file(f"/integrity-{tmp_path.name}/c/manifest.json"))
    frag = manifest["tensors"]["model/w"]["fragments"][0]
    chunk = f"/integrity-{tmp_path.name}/c/data/{frag['key']}/" + ("c.0" if "pack_offset" in frag else "c.0.0")
    data = bytearray(fs.cat_file(chunk))
    data[frag.get("pack_offset", 0)] ^= 1
    fs.pipe_file(chunk, bytes(data))
    with pytest.raises(ucp.ChecksumError, match=r"checksum mismatch in tensor 'model/w': file memory://"):
        ucp.load(url, store_options=IO[io_path])


def test_verify_cli_exit_codes_and_report(tmp_path, capsys):
    path = tmp_path / "c"
    _save(path)
    assert ucp_main(["verify", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["tensors"] == 2 and report["bytes_checked"] == 52
    chunk = _chunk(path, "model/b")
    data = bytearray(chunk.read_bytes())
    data[_offset(path, "model/b")] ^= 1
    chunk.write_bytes(bytes(data))
    assert ucp_main(["verify", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(p["tensor"], p["kind"]) for p in report["problems"]] == [("model/b", "ChecksumError")]
    assert report["problems"][0]["file"] == str(chunk.parent)
    assert ucp_main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "model/b" in out and "ChecksumError" in out
    assert ucp_main(["verify", str(tmp_path / "nope")]) == 2
    assert ucp_main(["verify", str(tmp_path / "nope"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "not-a-checkpoint"


def test_inspect_cli(tmp_path, capsys):
    path = tmp_path / "c"
    _save(path)
    assert ucp_main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 1 and info["total_bytes"] == 52 and info["world_size"] == 1
    assert [(t["name"], t["dtype"], t["shape"]) for t in info["tensors"]] == [
        ("model/b", "bfloat16", [2]), ("model/w", "float32", [3, 4])]
    assert ucp_main(["inspect", str(path)]) == 0
    assert "model/w" in capsys.readouterr().out
    assert ucp_main(["inspect", str(tmp_path / "nope")]) == 2


def test_interrupted_overwrite_points_at_the_previous_checkpoint(tmp_path):
    path = tmp_path / "c"
    _save(path)
    moved = tmp_path / ".c.ucp-staging-old-abc123"
    path.rename(moved)  # what a kill between the two renames of an overwrite leaves
    with pytest.raises(ucp.IncompleteCheckpointError) as err:
        ucp.load(path)
    assert str(err.value) == (
        f"{path} has no committed manifest.json: an overwrite was interrupted after moving the previous checkpoint "
        f"to {moved}; rename that directory back to recover it"
    )
    moved.rename(path)
    assert ucp.load(path)["step"] == 1
