"""Sharded metadata (format 2): groups of ranks write shards, rank 0 commits a root, loads read what they need.

Five real gloo processes save with ``metadata_shard_min_ranks=1``, so they form
groups of ceil(sqrt(5)) = 3 ranks: [0, 1, 2] and [3, 4]. The checkpoints they
write are then damaged on purpose, one way per test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.integrations.launch import free_port
import ucp
from ucp.commit import find_manifest, read_manifest
from ucp.coverage_weight import PRIME, CoverageWeights
from ucp.geometry import Box, FlatRange
from ucp.metadata_shards import GroupPlan, root_manifest, write_group_shard
from ucp.parts import new_part
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.stores import StoreOptions

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("sharded_metadata")

GOLDEN = Path(__file__).resolve().parent / "golden"
WORLD = 5
SHARDED = StoreOptions(metadata_shard_min_ranks=1)
W = torch.arange(50 * 4, dtype=torch.float32).reshape(50, 4)  # row-split over the 5 ranks
STAGE_A = torch.arange(12.0)  # held by ranks 0-2 only (like one pipeline stage), split 3 ways
STAGE_B = torch.arange(8.0) * -1  # held by ranks 3-4 only, split 2 ways


def _piece(name: str, shape: tuple, box: Box, *, replica: int = 0, replicas: int = 1) -> TensorSpec:
    local = Box((0,) * len(shape), box.sizes)
    return TensorSpec(name, (ShardPiece(name, local, box),), replica=replica, replicas=replicas)


def _state_and_spec(rank: int) -> tuple[dict, FragmentMap]:
    rows = Box((rank * 10, 0), (10, 4))
    logical = {"w": LogicalTensor("w", (50, 4), "float32")}
    tensors = {"w": _piece("w", (50, 4), rows)}
    state = {"w": W[rows.slices()].clone(), "step": 7, "rank": rank}
    if rank < 3:
        part = Box((rank * 4,), (4,))
        logical["a"] = LogicalTensor("a", (12,), "float32")
        tensors["a"] = _piece("a", (12,), part)
        state["a"] = STAGE_A[part.slices()].clone()
    else:
        part = Box(((rank - 3) * 4,), (4,))
        logical["b"] = LogicalTensor("b", (8,), "float32")
        tensors["b"] = _piece("b", (8,), part)
        state["b"] = STAGE_B[part.slices()].clone()
    return state, FragmentMap(rank=rank, logical=logical, tensors=tensors)


def _raises_everywhere(fn, cls, text: str) -> None:
    with pytest.raises(cls) as info:
        fn()
    assert text in str(info.value) or text in str(info.value.__cause__), str(info.value)


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        group = dist.group.WORLD
        state, spec = _state_and_spec(rank)
        result = ucp.save(state, f"{root}/good", spec=spec, process_group=group, store_options=SHARDED)
        assert result.committed
        # A rank loading only "b" reads the root and the one shard that holds "b".
        with ucp.CheckpointReader(f"{root}/good") as reader:
            assert torch.equal(reader.read_tensor("b"), STAGE_B)
            assert reader.manifest.tensors.shards_read == 1
            assert torch.equal(reader.read_tensor("w", Box((rank * 7, 1), (7, 2))), W[rank * 7: rank * 7 + 7, 1:3])
            assert reader.manifest.tensors.shards_read == 2
        whole = ucp.load(f"{root}/good")
        assert torch.equal(whole["w"], W) and torch.equal(whole["a"], STAGE_A) and torch.equal(whole["b"], STAGE_B)
        assert whole["rank"] == 0 and whole["step"] == 7
        # Each rank gets its own state tree back (from its group's shard).
        mine = ucp.load(f"{root}/good", spec=spec, rank=rank)
        assert mine["rank"] == rank and torch.equal(mine["w"], state["w"])
        # Replicas that differ across the two groups are refused on every rank.
        box = Box((0,), (2,))
        rep = FragmentMap(rank=rank, logical={"r": LogicalTensor("r", (2,), "float32")},
                          tensors={"r": _piece("r", (2,), box, replica=rank, replicas=WORLD)})
        _raises_everywhere(lambda: ucp.save({"r": torch.full((2,), float(rank >= 3))}, f"{root}/replicas",
                                            spec=rep, process_group=group, store_options=SHARDED),
                           ucp.ReplicaMismatchError, "replicas of 'r' [0:2] differ between ranks [0] vs [3]")
        # Ranks 1 and 3 (different groups) both write rows 10-20 and nobody writes rows 30-40: equal
        # counts, so only the coverage weights can tell.
        rows = Box((10 if rank == 3 else rank * 10, 0), (10, 4))
        bad = FragmentMap(rank=rank, logical={"w": LogicalTensor("w", (50, 4), "float32")},
                          tensors={"w": _piece("w", (50, 4), rows)})
        _raises_everywhere(lambda: ucp.save({"w": W[rows.slices()].clone()}, f"{root}/overlap", spec=bad,
                                            process_group=group, store_options=SHARDED),
                           ucp.CoverageError, "fragments of ranks in different groups overlap")

        # A rank that fails makes every rank fail, naming it.
        def failing():
            st = {"x": torch.zeros(2, dtype=torch.complex32) if rank == 4 else torch.zeros(2)}
            ucp.save(st, f"{root}/failed", process_group=group, store_options=SHARDED)
        _raises_everywhere(failing, ucp.UcpError,
                           "complex32" if rank == 4 else "save failed on rank 4: UnsupportedDtypeError")
        dist.barrier()
    finally:
        dist.destroy_process_group()


# Tests on the checkpoints of the five-process run: marked slow (the processes take ~30 s to start and save).
needs_processes = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    mp.spawn(_worker, args=(free_port(), str(root)), nprocs=WORLD, join=True)
    return root


@needs_processes
def test_five_ranks_write_two_shards_and_a_root(saved):
    root = json.loads((saved / "good" / "manifest.json").read_text())
    assert root["format_version"] == 4 and "states" not in root
    assert [s["ranks"] for s in root["shards"]] == [[0, 3], [3, 5]]
    assert root["tensors"]["a"]["shards"] == [0] and root["tensors"]["b"]["shards"] == [1]
    assert root["tensors"]["w"]["shards"] == [0, 1]
    for name in ("replicas", "overlap", "failed"):
        assert not (saved / name).exists()
    assert sorted(os.listdir(saved)) == ["good"]  # no staging left behind
    assert ucp.verify(saved / "good").ok
    from ucp.summary import describe

    summary = describe(saved / "good")  # ucp inspect
    assert summary.format_version == 4 and summary.world_size == 5 and len(summary.tensors) == 3


@needs_processes
def test_root_and_shard_match_golden(saved):
    """Pin format 4 (a sharded root) on disk (regenerate with UCP_REGEN_GOLDEN=1 after an intended change)."""
    root = json.loads((saved / "good" / "manifest.json").read_text())
    assert root.pop("created").endswith("+00:00")  # the only volatile field
    shard = json.loads((saved / "good" / root["shards"][1]["key"]).read_text())
    for name, actual in (("sharded-root.json", root), ("sharded-shard-1.json", shard)):
        path = GOLDEN / name
        if os.environ.get("UCP_REGEN_GOLDEN"):
            path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
        assert actual == json.loads(path.read_text()), name


def _damaged(saved, tmp_path, edit) -> str:
    path = tmp_path / "c"
    shutil.copytree(saved / "good", path)
    edit(path, json.loads((path / "manifest.json").read_text()))
    return str(path)


def _write_root(path, root: dict) -> None:
    (path / "manifest.json").write_text(json.dumps(root))


def _edit_shard(path, root: dict, change) -> None:
    shard = path / root["shards"][1]["key"]
    shard.write_bytes(change(shard.read_bytes()))


@needs_processes
@pytest.mark.parametrize("edit, message", [
    (lambda p, r: _edit_shard(p, r, lambda b: b.replace(b'"rank":4', b'"rank":3', 1)),
     "has {n} bytes with xxh3_64"),
    (lambda p, r: os.remove(p / r["shards"][1]["key"]), "is missing; the checkpoint is damaged"),
    (lambda p, r: _write_root(p, {**r, "shards": [{**r["shards"][0], "key": "../outside.json"}, r["shards"][1]]}),
     "shards[0]: field 'key' must be a relative path to a .json file"),
    (lambda p, r: _write_root(p, {**r, "shards": r["shards"][:1]}), "shards cover ranks 0..2 of world_size 5"),
    (lambda p, r: _write_root(p, {**r, "tensors": {**r["tensors"], "b": {**r["tensors"]["b"], "shards": [0]}}}),
     "holds no fragments of tensor 'b', which the root says it does"),
])
def test_damaged_sharded_metadata_is_refused(saved, tmp_path, edit, message):
    path = _damaged(saved, tmp_path, edit)
    with pytest.raises(ucp.ManifestError) as info:
        with ucp.CheckpointReader(path) as reader:
            reader.read_tensor("b")
    size = len((tmp_path / "c" / "data" / "meta" / "g00001.json").read_bytes()) if "{n}" in message else 0
    assert message.format(n=size) in str(info.value)
    assert not ucp.verify(path).ok


@needs_processes
def test_a_shard_claiming_another_groups_rank_is_refused(saved, tmp_path):
    """A shard whose digest is updated along with a forged fragment still may not speak for other ranks."""
    def forge(path, root):
        shard_path = path / root["shards"][1]["key"]
        shard = json.loads(shard_path.read_text())
        shard["tensors"]["b"][0]["rank"] = 1
        data = json.dumps(shard, separators=(",", ":")).encode()
        shard_path.write_bytes(data)
        from ucp.checksum import digest
        root["shards"][1].update(nbytes=len(data), xxh3_64=digest(data))
        _write_root(path, root)
    with pytest.raises(ucp.ManifestError, match="holds a fragment of rank 1, outside its ranks 3..4"):
        ucp.CheckpointReader(_damaged(saved, tmp_path, forge)).read_tensor("b")


@needs_processes
def test_a_root_parsed_without_its_store_says_how_to_open_it(saved):
    from ucp.manifest import Manifest

    manifest = Manifest.from_json((saved / "good" / "manifest.json").read_bytes())
    assert sorted(manifest.tensors) == ["a", "b", "w"] and manifest.header("w") == ("float32", (50, 4))
    with pytest.raises(ucp.ManifestError, match="open the checkpoint with ucp.commit.read_manifest"):
        manifest.tensors["w"]
    assert read_manifest(find_manifest(str(saved / "good"))).tensors["w"].numel == 200


# -- the checks of groups and root, without processes ---------------------------------------------------------------

def _part(rank: int, world: int, name: str, shape: tuple, region, *, digest: str | None = None) -> dict:
    part = new_part(rank=rank, world_size=world, checksum_algorithm=None)
    part["logical"][name] = {"dtype": "float32", "shape": list(shape)}
    region_dict = {"box": {"offsets": list(region.offsets), "sizes": list(region.sizes)}} if isinstance(region, Box) \
        else {"flat": {"start": region.start, "stop": region.stop}}
    part["fragments"][name] = [{"key": f"r{rank}/0", "rank": rank, "region": region_dict,
                                "nbytes": region.numel * 4, "chunk_rows": 1, "checksums": []}]
    if digest is not None:
        part["replica_digests"].append([name, region_dict, digest])
    part["state"] = {}
    return part


def _commit_groups(regions: list, shape: tuple) -> bytes:
    """Each region written by one rank; ranks grouped as a save of len(regions) ranks would group them."""
    world = len(regions)
    plan = GroupPlan(world)
    parts = [_part(r, world, "t", shape, region) for r, region in enumerate(regions)]
    written = {}
    summaries = [write_group_shard([parts[r] for r in plan.ranks(g)], index=g, ranks=plan.ranks(g), seed="s",
                                   key_prefix="", write=written.__setitem__) for g in range(plan.count)]
    return root_manifest(summaries, parts[0], seed="s", world_size=world, created=None)


def test_flat_ranges_and_boxes_of_one_tensor_tile_across_groups():
    regions = [FlatRange(0, 8), Box((1, 3), (1, 2)), FlatRange(10, 12), Box((2, 2), (1, 3)), Box((3, 0), (1, 5)),
               FlatRange(20, 20)]
    root = json.loads(_commit_groups(regions, (4, 5)))  # groups of ranks [0, 1, 2] and [3, 4, 5]
    assert root["tensors"]["t"]["shards"] == [0, 1]


@pytest.mark.parametrize("regions, message", [
    ([FlatRange(0, 8), Box((1, 3), (1, 2)), FlatRange(10, 12), Box((3, 0), (1, 5))],
     "its fragments hold 17 of 20 elements"),
    # groups [0, 1] and [2, 3]: no overlap inside a group, 20 elements in all, [3, 5) twice and [8, 10) never
    ([FlatRange(0, 5), FlatRange(10, 15), FlatRange(3, 8), FlatRange(15, 20)],
     "fragments of ranks in different groups overlap"),
])
def test_gaps_and_overlaps_across_groups_are_refused(regions, message):
    with pytest.raises(ucp.CoverageError, match=message):
        _commit_groups(regions, (4, 5))


def test_coverage_weights_add_up_only_for_exact_tilings():
    w = CoverageWeights("seed")
    shape = (6, 7, 3)
    halves = [Box((0, 0, 0), (3, 7, 3)), Box((3, 0, 0), (3, 7, 3))]
    assert sum(w.weight(b, shape) for b in halves) % PRIME == w.whole(shape)
    flat = [FlatRange(0, 50), FlatRange(50, 126)]
    assert sum(w.weight(r, shape) for r in flat) % PRIME == w.whole(shape)
    shifted = [Box((0, 0, 0), (3, 7, 3)), Box((2, 0, 0), (3, 7, 3))]  # row 2 twice, row 5 never
    assert sum(b.numel for b in shifted) == 126  # the counts agree; only the weight tells
    assert sum(w.weight(b, shape) for b in shifted) % PRIME != w.whole(shape)
    assert w.weight(FlatRange(0, 1), ()) == w.whole(())


@st.composite
def _cut_tensor(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    n = math.prod(shape)
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=6)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return shape, [FlatRange(a, b) for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=200, deadline=None)
@given(_cut_tensor(), st.data())
def test_coverage_weights_of_any_flat_partition_add_up_and_a_shifted_piece_does_not(cut, data):
    shape, ranges = cut
    w = CoverageWeights("hypothesis")
    assert sum(w.weight(r, shape) for r in ranges) % PRIME == w.whole(shape)
    movable = [i for i, r in enumerate(ranges) if r.start > 0]
    if movable:  # one range moved back by one element: same count, one element twice and one never
        i = data.draw(st.sampled_from(movable))
        moved = ranges[:i] + [FlatRange(ranges[i].start - 1, ranges[i].stop - 1)] + ranges[i + 1:]
        assert sum(w.weight(r, shape) for r in moved) % PRIME != w.whole(shape)


def test_a_shard_that_cannot_be_written_fails_the_save_instead_of_hanging_rank_0():
    """The leader's error travels in its summary: rank 0 raises it (and tells every rank) instead of waiting."""
    plan = GroupPlan(2)
    parts = [_part(r, 2, "t", (4,), Box((2 * r,), (2,))) for r in range(2)]

    def full_disk(key, data):
        raise OSError(28, "No space left on device")

    summaries = [write_group_shard([parts[r] for r in plan.ranks(g)], index=g, ranks=plan.ranks(g), seed="s",
                                   key_prefix="", write=full_disk) for g in range(plan.count)]
    with pytest.raises(OSError, match="No space left on device"):
        root_manifest(summaries, parts[0], seed="s", world_size=2, created=None)
