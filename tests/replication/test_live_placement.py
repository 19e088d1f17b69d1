"""The live placement sees what the simulator's policies see: per-node speed, capacity, measured read times.

Unit tests drive :func:`plan_replication` (rank 0's planning, pure); the ``slow`` test runs four
gloo processes whose ReplicaManagers report a slow node and a node with a disk tier only.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import ucp
from ucp.replication.errors import PlacementInputError
from ucp.replication.io_cost import IO_TIERS, OPS, IoCostModel, ShippedIoCost, Transfer
from ucp.replication.policies import GreedyForecast
from ucp.replication.replica_map import ArrayRecord, FileRecord
from ucp.replication.replica_plan import RankInfo, plan_replication
from ucp.replication.replica_tiers import DiskTier, MemoryTier
from ucp.replication.replicas import ReplicaManager
from ucp.stores.options import StoreOptions
from tests.replication.test_replica_recovery import WORLD, _spec, _state
from ucp.integrations.launch import free_port


def _records(owners, nbytes: int) -> dict[str, ArrayRecord]:
    return {f"r{o}/a{i}": ArrayRecord(f"r{o}/a{i}", o, "d", (FileRecord("zarr.json", nbytes, "d"),))
            for i, o in enumerate(owners)}


def _peer_ranks(holders) -> dict[int, int]:
    """Rank -> peer copies it holds (owner copies left out)."""
    out: dict[int, int] = {}
    for key, hs in holders.items():
        owner = int(key[1:key.index("/")])
        for h in hs:
            if h.rank != owner:
                out[h.rank] = out.get(h.rank, 0) + 1
    return out


@pytest.mark.parametrize("nbytes", [1_000, 4 << 20])
def test_greedy_keeps_copies_off_a_slow_node(nbytes):
    # 1,000 bytes: every read takes under a microsecond, which greedy's fixed 1e-6 s rounding used to tie
    infos = [RankInfo(rank=r, node=f"n{r}", free={"memory": 1 << 30, "disk": 0}, speed=0.5 if r == 2 else 1.0)
             for r in range(4)]
    holders, _ = plan_replication(_records([0, 1, 2, 3] * 2, nbytes), infos, policy=GreedyForecast(), replicas=2,
                                  io=None)
    assert 2 not in _peer_ranks(holders)
    assert all(len(hs) == 3 for hs in holders.values())  # the owner's copy and two peers


def test_a_node_reports_the_speed_of_its_slowest_rank():
    infos = [RankInfo(rank=r, node=f"n{r // 2}", free={"memory": 1 << 30, "disk": 0}, speed=0.1 if r == 5 else 1.0)
             for r in range(8)]
    holders, _ = plan_replication(_records([0, 2, 4, 6], 4 << 20), infos, policy=GreedyForecast(), replicas=1,
                                  io=None)
    assert not {4, 5} & set(_peer_ranks(holders))


def _model(rates: dict[str, float]) -> IoCostModel:
    """A cost model fitted to a table where ``tier`` restores at ``rates[tier]`` bytes/s (writes alike)."""
    sizes = [4 ** k * 1024 for k in range(1, 8)]
    return IoCostModel([Transfer(tier, op, n, run, n / rates[tier])
                        for tier in IO_TIERS for op in OPS for n in sizes for run in range(2)])


def test_measured_read_times_decide_between_a_peer_s_memory_and_another_s_disk():
    # rank 1 has room on disk only, rank 2 in memory only; rank 3 none
    free = [{"memory": 1 << 30, "disk": 0}, {"memory": 0, "disk": 1 << 30}, {"memory": 1 << 30, "disk": 0},
            {"memory": 0, "disk": 0}]
    infos = [RankInfo(rank=r, node=f"n{r}", free=free[r]) for r in range(4)]
    records = _records([0], 16 << 20)

    def peer(io):
        holders, _ = plan_replication(records, infos, policy=GreedyForecast(), replicas=1, io=io)
        return [(h.rank, h.tier) for h in holders["r0/a0"][1:]]

    assert peer(None) == [(2, "memory")]  # the constants: memory 12.5 GB/s, disk 2 GB/s
    # a host whose memory store is slow (swapping) and whose NVMe is fast, as measured
    assert peer(_model({"memory": 0.05e9, "disk": 20e9, "remote": 1e9})) == [(1, "disk")]


@pytest.mark.parametrize("kwargs, env, message", [
    ({"speed": 0}, None, "ReplicaManager: speed must be a finite number > 0, got 0"),
    ({"speed": float("nan")}, None, "ReplicaManager: speed must be a finite number > 0, got nan"),
    ({}, "fast", "UCP_NODE_SPEED='fast' is not a number; set it to this node's relative read rate "
                 "(1: nominal, 0.25: four times slower)"),
    ({"io": "fast"}, None, "io must be 'measured', 'constant' or a cost model with seconds(op, tier, nbytes), "
                           "got 'fast'"),
])
def test_bad_speed_or_io_is_refused(kwargs, env, message, monkeypatch):
    if env is not None:
        monkeypatch.setenv("UCP_NODE_SPEED", env)
    with pytest.raises(PlacementInputError) as err:
        ReplicaManager(tiers=[MemoryTier(capacity_bytes=1 << 20)], **kwargs)
    assert str(err.value) == message


def test_manager_defaults_measured_io_and_speed_from_the_environment(monkeypatch):
    monkeypatch.setenv("UCP_NODE_SPEED", "0.25")
    manager = ReplicaManager(tiers=[MemoryTier(capacity_bytes=1 << 20)])
    assert manager.speed == 0.25 and isinstance(manager.io, ShippedIoCost)
    assert ReplicaManager(tiers=[MemoryTier(capacity_bytes=1 << 20)], io="constant").io is None


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))  # a loaded 2-core CI machine
    try:
        path = f"{root}/ckpt"
        ucp.save(_state(rank), path, spec=_spec(rank), process_group=dist.group.WORLD,
                 store_options=StoreOptions(pack_max_bytes=256 << 10))  # several arrays per rank
        # rank 2's node serves reads 100x slower; rank 3 has a disk tier only
        tiers = [DiskTier(f"{root}/tier{rank}", capacity_bytes=64 << 20)] if rank == 3 else [
            MemoryTier(capacity_bytes=64 << 20)]
        manager = ReplicaManager(tiers=tiers, replicas=2, node=f"n{rank}", policy=GreedyForecast(),
                                 speed=0.01 if rank == 2 else 1.0, process_group=dist.group.WORLD)
        rmap = manager.replicate(path)
        peers = [(h.rank, h.tier) for r in rmap.arrays.values() for h in r.holders if h.rank != r.owner]
        assert peers and all(r != 2 for r, _ in peers)  # nothing placed on the slow node
        assert {t for r, t in peers if r == 3} == {"disk"}  # what rank 3 took went to the tier it has
        assert all(len(r.holders) == 3 for r in rmap.arrays.values())  # the owner's copy and two peers
        out = ucp.load(path, spec=_spec(rank), rank=rank)
        assert all(bool((out[k] == _state(rank)[k]).all()) for k in ("w", "big", "small"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_live_replicas_follow_node_speed_and_capacity(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
