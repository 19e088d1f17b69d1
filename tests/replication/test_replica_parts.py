"""Replica tiers, the replica map, planning and a single-process round trip (no process group needed)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import torch

import ucp
from ucp.stores.options import StoreOptions
from ucp.replication.errors import PlacementError, ReplicaCapacityError
from ucp.replication.policies import GroupPlacement, StaticRandom
from ucp.replication.replica_files import CheckpointFiles
from ucp.replication.replica_map import REPLICA_MAP_NAME, ArrayRecord, FileRecord, Holder, ReplicaMap
from ucp.replication.replica_plan import RankInfo, node_ranks, plan_replication
from ucp.replication.replica_tiers import CheckpointMeta, DiskTier, MemoryTier, ReplicaTier
from ucp.replication.replica_transfer import Transfer, rounds
from ucp.replication.replicas import ReplicaManager
from ucp.errors import ManifestError
from ucp.stores import FsspecStore


def _meta(gen: int, path: str = "/c") -> CheckpointMeta:
    return CheckpointMeta(path=path, generation=gen, manifest=b"{}", replica_map=b"{}")


@pytest.mark.parametrize("make", [lambda tmp: MemoryTier(capacity_bytes=1000),
                                  lambda tmp: DiskTier(tmp / "tier", capacity_bytes=1000),
                                  lambda tmp: ReplicaTier(FsspecStore(f"memory://tier-{uuid.uuid4().hex}"), tier="disk",
                                                          capacity_bytes=1000)],
                         ids=["memory", "disk", "any-store"])
def test_tier_evicts_older_checkpoints_first_and_refuses_what_never_fits(tmp_path, make):
    tier = make(tmp_path)
    for gen in (1, 2, 3):
        tier.put_meta(f"ck{gen}", _meta(gen))
        tier.put(f"ck{gen}", "r0/a", bytes([gen]) * 300)
    assert tier.checkpoints() == ["ck1", "ck2", "ck3"] and tier.bytes_held() == 3 * 306
    tier.put_meta("ck4", _meta(4))
    tier.put("ck4", "r0/a", b"x" * 300)  # ck1 goes, the oldest
    assert tier.checkpoints() == ["ck2", "ck3", "ck4"]
    assert tier.get("ck3", "r0/a") == bytes([3]) * 300 and tier.get("ck1", "r0/a") is None
    with pytest.raises(ReplicaCapacityError) as err:
        tier.put("ck4", "r0/b", b"y" * 995)
    assert str(err.value) == (f"{tier.tier} replica tier: 995 more bytes for checkpoint ck4 do not fit in 1000 bytes "
                              "(306 held after evicting older checkpoints); raise capacity_bytes or place fewer "
                              "replicas here")
    assert isinstance(err.value, MemoryError)
    tier.discard("ck4", "r0/a")
    assert not tier.has("ck4", "r0/a") and tier.checkpoint_bytes("ck4") == 6


def test_a_memory_tier_frees_its_bytes_when_it_goes():
    import gc

    tier = MemoryTier(capacity_bytes=1000)
    tier.put_meta("ck", _meta(1))
    tier.put("ck", "r0/a", b"x" * 100)
    store = tier.store
    assert store.exists("ck")
    del tier
    gc.collect()
    assert not store.exists("ck") and not store.exists()


def test_disk_tier_outlives_its_process(tmp_path):
    tier = DiskTier(tmp_path / "t", capacity_bytes=10_000)
    tier.put_meta("ck", CheckpointMeta("/c/step_1", 5, b'{"a":\n1}', b'{"m": 2}'))
    tier.put("ck", "r1/000002-w", b"abc")
    again = DiskTier(tmp_path / "t", capacity_bytes=10_000)
    assert again.get("ck", "r1/000002-w") == b"abc"
    assert again.get_meta("ck") == CheckpointMeta("/c/step_1", 5, b'{"a":\n1}', b'{"m": 2}')
    assert again.bytes_held() == tier.bytes_held()


def test_replica_map_round_trips_and_rejects_damage():
    rec = ArrayRecord("r0/a", 0, "d1" * 8, (FileRecord("zarr.json", 5, "f1" * 8), FileRecord("c.0", 7, "f2" * 8)),
                      (Holder(0, "memory"), Holder(2, "disk")))
    rmap = ReplicaMap(checkpoint="ab", path="/c", generation=3, policy="group", nodes=("n0", "n1", "n2"),
                      arrays={"r0/a": rec})
    text = rmap.to_json()
    assert ReplicaMap.from_json(text) == rmap
    assert json.loads(text)["arrays"]["r0/a"]["bytes"] == 12
    with pytest.raises(ManifestError) as err:
        ReplicaMap.from_json(text.replace('"replica_map_version": 1', '"replica_map_version": 9'))
    assert str(err.value) == ("replicas.json: not a replica map this version reads (replica_map_version must be 1, "
                              "got 9); replicate the checkpoint again")


def _records(owners):
    return {f"r{o}/a{i}": ArrayRecord(f"r{o}/a{i}", o, "d", (FileRecord("zarr.json", 100, "d"),))
            for i, o in enumerate(owners)}


def test_plan_places_owner_copy_then_peers_on_other_nodes_and_skips_what_is_held():
    # 4 ranks on 2 nodes: a replica never lands on the owner's node
    infos = [RankInfo(rank=r, node=f"n{r // 2}", free={"memory": 1000, "disk": 0}) for r in range(4)]
    assert node_ranks(infos) == [[0, 1], [2, 3]]
    holders, transfers = plan_replication(_records([0, 1, 2, 3]), infos, policy=GroupPlacement(), replicas=1)
    for key, hs in holders.items():
        owner = int(key[1])
        assert hs[0] == Holder(owner, "memory")
        assert [h.rank // 2 for h in hs[1:]] == [1 - owner // 2]
    assert sum(t.source == t.dest for t in transfers) == 4 and len(transfers) == 8
    # a re-replication where rank 2 already holds everything it is placed: only the rest moves
    held = {k: "memory" for k, hs in holders.items() if any(h.rank == 2 for h in hs)}
    infos[2] = RankInfo(rank=2, node="n1", free={"memory": 1000 - 100 * len(held), "disk": 0}, held=held)
    _, again = plan_replication(_records([0, 1, 2, 3]), infos, policy=GroupPlacement(), replicas=1)
    assert not any(t.dest == 2 for t in again)


def test_plan_uses_disk_when_memory_is_full_and_refuses_an_impossible_placement():
    infos = [RankInfo(rank=r, node=f"n{r}", free={"memory": 100, "disk": 1000}) for r in range(3)]
    holders, _ = plan_replication(_records([0, 0]), infos, policy=StaticRandom(seed=1), replicas=1)
    assert [h.tier for h in holders["r0/a0"]] == ["memory", "memory"]
    assert holders["r0/a1"][0] == Holder(0, "disk")
    full = [RankInfo(rank=r, node=f"n{r}", free={"memory": 10, "disk": 10}) for r in range(2)]
    with pytest.raises(PlacementError):
        plan_replication(_records([0]), full, policy=GroupPlacement(), replicas=1)


def test_transfer_rounds_bound_bytes():
    ts = [Transfer(0, 1, f"k{i}", 40) for i in range(5)]
    assert [[i for i, _ in r] for r in rounds(ts, round_bytes=100)] == [[0, 1], [2, 3], [4]]


def test_one_process_rebuilds_a_deleted_checkpoint_from_its_own_tier(tmp_path):
    torch.manual_seed(0)
    state = {"w": torch.randn(100, 1024), "b": torch.randn(3), "step": 7}  # w: its own array; b: packed
    path = str(tmp_path / "ck")
    ucp.save(state, path, store_options=StoreOptions(pack_max_bytes=256 << 10))  # format 3 would pack w too
    replicas = ReplicaManager(tiers=[MemoryTier(capacity_bytes=1 << 20)], replicas=0)
    rmap = replicas.replicate(path)
    assert ucp.verify(path).ok  # replicas.json beside the manifest does not disturb verify
    on_disk = ReplicaMap.from_json(CheckpointFiles(path).read(REPLICA_MAP_NAME))
    assert on_disk == rmap and all(r.holders == (Holder(0, "memory"),) for r in rmap.arrays.values())
    shutil.rmtree(path)
    report = replicas.recover(path)
    assert report.manifest_restored and len(report.repaired) == len(rmap.arrays) == report.arrays
    loaded = ucp.load(path)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"]) and loaded["step"] == 7
    assert ucp.verify(path).ok
    # an intact checkpoint is left alone
    assert replicas.recover(path).repaired == ()
    # a missing chunk file comes back from the tier
    key = next(k for k in rmap.arrays if k.endswith("-w"))
    os.remove(os.path.join(path, "data", key, rmap.arrays[key].files[1].name))
    assert [k for k, _, _ in replicas.recover(path).repaired] == [key]
    assert torch.equal(ucp.load(path)["w"], state["w"])


@pytest.mark.parametrize("async_save", [False, True])
def test_checkpoint_manager_replicates_each_commit_and_restores_a_lost_directory(tmp_path, async_save):
    from ucp.manager import CheckpointManager
    from ucp.policies import KeepLast

    tier = MemoryTier(capacity_bytes=4 << 20)
    manager = CheckpointManager(tmp_path / "run", retention=KeepLast(1), async_save=async_save,
                                replicas=ReplicaManager(tiers=[tier], replicas=0))
    for step in (1, 2):
        manager.save(step, {"w": torch.full((300, 300), float(step)), "step": step})
    manager.wait()
    assert [tier.get_meta(ck).path for ck in tier.checkpoints()] == [manager.path_for(2)]  # keep=1
    shutil.rmtree(tmp_path / "run")
    into = {"w": torch.zeros(300, 300), "step": 0}
    assert manager.restore(into=into) == 2
    assert torch.equal(into["w"], torch.full((300, 300), 2.0)) and into["step"] == 2


def test_every_policy_plans_real_replicas_across_racks():
    from ucp.replication.policies import baseline_policies
    from ucp.replication.rl_policy import RLPolicy

    records = _records(range(8))
    infos = [RankInfo(rank=r, node=f"n{r}", rack=r // 2, free={"memory": 300, "disk": 1000}) for r in range(8)]
    for policy in [*baseline_policies(seed=0), RLPolicy.load()]:
        holders, transfers = plan_replication(records, infos, policy=policy, replicas=2)
        for key, hs in holders.items():
            owner = int(key[1])
            assert hs[0] == Holder(owner, "memory"), policy.name
            assert len(hs) >= 2 and len({h.rank for h in hs}) == len(hs) and owner not in {h.rank for h in hs[1:]}
        assert sum(len(hs) - 1 for hs in holders.values()) <= 2 * len(records), policy.name  # the budget
        assert len(transfers) == sum(len(hs) for hs in holders.values())


def test_verify_store_repairs_a_bit_flip_that_sizes_cannot_see(tmp_path):
    state = {"w": torch.arange(100 * 1024, dtype=torch.float32)}
    path = str(tmp_path / "ck")
    ucp.save(state, path)
    tier = MemoryTier(capacity_bytes=1 << 20)
    rmap = ReplicaManager(tiers=[tier], replicas=0).replicate(path)
    (key, rec), = rmap.arrays.items()
    chunk = os.path.join(path, "data", key, rec.files[1].name)
    raw = bytearray(Path(chunk).read_bytes())
    raw[100] ^= 0x01
    Path(chunk).write_bytes(bytes(raw))
    assert ReplicaManager(tiers=[tier], replicas=0).recover(path).repaired == ()  # same size: not seen
    with pytest.raises(ucp.ChecksumError):
        ucp.load(path)
    report = ReplicaManager(tiers=[tier], replicas=0, verify_store=True).recover(path)
    assert report.repaired == ((key, 0, "memory"),) and report.corrupt_replicas == ()
    assert torch.equal(ucp.load(path)["w"], state["w"])
