"""Whole-fragment reads, coalesced: adjacent byte ranges of a pack become one read straight into the tensors.

When a load copies whole fragments into contiguous destinations (the usual case: a rank loads
the layout it saved, or whole tensors), each chunk of each fragment is a *unit*: a byte range
of a file and the destination bytes it fills. Units of one pack that lie next to each other
(alignment padding between them is read into a scratch buffer) are merged into *runs* of up to
``max_bytes``, and each run is one ``preadv`` into the destinations: no intermediate copy, one
system call for many small tensors. Checksums are computed by the I/O thread right after its
read, so hashing one run overlaps the reads of the others::

    >>> units = [Unit("r0/pack", 0, 100, "a"), Unit("r0/pack", 128, 50, "b"), Unit("r0/pack", 4096, 10, "c")]
    >>> [(r.start, r.stop, [u.tag for u in r.units]) for r in coalesce(units, max_bytes=1 << 20, max_gap=64)]
    [(0, 178, ['a', 'b']), (4096, 4106, ['c'])]

:func:`coalesce` is pure; :func:`read_runs` carries runs out against a store with a bounded
number of reads in flight.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Callable, Iterable, Sequence

import numpy as np

__all__ = ["ChunkPieces", "Run", "Unit", "coalesce", "read_runs"]


@dataclass(frozen=True)
class Unit:
    """``nbytes`` bytes at ``offset`` of pack ``key``, for whatever ``tag`` names (a destination, a chunk)."""

    key: str
    offset: int
    nbytes: int
    tag: Any = None

    @property
    def stop(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class Run:
    """Units of one pack read by one call: bytes ``[start, stop)``, gaps between the units included."""

    key: str
    units: tuple[Unit, ...]

    @property
    def start(self) -> int:
        return self.units[0].offset

    @property
    def stop(self) -> int:
        return self.units[-1].stop


def coalesce(units: Iterable[Unit], *, max_bytes: int, max_gap: int) -> list[Run]:
    """Merge units of the same pack, in offset order, whose gaps are at most ``max_gap`` bytes, into runs
    of at most ``max_bytes`` (a larger unit is a run of its own). Overlapping units never share a run."""
    runs: list[Run] = []
    current: list[Unit] = []
    for unit in sorted(units, key=lambda u: (u.key, u.offset)):
        if current:
            last = current[-1]
            if (
                unit.key == last.key
                and last.stop <= unit.offset <= last.stop + max_gap
                and unit.stop - current[0].offset <= max_bytes
            ):
                current.append(unit)
                continue
            runs.append(Run(last.key, tuple(current)))
        current = [unit]
    if current:
        runs.append(Run(current[-1].key, tuple(current)))
    return runs


def read_runs(
    runs: Sequence[Run],
    start_read: Callable[[Run, list[np.ndarray]], Any],
    destination: Callable[[Unit], list[np.ndarray]],
    on_read: Callable[[Unit, list[np.ndarray], list[str | None]], None],
    *,
    in_flight: int,
) -> None:
    """Read every run: ``start_read(run, outs)`` returns a future of one digest per out (``outs``: the
    destinations of the run's bytes from ``run.start`` on, back to back);
    ``destination(unit)`` is the arrays a unit's bytes fill, back to back (asked when its run starts,
    so buffers it makes exist only while the run is in flight); ``on_read(unit, arrays, digests)``
    checks a unit once its run is read.

    At most ``in_flight`` reads are outstanding; results are checked in run order.
    """
    scratch = np.empty(max((_largest_gap(r) for r in runs), default=0), dtype=np.uint8)

    def start(run: Run) -> Any:
        outs: list[np.ndarray] = []
        pieces: list[list[np.ndarray]] = []
        at = run.start
        for unit in run.units:
            if unit.offset > at:
                outs.append(scratch[: unit.offset - at])  # alignment padding: read, never used
            pieces.append(destination(unit))
            outs.extend(pieces[-1])
            at = unit.stop
        return pieces, start_read(run, outs)

    window: deque = deque()
    pending = iter(runs)
    for run in pending:
        window.append((run, start(run)))
        if len(window) >= in_flight:
            break
    while window:
        run, (pieces, future) = window.popleft()
        digests = future.result()
        nxt = next(pending, None)
        if nxt is not None:
            window.append((nxt, start(nxt)))
        found = iter(digests)
        at = run.start
        for unit, arrays in zip(run.units, pieces, strict=True):
            if unit.offset > at:
                next(found)  # the padding's
            on_read(unit, arrays, [next(found) for _ in arrays])
            at = unit.stop


class ChunkPieces:
    """One stored chunk (``nbytes`` at ``offset`` of its pack) read whole for parts of it that destinations want.

    A chunk is checked whole, so it is read whole: the wanted ranges straight into their
    destinations, the rest into scratch made when the read starts (:meth:`arrays`: the pieces
    back to back, hashed in order). Where wanted ranges overlap (two destinations of the same
    bytes), the whole chunk goes into scratch and :meth:`copy_out` fills the destinations once
    it is checked::

        >>> c = ChunkPieces("w", None, 0, 4096, 10)
        >>> c.want(2, np.zeros(3, np.uint8)); [a.nbytes for a in c.arrays()]
        [2, 3, 5]
    """

    def __init__(self, name: str, frag: Any, index: int, offset: int, nbytes: int) -> None:
        self.name, self.frag, self.index, self.offset, self.nbytes = name, frag, index, offset, nbytes
        self._wants: list[tuple[int, np.ndarray]] = []  # (start in the chunk, destination bytes)

    def want(self, start: int, dest: np.ndarray) -> None:
        """Bytes ``[start, start + dest.nbytes)`` of the chunk go into ``dest`` (1-d ``uint8``)."""
        assert 0 <= start and start + dest.nbytes <= self.nbytes, "a range inside the chunk"
        self._wants.append((start, dest))

    def _overlapping(self) -> bool:
        self._wants.sort(key=lambda w: w[0])
        return any(a[0] + a[1].nbytes > b[0] for a, b in pairwise(self._wants))

    def arrays(self) -> list[np.ndarray]:
        """The chunk's bytes as arrays back to back: destinations, and scratch between them."""
        if self._overlapping():
            return [np.empty(self.nbytes, np.uint8)]
        gaps, at = [], 0
        for start, dest in self._wants:
            gaps.append(start - at)
            at = start + dest.nbytes
        scratch = np.empty(sum(gaps) + self.nbytes - at, np.uint8)  # one buffer for every gap
        out, used = [], 0
        for gap, (_, dest) in zip(gaps, self._wants, strict=True):
            if gap:
                out.append(scratch[used : used + gap])
                used += gap
            out.append(dest)
        if used < scratch.nbytes:
            out.append(scratch[used:])
        return out

    def copy_out(self, arrays: list[np.ndarray]) -> None:
        """After the chunk is checked: fill destinations that :meth:`arrays` left in scratch."""
        if self._overlapping():
            for start, dest in self._wants:
                dest[:] = arrays[0][start : start + dest.nbytes]


def _largest_gap(run: Run) -> int:
    return max((b.offset - a.stop for a, b in pairwise(run.units)), default=0)
