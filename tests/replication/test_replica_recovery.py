"""Peer replicas on 4 real gloo processes: SIGKILL ranks, corrupt replicas, lose the store, lose every copy.

One spawn runs the whole story (process start-up dominates the cost):

1. 4 ranks (4 nodes) save step 1 through ``CheckpointManager(replicas=...)``: each array
   goes to its owner's memory tier and to 2 peers (Gemini groups).
2. Ranks 1 and 3 are SIGKILLed; their arrays vanish from the checkpoint with them (the
   node-local storage they wrote). Two new processes take their ranks; the survivors
   keep their memory tiers and join a new process group. ``restore`` brings the lost
   arrays back from the survivors' memory: bitwise equal, and re-replicated.
3. A rank-0 array is deleted from the store and rank 0 drops its own copy; the first
   peer holding it has a corrupt copy: a warning names it, the next copy is used.
4. The whole checkpoint directory (the remote store) is deleted: restored from peers only,
   and ``ucp verify`` passes on the result.
5. The directory is deleted again and every copy of one array is dropped: every rank
   raises ``ReplicaLostError`` naming it, and no manifest is written.

A second test keeps replicas on local-disk tiers, ends every process, deletes the
store and restores from the disks with new processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
import ucp
from ucp.stores.options import StoreOptions
import ucp.write_units
from ucp.replication.errors import ReplicaLostError, ReplicaWarning
from ucp.replication.replica_map import REPLICA_MAP_NAME, ReplicaMap
from ucp.replication.replica_tiers import DiskTier, MemoryTier
from ucp.replication.replicas import ReplicaManager
from ucp.geometry import Box
from ucp.manager import CheckpointManager
from ucp.sharding import split_fragment_map
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

WORLD = 4
BIG = 256 * 1024 + 5  # float32: ~1 MiB; with SPREAD_MIN_BYTES lowered in the workers its 4 replicas split the writes
LOST = (1, 3)
TIMEOUT = 90


def _full() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 6, generator=g), "big": torch.randn(BIG, generator=g),
            "small": torch.randn(3, generator=g)}


def _spec(rank: int) -> FragmentMap:
    logical = {"w": LogicalTensor("w", (8, 6), "float32"), "big": LogicalTensor("big", (BIG,), "float32"),
               "small": LogicalTensor("small", (3,), "float32")}
    tensors = dict(split_fragment_map({"w": logical["w"]}, rank=rank, world_size=WORLD).tensors)
    for name in ("big", "small"):  # replicated over every rank, like data parallelism
        box = Box.full(logical[name].shape)
        tensors[name] = TensorSpec(name, (ShardPiece(name, box, box),), replica=rank, replicas=WORLD)
    return FragmentMap(rank=rank, logical=logical, tensors=tensors)


def _state(rank: int, *, empty: bool = False) -> dict:
    full = _full()
    w = full["w"][2 * rank:2 * rank + 2].clone()
    state = {"w": w, "big": full["big"].clone(), "small": full["small"].clone(), "step": 1}
    if empty:
        state = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}
    return state


# Replication places copies per array; format 3 packs a rank's fragments into one array, so
# these tests pack only small fragments (as format 1 did) to place several arrays per rank.
ARRAY_PER_FRAGMENT = StoreOptions(pack_max_bytes=256 << 10)


def _manager(root: str, rank: int, tier) -> CheckpointManager:
    replicas = ReplicaManager(tiers=[tier], replicas=2, node=f"n{rank}")
    return CheckpointManager(f"{root}/ckpt", process_group=dist.group.WORLD, replicas=replicas,
                             save_options={"spec": _spec(rank), "store_options": ARRAY_PER_FRAGMENT})


def _init(rank: int, port: int) -> None:
    # Parts of at least 64 KiB instead of 4 MiB, so a 1 MiB replicated tensor is written by all four
    # ranks (each owns an array of it) while the test stays small.
    ucp.write_units.SPREAD_MIN_BYTES = 64 << 10
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=TIMEOUT))


def _restore_equal(manager: CheckpointManager, rank: int) -> list[str]:
    """Restore into zeros, check bitwise equality, return the replica warnings this rank saw."""
    into = _state(rank, empty=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert manager.restore(into=into, spec=_spec(rank)) == 1
    expected = _state(rank)
    for key in ("w", "big", "small"):
        assert torch.equal(into[key], expected[key]), key
    assert into["step"] == 1
    return [str(w.message) for w in caught if issubclass(w.category, ReplicaWarning)]


def _rmap(manager: CheckpointManager) -> ReplicaMap:
    return ReplicaMap.from_json(Path(manager.path_for(1), REPLICA_MAP_NAME).read_bytes())


def _after_restart(rank: int, root: str, tier: MemoryTier, out: dict) -> None:
    manager = _manager(root, rank, tier)
    path = manager.path_for(1)
    # 2. lost ranks: their arrays come back from the survivors' memory
    out["restart_warnings"] = _restore_equal(manager, rank)
    rmap = _rmap(manager)
    out["holders_after_restart"] = sorted(len(r.holders) for r in rmap.arrays.values())
    out["verify_after_restart"] = [p.message for p in ucp.verify(path).problems]
    dist.barrier()
    # 3. a corrupt replica is skipped for the next one
    key = next(k for k, r in rmap.arrays.items() if r.owner == 0)
    peers = sorted(h.rank for h in rmap.arrays[key].holders if h.rank != 0)
    if rank == 0:
        shutil.rmtree(Path(path, "data", key))
        tier.discard(rmap.checkpoint, key)
    if rank == peers[0]:
        tier.corrupt(rmap.checkpoint, key)
    dist.barrier()
    out["corrupt_warnings"] = _restore_equal(manager, rank)
    out["corrupt"] = {"key": key, "bad": peers[0], "path": path, "checkpoint": rmap.checkpoint}
    dist.barrier()
    # 4. the remote store is gone: peers only
    if rank == 0:
        shutil.rmtree(f"{root}/ckpt")
    dist.barrier()
    _restore_equal(manager, rank)
    out["verify_after_store_loss"] = ucp.verify(path).ok
    dist.barrier()
    # 5. every copy of one array is gone
    lost_key = next(k for k, r in _rmap(manager).arrays.items() if r.owner == 2 and k.endswith("-big"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(f"{root}/ckpt")
    tier.discard(rmap.checkpoint, lost_key)
    dist.barrier()
    try:
        manager.replicas.recover(path)
    except ReplicaLostError as err:
        out["lost_error"] = str(err)
    out["lost_key"] = lost_key
    out["manifest_after_loss"] = os.path.exists(os.path.join(path, "manifest.json"))
    dist.barrier()
    # ... and a restore does not fail on it forever: it warns and goes on (here: no other checkpoint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["restore_after_loss"] = manager.restore(into=_state(rank, empty=True), spec=_spec(rank))
    out["restore_warnings"] = [str(w.message) for w in caught if issubclass(w.category, ReplicaWarning)]
    dist.barrier()


def _write(root: str, rank: int, out: dict) -> None:
    Path(root, f"out-{rank}.json").write_text(json.dumps(out))


def _survivor(rank: int, port: int, port2: int, root: str) -> None:
    _init(rank, port)
    tier = MemoryTier(capacity_bytes=16 << 20)
    manager = _manager(root, rank, tier)
    manager.save(1, _state(rank))
    dist.barrier()
    Path(root, f"ready-{rank}").write_text("")
    if rank in LOST:
        time.sleep(TIMEOUT)  # SIGKILLed here
        return
    while not Path(root, "go").exists():
        time.sleep(0.05)
    dist.destroy_process_group()  # the old group lost two members: a new one, new port
    _init(rank, port2)
    out: dict = {}
    try:
        _after_restart(rank, root, tier, out)
    finally:
        _write(root, rank, out)
        dist.destroy_process_group()


def _replacement(index: int, port2: int, root: str) -> None:
    rank = LOST[index]
    _init(rank, port2)
    out: dict = {}
    try:
        _after_restart(rank, root, MemoryTier(capacity_bytes=16 << 20), out)
    finally:
        _write(root, rank, out)
        dist.destroy_process_group()


def _join(procs, deadline: float) -> None:
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "workers did not finish in time"
    assert [p.exitcode for p in procs] == [0] * len(procs)


@pytest.mark.slow
def test_sigkilled_ranks_corrupt_replicas_and_a_lost_store_recover_from_peers(tmp_path):
    root = str(tmp_path)
    port, port2 = free_port(), free_port()
    first = mp.start_processes(_survivor, args=(port, port2, root), nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + 150
    while not all(Path(root, f"ready-{r}").exists() for r in range(WORLD)):
        assert time.monotonic() < deadline and all(p.is_alive() for p in first.processes), "first run failed"
        time.sleep(0.05)
    step = Path(root, "ckpt", "step_00000001")
    rmap = ReplicaMap.from_json((step / REPLICA_MAP_NAME).read_bytes())
    assert ucp.verify(str(step)).ok
    for rank in LOST:
        os.kill(first.processes[rank].pid, signal.SIGKILL)
        first.processes[rank].join()
        for key, rec in rmap.arrays.items():  # their node-local files die with them
            if rec.owner == rank:
                shutil.rmtree(step / "data" / key)
    second = mp.start_processes(_replacement, args=(port2, root), nprocs=len(LOST), join=False,
                                start_method="spawn")
    Path(root, "go").write_text("")
    _join([p for r, p in enumerate(first.processes) if r not in LOST] + list(second.processes), deadline)
    outs = {r: json.loads(Path(root, f"out-{r}.json").read_text()) for r in range(WORLD)}
    # 2. nothing lost, every array back to its owner copy plus 2 peers
    for out in outs.values():
        assert out["restart_warnings"] == [] and out["verify_after_restart"] == []
        assert out["holders_after_restart"] == [3] * len(rmap.arrays)
    # 3. the corrupt copy was named once, by the rank that wrote the array back (rank 0)
    bad = outs[0]["corrupt"]
    assert outs[0]["corrupt_warnings"][0].startswith(
        f"replica of array {bad['key']!r} of {bad['path']} on rank {bad['bad']} (memory tier) fails its checksum "
        "(xxh3_64 "), outs[0]["corrupt_warnings"]
    assert outs[0]["corrupt_warnings"][0].endswith("); reading the next copy")
    assert all(out["corrupt_warnings"] == [] for r, out in outs.items() if r != 0)
    # 4. the store was rebuilt from peers and verifies
    assert all(out["verify_after_store_loss"] for out in outs.values())
    # 5. every rank names the lost array; no manifest committed
    key = outs[0]["lost_key"]
    expected = (f"cannot recover {bad['path']}: 1 array(s) have no surviving copy: array {key!r} (tensor 'big', written "
                f"by rank 2): {bad['path']} has no manifest.json and no surviving rank holds a replica. Nothing was "
                "committed; restore an older checkpoint")
    assert [out.get("lost_error") for out in outs.values()] == [expected] * WORLD
    assert not any(out["manifest_after_loss"] for out in outs.values())
    assert [out["restore_after_loss"] for out in outs.values()] == [None] * WORLD
    assert [out["restore_warnings"] for out in outs.values()] == [[f"{expected}; the checkpoint is left as it is"]] * WORLD


def _disk_worker(rank: int, port: int, root: str, phase: str) -> None:
    _init(rank, port)
    try:
        tier = DiskTier(f"{root}/tier-{rank}", capacity_bytes=16 << 20)
        manager = _manager(root, rank, tier)
        if phase == "save":
            for step in (1, 2):
                state = _state(rank)
                state["step"] = step
                manager.save(step, state)
            assert len(tier.checkpoints()) == 1  # keep=1: step 1's replicas were evicted
        else:
            into = _state(rank, empty=True)
            assert manager.restore(into=into, spec=_spec(rank)) == 2
            expected = _state(rank)
            assert all(torch.equal(into[k], expected[k]) for k in ("w", "big", "small")) and into["step"] == 2
            assert manager.steps() == [2]
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_disk_tiers_outlive_every_process_and_rebuild_a_lost_store(tmp_path):
    root = str(tmp_path)
    for phase in ("save", "restore"):
        ctx = mp.start_processes(_disk_worker, args=(free_port(), root, phase), nprocs=WORLD, join=False,
                                 start_method="spawn")
        _join(ctx.processes, time.monotonic() + 120)
        if phase == "save":
            shutil.rmtree(f"{root}/ckpt")
