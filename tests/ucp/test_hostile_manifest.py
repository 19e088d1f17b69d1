"""A damaged or hostile manifest gets a clear error before any file outside the checkpoint is read."""

import json

import pytest
import torch

import ucp
from ucp.errors import ManifestError, TensorTooLargeError


@pytest.fixture()
def checkpoint(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": torch.ones(4, 4)}, path)
    return path


def _edit(path, change):
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _fragment(m):
    return m["tensors"]["w"]["fragments"][0]


@pytest.mark.parametrize("key", ["../../../etc/passwd", "/etc/passwd", "r0/../../x", "r0//x", "r0/x\\y", ""])
def test_fragment_keys_cannot_leave_the_checkpoint(checkpoint, key):
    _edit(checkpoint, lambda m: _fragment(m).update(key=key))
    with pytest.raises(ManifestError, match="a fragment key must be a relative path of plain names under data/"):
        ucp.load(checkpoint)


@pytest.mark.parametrize("field, value, message", [
    ("pack_offset", -5, "field 'pack_offset' must be >= 0, got -5"),
    ("chunk_rows", 0, r"chunk_rows must be between 1 and 4 \(the rows it stores\), got 0"),
    ("nbytes", 65, "nbytes 65 does not match its region of 16 elements of 4 byte"),
])
def test_inconsistent_fragment_fields(checkpoint, field, value, message):
    _edit(checkpoint, lambda m: _fragment(m).update({field: value}))
    with pytest.raises(ManifestError, match=message):
        ucp.load(checkpoint)


def test_a_huge_claimed_shape_is_a_clear_error_not_an_allocator_crash(checkpoint):
    rows, cols = 10**7, 10**6  # 40 TB of float32: consistent fields, impossible tensor

    def huge(m):
        m["tensors"]["w"]["shape"] = [rows, cols]
        frag = _fragment(m)
        frag["region"]["box"]["sizes"] = [rows, cols]
        frag["nbytes"] = rows * cols * 4
        frag["chunk_rows"] = rows  # one chunk, as its one checksum says
        frag.pop("pack_offset")

    _edit(checkpoint, huge)
    with pytest.raises(TensorTooLargeError, match=r"cannot allocate 'w' float32\[10000000, 1000000\] \(37252\.9 GiB\)"):
        ucp.load(checkpoint)
    assert isinstance(TensorTooLargeError("x"), MemoryError)


def test_absurd_nesting_is_a_manifest_error(checkpoint):
    text = (checkpoint / "manifest.json").read_text()
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    (checkpoint / "manifest.json").write_text(text[:-1] + ',"extra2":' + deep + "}")
    with pytest.raises(ManifestError):
        ucp.load(checkpoint)
