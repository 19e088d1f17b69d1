"""Integer geometry of shards: boxes, flat element ranges and their overlaps.

Everything here is pure: plain frozen dataclasses and functions over them, so
resharding can be tested without processes or disks.

A *region* of a tensor of shape ``S`` is either

* a :class:`Box`: an N-d block given by ``offsets`` and ``sizes``, or
* a :class:`FlatRange`: elements ``[start, stop)`` of the row-major flattening
  of the tensor (ZeRO and FSDP flat partitions cut tensors this way).

Any region is also a list of :class:`Piece` s: boxes of the tensor, each of
which is a contiguous run of the region's own storage. A box region is one
piece with no span; a flat range is at most ``2 * ndim - 1`` row-major pieces.
Overlaps are computed piece against piece, which handles box/box, flat/flat
and box/flat alike::

    >>> src = FlatRange(3, 9)                      # elements 3..8 of a 3x4 tensor
    >>> dst = Box((1, 0), (2, 4))                  # rows 1 and 2
    >>> [op.overlap for op in plan_overlaps([src], dst, (3, 4))]
    [Box(offsets=(1, 0), sizes=(1, 4)), Box(offsets=(2, 0), sizes=(1, 1))]
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Sequence, TypeGuard

from ucp.errors import ManifestError


@dataclass(frozen=True)
class Box:
    """An N-d block of a tensor: ``tensor[o0:o0+s0, o1:o1+s1, ...]``."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.sizes):
            raise ValueError(f"box offsets {self.offsets} and sizes {self.sizes} differ in rank")
        if self.sizes and min(min(self.offsets), min(self.sizes)) < 0:  # min() in C: manifests make millions
            raise ValueError(f"box offsets {self.offsets} and sizes {self.sizes} must be >= 0")

    @classmethod
    def full(cls, shape: Sequence[int]) -> "Box":
        """The box covering a whole tensor of ``shape``."""
        return cls((0,) * len(shape), tuple(int(s) for s in shape))

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def stops(self) -> tuple[int, ...]:
        return tuple(o + s for o, s in zip(self.offsets, self.sizes, strict=True))

    def is_empty(self) -> bool:
        return 0 in self.sizes

    def intersect(self, other: "Box") -> "Box | None":
        """The common block, or None when the boxes do not overlap (or one is empty)."""
        if self.ndim != other.ndim:
            raise ValueError(f"cannot intersect a {self.ndim}-d box with a {other.ndim}-d box")
        # One pass, stopping at the first dim without overlap: a reader plans millions of these.
        # (An empty box has a dim of size 0, which no other box overlaps, so it gives None here too.)
        lo, sizes = [], []
        for a, s, b, t in zip(self.offsets, self.sizes, other.offsets, other.sizes, strict=True):
            start, stop = max(a, b), min(a + s, b + t)
            if stop <= start:
                return None
            lo.append(start)
            sizes.append(stop - start)
        return Box(tuple(lo), tuple(sizes))

    def contains(self, other: "Box") -> bool:
        return all(a <= b for a, b in zip(self.offsets, other.offsets, strict=True)) and all(
            a >= b for a, b in zip(self.stops, other.stops, strict=True)
        )

    def relative_to(self, outer: "Box") -> "Box":
        """This box in the coordinates of ``outer`` (which must contain it)."""
        return Box(tuple(a - b for a, b in zip(self.offsets, outer.offsets, strict=True)), self.sizes)

    def shifted(self, offsets: Sequence[int]) -> "Box":
        return Box(tuple(a + b for a, b in zip(self.offsets, offsets, strict=True)), self.sizes)

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes, strict=True))

    def to_dict(self) -> dict:
        return {"offsets": list(self.offsets), "sizes": list(self.sizes)}

    def __str__(self) -> str:
        return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(self.offsets, self.sizes, strict=True)) + "]"


@dataclass(frozen=True)
class FlatRange:
    """Elements ``[start, stop)`` of a tensor's row-major flattening."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise ValueError(f"flat range [{self.start}, {self.stop}) must have 0 <= start <= stop")

    @property
    def numel(self) -> int:
        return self.stop - self.start

    def is_empty(self) -> bool:
        return self.stop == self.start

    def intersect(self, other: "FlatRange") -> "FlatRange | None":
        lo, hi = max(self.start, other.start), min(self.stop, other.stop)
        return FlatRange(lo, hi) if lo < hi else None

    def to_dict(self) -> dict:
        return {"start": self.start, "stop": self.stop}

    def __str__(self) -> str:
        return f"flat[{self.start}:{self.stop}]"


Region = Box | FlatRange


def region_to_dict(region: Region) -> dict:
    """The manifest form of a region: ``{"box": {...}}`` or ``{"flat": {...}}``."""
    if isinstance(region, Box):
        return {"box": region.to_dict()}
    return {"flat": region.to_dict()}


def region_from_dict(data: Any) -> Region:
    """Inverse of :func:`region_to_dict`; raises ManifestError on anything else.

    Coordinates must be JSON integers (not numbers with a fraction, strings or booleans)::

        >>> region_from_dict({"flat": {"start": 0, "stop": 2.5}})
        Traceback (most recent call last):
        ...
        ucp.errors.ManifestError: bad region {'flat': {'start': 0, 'stop': 2.5}}: coordinates must be integers >= 0
    """
    if type(data) is dict and len(data) == 1:  # the fast path, for the many fragments of a manifest
        box, flat = data.get("box"), data.get("flat")
        if type(box) is dict and len(box) == 2:
            offsets, sizes = box.get("offsets"), box.get("sizes")
            if _int_list(offsets) and _int_list(sizes) and len(offsets) == len(sizes):
                return Box(tuple(map(int, offsets)), tuple(map(int, sizes)))
        elif type(flat) is dict and len(flat) == 2:
            ends = (flat.get("start"), flat.get("stop"))
            if _int_list(ends) and ends[0] <= ends[1]:
                return FlatRange(int(ends[0]), int(ends[1]))
    raise ManifestError(f"bad region {_shown(data)}: {_region_problem(data)}")


def _region_problem(data: object) -> str:
    if isinstance(data, dict) and set(data) == {"box"} and isinstance(data["box"], dict):
        offsets, sizes = data["box"].get("offsets"), data["box"].get("sizes")
        if set(data["box"]) == {"offsets", "sizes"} and _int_list(offsets) and _int_list(sizes):
            return "offsets and sizes differ in length"
        return "a box needs lists of integers >= 0 'offsets' and 'sizes'"
    if isinstance(data, dict) and set(data) == {"flat"} and isinstance(data["flat"], dict):
        start, stop = data["flat"].get("start"), data["flat"].get("stop")
        if set(data["flat"]) == {"start", "stop"} and _int_list([start, stop]):
            return "start is after stop"
        return "coordinates must be integers >= 0"
    return "expected {'box': ...} or {'flat': ...}"


def _shown(data: object) -> str:
    text = repr(data)
    return text if len(text) <= 120 else text[:117] + "..."


def _int_list(values: object) -> TypeGuard[Sequence[int]]:
    """A list of integers >= 0 (JSON gives ints; parts gathered in memory may hold numpy integers)."""
    if not isinstance(values, (list, tuple)):
        return False
    for v in values:
        if type(v) is not int and (not isinstance(v, numbers.Integral) or isinstance(v, bool)):
            return False
        if v < 0:
            return False
    return True


def region_numel(region: Region) -> int:
    return region.numel


def region_shape(region: Region) -> tuple[int, ...]:
    """The shape of the array that stores a region: the box sizes, or 1-d for a flat range."""
    return region.sizes if isinstance(region, Box) else (region.numel,)


def unravel(index: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major coordinates of flat ``index`` in ``shape``."""
    coords = []
    for size in reversed(shape):
        coords.append(index % size if size else 0)
        index = index // size if size else 0
    return tuple(reversed(coords))


def flat_to_boxes(rng: FlatRange, shape: Sequence[int]) -> list[tuple[FlatRange, Box]]:
    """Split a flat range of a ``shape`` tensor into row-major boxes.

    Returns ``(span, box)`` pairs in order, where ``span`` is the run of the
    range (in tensor flat coordinates) that the box occupies. At most
    ``2 * ndim - 1`` boxes::

        >>> [str(b) for _, b in flat_to_boxes(FlatRange(3, 9), (3, 4))]
        ['[0:1, 3:4]', '[1:2, 0:4]', '[2:3, 0:1]']
    """
    shape = tuple(int(s) for s in shape)
    total = math.prod(shape)
    if rng.stop > total:
        raise ValueError(f"flat range [{rng.start}, {rng.stop}) exceeds {total} elements of shape {shape}")
    if rng.is_empty():
        return []
    if not shape:
        return [(rng, Box((), ()))]
    out: list[tuple[FlatRange, Box]] = []
    pos = rng.start
    while pos < rng.stop:
        coords = unravel(pos, shape)
        # Largest aligned block starting at pos: extend over trailing dims whose
        # coordinate is 0 while the block still fits inside the range.
        stride = 1
        dim = len(shape) - 1
        while dim > 0 and coords[dim] == 0 and pos + stride * shape[dim] <= rng.stop:
            stride *= shape[dim]
            dim -= 1
        # Along `dim`, take as many stride-blocks as fit in the range and the row.
        count = min((rng.stop - pos) // stride, shape[dim] - coords[dim])
        sizes = (1,) * dim + (count,) + tuple(shape[dim + 1 :])
        box = Box(coords, sizes)
        out.append((FlatRange(pos, pos + count * stride), box))
        pos += count * stride
    return out


@dataclass(frozen=True)
class Piece:
    """A box of a tensor stored as one contiguous run of a region's storage.

    ``span`` is that run's element range *within the region's own storage*
    (None for a box region, whose storage is the box itself); the storage run
    is viewed with shape ``box.sizes``.
    """

    box: Box
    span: FlatRange | None


def box_fits(box: Box, shape: Sequence[int]) -> bool:
    """Whether ``box`` lies inside a ``shape`` tensor (same rank, every stop within its dim)."""
    if len(box.sizes) != len(shape):
        return False
    for o, s, n in zip(box.offsets, box.sizes, shape, strict=True):  # a loop, not all(): every planned copy asks
        if o + s > n:
            return False
    return True


def region_fits(region: Region, shape: Sequence[int]) -> bool:
    """Whether ``region`` lies inside a ``shape`` tensor.

    >>> region_fits(Box((1, 0), (2, 4)), (3, 4)), region_fits(FlatRange(6, 13), (3, 4))
    (True, False)
    """
    return box_fits(region, shape) if isinstance(region, Box) else region.stop <= math.prod(shape)


def region_pieces(region: Region, shape: Sequence[int]) -> list[Piece]:
    """Decompose a region of a ``shape`` tensor into pieces (see :class:`Piece`)."""
    if isinstance(region, Box):
        if not box_fits(region, shape):
            raise ValueError(f"box {region} does not fit in shape {tuple(shape)}")
        return [] if region.is_empty() else [Piece(region, None)]
    pieces = []
    for span, box in flat_to_boxes(region, shape):
        pieces.append(Piece(box, FlatRange(span.start - region.start, span.stop - region.start)))
    return pieces


@dataclass(frozen=True)
class CopyOp:
    """Copy ``overlap`` (logical coordinates) from a source region into a target region.

    ``source`` indexes the source list given to :func:`plan_overlaps`;
    ``src``/``dst`` are the pieces of source and target that hold the overlap.
    """

    source: int
    src: Piece
    dst: Piece
    overlap: Box


def plan_overlaps(sources: Sequence[Region], target: Region, shape: Sequence[int]) -> list[CopyOp]:
    """Every copy needed to fill ``target`` from ``sources``, all regions of one ``shape`` tensor.

    Only sources that overlap the target produce operations, so an executor
    reads only the bytes it needs. Overlaps are listed in target order.
    """
    target_pieces = region_pieces(target, shape)
    ops: list[CopyOp] = []
    for index, source in enumerate(sources):
        if isinstance(source, FlatRange) and isinstance(target, FlatRange) and source.intersect(target) is None:
            continue
        for sp in region_pieces(source, shape):
            for tp in target_pieces:
                overlap = sp.box.intersect(tp.box)
                if overlap is not None:
                    ops.append(CopyOp(index, sp, tp, overlap))
    return ops


def coverage_gaps(regions: Iterable[Region], shape: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
    """Check that ``regions`` tile a ``shape`` tensor exactly once.

    Returns ``(uncovered_elements, overlapping_pairs)`` where the pairs index
    regions that share elements. ``(0, [])`` means exact coverage. An exact
    tiling is recognised in near-linear time (:func:`tiles_exactly`); only a
    faulty one is examined pair by pair, never on an element mask::

        >>> coverage_gaps([Box((0, 0), (2, 2)), Box((1, 0), (1, 2))], (3, 2))
        (2, [(0, 1)])
    """
    regions = list(regions)
    if tiles_exactly(regions, shape):
        return 0, []
    pieces = [(i, p.box) for i, r in enumerate(regions) for p in region_pieces(r, shape)]
    overlaps: list[tuple[int, int]] = []
    # Sort by first offset so the pairwise scan can stop early along dim 0.
    pieces.sort(key=lambda ib: ib[1].offsets[:1])
    for a in range(len(pieces)):
        ia, ba = pieces[a]
        for b in range(a + 1, len(pieces)):
            ib, bb = pieces[b]
            if ba.ndim and bb.offsets[0] >= ba.stops[0]:
                break
            if ia != ib and ba.intersect(bb) is not None:
                overlaps.append((min(ia, ib), max(ia, ib)))
    covered = sum(r.numel for r in regions)
    total = math.prod(shape)
    uncovered = total - covered if not overlaps else max(0, total - _union_numel([b for _, b in pieces]))
    return uncovered, sorted(set(overlaps))


# A Mersenne prime: fingerprints are polynomials over this field (see tiles_exactly).
_FINGERPRINT_PRIME = (1 << 61) - 1


def tiles_exactly(regions: Sequence[Region], shape: Sequence[int]) -> bool:
    """Whether ``regions`` cover every element of a ``shape`` tensor exactly once.

    False as well when a region does not fit in the shape. Near-linear in the
    number of regions, whatever their arrangement (a manifest may hold 10^6
    fragments, and a hostile one any arrangement):

    * flat ranges (and boxes of a 1-d tensor) are sorted and must follow each
      other without gap or overlap;
    * otherwise the regions' element counts must add up, and a fingerprint must
      match: each distinct cut coordinate ``c`` of dim ``d`` gets a random value
      ``P_d(c)`` modulo a 61-bit prime, a box weighs
      ``prod_d (P_d(stop_d) - P_d(offset_d))``, and the weights of the pieces
      must add up to the weight of the whole tensor. That sum is a polynomial of
      degree ``ndim`` in the random values that equals the whole's for every
      choice exactly when each element is covered once (Schwartz-Zippel), so a
      faulty tiling passes with probability at most ``ndim / 2**61``. The values
      are drawn fresh from the OS for each call, so no input can be made to pass.

    >>> tiles_exactly([Box((0, 0), (2, 3)), Box((2, 0), (1, 3))], (3, 3))
    True
    >>> tiles_exactly([Box((0, 0), (2, 2)), Box((1, 1), (2, 2)), Box((0, 2), (1, 1))], (3, 3))
    False
    >>> tiles_exactly([FlatRange(0, 4), FlatRange(4, 9)], (3, 3))
    True
    """
    shape = tuple(int(s) for s in shape)
    total = math.prod(shape)
    regions = [r for r in regions if r.numel]
    if sum(r.numel for r in regions) != total:
        return False
    if len(shape) <= 1 or all(isinstance(r, FlatRange) for r in regions):
        return _intervals_tile(regions, total)
    boxes: list[Box] = []
    for region in regions:
        if isinstance(region, Box):
            boxes.append(region)
        else:
            try:
                boxes.extend(box for _, box in flat_to_boxes(region, shape))
            except ValueError:
                return False
    return _fingerprint(boxes, shape)


def _intervals_tile(regions: Sequence[Region], total: int) -> bool:
    """Flat ranges (or boxes of a 0-d/1-d tensor) as intervals of the flattening, sorted and abutting."""
    spans = sorted(
        (r.start, r.stop) if isinstance(r, FlatRange) else ((r.offsets[0], r.stops[0]) if r.ndim else (0, 1))
        for r in regions
    )
    position = 0
    for start, stop in spans:
        if start != position:
            return False
        position = stop
    return position == total


def _fingerprint(boxes: Sequence[Box], shape: tuple[int, ...]) -> bool:
    import random
    import secrets

    prime = _FINGERPRINT_PRIME
    draw = random.Random(secrets.randbits(128)).getrandbits
    tables: list[dict[int, int]] = [{} for _ in shape]

    def value(dim: int, coordinate: int) -> int:
        table = tables[dim]
        found = table.get(coordinate)
        if found is None:
            found = table[coordinate] = draw(61)
        return found

    whole = 1
    for dim, size in enumerate(shape):
        whole = whole * (value(dim, size) - value(dim, 0)) % prime
    total = 0
    ndim = len(shape)
    for box in boxes:
        if len(box.sizes) != ndim:
            return False
        term = 1
        for dim, (offset, size) in enumerate(zip(box.offsets, box.sizes, strict=True)):
            if offset + size > shape[dim]:
                return False  # does not fit (offsets and sizes are >= 0 by construction)
            table = tables[dim]
            low, high = table.get(offset), table.get(offset + size)
            if low is None:
                low = value(dim, offset)
            if high is None:
                high = value(dim, offset + size)
            term = term * (high - low) % prime
        total += term
    return total % prime == whole


def overlapping_regions(
    regions: Sequence[Region], shape: Sequence[int], *, budget: int = 1_000_000
) -> tuple[int, int] | None:
    """Indices ``(i, j)`` of two regions that share an element, or None if none is found.

    At most ``budget`` box pairs are compared, so a faulty layout of a million
    regions is examined in bounded time (None then says nothing)::

        >>> overlapping_regions([FlatRange(0, 5), FlatRange(3, 9), FlatRange(9, 12)], (3, 4))
        (0, 1)
    """
    shape = tuple(shape)
    if len(shape) <= 1 or all(isinstance(r, FlatRange) for r in regions):
        spans = sorted(
            (
                (r.start, r.stop)
                if isinstance(r, FlatRange)
                else ((r.offsets[0], r.stops[0]) if r.ndim else (0, r.numel)),
                i,
            )
            for i, r in enumerate(regions)
            if r.numel
        )
        reach, owner = -1, -1
        for (start, stop), index in spans:
            if start < reach:
                return (min(owner, index), max(owner, index))
            if stop > reach:
                reach, owner = stop, index
        return None
    pieces = sorted(
        ((p.box, i) for i, r in enumerate(regions) for p in region_pieces(r, shape)), key=lambda bi: bi[0].offsets[0]
    )
    for a, (box_a, ia) in enumerate(pieces):
        for b in range(a + 1, len(pieces)):
            box_b, ib = pieces[b]
            budget -= 1
            if budget < 0:
                return None
            if box_b.offsets[0] >= box_a.stops[0]:
                break
            if ia != ib and box_a.intersect(box_b) is not None:
                return (min(ia, ib), max(ia, ib))
    return None


def _union_numel(boxes: list[Box]) -> int:
    """Elements in the union of boxes, by coordinate compression (only used when boxes overlap)."""
    if not boxes:
        return 0
    ndim = boxes[0].ndim
    if ndim == 0:
        return 1
    cuts = [sorted({c for b in boxes for c in (b.offsets[d], b.stops[d])}) for d in range(ndim)]
    total = 0

    def walk(dim: int, active: list[Box], volume: int) -> None:
        nonlocal total
        if dim == ndim:
            total += volume if active else 0
            return
        for lo, hi in itertools.pairwise(cuts[dim]):
            inside = [b for b in active if b.offsets[dim] <= lo and hi <= b.stops[dim]]
            if inside:
                walk(dim + 1, inside, volume * (hi - lo))

    walk(0, boxes, 1)
    return total


def split_evenly(size: int, parts: int, index: int) -> tuple[int, int]:
    """``(offset, length)`` of part ``index`` when ``size`` is split into ``parts``.

    Uneven splits give the first ``size % parts`` parts one extra element, the
    convention of torch.chunk-free "balanced" splitting::

        >>> [split_evenly(10, 4, i) for i in range(4)]
        [(0, 3), (3, 3), (6, 2), (8, 2)]
    """
    base, extra = divmod(size, parts)
    offset = index * base + min(index, extra)
    return offset, base + (1 if index < extra else 0)
