"""What a load reads, as a value: for each target region, the overlaps with the saved fragments.

:func:`plan_load` turns "these regions of these logical tensors" (a load-direction fragment
map, or plain :class:`LoadRequest` values) into :class:`ReadItem` values: copy ``overlap``
(logical coordinates) out of saved fragment ``fragment`` into request ``request``. It is pure
geometry (:func:`ucp.geometry.plan_overlaps`) over the manifest's fragments; the reader
(:meth:`ucp.reader.CheckpointReader.read_into`) carries the items out against a store, and a
recovery can carry the same items out against peers holding the fragments' arrays::

    >>> from ucp.geometry import Box
    >>> from ucp.manifest import Fragment, TensorEntry
    >>> saved = {"w": TensorEntry("w", "float32", (4, 2), (
    ...     Fragment("r0/a", 0, Box((0, 0), (2, 2)), 16, 2), Fragment("r1/a", 1, Box((2, 0), (2, 2)), 16, 2)))}
    >>> plan = plan_load(saved, [LoadRequest("w", Box((1, 0), (2, 2)))])
    >>> [(i.fragment.key, str(i.overlap)) for i in plan.items]
    [('r0/a', '[1:2, 0:2]'), ('r1/a', '[2:3, 0:2]')]
    >>> plan.sources()
    {'r0/a': 0, 'r1/a': 1}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ucp.errors import KeyMismatchError, ShapeMismatchError
from ucp.geometry import Box, Piece, Region, plan_overlaps, region_fits
from ucp.manifest import Fragment, TensorEntry
from ucp.spec import FragmentMap

__all__ = ["LoadPlan", "LoadRequest", "ReadItem", "plan_load", "requests_of"]


@dataclass(frozen=True)
class LoadRequest:
    """Fill ``region`` of logical tensor ``logical``: piece ``piece`` of local tensor ``dest`` (when it
    comes from a fragment map; ``dest`` None for a plain read)."""

    logical: str
    region: Region
    dest: str | None = None
    piece: int = 0


@dataclass(frozen=True)
class ReadItem:
    """Copy ``overlap`` (logical coordinates) from saved ``fragment`` into request ``request``.

    ``src``/``dst`` are the pieces of the fragment's region and of the request's region that
    hold the overlap (:class:`~ucp.geometry.Piece`: a box, and for a flat region the run of
    its storage that box is).
    """

    request: int
    fragment: Fragment
    src: Piece
    dst: Piece
    overlap: Box

    @property
    def numel(self) -> int:
        return self.overlap.numel


@dataclass(frozen=True)
class LoadPlan:
    """Every read of one load: ``items`` in request order, each request's in target order."""

    requests: tuple[LoadRequest, ...]
    items: tuple[ReadItem, ...]

    def sources(self) -> dict[str, int]:
        """The saved arrays the plan reads: key -> the rank that wrote it (first-read order)."""
        return {i.fragment.key: i.fragment.rank for i in self.items}

    def gaps(self) -> dict[int, int]:
        """Request index -> elements no saved fragment supplies (empty for a checkpoint that covers the load)."""
        filled = [0] * len(self.requests)
        for item in self.items:
            filled[item.request] += item.numel
        return {i: r.region.numel - f for i, (r, f) in enumerate(zip(self.requests, filled)) if r.region.numel != f}


Target = FragmentMap | Sequence[LoadRequest]


def requests_of(target: Target) -> tuple[LoadRequest, ...]:
    """The requests of a load-direction fragment map (every piece of every local tensor), or ``target`` itself."""
    if isinstance(target, FragmentMap):
        return tuple(
            LoadRequest(p.logical, p.target, key, i)
            for key, spec in target.tensors.items()
            for i, p in enumerate(spec.pieces)
        )
    return tuple(target)


def plan_load(manifest: Any, target: Target) -> LoadPlan:
    """The reads that fill ``target`` from the fragments of ``manifest`` (a :class:`~ucp.manifest.Manifest`,
    or a mapping of logical name to :class:`~ucp.manifest.TensorEntry`). Pure.

    Only fragments that overlap a request produce items, so an executor reads only the bytes
    it needs. A request for a tensor the manifest lacks raises :class:`~ucp.errors.KeyMismatchError`,
    one outside its tensor :class:`~ucp.errors.ShapeMismatchError`.
    """
    tensors: Mapping[str, TensorEntry] = getattr(manifest, "tensors", manifest)
    requests = requests_of(target)
    items: list[ReadItem] = []
    for index, request in enumerate(requests):
        try:
            entry = tensors[request.logical]
        except KeyError:
            raise KeyMismatchError(
                f"no logical tensor {request.logical!r} in the checkpoint (a load asks for "
                f"{request.region} of it); `ucp inspect` lists the tensors it has"
            ) from None
        if not region_fits(request.region, entry.shape):
            raise ShapeMismatchError(
                f"cannot read {request.region} of tensor {request.logical!r}: it does not fit "
                f"its shape {list(entry.shape)}"
            )
        frags = entry.fragments
        for op in plan_overlaps([f.region for f in frags], request.region, entry.shape):
            items.append(ReadItem(index, frags[op.source], op.src, op.dst, op.overlap))
    return LoadPlan(requests, tuple(items))
