"""Asynchronous saves: the caller waits only for a snapshot into host memory.

:class:`AsyncSaver` copies every tensor of the state into a bounded, reused
staging arena (:mod:`ucp.staging_pool`) and hands each copy to a background thread
that writes it with :class:`ucp.writer.CheckpointWriter` and gives the memory
back. When the state is larger than the staging budget the snapshot streams:
the caller copies as fast as the writer frees space, so it blocks longer but
memory never exceeds the budget. A tensor larger than the whole budget is
written straight from the caller's tensor while the caller waits.

Failures are never lost: a background failure is raised (as
:class:`~ucp.errors.AsyncSaveError`, chaining the original) by the handle and
also by the next ``save``/``wait`` of the same saver. One save is in flight
per saver; a new one first waits for the previous one.

A program may end without waiting: the background writer is not a daemon
thread, so the interpreter finishes the save before it exits. If that save
fails and nobody asked the handle or the saver about it, the failure is
printed to stderr at exit and the process exits with status 1 (other exit
handlers registered before the save then do not run): a job never ends
"successfully" with its last checkpoint lost.

Distributed saves run their collectives from the background thread on the
``process_group`` passed in. Pass a group dedicated to checkpointing (e.g.
``dist.new_group(backend="gloo")``) so those collectives never interleave
with the training loop's own.

Example::

    saver = AsyncSaver(staging_budget=1 << 30)
    handle = saver.save({"model": model.state_dict(), "step": 100}, "ckpt/step_100")
    ...  # keep training: the state may change now, the checkpoint will not
    handle.wait()
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ucp.api import open_writer
from ucp.errors import AsyncSaveError, SaveTimeoutError
from ucp.staging_pool import DEFAULT_BUDGET_BYTES, PoolStats, StagedBlock, StagingPool, staged_nbytes

__all__ = ["AsyncSaver", "AsyncSaveHandle", "async_save", "default_saver"]


@dataclass(frozen=True)
class _Write:
    key: str
    tensor: torch.Tensor
    block: StagedBlock | None = None  # staged copy, released after the write
    written: threading.Event | None = None  # set once a direct (unstaged) write is done


@dataclass(frozen=True)
class _Commit:
    tree: Any


@dataclass(frozen=True)
class _Abort:
    error: BaseException


class AsyncSaveHandle:
    """The result of one asynchronous save (``concurrent.futures`` style).

    ``blocking_seconds``: how long the caller was blocked (the snapshot);
    ``background_seconds``: from the caller's return until the commit (``None`` while running).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.blocking_seconds: float = 0.0
        self._started = time.perf_counter()
        self._returned: float | None = None
        self._finished: float | None = None
        self._done = threading.Event()
        self._error: AsyncSaveError | None = None
        self._observed = False  # someone asked for the outcome: a failure is theirs to handle

    @property
    def background_seconds(self) -> float | None:
        if self._finished is None or self._returned is None:
            return None
        return max(0.0, self._finished - self._returned)

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self._done.is_set()

    def exception(self, timeout: float | None = None) -> AsyncSaveError | None:
        """Wait for the save and return its failure, or ``None`` if it committed."""
        if not self._done.wait(timeout):
            raise SaveTimeoutError(f"async save to {self.path} still running after {timeout} s")
        self._observed = True
        atexit.unregister(self._fail_if_lost)
        return self._error

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the checkpoint is committed; raise :class:`AsyncSaveError` if it failed."""
        error = self.exception(timeout)
        if error is not None:
            raise error

    def _finish(self, error: BaseException | None) -> None:  # called by the saver's thread
        if error is not None:
            wrapped = AsyncSaveError(f"async save to {self.path} failed: {type(error).__name__}: {error}")
            wrapped.__cause__ = error
            self._error = wrapped
        else:
            atexit.unregister(self._fail_if_lost)
        self._finished = time.perf_counter()
        self._done.set()

    def _fail_if_lost(self) -> None:  # an atexit handler, registered when the save starts
        """At exit (after the writer thread finished): a failure nobody looked at ends the process loudly."""
        if self._observed or (self.done() and self._error is None):
            return
        what = f"{type(self._error).__name__}: {self._error}" if self._error is not None else "it never finished"
        sys.stderr.write(f"ucp: the async save to {self.path} failed and nobody waited for it: {what}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # exit handlers cannot change the exit status any other way


class AsyncSaver:
    """Saves in the background through a reusable staging pool of at most ``staging_budget`` bytes.

    ``save_kwargs`` given to :meth:`save` are those of :func:`ucp.save` (``spec``,
    ``process_group``, ``rank``, ``world_size``, ``checksums``, ``overwrite``...).
    The budget defaults to 2 GiB; the arena takes ``min(budget, state size)``
    and is kept for the next save (``stats()`` shows it).

    Example::

        saver = AsyncSaver(staging_budget=4 << 30)
        for step in range(1, steps + 1):
            train_one_step()
            if step % 100 == 0:
                saver.save(state, f"ckpt/step_{step}")  # waits for the previous save first
        saver.wait()
    """

    def __init__(self, *, staging_budget: int | None = None, pin_memory: bool | None = None) -> None:
        self.pool = StagingPool(budget_bytes=staging_budget or DEFAULT_BUDGET_BYTES, pin_memory=pin_memory)
        self._lock = threading.Lock()  # one save (snapshot phase) at a time per saver
        self._inflight: AsyncSaveHandle | None = None
        self._unreported: AsyncSaveError | None = None
        _finish_before_shutdown(weakref.ref(self))

    # ------------------------------------------------------------- public API
    def save(self, state: Any, path: str | Path, **save_kwargs: Any) -> AsyncSaveHandle:
        """Snapshot ``state`` and write it to ``path`` in the background; see the module doc."""
        with self._lock:
            self._wait_previous()
            return self._start(state, path, save_kwargs)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the save in flight; raise a background failure not yet raised by this saver."""
        with self._lock:
            self._wait_previous(timeout)

    def stats(self) -> PoolStats:
        """The staging pool's instrumentation (capacity, bytes in use, peak, allocations)."""
        return self.pool.stats()

    # --------------------------------------------------------------- internals
    def _wait_previous(self, timeout: float | None = None) -> None:
        if self._inflight is not None:
            error = self._inflight.exception(timeout)
            self._inflight = None
            if error is not None:
                self._unreported = error
        if self._unreported is not None:
            error, self._unreported = self._unreported, None
            raise AsyncSaveError(f"the previous async save failed: {error}") from error

    def _start(self, state: Any, path: str | Path, save_kwargs: dict[str, Any]) -> AsyncSaveHandle:
        started = time.perf_counter()
        # Everything that can be refused (bad input on any rank, an existing checkpoint) is
        # refused here, in the caller's thread; flattening copies the non-tensor state into
        # fresh JSON values: the snapshot of the tree.
        flat, writer = open_writer(state, path, **save_kwargs)
        handle = AsyncSaveHandle(path)
        stageable = {k for k, t in flat.tensors.items() if type(t) in (torch.Tensor, torch.nn.Parameter)}
        total = sum(staged_nbytes(flat.tensors[k]) for k in stageable)
        try:
            capacity = self.pool.reserve(total)
        except BaseException as err:  # e.g. no memory for the arena: the open writer must not linger
            writer.abort(f"{type(err).__name__}: {err}")
            raise
        work: queue.SimpleQueue = queue.SimpleQueue()
        thread = threading.Thread(
            target=self._background,
            args=(writer, work, handle, total > capacity),
            name="ucp-async-save",
            daemon=False,  # the interpreter finishes a save in flight before it exits
        )
        atexit.register(handle._fail_if_lost)
        self._inflight = handle
        # When everything fits, the writer starts only once the snapshot is complete:
        # both compete for CPU and memory bandwidth, and the caller waits only for the
        # snapshot. Streaming (or a tensor written directly) needs the writer at once.
        direct = len(stageable) < len(flat.tensors) or any(not self.pool.fits(flat.tensors[k]) for k in stageable)
        if total > capacity or direct:
            thread.start()
        try:
            for key, tensor in flat.tensors.items():
                if key in stageable and self.pool.fits(tensor):
                    block = self.pool.stage(tensor)
                    work.put(_Write(key, block.tensor, block))
                else:
                    # Too big to stage (or not a plain tensor, e.g. a DTensor): written from the
                    # caller's tensor while the caller waits, so later mutation cannot leak in.
                    written = threading.Event()
                    work.put(_Write(key, tensor, written=written))
                    while not written.wait(0.05) and not handle.done():
                        pass
                if handle.done():  # the writer failed; the handle carries the error
                    break
            else:
                work.put(_Commit(flat.tree))
            if not thread.is_alive() and not handle.done():
                thread.start()
        except AsyncSaveError:
            pass  # staging was interrupted by a writer failure: the handle reports it
        except BaseException as err:
            # The caller's own failure (e.g. KeyboardInterrupt mid-snapshot): stop the writer,
            # and do not report the same failure again from the next save.
            work.put(_Abort(err))
            if not thread.is_alive() and not handle.done():
                thread.start()
            handle.exception()  # waits; the caller gets this failure as it is
            self._inflight = None
            raise
        finally:
            handle._returned = time.perf_counter()
            handle.blocking_seconds = handle._returned - started
        return handle

    def _background(self, writer: Any, work: queue.SimpleQueue, handle: AsyncSaveHandle, streaming: bool) -> None:
        error: BaseException | None = None
        unflushed: list[StagedBlock] = []
        unflushed_bytes = 0
        # The writer keeps referencing a tensor until its write completes, so a staged
        # block goes back to the pool only after a flush. Flushing costs pipelining,
        # so it happens only when the snapshot needs the memory: in streaming mode
        # once half the arena is written-but-unflushed, or when the snapshot stalls.
        half = self.pool.capacity_bytes // 2

        def hand_back() -> None:
            nonlocal unflushed_bytes
            writer.flush()
            for block in unflushed:
                self.pool.release(block)
            unflushed.clear()
            unflushed_bytes = 0

        try:
            while True:
                try:
                    item = work.get(timeout=0.01 if streaming and unflushed else None)
                except queue.Empty:
                    hand_back()  # the snapshot is probably waiting for space
                    continue
                if isinstance(item, _Abort):
                    raise item.error
                if isinstance(item, _Commit):
                    writer.set_state(item.tree)
                    writer.close()
                    break
                writer.add(item.key, item.tensor)
                if item.block is not None:
                    unflushed.append(item.block)
                    unflushed_bytes += item.block.end - item.block.start
                if item.written is not None:
                    hand_back()
                    item.written.set()
                elif streaming and unflushed_bytes >= half:
                    hand_back()
        except BaseException as err:  # noqa: BLE001 - reported through the handle, never lost
            error = err
            self.pool.interrupt(err)
            try:
                writer.abort(f"{type(err).__name__}: {err}")
            except Exception:  # noqa: BLE001 - the first failure is the one worth reporting
                pass
        finally:
            self.pool.release_all()
            handle._finish(error)


def _finish_before_shutdown(saver_ref: weakref.ref) -> None:
    """Make the interpreter's shutdown wait for this saver's save in flight, before thread pools stop.

    ``threading._register_atexit`` hooks run once the main thread is done and before
    ``concurrent.futures`` refuses new work (its own hook), which the writer needs; plain
    ``atexit`` handlers run too late. Waiting for the (non-daemon) writer thread alone
    would let its I/O pools shut down under it.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # not CPython >= 3.9: the non-daemon thread still finishes or fails loudly
        return

    def finish() -> None:
        saver = saver_ref()
        handle = None if saver is None else saver._inflight
        if handle is not None:
            handle._done.wait()

    try:
        register(finish)
    except RuntimeError:  # the interpreter is already shutting down
        pass


@functools.cache
def default_saver() -> AsyncSaver:
    """The process-wide saver behind :func:`async_save` (created on first use)."""
    return AsyncSaver()


def async_save(state: Any, path: str | Path, **save_kwargs: Any) -> AsyncSaveHandle:
    """Save ``state`` to ``path`` in the background; return once it is snapshotted.

    Example::

        handle = ucp.async_save(model.state_dict(), "ckpt/step_200")
        train_more()
        handle.wait()  # raises AsyncSaveError if the write failed
    """
    return default_saver().save(state, path, **save_kwargs)
