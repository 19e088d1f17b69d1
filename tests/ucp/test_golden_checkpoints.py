"""Whole checkpoints of every format version, committed once and never rewritten: each must load bitwise.

A new format version adds its own directory (``tests/ucp/golden/v<N>-checkpoint``), written by the
code of that version with ``UCP_WRITE_GOLDEN_CHECKPOINT=<N>``; the directories of older versions
stay as they were written, so a reader change that breaks an old checkpoint fails here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import ucp
from ucp.stores import StoreOptions

GOLDEN = Path(__file__).resolve().parent / "golden"
VERSIONS = {1: GOLDEN / "v1-checkpoint", 3: GOLDEN / "v3-checkpoint"}
# Small chunks and packs, so that a few tensors exercise every kind of stored array. Format 1:
# multi-chunk arrays (with an uneven last chunk), one-chunk arrays, packs of small fragments and
# a 0-d tensor; format 3: packed fragments of several chunks, in three packs.
OPTIONS = {
    1: StoreOptions(chunk_bytes=256, pack_max_bytes=64, pack_target_bytes=128),
    3: StoreOptions(chunk_bytes=256, pack_target_bytes=512),
}


def golden_state() -> dict:
    """The state every golden checkpoint holds (deterministic: no random numbers)."""
    return {
        "model": {
            "embed": (torch.arange(40 * 6, dtype=torch.float32).view(40, 6) / 7).to(torch.bfloat16),
            "fc.weight": torch.arange(24 * 5, dtype=torch.float32).view(24, 5) * -0.25,
            "fc.bias": torch.arange(5, dtype=torch.float16),
            "norm": torch.linspace(-1, 1, 9, dtype=torch.float64),
            "mask": torch.tensor([True, False, True]),
            "ids": torch.arange(-3, 3, dtype=torch.int64),
            "empty": torch.zeros(0, 4),
        },
        "optimizer": {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.full((24, 5), 0.5)}}},
        "step": 7,
        "note": "golden",
    }


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat(value, f"{prefix}{key}/")
    else:
        yield prefix.rstrip("/"), tree


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: equal bits, not equal values (NaNs, signed zeros)."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


@pytest.mark.skipif(not os.environ.get("UCP_WRITE_GOLDEN_CHECKPOINT"), reason="writes a golden checkpoint on request")
def test_write_golden_checkpoint():
    version = int(os.environ["UCP_WRITE_GOLDEN_CHECKPOINT"])
    path = GOLDEN / f"v{version}-checkpoint"
    assert not path.exists(), f"{path} exists: golden checkpoints are written once"
    ucp.save(golden_state(), path, store_options=OPTIONS[version])
    assert json.loads((path / "manifest.json").read_text())["format_version"] == version


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_golden_checkpoint_loads_bitwise(version):
    path = VERSIONS[version]
    assert json.loads((path / "manifest.json").read_text())["format_version"] == version
    loaded = dict(_flat(ucp.load(path)))
    expected = dict(_flat(golden_state()))
    assert sorted(loaded) == sorted(expected)
    for key, want in expected.items():
        got = loaded[key]
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(_bits(got), _bits(want)), key
        else:
            assert got == want, key


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_golden_checkpoint_verifies(version):
    report = ucp.verify(str(VERSIONS[version]))
    assert report.ok, report
