"""Ranks sharing one staging area (no process group) never touch each other's files.

Regression: a rank's pre-commit sync walked the whole shared staging tree and
fsynced other ranks' files, which come and go while they write (temporary part
files); one vanished file failed that rank, whose cleanup then removed the
shared staging area under every other rank.
"""

import os

import torch

import ucp
from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.stores import open_store


def test_sync_stays_inside_this_ranks_directory(tmp_path):
    root = tmp_path / "staging"
    (root / "data" / "r0").mkdir(parents=True)
    (root / "data" / "r0" / "chunk").write_bytes(b"x")
    (root / "data" / "r1").mkdir()
    # Another rank's file that is gone by the time anyone opens it (a dangling link).
    os.symlink(root / "data" / "r1" / "vanished.tmp", root / "data" / "r1" / "part.json.tmp-123")
    storage = open_store(str(root))
    storage.sync(under="data/r0")  # must not look at r1


def test_ranks_saving_one_checkpoint_without_a_process_group(tmp_path):
    path = tmp_path / "c"
    world, whole = 4, torch.arange(24.0).reshape(8, 3)
    for rank in range(world):  # each rank's writer would run in its own process; order does not matter
        rows = Box((2 * rank, 0), (2, 3))
        spec = FragmentMap(rank=rank, logical={"w": LogicalTensor("w", (8, 3), "float32")},
                           tensors={"w": TensorSpec("w", (ShardPiece("w", Box((0, 0), (2, 3)), rows),))})
        ucp.save({"w": whole[rows.slices()].clone()}, path, rank=rank, world_size=world, spec=spec)
    assert not (path / "manifest.json").exists()  # nothing is a checkpoint until finalize
    ucp.finalize(str(path), world_size=world)
    assert torch.equal(ucp.load(path)["w"], whole)
