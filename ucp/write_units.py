"""Which part of each shard piece this rank writes, and how replicas are reconciled.

A piece held by ``replicas`` ranks is written once in total: a large one is cut
along its first dimension (or its flat range) into parts of at least
``SPREAD_MIN_BYTES``, at most one per replica and ``SPREAD_MAX_PARTS`` in all, a small
one is written whole; the
first part goes to a replica chosen by a stable hash of the piece's name and region,
the next ones to the replicas after it. Pure functions
of the piece and the local tensor, so the spreading is tested without processes::

    >>> import torch
    >>> from ucp.spec import ShardPiece, TensorSpec
    >>> piece = ShardPiece("w", local=Box((0, 0), (4, 2)), target=Box((0, 0), (4, 2)))
    >>> write_units(piece, torch.zeros(4, 2), TensorSpec("w", (piece,), replica=1, replicas=2, policy="take-first"))
    []
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch

from ucp.geometry import Box, FlatRange, Region, split_evenly
from ucp.spec import SPREAD_MAX_PARTS, SPREAD_MIN_BYTES, ShardPiece, TensorSpec


def write_units(piece: ShardPiece, data: torch.Tensor, tspec: TensorSpec) -> list[tuple[Region, Region]]:
    """The (local-in-data, target) sub-regions this replica writes of one piece.

    ``data`` is the piece's part of the local tensor (:func:`local_region`).
    """
    return write_plan(piece, data.numel() * data.element_size(), tspec)


def write_plan(piece: ShardPiece, nbytes: int, tspec: TensorSpec) -> list[tuple[Region, Region]]:
    """:func:`write_units` without the tensor: what this replica writes of a piece of ``nbytes`` bytes.

    Local regions are relative to the piece's own data: a box of its sizes, or a run of its
    flattening (a ``FlatRange`` local piece; its target box is split along dim 0, whose slices
    are runs of the same row-major order)::

        >>> piece = ShardPiece("w", local=FlatRange(0, 8 << 20), target=Box((0, 0), (1024, 8192)))
        >>> [write_plan(piece, 32 << 20, TensorSpec("b", (piece,), replica=r, replicas=2))[0][1] for r in (0, 1)]
        [Box(offsets=(512, 0), sizes=(512, 8192)), Box(offsets=(0, 0), sizes=(512, 8192))]
    """
    flat_local = isinstance(piece.local, FlatRange)
    whole_local: Region = (
        FlatRange(0, piece.local.numel) if isinstance(piece.local, FlatRange) else Box.full(piece.local.sizes)
    )
    if tspec.replicas == 1:
        return [(whole_local, piece.target)]
    if tspec.policy == "take-first":
        return [(whole_local, piece.target)] if tspec.replica == 0 else []
    splittable = isinstance(piece.target, FlatRange) or piece.target.ndim > 0
    size = piece.target.numel if isinstance(piece.target, FlatRange) else piece.target.sizes[0] if splittable else 1
    # Parts of at least SPREAD_MIN_BYTES, at most one per replica and SPREAD_MAX_PARTS in all: at
    # dp=128 a 20 MiB weight is 5 fragments and a 1 GiB one 16, not 128 each (every fragment is a
    # manifest entry, a file and a checksum); the writes still spread over the replicas.
    parts = max(1, min(tspec.replicas, SPREAD_MAX_PARTS, nbytes // SPREAD_MIN_BYTES, size))
    first = zlib.crc32(f"{piece.logical}{piece.target}".encode()) % tspec.replicas
    index = (tspec.replica - first) % tspec.replicas  # parts go to replicas first, first + 1, ...
    if index >= parts:
        return []
    if parts == 1:
        return [(whole_local, piece.target)]
    if isinstance(piece.target, FlatRange):
        offset, length = split_evenly(piece.target.numel, parts, index)
        start = piece.target.start + offset
        return [(FlatRange(offset, offset + length), FlatRange(start, start + length))]
    offset, length = split_evenly(piece.target.sizes[0], parts, index)
    sizes = (length,) + piece.target.sizes[1:]
    target = Box((piece.target.offsets[0] + offset,) + piece.target.offsets[1:], sizes)
    if flat_local:
        row = math.prod(sizes[1:])
        return [(FlatRange(offset * row, (offset + length) * row), target)]
    return [(Box((offset,) + (0,) * (len(sizes) - 1), sizes), target)]


def local_region(tensor: torch.Tensor, region: Region) -> torch.Tensor:
    """The part of a local tensor a piece names: box-shaped, or 1-d for a flat range (whatever its target).

    The piece must fit (:func:`ucp.save_checks.check_pieces` says so first).
    """
    if isinstance(region, Box):
        return tensor[region.slices()] if region.ndim else tensor
    return tensor.reshape(-1)[region.start : region.stop]


def average_replicas(data: torch.Tensor, replicas: int, pg: Any) -> torch.Tensor:
    """The element-wise mean of the replicas (policy ``average``: an opt-in all-reduce over the whole group)."""
    import torch.distributed as dist

    out = data.detach().clone()
    dist.all_reduce(out, group=pg)
    return (
        out.div_(replicas) if out.is_floating_point() or out.is_complex() else out.div_(replicas, rounding_mode="floor")
    )
