"""Rank parts (saves without a process group) are checked against their schema before finalize merges them."""

from __future__ import annotations

import json

import pytest
import torch

import ucp


def _two_ranks(path) -> None:
    for rank in range(2):
        ucp.save({"w": torch.full((2,), float(rank))}, path, spec=None, rank=rank, world_size=2)


def _part(path, rank: int):
    return path.parent / f".{path.name}.ucp-staging-shared" / "parts" / f"rank-{rank:05d}.json"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: {k: v for k, v in p.items() if k != "logical"}, "missing member 'logical'"),
    (lambda p: {**p, "rank": 0}, "member 'rank' is 0, but the file is rank 1's"),
    (lambda p: {**p, "world_size": 3}, "member 'world_size' is 3, but finalize was told world_size=2"),
    (lambda p: {**p, "fragments": {"w": [{"key": 1}]}}, "member 'fragments' is not a map of tensor name to a list of "
                                                        "fragments: fragment 0 of 'w': missing member 'rank'"),
    (lambda p: {**p, "logical": {"w": {"dtype": "float32", "shape": [-1]}}},
     "member 'logical' is not a map of tensor name to {\"dtype\", \"shape\"}: bad shape [-1] of 'w'"),
    (lambda p: {**p, "replica_digests": "x"}, "member 'replica_digests' is not a list of [name, region, digest]"),
    (lambda p: {**p, "fragments": {**p["fragments"], "ghost": []}},
     "member 'fragments' names 'ghost', which member 'logical' does not"),
    (lambda p: [1, 2], "not a JSON object"),
])
def test_a_damaged_part_is_refused_by_finalize_naming_the_file(tmp_path, edit, message):
    path = tmp_path / "c"
    _two_ranks(path)
    part = _part(path, 1)
    part.write_text(json.dumps(edit(json.loads(part.read_text()))))
    with pytest.raises(ucp.ManifestError) as err:
        ucp.finalize(path, world_size=2)
    assert str(err.value) == f"{part}: {message}; the rank's save is damaged - save that rank again"
    assert not (path / "manifest.json").exists()


def test_a_part_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "c"
    _two_ranks(path)
    _part(path, 0).write_bytes(b"\xff\x00{")
    with pytest.raises(ucp.ManifestError, match=r"rank-00000.json: not valid UTF-8 JSON \("):
        ucp.finalize(path, world_size=2)


def test_a_rank_that_failed_makes_finalize_say_why(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": torch.zeros(2)}, path, rank=0, world_size=2)
    with pytest.raises(ucp.UnsupportedTensorError):
        ucp.save({"w": torch.empty(2, device="meta")}, path, rank=1, world_size=2)
    with pytest.raises(ucp.UcpError) as err:
        ucp.finalize(path, world_size=2)
    assert str(err.value) == (
        "save failed on rank 1: UnsupportedTensorError: tensor 'w' is on the meta device and has no data; "
        "materialize it (e.g. module.to_empty(device='cpu'), then initialize or load it) before saving"
    )
    assert (_part(path, 0)).exists()  # a failing rank never deletes the other ranks' bytes


def test_a_rank_that_aborts_says_why_and_leaves_the_others_bytes(tmp_path):
    from ucp.writer import CheckpointWriter

    path = tmp_path / "c"
    ucp.save({"w": torch.zeros(2)}, path, rank=0, world_size=2)
    writer = CheckpointWriter(str(path), rank=1, world_size=2)
    writer.add("w", torch.ones(2))
    writer.abort("OSError: disk full")
    with pytest.raises(ucp.UcpError, match=r"^save failed on rank 1: OSError: disk full$"):
        ucp.finalize(path, world_size=2)
    assert _part(path, 0).exists()
    ucp.save({"w": torch.zeros(2)}, path, rank=1, world_size=2)  # the rank saves again: its part is replaced
    ucp.finalize(path, world_size=2)
    assert ucp.load(path)["w"].tolist() == [0.0, 0.0]


def test_finalize_replaces_a_checkpoint_when_the_ranks_were_told_to(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": torch.zeros(2)}, path)
    for rank in range(2):
        ucp.save({"w": torch.ones(2)}, path, rank=rank, world_size=2, overwrite=True)
    ucp.finalize(path, world_size=2)
    assert ucp.load(path)["w"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_finalize_needs_a_positive_world_size(tmp_path):
    with pytest.raises(ucp.InvalidArgumentError, match=r"world_size must be a positive integer \(the number of ranks "
                                                      r"that saved\), got 0"):
        ucp.finalize(tmp_path / "c", world_size=0)
