"""Golden files pin the on-disk format of docs/FORMAT.md; zarr-python proves it is open.

Regenerate after an intended format change with ``UCP_REGEN_GOLDEN=1`` (and
bump ``format_version`` if old readers would misread the new files).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import zarr

import ucp

GOLDEN = Path(__file__).resolve().parent / "golden"


def _fixed_state() -> dict:
    return {
        "model": {
            "linear.weight": torch.arange(6, dtype=torch.float32).view(2, 3),
            "linear.bias": torch.tensor([0.5, -1.0], dtype=torch.bfloat16),
        },
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "step": 3,
        "flags": (True, None),
    }


def _check_golden(name: str, actual: dict) -> None:
    path = GOLDEN / name
    if os.environ.get("UCP_REGEN_GOLDEN"):
        path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
    assert actual == json.loads(path.read_text())


def test_manifest_matches_golden(tmp_path):
    ucp.save(_fixed_state(), tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest.pop("created").endswith("+00:00")  # the only volatile field
    _check_golden("manifest.json", manifest)


def _save_unpacked(path, state, store_options=None) -> None:
    """Save with packing off, so every fragment is its own array (as big tensors always are)."""
    from ucp.state import flatten_state

    flat = flatten_state(state)
    with ucp.CheckpointWriter(str(path), pack_max_bytes=0, store_options=store_options) as writer:
        for key, tensor in flat.tensors.items():
            writer.add(key, tensor)
        writer.set_state(flat.tree)


def test_array_metadata_matches_golden(tmp_path):
    _save_unpacked(tmp_path / "c", _fixed_state())
    frag = json.loads((tmp_path / "c" / "manifest.json").read_text())["tensors"]["model/linear.bias"]["fragments"][0]
    meta = json.loads((tmp_path / "c" / "data" / frag["key"] / "zarr.json").read_text())
    _check_golden("zarr.json", meta)
    # bfloat16 is stored as its bit pattern; the true dtype is in the attributes.
    assert meta["data_type"] == "uint16" and meta["attributes"]["ucp"]["dtype"] == "bfloat16"


def test_pack_metadata_matches_golden(tmp_path):
    ucp.save(_fixed_state(), tmp_path / "c")
    frag = json.loads((tmp_path / "c" / "manifest.json").read_text())["tensors"]["model/linear.bias"]["fragments"][0]
    assert frag["pack_offset"] % 64 == 0
    _check_golden("pack.zarr.json", json.loads((tmp_path / "c" / "data" / frag["key"] / "zarr.json").read_text()))


def test_tensorstore_and_plain_file_writers_agree(tmp_path):
    """Small arrays are written as plain files; big ones by tensorstore. The format must not differ."""
    from ucp.stores import StoreOptions

    _save_unpacked(tmp_path / "plain", _fixed_state())
    _save_unpacked(tmp_path / "ts", _fixed_state(), StoreOptions(small_array_bytes=-1, direct_writes=False))
    plain_files = sorted(p.relative_to(tmp_path / "plain") for p in (tmp_path / "plain").rglob("*") if p.is_file())
    ts_files = sorted(p.relative_to(tmp_path / "ts") for p in (tmp_path / "ts").rglob("*") if p.is_file())
    assert plain_files == ts_files
    for rel in plain_files:
        a, b = (tmp_path / "plain" / rel).read_bytes(), (tmp_path / "ts" / rel).read_bytes()
        if rel.name == "manifest.json":
            a, b = (json.loads(x) for x in (a, b))
            a.pop("created"), b.pop("created")
        elif rel.name == "zarr.json":
            a, b = json.loads(a), json.loads(b)
        assert a == b, rel


def test_zarr_python_reads_packed_fragments(tmp_path):
    state = _fixed_state()
    ucp.save(state, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    frag = manifest["tensors"]["model/linear.weight"]["fragments"][0]
    pack = zarr.open_array(str(tmp_path / "c" / "data" / frag["key"]), mode="r")[:]
    assert pack.dtype == np.uint8
    raw = pack[frag["pack_offset"] : frag["pack_offset"] + frag["nbytes"]]
    np.testing.assert_array_equal(raw.view("<f4").reshape(2, 3), state["model"]["linear.weight"].numpy())


def test_zarr_python_reads_every_fragment(tmp_path):
    state = _fixed_state()
    _save_unpacked(tmp_path / "c", state)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    weight = manifest["tensors"]["model/linear.weight"]["fragments"][0]
    array = zarr.open_array(str(tmp_path / "c" / "data" / weight["key"]), mode="r")
    np.testing.assert_array_equal(array[:], state["model"]["linear.weight"].numpy())
    bias = manifest["tensors"]["model/linear.bias"]["fragments"][0]
    bits = zarr.open_array(str(tmp_path / "c" / "data" / bias["key"]), mode="r")[:]
    assert bits.dtype == np.uint16
    assert torch.equal(torch.from_numpy(bits.astype(np.int32)).to(torch.int16).view(torch.bfloat16),
                       state["model"]["linear.bias"])
    step = manifest["tensors"]["optimizer/state/0/step"]["fragments"][0]
    assert zarr.open_array(str(tmp_path / "c" / "data" / step["key"]), mode="r")[()] == 3.0
