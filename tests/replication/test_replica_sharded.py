"""Peer replicas of a checkpoint with sharded metadata (format 2): replicated, then lost arrays recovered.

Four gloo processes save with ``metadata_shard_min_ranks=1`` (groups [0, 1] and [2, 3]), so the
replica manager has to read the fragments from the metadata shards to find each rank's arrays.
"""

from __future__ import annotations

import shutil
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
import ucp
from ucp.replication.replica_tiers import MemoryTier
from ucp.replication.replicas import ReplicaManager
from tests.replication.test_replica_recovery import WORLD, _spec, _state
from ucp.stores import StoreOptions


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        path = f"{root}/ckpt"
        ucp.save(_state(rank), path, spec=_spec(rank), process_group=dist.group.WORLD,
                 store_options=StoreOptions(metadata_shard_min_ranks=1))
        assert ucp.CheckpointReader(path).manifest.format_version == 4
        manager = ReplicaManager(tiers=[MemoryTier(capacity_bytes=64 << 20)], replicas=2, node=f"n{rank}", process_group=dist.group.WORLD)
        rmap = manager.replicate(path)
        assert rmap.arrays and all(len(record.holders) >= 2 for record in rmap.arrays.values())
        dist.barrier()
        if rank == 0:
            shutil.rmtree(f"{path}/data/r1")  # rank 1's node-local arrays are lost
        dist.barrier()
        report = manager.recover(path)
        assert report.repaired
        expected = _state(rank)
        out = ucp.load(path, spec=_spec(rank), rank=rank)
        assert all(torch.equal(out[k], expected[k]) for k in ("w", "big", "small"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_replicas_of_a_format_2_checkpoint_recover_lost_arrays(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    assert ucp.verify(tmp_path / "ckpt").ok
