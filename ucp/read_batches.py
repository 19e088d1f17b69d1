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

__all__ = ["Run", "Unit", "coalesce", "read_runs"]


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
    destination: Callable[[Unit], np.ndarray],
    on_digest: Callable[[Unit, str | None], None],
    *,
    in_flight: int,
) -> None:
    """Read every run: ``start_read(run, outs)`` returns a future of one digest per out (``outs``: the
    destinations of the run's bytes from ``run.start`` on, back to back);
    ``destination(unit)`` is the array a unit fills; ``on_digest(unit, digest)`` checks it.

    At most ``in_flight`` reads are outstanding; results are checked in run order.
    """
    scratch = np.empty(max((_largest_gap(r) for r in runs), default=0), dtype=np.uint8)

    def start(run: Run) -> Any:
        outs: list[np.ndarray] = []
        at = run.start
        for unit in run.units:
            if unit.offset > at:
                outs.append(scratch[: unit.offset - at])  # alignment padding: read, never used
            outs.append(destination(unit))
            at = unit.stop
        return start_read(run, outs)

    window: deque = deque()
    pending = iter(runs)
    for run in pending:
        window.append((run, start(run)))
        if len(window) >= in_flight:
            break
    while window:
        run, future = window.popleft()
        digests = future.result()
        nxt = next(pending, None)
        if nxt is not None:
            window.append((nxt, start(nxt)))
        found = iter(digests)
        at = run.start
        for unit in run.units:
            if unit.offset > at:
                next(found)  # the padding's
            on_digest(unit, next(found))
            at = unit.stop


def _largest_gap(run: Run) -> int:
    return max((b.offset - a.stop for a, b in pairwise(run.units)), default=0)
