"""Flat partitions (ZeRO-1/2/3, FSDP flat parameters) as fragment pieces.

A flat buffer is the concatenation of *member* tensors (a rank's local
tensors, themselves mapped onto logical tensors by ``tensor`` rules), with
optional per-member alignment, padded and cut into equal partitions; a rank
keeps its partition. ``partition each`` cuts every member separately instead
(ZeRO-3 / DeepSpeed stage 3: each parameter padded to a multiple of dp).

A partition's share of a member is one contiguous range of the member, and a
contiguous range of an N-d box is at most ``2N - 1`` boxes (a partial first
row, whole rows, a partial last row, recursively). Each such box becomes one
``FlatRange <-> Box`` piece (a run of the buffer whose order is the box's
row-major order), so a row-parallel TP shard in a ZeRO buffer costs a few
pieces per partition, not one per row; a run that is contiguous in the
logical tensor as well stays a ``FlatRange <-> FlatRange`` piece.

    >>> flat_layout([10, 7], parts=2, index=1, each=False, pad_multiple=2, align=1)
    (9, [(0, 9, 10, 0), (1, 0, 7, 1)])
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

from ucp.ucl.expr import ceil_to
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
    for m, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        a, b = max(lo, start), min(hi, start + size)
        if b > a:
            runs.append((m, a - start, b - start, a - lo))
    return chunk, runs


def _ravel(coords: Sequence[int], shape: Sequence[int]) -> int:
    index = 0
    for c, s in zip(coords, shape, strict=True):
        index = index * s + c
    return index


def is_contiguous(box: Box, shape: Sequence[int]) -> bool:
    """Whether ``box`` is one run of the row-major flattening of a ``shape`` tensor.

    True when every dim after the first one longer than 1 is whole::

        >>> is_contiguous(Box((1, 0), (2, 4)), (3, 4)), is_contiguous(Box((0, 1), (2, 3)), (3, 4))
        (True, False)
    """
    first = next((d for d, s in enumerate(box.sizes) if s > 1), len(box.sizes))
    return all(box.sizes[d] == shape[d] for d in range(first + 1, len(shape)))


def contiguous_boxes(box: Box, shape: Sequence[int]) -> list[Box]:
    """``box`` cut into the fewest sub-boxes that are each one run of a ``shape`` tensor, in row-major order.

    The dims after the last one the box does not cover whole are kept; the dims before it
    are enumerated (``fuse dim 1`` pieces inside a flat buffer cut the rows)::

        >>> [str(b) for b in contiguous_boxes(Box((0, 1), (2, 2)), (2, 4))]
        ['[0:1, 1:3]', '[1:2, 1:3]']
    """
    if is_contiguous(box, shape):
        return [box]
    last = max(d for d in range(box.ndim) if box.sizes[d] != shape[d])
    out = []
    for index in itertools.product(*(range(n) for n in box.sizes[:last])):
        # index covers dims [0, last) only; the rest of the offsets are the box's own
        offsets = tuple(o + i for o, i in zip(box.offsets[:last], index, strict=True)) + box.offsets[last:]
        out.append(Box(offsets, (1,) * last + box.sizes[last:]))
    return out


def contiguous_count(box: Box, shape: Sequence[int]) -> int:
    """``len(contiguous_boxes(box, shape))`` without listing them: the runs a box is in its tensor.

    >>> contiguous_count(Box((0, 1), (3, 2)), (4, 4)), contiguous_count(Box((1, 0), (2, 4)), (4, 4))
    (3, 1)
    """
    if not box.ndim or is_contiguous(box, shape):
        return 1
    last = max(d for d in range(box.ndim) if box.sizes[d] != shape[d])
    return math.prod(box.sizes[:last])


def range_pieces(
    name: str, member: Box, target: Box, member_shape: Sequence[int], member_range: tuple[int, int], buffer_start: int
) -> list[tuple[int, ShardPiece]]:
    """The pieces of a buffer for elements ``member_range`` of one member, inside one of its tensor-rule pieces.

    ``member``/``target``: the tensor-rule piece (a box of the member and the equal box of logical
    tensor ``name``). Returns ``(buffer position, piece)`` pairs, each piece a ``FlatRange`` of the
    buffer onto a box of the logical tensor in the same row-major order: at most ``2 * ndim - 1`` per
    range where the piece spans whole trailing dims of the member (every split and dim-0 fusion).
    """
    a, b = member_range
    shift = tuple(t - m for t, m in zip(target.offsets, member.offsets, strict=True))
    out = []
    for _, box in flat_to_boxes(FlatRange(a, b), member_shape):
        x = box.intersect(member) if box.ndim else box
        if x is None:
            continue
        for sub in contiguous_boxes(x, member_shape) if x.ndim else [x]:
            start = buffer_start + _ravel(sub.offsets, member_shape) - a
            out.append((start, ShardPiece(name, FlatRange(start, start + sub.numel), sub.shifted(shift))))
    return out


def compose(
    member_pieces: Sequence[ShardPiece],
    member_shape: tuple[int, ...],
    logical_shapes: dict[str, tuple[int, ...]],
    member_range: tuple[int, int],
    buffer_start: int,
    rename,
) -> list[ShardPiece]:
    """Pieces of the buffer for elements ``member_range`` of one member tensor, in buffer order.

    A contiguous range of an N-d box is at most ``2N - 1`` boxes (a partial first row, whole
    rows, a partial last row, recursively), so each range becomes a few ``FlatRange <-> Box``
    pieces, not one piece per row. Runs that are also contiguous in the logical tensor (column
    splits, whole tensors, single rows) stay ``FlatRange <-> FlatRange`` and merge with their
    neighbours, so a partition of a whole tensor is one piece.
    """
    found: list[tuple[int, ShardPiece, tuple[int, ...]]] = []
    for piece in member_pieces:
        lb, tb = piece.local, piece.target
        assert isinstance(lb, Box) and isinstance(tb, Box), "tensor rules make box pieces"
        shape = logical_shapes[piece.logical]
        found += [
            (pos, new, shape)
            for pos, new in range_pieces(rename(piece.logical), lb, tb, member_shape, member_range, buffer_start)
        ]
    found.sort(key=lambda item: item[0])
    out: list[ShardPiece] = []
    for _, piece, shape in found:
        target, local = piece.target, piece.local
        assert isinstance(target, Box) and isinstance(local, FlatRange), "range_pieces makes flat runs onto boxes"
        if target.ndim == 0 or is_contiguous(target, shape):
            start = _ravel(target.offsets, shape)
            run = FlatRange(start, start + target.numel)
            flat = ShardPiece(piece.logical, local, run)
            last = out[-1] if out else None
            if (
                last is not None
                and last.logical == flat.logical
                and isinstance(last.target, FlatRange)
                and isinstance(last.local, FlatRange)
                and last.local.stop == local.start
                and last.target.stop == run.start
            ):
                out[-1] = ShardPiece(
                    last.logical, FlatRange(last.local.start, local.stop), FlatRange(last.target.start, run.stop)
                )
            else:
                out.append(flat)
        else:
            out.append(piece)
    return out
