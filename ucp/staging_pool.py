"""A bounded, reusable pool of host memory that async saves snapshot tensors into.

One byte arena, handed out as a ring: the snapshot takes blocks at the head
in the order the background writer consumes them, the writer gives them back
from the tail. Because both ends move in the same order, a ring never
fragments, and a state larger than the arena streams through it: the caller
waits for space only when the writer is behind. The arena is allocated once
(and grown only when a later state is bigger, never beyond the budget), so a
repeated save of the same state reuses the same addresses.

Example::

    >>> pool = StagingPool(budget_bytes=1 << 20)
    >>> pool.reserve(64)  # bytes the coming snapshot needs, capped at the budget
    64
    >>> block = pool.stage(torch.ones(4, 4))
    >>> block.tensor.sum().item()
    16.0
    >>> pool.release(block)
    >>> pool.stats().in_use_bytes
    0
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ucp.errors import AsyncSaveError, InvalidArgumentError, SaveTimeoutError

__all__ = ["StagingPool", "StagedBlock", "PoolStats", "DEFAULT_BUDGET_BYTES", "staged_nbytes"]

DEFAULT_BUDGET_BYTES = 2 << 30
# Block starts are aligned so that any dtype view of the byte arena is legal and
# copies run on cache-line boundaries.
ALIGN = 64


def staged_nbytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor takes in the arena (its data, rounded up to the alignment)."""
    nbytes = tensor.numel() * tensor.element_size()
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class PoolStats:
    """Instrumentation for tests and benchmarks."""

    capacity_bytes: int  # size of the arena now allocated
    in_use_bytes: int  # bytes held by staged blocks now
    peak_in_use_bytes: int  # most bytes ever held at once (since creation)
    arena_allocations: int  # how many times an arena was allocated


@dataclass(frozen=True, eq=False)
class StagedBlock:
    """A host copy of one tensor, living in the arena until released."""

    tensor: torch.Tensor
    start: int
    end: int


class _Closed(Exception):
    """Internal: the pool was interrupted while a caller waited for space."""


class StagingPool:
    """A host byte arena of at most ``budget_bytes``, used as a ring of tensor copies.

    Thread-safe: one producer (the thread that snapshots) and one consumer
    (the background writer) are the intended users. ``interrupt`` wakes a
    producer waiting for space, e.g. when the consumer died.
    """

    def __init__(self, *, budget_bytes: int = DEFAULT_BUDGET_BYTES, pin_memory: bool | None = None) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < ALIGN:
            raise InvalidArgumentError(
                f"staging budget must be an integer of at least {ALIGN} bytes, got {budget_bytes!r}"
            )
        self.budget_bytes = budget_bytes
        # Pinned host memory makes device->host copies faster; only possible with CUDA.
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._arena: torch.Tensor | None = None
        self._blocks: collections.deque[list] = collections.deque()  # [start, end, released]
        self._in_use = 0
        self._peak = 0
        self._allocations = 0
        self._interrupted: BaseException | None = None
        self._cond = threading.Condition()

    # ------------------------------------------------------------------ sizing
    @property
    def capacity_bytes(self) -> int:
        return 0 if self._arena is None else self._arena.numel()

    def reserve(self, total_bytes: int) -> int:
        """Make the arena hold ``min(total_bytes, budget)`` bytes; call while no block is staged.

        Grows (reallocates) only when the arena is smaller than that, so the
        same state staged twice uses the same memory. Returns the capacity.
        """
        want = min(max(total_bytes, ALIGN), self.budget_bytes)
        with self._cond:
            if self._blocks:
                raise RuntimeError("StagingPool.reserve called while blocks are staged")
            self._interrupted = None
            if want > self.capacity_bytes:
                self._arena = None  # drop the old arena before allocating the new one
                self._arena = torch.empty(want, dtype=torch.uint8, pin_memory=self._pin)
                self._allocations += 1
            return self.capacity_bytes

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether the tensor can ever be staged (it is no larger than the arena)."""
        return staged_nbytes(tensor) <= self.capacity_bytes

    # ------------------------------------------------------------ ring logic
    def _find_space(self, nbytes: int) -> int | None:
        capacity = self.capacity_bytes
        if not self._blocks:
            return 0 if nbytes <= capacity else None
        first_start = self._blocks[0][0]
        last_start, last_end = self._blocks[-1][0], self._blocks[-1][1]
        if last_start >= first_start:  # live blocks are one run: free space at both ends
            if capacity - last_end >= nbytes:
                return last_end
            if first_start >= nbytes:
                return 0
            return None
        # wrapped: the only gap is between the newest block and the oldest
        return last_end if first_start - last_end >= nbytes else None

    def stage(self, tensor: torch.Tensor, *, timeout: float | None = None) -> StagedBlock:
        """Copy ``tensor`` into the arena, waiting for space if the ring is full.

        Raises :class:`~ucp.errors.InvalidArgumentError` (a ValueError) when the tensor is larger than the whole arena
        (check :meth:`fits` first) and :class:`AsyncSaveError` when the pool
        was interrupted while waiting.
        """
        nbytes = staged_nbytes(tensor)
        if nbytes > self.capacity_bytes:
            raise InvalidArgumentError(
                f"tensor of {nbytes} bytes does not fit a staging arena of {self.capacity_bytes} bytes; "
                "raise the staging budget or write it directly"
            )
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._interrupted is not None or self._find_space(nbytes) is not None,
                timeout=timeout,
            )
            if self._interrupted is not None:
                raise AsyncSaveError(f"staging interrupted: {self._interrupted}") from self._interrupted
            if not ok:
                raise SaveTimeoutError(f"no staging space for {nbytes} bytes within {timeout} s")
            start = self._find_space(nbytes)
            assert start is not None
            self._blocks.append([start, start + nbytes, False])
            self._in_use += nbytes
            self._peak = max(self._peak, self._in_use)
            arena = self._arena
            assert arena is not None, "the arena exists while there is space in it"
        # Copy outside the lock: the writer may release other blocks meanwhile.
        raw = arena[start : start + tensor.numel() * tensor.element_size()]
        view = (
            raw.view(tensor.dtype).view(tensor.shape)
            if tensor.numel()
            else torch.empty(tensor.shape, dtype=tensor.dtype)
        )
        # A blocking copy: the writer may read the block as soon as it is handed over.
        _copy(view, tensor.detach())
        return StagedBlock(tensor=view, start=start, end=start + nbytes)

    def release(self, block: StagedBlock) -> None:
        """Give a block back; space is reclaimed once all older blocks are back too."""
        with self._cond:
            for entry in self._blocks:
                if entry[0] == block.start and entry[1] == block.end and not entry[2]:
                    entry[2] = True
                    self._in_use -= block.end - block.start
                    break
            else:
                raise RuntimeError(f"block [{block.start}, {block.end}) is not staged in this pool")
            while self._blocks and self._blocks[0][2]:
                self._blocks.popleft()
            self._cond.notify_all()

    def release_all(self) -> None:
        """Drop every staged block (after a failed save)."""
        with self._cond:
            self._blocks.clear()
            self._in_use = 0
            self._cond.notify_all()

    def interrupt(self, error: BaseException) -> None:
        """Wake any thread waiting in :meth:`stage`; it raises AsyncSaveError from ``error``."""
        with self._cond:
            self._interrupted = error
            self._cond.notify_all()

    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(
                capacity_bytes=self.capacity_bytes,
                in_use_bytes=self._in_use,
                peak_in_use_bytes=self._peak,
                arena_allocations=self._allocations,
            )


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``; between CPU tensors by numpy, large ones split over a few threads.

    torch's ``copy_`` hands CPU copies to its OpenMP pool, which stalls badly when other
    processes keep the cores busy (measured on a shared 2-core machine: a 1 GiB state
    copied in 1-3 s by ``copy_``, 0.16 s by numpy). Plain threads (numpy releases the
    GIL) still use idle cores, but degrade gracefully when there are none.
    """
    if src.device.type == "cpu" and src.numel():
        from ucp.dtypes import to_numpy

        try:
            out, source = to_numpy(dst), to_numpy(src)
        except (TypeError, ValueError, RuntimeError):  # a dtype numpy cannot view: let torch copy
            dst.copy_(src)
            return
        if not (src.is_contiguous() and dst.is_contiguous()):
            np.copyto(out, source)
            return
        out, source = out.reshape(-1), source.reshape(-1)
        pieces = min(_COPY_THREADS + 1, max(1, source.nbytes // _COPY_PIECE_BYTES))
        bounds = [len(source) * i // pieces for i in range(pieces + 1)]
        jobs = [
            _copier().submit(np.copyto, out[lo:hi], source[lo:hi])
            for lo, hi in zip(bounds[1:-1], bounds[2:], strict=True)
        ]
        np.copyto(out[: bounds[1]], source[: bounds[1]])
        for job in jobs:
            job.result()
        return
    dst.copy_(src)


_COPY_THREADS = max(1, min(3, (os.cpu_count() or 2) - 1))
_COPY_PIECE_BYTES = 8 << 20


@functools.cache
def _copier() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_COPY_THREADS, thread_name_prefix="ucp-stage")
