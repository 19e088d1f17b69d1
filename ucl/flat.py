"""Flat partitions (ZeRO-1/2/3, FSDP flat parameters) as fragment pieces.

A flat buffer is the concatenation of *member* tensors (a rank's local
tensors, themselves mapped onto logical tensors by ``tensor`` rules), with
optional per-member alignment, padded and cut into equal partitions; a rank
keeps its partition. ``partition each`` cuts every member separately instead
(ZeRO-3 / DeepSpeed stage 3: each parameter padded to a multiple of dp).

Pieces are flat ranges: each run of the buffer that is contiguous both in the
member and in the logical tensor becomes one ``FlatRange <-> FlatRange``
piece, so partitions of TP shards (not contiguous in the logical tensor) work.

    >>> flat_layout([10, 7], parts=2, index=1, each=False, pad_multiple=2, align=1)
    (9, [(0, 9, 10, 0), (1, 0, 7, 1)])
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

from ucl.expr import ceil_to
from ucp.geometry import Box, FlatRange, flat_to_boxes
from ucp.spec import ShardPiece


def flat_layout(sizes: Sequence[int], *, parts: int, index: int, each: bool, pad_multiple: int, align: int):
    """``(buffer_numel, [(member, member_start, member_stop, buffer_start), ...])`` for partition ``index``."""
    runs = []
    if each:
        pos = 0
        for m, size in enumerate(sizes):
            pos = ceil_to(pos, align)
            chunk = ceil_to(size, math.lcm(pad_multiple, parts)) // parts
            lo, hi = index * chunk, min((index + 1) * chunk, size)
            if hi > lo:
                runs.append((m, lo, hi, pos))
            pos += chunk
        return pos, runs
    starts, pos = [], 0
    for size in sizes:
        pos = ceil_to(pos, align)
        starts.append(pos)
        pos += size
    total = ceil_to(pos, math.lcm(pad_multiple, parts))
    chunk = total // parts
    lo, hi = index * chunk, (index + 1) * chunk
    for m, (start, size) in enumerate(zip(starts, sizes)):
        a, b = max(lo, start), min(hi, start + size)
        if b > a:
            runs.append((m, a - start, b - start, a - lo))
    return chunk, runs


def _ravel(coords: Sequence[int], shape: Sequence[int]) -> int:
    index = 0
    for c, s in zip(coords, shape):
        index = index * s + c
    return index


def compose(
    member_pieces: Sequence[ShardPiece],
    member_shape: tuple[int, ...],
    logical_shapes: dict[str, tuple[int, ...]],
    member_range: tuple[int, int],
    buffer_start: int,
    rename,
) -> list[ShardPiece]:
    """Flat pieces of the buffer for elements ``member_range`` of one member tensor."""
    a, b = member_range
    runs: list[tuple[str, int, int, int]] = []  # (logical, buffer_start, target_start, length)
    for piece in member_pieces:
        shape = logical_shapes[piece.logical]
        lb, tb = piece.local, piece.target
        assert isinstance(lb, Box) and isinstance(tb, Box), "tensor rules make box pieces"
        for _, box in flat_to_boxes(FlatRange(a, b), member_shape):
            x = box.intersect(lb) if box.ndim else box
            if x is None:
                continue
            ndim = x.ndim
            k = ndim  # dims >= k are full in both the member and the logical tensor
            while k > 0 and x.sizes[k - 1] == member_shape[k - 1] == shape[k - 1]:
                k -= 1
            k = max(k - 1, 0) if ndim else 0
            length = math.prod(x.sizes[k:]) if ndim else 1
            shift = tuple(t - l for t, l in zip(tb.offsets, lb.offsets))
            for idx in itertools.product(*(range(n) for n in x.sizes[:k])):
                local = tuple(o + i for o, i in zip(x.offsets, idx)) + x.offsets[k:]
                target = tuple(c + s for c, s in zip(local, shift))
                lstart = _ravel(local, member_shape)
                runs.append((rename(piece.logical), buffer_start + lstart - a, _ravel(target, shape), length))
    runs.sort(key=lambda r: r[1])
    merged: list[list] = []
    for name, bs, ts, n in runs:
        last = merged[-1] if merged else None
        if last and last[0] == name and last[1] + last[3] == bs and last[2] + last[3] == ts:
            last[3] += n
        else:
            merged.append([name, bs, ts, n])
    return [ShardPiece(name, FlatRange(bs, bs + n), FlatRange(ts, ts + n)) for name, bs, ts, n in merged]
