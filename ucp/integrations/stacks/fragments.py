"""Fragment maps for tensors whose place in the logical tensor each rank knows (a box).

A rank lists ``key -> (logical name, box)`` for its local tensors; one all-gather
of that metadata finds, for every piece, which ranks hold identical copies, so
each is written once (replicas) and the engine checks they agree. Used by the
torch-native stack, whose boxes come from DTensor's own chunk metadata (FSDP2 on
top of tensor parallelism shards with ``_StridedShard``, which torch resolves).

    fmap = box_fragment_map({"model/w": ("w", Box((4, 0), (4, 8)))}, logical_shapes, dtypes)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

__all__ = ["dtensor_box", "box_fragment_map"]


def dtensor_box(tensor: torch.Tensor) -> Box:
    """The block of the global tensor that this rank's local part of ``tensor`` holds."""
    if type(tensor).__name__ != "DTensor":
        return Box.full(tuple(tensor.shape))
    (chunk,) = tensor.__create_chunk_list__()  # torch's own answer, _StridedShard included
    return Box(tuple(int(o) for o in chunk.offsets), tuple(int(s) for s in chunk.sizes))


def box_fragment_map(local: dict[str, tuple[str, Box]], logical: dict[str, LogicalTensor], *,
                     group=None) -> FragmentMap:
    """This rank's map; ranks holding the same (logical, box) become replicas (a collective)."""
    rank = dist.get_rank(group)
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, {k: (n, b.offsets, b.sizes) for k, (n, b) in local.items()}, group=group)
    holders: dict[tuple, list[int]] = {}
    for r, entries in enumerate(everyone):
        for name, offsets, sizes in entries.values():
            holders.setdefault((name, tuple(offsets), tuple(sizes)), []).append(r)
    tensors = {}
    for key, (name, box) in local.items():
        ranks = holders[(name, box.offsets, box.sizes)]
        piece = ShardPiece(name, Box((0,) * box.ndim, box.sizes), box)
        tensors[key] = TensorSpec(key, (piece,), replica=ranks.index(rank), replicas=len(ranks))
    used = {name for name, _ in local.values()}
    return FragmentMap(rank=rank, logical={n: t for n, t in logical.items() if n in used}, tensors=tensors)
