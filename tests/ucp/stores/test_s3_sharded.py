"""Sharded metadata on an object store: three gloo processes save to the local S3 server (marker commits).

On a marker store each save writes under its own key prefix, shards included
(``data/<token>/meta/g<k>.json``): an overwrite leaves the old checkpoint whole until the
new root replaces its manifest, then removes the old prefix; a failed save leaves nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
import ucp
from ucp.stores import StoreOptions

WORLD = 3  # groups of ceil(sqrt(3)) = 2 ranks: [0, 1] and [2]
SHARDED = StoreOptions(metadata_shard_min_ranks=1)


def _state(rank: int, version: float) -> dict:
    return {"mine": torch.full((1, 4), version + rank), "step": int(version)}


def _spec(rank: int, row: int | None = None):
    from ucp.geometry import Box
    from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

    box = Box((rank if row is None else row, 0), (1, 4))
    piece = ShardPiece("mine", Box((0, 0), (1, 4)), box)
    return FragmentMap(rank=rank, logical={"mine": LogicalTensor("mine", (WORLD, 4), "float32")},
                       tensors={"mine": TensorSpec("mine", (piece,))})


def _worker(rank: int, port: int, url: str, options: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        group = dist.group.WORLD
        for version in (1.0, 2.0):  # the second save overwrites the first
            ucp.save(_state(rank, version), url, spec=_spec(rank), process_group=group, storage_options=options,
                     store_options=SHARDED, overwrite=True)
            with ucp.CheckpointReader(url, storage_options=options) as reader:
                assert torch.equal(reader.read_tensor("mine")[rank], torch.full((4,), version + rank))
        # Rank 2 (the second group) writes row 0 as well, and row 2 is missing: refused after the shards
        # are written, so the failed save's prefix must go.
        with pytest.raises(ucp.CoverageError, match="fragments of ranks in different groups overlap"):
            ucp.save(_state(rank, 3.0), url + "-failed", spec=_spec(rank, 0 if rank == 2 else None),
                     process_group=group, storage_options=options, store_options=SHARDED)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sharded_saves_commit_overwrite_and_fail_cleanly_on_s3(s3):
    import fsspec

    bucket, options = s3
    url = f"{bucket}/ckpt"
    mp.spawn(_worker, args=(free_port(), url, options), nprocs=WORLD, join=True)
    fs = fsspec.filesystem("s3", **options)
    root = ucp.CheckpointReader(url, storage_options=options).manifest
    assert root.world_size == WORLD and root.states[2]["step"] == 2
    prefixes = fs.ls(f"{url}/data", detail=False)
    assert len(prefixes) == 1  # the first save's prefix (its arrays and shards) is gone
    shards = sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{prefixes[0]}/meta", detail=False))
    assert shards == ["g00000.json", "g00001.json"]
    assert (fs.find(f"{url}-failed") if fs.exists(f"{url}-failed") else []) == []
    assert ucp.verify(url, storage_options=options).ok
