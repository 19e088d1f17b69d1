"""ZeRO's flat partitions as geometry: where each parameter's elements sit on which rank, and region reads.

DeepSpeed flattens each group of parameters into one 1-d buffer and gives
each data-parallel rank a slice of it. Two layouts (learned from DeepSpeed's
``stage_1_and_2.py``, ``stage3.py`` and ``zero_to_fp32.py``):

* **ZeRO-1/2** (:func:`zero12_fragments`): per param group, the parameters one
  after another (each followed by its alignment padding, usually 0), the
  whole padded to a multiple of the dp size; rank ``r`` holds elements
  ``[r*p, (r+1)*p)``. DeepSpeed strips the trailing padding from the saved
  fp32 partition of the last rank(s) (and, with ``elastic_checkpoint``, from
  the optimizer states), so ``p`` is the stored length plus the recorded
  ``group_paddings`` of that rank.
* **ZeRO-3** (:func:`zero3_fragments`): every parameter is split on its own:
  ``ceil(numel/dp)`` elements per rank, the last rank's padded; a rank's flat
  sub-group is its pieces of the sub-group's parameters one after another.

A :class:`Fragment` says that elements ``[start, stop)`` of a parameter's
flattening are elements ``[offset, offset + stop - start)`` of flat tensor
``group`` on ``rank``. :func:`read_region` assembles any region of a logical
tensor from such runs, calling for the bytes of only the runs that overlap::

    >>> frags = zero12_fragments([[("a", 3), ("b", 4)]], [[0, 0]], dp=2, partition_sizes=[4])
    >>> [(f.rank, f.start, f.stop, f.offset) for f in frags["b"]]
    [(0, 0, 1, 3), (1, 1, 4, 0)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ucp.formats.deepspeed.pt import release_pages
from ucp.geometry import Box, FlatRange, Region, plan_overlaps

__all__ = ["Fragment", "zero12_fragments", "zero3_fragments", "read_region"]


@dataclass(frozen=True)
class Fragment:
    """Elements ``[start, stop)`` of a parameter's flattening, at ``offset`` in flat tensor ``group`` of ``rank``."""

    rank: int
    group: int
    start: int
    stop: int
    offset: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


def zero12_fragments(
    groups: Sequence[Sequence[tuple[str, int]]],
    paddings: Sequence[Sequence[int]],
    *,
    dp: int,
    partition_sizes: Sequence[int],
) -> dict[str, list[Fragment]]:
    """Every parameter's fragments under ZeRO-1/2: ``groups[g]`` = (name, numel) in flat order.

    ``paddings[g][i]`` is the alignment padding after parameter ``i`` of group ``g``;
    ``partition_sizes[g]`` the (unstripped) elements per rank of group ``g``.
    """
    out: dict[str, list[Fragment]] = {}
    for g, params in enumerate(groups):
        p = partition_sizes[g]
        pos = 0
        for i, (name, numel) in enumerate(params):
            frags = []
            if numel and p:
                for rank in range(pos // p, (pos + numel - 1) // p + 1):
                    lo, hi = max(pos, rank * p), min(pos + numel, (rank + 1) * p)
                    frags.append(Fragment(rank, g, lo - pos, hi - pos, lo - rank * p))
            out[name] = frags
            pos += numel + (paddings[g][i] if i < len(paddings[g]) else 0)
        if pos > p * dp:
            raise ValueError(f"param group {g} holds {pos} elements but its {dp} partitions of {p} hold {p * dp}")
    return out


def zero3_fragments(sub_groups: Sequence[Sequence[tuple[str, int]]], *, dp: int) -> dict[str, list[Fragment]]:
    """Every parameter's fragments under ZeRO-3: ``sub_groups[i]`` = (name, numel) in flat order."""
    out: dict[str, list[Fragment]] = {}
    for i, params in enumerate(sub_groups):
        offset = 0
        for name, numel in params:
            per_rank = math.ceil(numel / dp)
            frags = []
            for rank in range(dp):
                lo, hi = rank * per_rank, min((rank + 1) * per_rank, numel)
                if lo < hi:
                    frags.append(Fragment(rank, i, lo, hi, offset))
            out[name] = frags
            offset += per_rank
    return out


def zero3_rank_sizes(sub_groups: Sequence[Sequence[tuple[str, int]]], *, dp: int) -> list[int]:
    """Elements of each flat sub-group on every rank (the padded per-rank pieces added up)."""
    return [sum(math.ceil(numel / dp) for _, numel in params) for params in sub_groups]


def read_region(
    shape: Sequence[int],
    dtype: torch.dtype,
    runs: Sequence[tuple[FlatRange, Callable[[], torch.Tensor]]],
    region: Region | None,
    *,
    mapped: bool = False,
) -> torch.Tensor:
    """``region`` of a ``shape`` tensor whose flattening is tiled by ``runs``: (range, fetch the run's 1-d data).

    Only the runs that overlap the region are fetched. Returns the whole tensor
    for ``None``, a 1-d tensor for a FlatRange, a box-shaped one for a Box.
    ``mapped``: the runs are slices of memory-mapped files, whose pages are let go once copied.
    """
    shape = tuple(int(s) for s in shape)
    total = math.prod(shape)
    fetched: list[torch.Tensor] = []
    try:
        return _assemble(shape, total, dtype, runs, region, fetched)
    finally:
        for view in fetched if mapped else ():
            release_pages(view)


def _assemble(
    shape: tuple[int, ...],
    total: int,
    dtype: torch.dtype,
    runs: Sequence[tuple[FlatRange, Callable[[], torch.Tensor]]],
    region: Region | None,
    fetched: list[torch.Tensor],
) -> torch.Tensor:
    if region is None or isinstance(region, FlatRange):
        lo, hi = (0, total) if region is None else (region.start, region.stop)
        if hi > total:
            raise ValueError(f"flat range [{lo}, {hi}) exceeds the {total} elements of shape {shape}")
        out = torch.empty(hi - lo, dtype=dtype)
        for rng, fetch in runs:
            a, b = max(lo, rng.start), min(hi, rng.stop)
            if a < b:
                run = fetch()
                fetched.append(run)
                out[a - lo : b - lo].copy_(run[a - rng.start : b - rng.start])
        return out.view(shape) if region is None else out
    out = torch.empty(region.sizes, dtype=dtype)
    ops = plan_overlaps([rng for rng, _ in runs], region, shape)
    by_source: dict[int, torch.Tensor] = {}
    for op in ops:
        if op.source not in by_source:
            by_source[op.source] = runs[op.source][1]()
            fetched.append(by_source[op.source])
        data = by_source[op.source]
        span = op.src.span
        assert span is not None, "a flat source's pieces have spans"
        src = data[span.start : span.stop].view(op.src.box.sizes)[op.overlap.relative_to(op.src.box).slices()]
        out[op.overlap.relative_to(region).slices()] = src
    return out


def read_dense(tensor: torch.Tensor, region: Region | None, *, mapped: bool = False) -> torch.Tensor:
    """A copy of ``region`` of a tensor held whole; a memory-mapped one reads only the pages the region
    covers, and lets go of them afterwards (:func:`~ucp.formats.deepspeed.pt.release_pages`)."""
    if region is None:
        out = tensor.clone()
    elif isinstance(region, Box):
        out = tensor[region.slices()].clone()
    else:
        out = tensor.reshape(-1)[region.start : region.stop].clone()
    if mapped and tensor.is_contiguous():
        release_pages(tensor)
    return out
