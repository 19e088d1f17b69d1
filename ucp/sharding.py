"""Fragment maps for plain even splits: the simplest layouts, without UCL.

Useful for tests, benchmarks and hand-rolled data/tensor parallelism: every
logical tensor is split along one dim (``dim``) or along its row-major
flattening (``flat=True``, as ZeRO does), balanced the way
:func:`ucp.geometry.split_evenly` splits (the first ``size % parts`` parts get
one extra element)::

    >>> from ucp.spec import LogicalTensor
    >>> fmap = split_fragment_map({"w": LogicalTensor("w", (5, 2), "float32")}, rank=1, world_size=2)
    >>> fmap.tensors["w"].pieces[0].target
    Box(offsets=(3, 0), sizes=(2, 2))
    >>> local_shapes(fmap)
    {'w': (2, 2)}
"""

from __future__ import annotations

import math
from typing import cast

from ucp.geometry import Box, FlatRange, split_evenly
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec


def split_fragment_map(
    logical: dict[str, LogicalTensor],
    *,
    rank: int,
    world_size: int,
    dim: int = 0,
    flat: bool = False,
) -> FragmentMap:
    """Rank ``rank``'s share of every tensor split ``world_size`` ways (0-d tensors: rank 0 holds them)."""
    tensors = {}
    for name, lt in logical.items():
        if flat:
            offset, length = split_evenly(math.prod(lt.shape), world_size, rank)
            piece = ShardPiece(name, FlatRange(0, length), FlatRange(offset, offset + length))
        elif not lt.shape or dim >= len(lt.shape):
            # Unsplittable: held whole by every rank, as replicas.
            box = Box.full(lt.shape)
            tensors[name] = TensorSpec(name, (ShardPiece(name, box, box),), replica=rank, replicas=world_size)
            continue
        else:
            offset, length = split_evenly(lt.shape[dim], world_size, rank)
            sizes = tuple(length if d == dim else s for d, s in enumerate(lt.shape))
            offsets = tuple(offset if d == dim else 0 for d in range(len(lt.shape)))
            piece = ShardPiece(name, Box((0,) * len(sizes), sizes), Box(offsets, sizes))
        tensors[name] = TensorSpec(name, (piece,))
    return FragmentMap(rank=rank, logical=dict(logical), tensors=tensors)


def local_shapes(fmap: FragmentMap) -> dict[str, tuple[int, ...]]:
    """The local tensor shape each key needs under ``fmap``."""
    out: dict[str, tuple[int, ...]] = {}
    for key, spec in fmap.tensors.items():
        local = spec.pieces[0].local
        if isinstance(local, FlatRange):  # a map's pieces of one key are all flat or all boxes
            out[key] = (max(cast(FlatRange, p.local).stop for p in spec.pieces),)
        else:
            out[key] = tuple(max(cast(Box, p.local).stops[d] for p in spec.pieces) for d in range(local.ndim))
    return out
