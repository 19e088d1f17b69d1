"""DTensor placements -> the box each rank holds (pure: no process group needed)."""

from __future__ import annotations

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard

import ucp
from ucp.dtensor import dtensor_box
from ucp.geometry import Box, coverage_gaps

CASES = [
    # shape, placements, mesh shape
    ((5, 7), [Shard(0), Shard(1)], (2, 2)),
    ((7, 3), [Shard(0), Replicate()], (2, 2)),
    ((9, 2), [Shard(0), Shard(0)], (2, 2)),  # dim 0 split twice, unevenly
    ((3, 4), [Shard(0)], (4,)),  # more shards than rows: one rank holds nothing
    ((4,), [Replicate(), Replicate()], (2, 2)),
    ((6, 5), [Shard(-1), Shard(0)], (3, 2)),
]


@pytest.mark.parametrize("shape,placements,mesh", CASES, ids=[str(c[1]) for c in CASES])
def test_dtensor_boxes_tile_the_tensor_once_per_replica_group(shape, placements, mesh):
    coords = [(a, b) for a in range(mesh[0]) for b in range(mesh[1])] if len(mesh) == 2 else [(a,) for a in range(mesh[0])]
    by_replica: dict[int, list[Box]] = {}
    replicas = set()
    for c in coords:
        box, replica, count = dtensor_box(shape, placements, mesh, c)
        by_replica.setdefault(replica, []).append(box)
        replicas.add(count)
    assert len(replicas) == 1 and len(by_replica) == replicas.pop()
    for boxes in by_replica.values():
        assert coverage_gaps([b for b in boxes if not b.is_empty()], shape) == (0, [])


def test_dtensor_split_matches_torch_chunking():
    # 9 rows over 2 then 2: ceil(9/2)=5 -> [0:5], [5:9]; then [0:3], [3:5], [5:7], [7:9]
    boxes = [dtensor_box((9, 2), [Shard(0), Shard(0)], (2, 2), (a, b))[0] for a in range(2) for b in range(2)]
    assert [str(b) for b in boxes] == ["[0:3, 0:2]", "[3:5, 0:2]", "[5:7, 0:2]", "[7:9, 0:2]"]
    assert str(dtensor_box((3, 4), [Shard(0)], (4,), (3,))[0]) == "[3:3, 0:4]"


def test_partial_placement_is_refused():
    with pytest.raises(ucp.UcpError) as err:
        dtensor_box((4,), [Partial()], (2,), (0,), key="model/w")
    assert str(err.value) == (
        "tensor 'model/w' has placement P(sum) on mesh dim 0; only Shard and Replicate can be saved - reduce it "
        "first (dtensor.redistribute(mesh, [Replicate()...]))"
    )
