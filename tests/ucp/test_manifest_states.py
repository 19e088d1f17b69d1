"""Identical per-rank state trees are stored once (`$same_as`) and read back per rank."""

import json

import pytest
import torch

import ucp
from ucp.errors import ManifestError
from ucp.geometry import Box
from ucp.manifest import Manifest
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec


def test_round_trip_dedupes_identical_trees():
    trees = {0: {"step": 3, "lr": [0.1]}, 1: {"step": 3, "lr": [0.1]}, 2: {"step": 4}, 3: {"step": 3, "lr": [0.1]}}
    text = Manifest(tensors={}, states=trees, world_size=4).to_json()
    assert json.loads(text)["states"] == {"0": trees[0], "1": {"$same_as": 0}, "2": trees[2], "3": {"$same_as": 0}}
    assert Manifest.from_json(text).states == trees


@pytest.mark.parametrize("ref", [1, 5, -1, True, "0", None])
def test_bad_references_are_rejected(ref):
    data = json.loads(Manifest(tensors={}, states={0: {"a": 1}}, world_size=2).to_json())
    data["states"]["1"] = {"$same_as": ref}
    with pytest.raises(ManifestError, match=r"states\[1\] refers to .*, which is not a lower rank's tree"):
        Manifest.from_json(json.dumps(data))


def test_ranks_with_equal_trees_write_one_copy(tmp_path):
    path, world = tmp_path / "c", 4
    for rank in range(world):
        spec = FragmentMap(rank=rank, logical={"w": LogicalTensor("w", (4, 2), "float32")},
                           tensors={"model/w": TensorSpec("model/w", (ShardPiece("w", Box((0, 0), (1, 2)),
                                                                                  Box((rank, 0), (1, 2))),))})
        state = {"model": {"w": torch.full((1, 2), float(rank))}, "step": 7, "data": {"epoch": rank // 2}}
        ucp.save(state, path, rank=rank, world_size=world, spec=spec)
    ucp.finalize(str(path), world_size=world)
    stored = json.loads((path / "manifest.json").read_text())["states"]
    assert stored["1"] == {"$same_as": 0} and stored["3"] == {"$same_as": 2} and "$same_as" not in stored["2"]
    reader = ucp.CheckpointReader(str(path))
    assert [reader.manifest.states[r]["data"]["epoch"] for r in range(world)] == [0, 0, 1, 1]
