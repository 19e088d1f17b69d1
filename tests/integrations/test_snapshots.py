"""In-memory snapshots: saved every N steps, replicated, and only complete ones resumed from.

One process in a world of one (a gloo group over an in-memory store): the reshard's collectives
run for real, its peers are itself. The multi-process case is in stacks/test_hot_recovery.py.
"""

from __future__ import annotations

import pytest
import torch

from ucp.errors import InvalidArgumentError
from ucp.geometry import Box
from ucp.integrations.snapshots import SnapshotOptions, Snapshots
from ucp.replication.errors import ReplicaError
from ucp.replication.hot_reshard import reshard_from_memory
from ucp.spec import FragmentMap, ShardPiece, TensorSpec


def _target(logical):
    fmap = FragmentMap(rank=0, logical={"w": logical["w"]},
                       tensors={"w": TensorSpec("w", (ShardPiece("w", Box((0,), (6,)), Box((0,), (6,))),))})
    return fmap, {"w": torch.zeros(6)}


def test_snapshot_options_refuse_a_period_below_one_step():
    with pytest.raises(InvalidArgumentError, match=r"^snapshot every must be a whole number of steps >= 1, got 0$"):
        SnapshotOptions(every=0)


def test_only_a_snapshot_known_complete_is_resumed_from(world_of_one, tmp_path):
    snapshots = Snapshots(SnapshotOptions(every=2, directory=str(tmp_path / "snap")), save_options={})
    saved = {}
    for step in range(1, 6):
        path = snapshots.maybe_save(step, {"w": torch.arange(6.0) * step, "step": step})
        if path:
            saved[step] = path
    assert sorted(saved) == [2, 4] and snapshots.complete == set(saved.values())
    tree, into, _, report = reshard_from_memory(snapshots.tiers, _target, complete=snapshots.complete)
    assert tree["step"] == 4 and torch.equal(into["w"], torch.arange(6.0) * 4)
    assert report.elements == {"own": 6, "peer": 0, "storage": 0}
    # a step-4 snapshot whose replication no rank saw finish is passed over for the older, complete one
    tree, into, _, _ = reshard_from_memory(snapshots.tiers, _target, complete={saved[2]})
    assert tree["step"] == 2 and torch.equal(into["w"], torch.arange(6.0) * 2)
    with pytest.raises(ReplicaError, match="no surviving rank holds a completely replicated checkpoint in memory"):
        reshard_from_memory(snapshots.tiers, _target, complete=set())
