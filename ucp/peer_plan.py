"""Where each piece of a rank's new state comes from: itself, a peer's memory, or storage.

A recovering job holds a committed checkpoint's arrays in memory, spread over the
surviving ranks (each rank's own arrays, and the replicas of other ranks' arrays that
a placement policy put there). A rank that takes a new place in a new layout needs the
regions of logical tensors its new fragment map names. :func:`plan_sources` decides,
for every such region, which held fragment supplies it: the rank's own memory first,
then a peer's (spread over the holders), and storage only for what no survivor holds.

It is the reader's geometry (:func:`ucp.geometry.plan_overlaps` over a logical
tensor's regions) with more than one kind of source: a plan is a value, computed from
plain data, so it is tested without processes; the executor that moves the bytes
(:mod:`ucp.replication.hot_reshard`) is thin. Its requests are those a load plan of the
same map fills (:func:`ucp.load_plan.requests_of`); unlike a load plan's fragments, held
regions may overlap (a rank's own copy and a peer's), so the first holder in order wins.
Every element of every target piece is planned exactly once::

    >>> from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
    >>> lt = {"w": LogicalTensor("w", (4, 2), "float32")}
    >>> want = FragmentMap(rank=0, logical=lt, tensors={"w": TensorSpec("w", (
    ...     ShardPiece("w", Box((0, 0), (4, 2)), Box((0, 0), (4, 2))),))})
    >>> held = [HeldFragment(rank=1, key="r1/a", logical="w", region=Box((2, 0), (2, 2)))]
    >>> plan = plan_sources(want, held, {"w": (4, 2)})
    >>> [(f.source.rank, str(f.overlap)) for f in plan.fetches], [str(r.overlap) for r in plan.reads]
    ([(1, '[2:4, 0:2]')], ['[0:2, 0:2]'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ucp.geometry import Box, Piece, Region, plan_overlaps, region_pieces
from ucp.load_plan import requests_of
from ucp.spec import FragmentMap

__all__ = ["HeldFragment", "Fetch", "PeerPlan", "plan_sources", "subtract"]


@dataclass(frozen=True)
class HeldFragment:
    """A checkpoint fragment some rank holds in memory: ``region`` of logical tensor ``logical``,
    stored in array ``key`` (as the manifest records it)."""

    rank: int
    key: str
    logical: str
    region: Region


@dataclass(frozen=True)
class Fetch:
    """Copy ``overlap`` (logical coordinates) into local tensor ``dest_key``.

    ``source`` is None for a read from storage. ``piece`` indexes the local tensor's
    pieces in its fragment map; ``dst`` is the piece of that piece's target region
    holding the overlap (the reader's :class:`~ucp.geometry.Piece`).
    """

    source: HeldFragment | None
    logical: str
    dest_key: str
    piece: int
    dst: Piece
    overlap: Box

    @property
    def numel(self) -> int:
        return self.overlap.numel


@dataclass(frozen=True)
class PeerPlan:
    """One rank's plan: ``fetches`` from held fragments (its own or peers'), ``reads`` from storage."""

    rank: int
    fetches: tuple[Fetch, ...]
    reads: tuple[Fetch, ...]

    def elements(self) -> dict[str, int]:
        """Elements by origin: ``own``, ``peer`` and ``storage``."""
        out = {"own": 0, "peer": 0, "storage": sum(r.numel for r in self.reads)}
        for f in self.fetches:
            assert f.source is not None, "a fetch has a held source (reads from storage are in reads)"
            out["own" if f.source.rank == self.rank else "peer"] += f.numel
        return out


def subtract(box: Box, cut: Box) -> list[Box]:
    """``box`` minus ``cut`` as disjoint boxes (at most ``2 * ndim``).

    >>> [str(b) for b in subtract(Box((0, 0), (4, 4)), Box((1, 1), (2, 2)))]
    ['[0:1, 0:4]', '[3:4, 0:4]', '[1:3, 0:1]', '[1:3, 3:4]']
    """
    inner = box.intersect(cut)
    if inner is None:
        return [box]
    out: list[Box] = []
    lo, sizes = list(box.offsets), list(box.sizes)
    for d in range(box.ndim):
        if inner.offsets[d] > lo[d]:  # the slab before the cut along d
            out.append(
                Box(
                    tuple(lo[:d]) + (lo[d],) + tuple(lo[d + 1 :]),
                    tuple(sizes[:d]) + (inner.offsets[d] - lo[d],) + tuple(sizes[d + 1 :]),
                )
            )
        stop, inner_stop = lo[d] + sizes[d], inner.offsets[d] + inner.sizes[d]
        if inner_stop < stop:  # the slab after it
            out.append(
                Box(
                    tuple(lo[:d]) + (inner_stop,) + tuple(lo[d + 1 :]),
                    tuple(sizes[:d]) + (stop - inner_stop,) + tuple(sizes[d + 1 :]),
                )
            )
        lo[d], sizes[d] = inner.offsets[d], inner.sizes[d]  # the rest lies inside the cut along d
    return out


def _order(held: Sequence[HeldFragment], rank: int, world: int) -> list[HeldFragment]:
    """Own fragments first; then peers, starting after ``rank`` so that ranks needing the same
    piece ask different holders."""
    return sorted(held, key=lambda h: ((h.rank - rank) % max(world, 1), h.key))


def plan_sources(
    target: FragmentMap,
    held: Sequence[HeldFragment],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    world: int | None = None,
) -> PeerPlan:
    """Sources for every piece of ``target`` (one rank's load-direction fragment map).

    ``held``: every fragment held in memory anywhere (any order); ``shapes``: logical
    name -> shape. Regions no held fragment covers become storage reads. Pure.
    """
    world = world if world is not None else 1 + max((h.rank for h in held), default=target.rank)
    by_name: dict[str, list[HeldFragment]] = {}
    for h in held:
        by_name.setdefault(h.logical, []).append(h)
    ordered = {name: _order(items, target.rank, world) for name, items in by_name.items()}
    fetches: list[Fetch] = []
    reads: list[Fetch] = []
    for request in requests_of(target):  # the requests a load plan of the same map fills
        dest = request.dest
        assert dest is not None, "a fragment map's requests name their local tensor"
        shape = tuple(shapes[request.logical])
        remaining: list[tuple[Piece, Box]] = [(p, p.box) for p in region_pieces(request.region, shape)]
        for source in ordered.get(request.logical, ()):
            if not remaining:
                break
            left: list[tuple[Piece, Box]] = []
            for dst, box in remaining:
                rest = [box]
                for op in plan_overlaps([source.region], box, shape):
                    fetches.append(Fetch(source, request.logical, dest, request.piece, dst, op.overlap))
                    rest = [part for r in rest for part in subtract(r, op.overlap)]
                left += [(dst, r) for r in rest]
            remaining = left
        reads += [Fetch(None, request.logical, dest, request.piece, dst, box) for dst, box in remaining]
    return PeerPlan(target.rank, tuple(fetches), tuple(reads))
