"""Distributed saves with 4 real processes on gloo: own fragments only, replicas, policies, errors.

One spawn runs every scenario in sequence (process start-up dominates the cost).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
import ucp
from ucp.geometry import Box
from ucp.sharding import split_fragment_map
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

WORLD = 4
BIG = 4 * 1024 * 1024  # float32 elements: 16 MiB, four parts of at least SPREAD_MIN_BYTES, so the 4 replicas split it


def _full() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(10, 6, generator=g), "big": torch.randn(BIG, generator=g), "small": torch.randn(3, generator=g)}


def _spec(rank: int) -> FragmentMap:
    logical = {
        "w": LogicalTensor("w", (10, 6), "float32"),
        "big": LogicalTensor("big", (BIG,), "float32"),
        "small": LogicalTensor("small", (3,), "float32"),
    }
    fmap = split_fragment_map({"w": logical["w"]}, rank=rank, world_size=WORLD)
    tensors = dict(fmap.tensors)
    for name in ("big", "small"):  # replicated over all 4 ranks (like dp)
        box = Box.full(logical[name].shape)
        tensors[name] = TensorSpec(name, (ShardPiece(name, box, box),), replica=rank, replicas=WORLD)
    return FragmentMap(rank=rank, logical=logical, tensors=tensors)


def _expect_error(fn, cls, text):
    try:
        fn()
    except cls as err:
        assert text in str(err), str(err)
    else:
        raise AssertionError(f"expected {cls.__name__}")


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    try:
        group = dist.group.WORLD
        full = _full()
        fmap = _spec(rank)
        w_local = full["w"][fmap.tensors["w"].pieces[0].target.slices()].clone()
        state = {"w": w_local, "big": full["big"].clone(), "small": full["small"].clone(),
                 "plain": torch.arange(4.0), "rank_info": {"rank": rank}}
        # 1. sharded + replicated save; only metadata crosses ranks.
        result = ucp.save(state, f"{root}/a", spec=fmap, process_group=group)
        assert result.committed and (result.manifest is not None) == (rank == 0)  # only rank 0 gathers the parts
        manifest = ucp.CheckpointReader(f"{root}/a").manifest
        mine = [f for t in manifest.tensors.values() for f in t.fragments if f.rank == rank]
        assert result.fragments == len(mine)
        # 2. every rank loads a different layout: 4 -> 2 along dim 1 (ranks 0, 1) and whole (ranks 2, 3).
        if rank < 2:
            target = split_fragment_map({"w": LogicalTensor("w", (10, 6), "float32")}, rank=rank, world_size=2, dim=1)
            out = ucp.load(f"{root}/a", spec=target)
            assert torch.equal(out["w"], full["w"][:, rank * 3 : rank * 3 + 3])
            assert out["rank_info"] == {"rank": rank}
        else:
            out = ucp.load(f"{root}/a")
            assert torch.equal(out["w"], full["w"]) and torch.equal(out["big"], full["big"])
        # 2b. 4 -> 3 ranks, uneven rows of w and ZeRO-style flat ranges of big (rank 3 loads nothing).
        if rank < 3:
            w_spec = split_fragment_map({"w": LogicalTensor("w", (10, 6), "float32")}, rank=rank, world_size=3)
            big_spec = split_fragment_map({"big": LogicalTensor("big", (BIG,), "float32")}, rank=rank, world_size=3,
                                          flat=True)
            target = FragmentMap(rank=rank, logical={**w_spec.logical, **big_spec.logical},
                                 tensors={**w_spec.tensors, **big_spec.tensors})
            out = ucp.load(f"{root}/a", spec=target)
            rows = w_spec.tensors["w"].pieces[0].target
            flat = big_spec.tensors["big"].pieces[0].target
            assert torch.equal(out["w"], full["w"][rows.slices()])
            assert torch.equal(out["big"], full["big"][flat.start : flat.stop])
        # 3. replicas that differ are refused on every rank, nothing committed.
        bad = {"plain": torch.full((2,), float(rank == 3))}
        _expect_error(lambda: ucp.save(bad, f"{root}/b", process_group=group), ucp.ReplicaMismatchError,
                      "replicas of 'plain' [0:2] differ between ranks [0, 1, 2] vs [3]")
        # 4. take-first keeps replica 0's values; average all-reduces.
        for policy, expected in (("take-first", 0.0), ("average", 1.5)):
            spec = FragmentMap(rank=rank, logical={"x": LogicalTensor("x", (2,), "float32")},
                               tensors={"x": TensorSpec("x", (ShardPiece("x", Box((0,), (2,)), Box((0,), (2,))),),
                                                        replica=rank, replicas=WORLD, policy=policy)})
            ucp.save({"x": torch.full((2,), float(rank))}, f"{root}/{policy}", spec=spec, process_group=group)
            assert torch.equal(ucp.load(f"{root}/{policy}")["x"], torch.full((2,), expected))
        # 5. a rank that fails mid-save makes every rank fail, and nothing is committed.
        def failing():
            st = {"w": torch.zeros(2, dtype=torch.complex32) if rank == 2 else torch.zeros(2)}
            ucp.save(st, f"{root}/c", process_group=group)
        _expect_error(failing, ucp.UcpError, "complex32" if rank == 2 else "save failed on rank 2: UnsupportedDtypeError")
        _dtensors(rank, root)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _dtensors(rank: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2))
    g = torch.Generator().manual_seed(1)
    full = {"a": torch.randn(5, 7, generator=g), "b": torch.randn(7, 3, generator=g),
            "c": torch.randn(4, generator=g), "d": torch.randn(9, 2, generator=g)}
    placements = {"a": [Shard(0), Shard(1)], "b": [Shard(0), Replicate()], "c": [Replicate(), Replicate()],
                  "d": [Shard(0), Shard(0)]}  # uneven everywhere; d is sharded twice along dim 0
    state = {"model": {k: distribute_tensor(full[k], mesh, placements[k]) for k in full}, "step": 3}
    ucp.save(state, f"{root}/dt", process_group=dist.group.WORLD)
    manifest = ucp.CheckpointReader(f"{root}/dt").manifest
    assert {k: v.shape for k, v in manifest.tensors.items()} == {f"model/{k}": tuple(v.shape) for k, v in full.items()}
    assert len(manifest.tensors["model/c"].fragments) == 1  # replicated: written once
    # Load into another layout: a 1-d mesh of 4, sharded along dim 1 / dim 0.
    mesh4 = init_device_mesh("cpu", (4,))
    into = {"model": {k: distribute_tensor(torch.zeros_like(v), mesh4, [Shard(1 if v.dim() > 1 else 0)])
                      for k, v in full.items()}, "step": 0}
    out = ucp.load(f"{root}/dt", into=into)
    assert out["step"] == 3
    for k, v in full.items():
        assert out["model"][k] is into["model"][k]
        assert torch.equal(into["model"][k].full_tensor(), v), k
    whole = ucp.load(f"{root}/dt")  # no process group needed to read everything
    assert all(torch.equal(whole["model"][k], v) for k, v in full.items())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_four_process_save_and_reshard(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    big = manifest["tensors"]["big"]["fragments"]
    assert sorted(f["rank"] for f in big) == [0, 1, 2, 3]  # spread over the replicas
    assert sum(f["nbytes"] for f in big) == BIG * 4  # ... and written once in total
    assert len(manifest["tensors"]["small"]["fragments"]) == 1
    assert [f["rank"] for f in manifest["tensors"]["w"]["fragments"]] == [0, 1, 2, 3]
    assert manifest["world_size"] == 4 and sorted(manifest["states"]) == ["0", "1", "2", "3"]
    for name in ("b", "c"):
        assert not (tmp_path / name).exists()
    assert sorted(os.listdir(tmp_path)) == ["a", "average", "dt", "take-first"]  # no staging left behind
