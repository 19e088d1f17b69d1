"""Start a group of gloo worker processes on this machine, torchrun style, and watch them.

:func:`launch` starts ``world`` processes running ``fn(ctx, *args)`` and returns a
:class:`Group` to watch; :func:`run` starts them, waits and raises with the
failing rank's traceback if any rank fails. Processes are forked from a fork
server that has imported torch (and ``preload``) once, so starting 8 ranks costs
milliseconds rather than 8 interpreter start-ups; each rank then initialises a
real process group over TCP. ``ctx.events`` is a queue back to the parent
(progress, losses); results are returned by ``fn`` from rank 0.

Example::

    def work(ctx, n):
        return dist.get_world_size() * n       # inside a process group of `world` ranks

    assert run(work, world=4, args=(3,)) == 12
"""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch.multiprocessing as mp

from ucp.errors import UcpError

__all__ = ["WorkerContext", "Group", "launch", "run", "WorkerFailed", "PRELOAD", "WITH_DEEPSPEED",
           "start_fork_server", "free_port"]

# Imported once by the fork server, inherited by every worker (ucp's engine and DCP alike, so a
# benchmark restarting ranks charges neither with imports the other was spared).
PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
           "torch.distributed.pipelining", "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
           "tensorstore", "ucp.api", "ucp.ucl.bind", "ucp.integrations.llama.model")
WITH_DEEPSPEED = (*PRELOAD, "ucp.integrations.deepspeed.preload")


class WorkerFailed(UcpError, RuntimeError):
    """A worker process raised, died or hung; the message carries its rank and traceback."""


@dataclass(frozen=True)
class WorkerContext:
    """What a worker knows about its place in the group."""

    rank: int
    world: int
    events: Any  # multiprocessing queue to the parent

    def emit(self, kind: str, **data: Any) -> None:
        self.events.put({"kind": kind, "rank": self.rank, **data})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous bound a moment later.

    Binding port 0 and closing hands back an *ephemeral* port, which the kernel may give to the
    next outgoing connection (gloo opens many) before the rendezvous binds it; under a parallel
    test run that race happens. This picks a random port below the kernel's ephemeral range
    instead, which outgoing connections never get; the bind test skips ports in use. Only another
    caller drawing the same port in the same instant can still collide (about 1 in 10^4):
    :func:`launch` avoids even that by binding its store to port 0 itself.

    >>> 1024 < free_port() < 65536
    True
    """
    low, high = _ephemeral_range()
    first, last = (10000, low - 1) if low > 12000 else (high + 1, 65535)
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randint(first, last)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # everything drawn was busy: fall back to the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(v) for v in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; macOS uses 49152-65535, above it as well


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when its parent (the fork server, which exits with the launcher)
    goes, so a launcher killed outright leaves no ranks behind. Elsewhere a no-op."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _worker(rank: int, world: int, port: int, timeout_s: float, events, fn, args) -> None:
    import torch
    import torch.distributed as dist

    _die_with_parent()
    torch.set_num_threads(1)  # ranks share the cores; more threads only contend
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank, world, events)
    try:
        # The store is the launcher's (see launch): no rank hosts the rendezvous, so none can take it
        # down while the others still talk to it, and its port was bound, never guessed.
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        result = fn(ctx, *args)
        ctx.emit("done", result=result if rank == 0 else None)
    except BaseException:  # noqa: BLE001 - reported to the parent, then the process exits non-zero
        ctx.emit("error", traceback=traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Group:
    """A started group of worker processes (see :func:`launch`)."""

    def __init__(self, procs: list, events, store: Any = None) -> None:
        self.procs = procs
        self.events = events
        self.store = store  # the rendezvous the ranks joined; it lives as long as the group is watched
        self.result: Any = None
        self.errors: dict[int, str] = {}
        self.done: set[int] = set()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self) -> list[bool]:
        return [p.is_alive() for p in self.procs]

    def poll(self, timeout: float = 0.2) -> dict | None:
        """The next event from any worker (``done``/``error`` are recorded here too), or None."""
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        except (EOFError, OSError, RuntimeError):  # a message cut short by a killed sender
            return None
        if event["kind"] == "done":
            self.done.add(event["rank"])
            if event["rank"] == 0:
                self.result = event["result"]
        elif event["kind"] == "error":
            self.errors[event["rank"]] = event["traceback"]
        return event

    def kill(self, rank: int) -> None:
        """SIGKILL one rank: a real, unannounced failure."""
        os.kill(self.procs[rank].pid, signal.SIGKILL)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.join(timeout=10)

    def wait(self, *, timeout: float, on_event: Callable[[dict], Any] | None = None) -> Any:
        """Wait for every rank to finish; return rank 0's result or raise :class:`WorkerFailed`."""
        deadline = time.monotonic() + timeout
        while len(self.done) < len(self.procs) and not self.errors:
            event = self.poll()
            if event is not None and on_event is not None and event["kind"] not in ("done", "error"):
                on_event(event)
            if event is None and self._dead_silently():
                self._drain(on_event)
                if self._dead_silently():
                    break
            if time.monotonic() > deadline:
                self.kill_all()
                raise WorkerFailed(f"workers did not finish within {timeout:.0f}s (ranks done: {sorted(self.done)})")
        self._drain(on_event)
        if self.errors and not self._dead_silently():
            time.sleep(0.2)  # a rank that died makes its peers fail at once: let the agent see the death
            # and read the errors that arrived meanwhile: a peer that failed in those 0.2 s has exited,
            # and without its report it would pass for one that died without a traceback
            self._drain(on_event)
        silent = self._dead_silently()  # before anyone is killed here
        if silent or self.errors:
            self.kill_all()
        if silent:
            rank = silent[0]
            others = f"; {len(self.errors)} other rank(s) failed after it" if self.errors else ""
            raise WorkerFailed(f"rank {rank} of {len(self.procs)} died without a traceback "
                               f"(exit code {self.procs[rank].exitcode}: killed or crashed){others}")
        if self.errors:
            rank = next(iter(self.errors))  # the first to report: the others usually fail because of it
            raise WorkerFailed(f"rank {rank} of {len(self.procs)} failed:\n{self.errors[rank]}")
        for proc in self.procs:
            proc.join(timeout=30)
        return self.result

    def _dead_silently(self) -> list[int]:
        """Ranks whose process ended without reporting done or an error (killed, crashed)."""
        return [r for r, p in enumerate(self.procs)
                if not p.is_alive() and r not in self.done and r not in self.errors]

    def _drain(self, on_event) -> None:
        while True:
            event = self.poll(timeout=0.05)
            if event is None:
                return
            if on_event is not None and event["kind"] not in ("done", "error"):
                on_event(event)


def start_fork_server(preload: tuple[str, ...] = PRELOAD):
    """The multiprocessing context whose fork server imported ``preload`` (started on first use).

    There is one fork server per process: the first caller's ``preload`` wins, later
    ones only add imports to each worker. Start it early with everything the
    process will need (:data:`WITH_DEEPSPEED` for DeepSpeed ranks).
    """
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    forkserver.ensure_running()
    return ctx


def launch(fn: Callable, *, world: int, args: tuple = (), collective_timeout_s: float = 120.0,
           preload: tuple[str, ...] = PRELOAD) -> Group:
    """Start ``world`` ranks running ``fn(ctx, *args)`` in a gloo process group; return at once.

    ``fn`` must be importable (a module-level function). ``collective_timeout_s``
    bounds every collective: it is how surviving ranks notice a dead peer.
    """
    import torch.distributed as dist

    ctx = start_fork_server(preload)
    events = ctx.Queue()
    # The launcher hosts the rendezvous on a port the kernel picks as it binds (no free-port race),
    # and outlives every rank (no rank exits while its peers still use the store).
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=collective_timeout_s))
    procs = [ctx.Process(target=_worker, args=(r, world, store.port, collective_timeout_s, events, fn, args),
                         daemon=True) for r in range(world)]
    for proc in procs:
        proc.start()
    return Group(procs, events, store)


def run(fn: Callable, *, world: int, args: tuple = (), timeout: float = 600.0,
        on_event: Callable[[dict], Any] | None = None, preload: tuple[str, ...] = PRELOAD) -> Any:
    """Start ``world`` ranks, wait for them, return rank 0's result (see :func:`launch`)."""
    return launch(fn, world=world, args=args, preload=preload).wait(timeout=timeout, on_event=on_event)
