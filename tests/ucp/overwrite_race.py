"""Two overwrite saves to one marker-store path in flight at once (shared by the memory and S3 tests).

The first to commit must not delete the second's arrays: it replaces the checkpoint that was
committed, not a save that has not committed yet.
"""

from __future__ import annotations

import fsspec
import torch

import ucp
from ucp.writer import CheckpointWriter


def check_concurrent_overwrites(path: str, storage_options: dict | None = None) -> None:
    ucp.save({"w": torch.zeros(300, 300)}, path, storage_options=storage_options)
    first, second = (CheckpointWriter(path, overwrite=True, storage_options=storage_options) for _ in range(2))
    for writer, value in ((first, 1.0), (second, 2.0)):
        writer.add("w", torch.full((300, 300), value))  # large enough for its own array, not a pack
        writer.set_state({"w": {"$tensor": "w"}})
        writer.flush()
    first.close()
    assert torch.equal(ucp.load(path, storage_options=storage_options)["w"], torch.ones(300, 300))
    second.close()  # its arrays must still be there
    assert torch.equal(ucp.load(path, storage_options=storage_options)["w"], torch.full((300, 300), 2.0))
    assert ucp.verify(path, storage_options=storage_options).ok
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    assert len(fs.ls(f"{root}/data", detail=False)) == 1  # the replaced checkpoints' arrays are gone
