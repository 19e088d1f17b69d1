"""Where each read of a rank's new state comes from: itself, a peer's memory, or storage.

A recovering job holds a committed checkpoint's arrays in memory, spread over the
surviving ranks (each rank's own arrays, and the replicas of other ranks' arrays that
a placement policy put there). A rank that takes a new place in a new layout needs the
regions of logical tensors its new fragment map names: exactly the reads of a load plan
(:func:`ucp.load_plan.plan_load` over the checkpoint's manifest). Every read comes out of
one saved fragment, and a fragment is held whole (its array) or not at all, so choosing a
source is a per-read choice among the fragment's holders, with no geometry of its own:
:func:`assign_holders` picks the rank's own memory first, then a peer (spread over the
holders, so ranks needing the same array ask different ones), and storage only for a
fragment no survivor holds. Every element of every target piece is planned exactly once,
because the load plan's reads are::

    >>> from ucp.geometry import Box
    >>> from ucp.load_plan import LoadRequest, plan_load
    >>> from ucp.manifest import Fragment, TensorEntry
    >>> saved = {"w": TensorEntry("w", "float32", (4, 2), (
    ...     Fragment("r0/a", 0, Box((0, 0), (2, 2)), 16, 2), Fragment("r1/a", 1, Box((2, 0), (2, 2)), 16, 2)))}
    >>> plan = plan_load(saved, [LoadRequest("w", Box((0, 0), (4, 2)), "w")])
    >>> peer = assign_holders(plan, {"r1/a": [1, 2]}, rank=0, world=3)
    >>> [(f.holder, str(f.overlap)) for f in peer.fetches], [str(r.overlap) for r in peer.reads]
    ([(1, '[2:4, 0:2]')], ['[0:2, 0:2]'])
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ucp.geometry import Box, Piece
from ucp.load_plan import LoadPlan, LoadRequest, ReadItem

__all__ = ["Fetch", "PeerPlan", "assign_holders"]


@dataclass(frozen=True)
class Fetch:
    """One read of a load plan and where it comes from: rank ``holder``'s memory, or storage (None).

    ``request`` is the read's request (its local tensor ``dest`` and piece ``piece``), ``item``
    the read (saved fragment, the overlap in logical coordinates, and the pieces holding it).
    """

    request: LoadRequest
    item: ReadItem
    holder: int | None

    @property
    def logical(self) -> str:
        return self.request.logical

    @property
    def dest_key(self) -> str:
        assert self.request.dest is not None, "a fragment map's requests name their local tensor"
        return self.request.dest

    @property
    def piece(self) -> int:
        return self.request.piece

    @property
    def dst(self) -> Piece:
        return self.item.dst

    @property
    def overlap(self) -> Box:
        return self.item.overlap

    @property
    def numel(self) -> int:
        return self.item.numel


@dataclass(frozen=True)
class PeerPlan:
    """One rank's plan: ``fetches`` from held arrays (its own or peers'), ``reads`` from storage."""

    rank: int
    fetches: tuple[Fetch, ...]
    reads: tuple[Fetch, ...]

    def elements(self) -> dict[str, int]:
        """Elements by origin: ``own``, ``peer`` and ``storage``."""
        out = {"own": 0, "peer": 0, "storage": sum(r.numel for r in self.reads)}
        for f in self.fetches:
            out["own" if f.holder == self.rank else "peer"] += f.numel
        return out


def _choose(holders: Collection[int], rank: int, world: int) -> int | None:
    """Own memory first; then the first holder after ``rank`` in ring order, so that ranks
    needing the same array ask different holders."""
    if rank in holders:
        return rank
    return min(holders, key=lambda h: (h - rank) % max(world, 1), default=None)


def assign_holders(plan: LoadPlan, holders: Mapping[str, Collection[int]], rank: int, world: int) -> PeerPlan:
    """A source for every read of ``plan`` (this rank's load plan). Pure.

    ``holders``: saved array key -> the ranks holding it in memory (with a digest that matched);
    a read whose array nobody holds is left to storage.
    """
    fetches: list[Fetch] = []
    reads: list[Fetch] = []
    for item in plan.items:
        holder = _choose(holders.get(item.fragment.key, ()), rank, world)
        fetch = Fetch(plan.requests[item.request], item, holder)
        (reads if holder is None else fetches).append(fetch)
    return PeerPlan(rank, tuple(fetches), tuple(reads))
