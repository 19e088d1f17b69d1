"""Fixtures made by the real libraries: DCP by FSDP2 on gloo, files by torch.save and safetensors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def fsdp2_dcp(tmp_path_factory) -> Path:
    """A DCP folder written by FSDP2 on 3 gloo ranks (uneven shards, AdamW with 2 groups), and the same state whole.

    ``root/dcp`` is the checkpoint; ``root/full.pt`` holds ``{"tensors": {logical name: tensor}, "param_groups"}``.
    """
    import fsdp2_job

    root = tmp_path_factory.mktemp("fsdp2")
    fsdp2_job.make(str(root), world=3)
    return root


class Sentinel:
    """A pickle that runs ``touch <path>`` if anything unpickles it for real."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


@pytest.fixture
def hostile(tmp_path) -> Sentinel:
    return Sentinel(tmp_path / "pwned")
