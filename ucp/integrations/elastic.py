"""Ranks that outlive a failure: an agent that decides who goes on, and ranks that re-form in-process.

The agent (:class:`ElasticAgent`, the launcher's process) hosts the rendezvous store, a
``TCPStore`` that lives outside every rank, so no rank's death takes it down. It starts
``world`` ranks plus ``spares`` waiting processes and watches them: a child that exits
without finishing, or whose heartbeat (a thread of each rank beats every 0.5 s, also while
the rank waits in a collective) is older than ``hang_timeout_s`` (then it is SIGKILLed
first: a frozen process), is lost. A rank that is alive but stuck in its own code keeps
beating; the process group's timeout bounds its peers' wait, and with no new generation
their rendezvous times out (:class:`RendezvousTimeout`): the job fails loudly, never hangs. It then plans the layout for
the processes left (:func:`ucp.integrations.layout_planner.plan_layout`) and publishes a new
*generation*: the members in their new rank order, the layout, how many are active.

A rank learns of a failure from a collective that raises (a dead gloo peer closes its
sockets at once; a hung one is killed by the agent, or the group's timeout bounds the
wait). It then calls :meth:`ElasticContext.join` with the generation it had: that waits,
with a deadline, for a newer generation that names it, marks itself ready, waits until
every member is ready (or a still newer generation appears: a second failure while
re-forming) and returns the membership; :meth:`ElasticContext.form` destroys the old
process group and creates the new one over a fresh store prefix, in the same Python
process. With NCCL the old communicator must be aborted first (a collective stuck on a
GPU does not return on its own); gloo's sockets fail by themselves, so here destroying
the group is enough.

    agent = ElasticAgent(work, args=(...,), layout="tp=2,dp=2", spares=1)
    result = agent.run(timeout_s=300)
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ucp.integrations.launch import PRELOAD, Group, WorkerFailed, _die_with_parent, free_port, start_fork_server
from ucp.integrations.layout_planner import LayoutChoice, plan_layout
from ucp.errors import UcpError
from ucp.layout import Layout

__all__ = ["ElasticAgent", "ElasticContext", "Membership", "RendezvousTimeout"]


class RendezvousTimeout(UcpError, TimeoutError):
    """No generation that names this rank was published in time (or its members never all came)."""


@dataclass(frozen=True)
class Membership:
    """One generation as a rank sees it: its rank, the world, the layout, how many ranks train."""

    generation: int
    rank: int
    world: int
    layout: Layout
    active: int
    why: str
    uids: tuple[int, ...]

    @property
    def training(self) -> bool:
        return self.rank < self.active


@dataclass
class ElasticContext:
    """What a rank of an elastic job knows: its process id (``uid``), the store, the event queue."""

    uid: int
    store: Any
    events: Any
    collective_timeout_s: float
    rendezvous_timeout_s: float
    membership: Membership | None = None
    _formed: str | None = field(default=None, repr=False)
    # join() and the beat thread's release of a stale generation's collectives exclude each other
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _joining: bool = field(default=False, repr=False)
    # what the main thread is doing, published with every beat: a rendezvous that times out names
    # the members that never came and where each of them was (a diagnosis, not a guess)
    stage: str = field(default="starting", repr=False)
    _stage_since: float = field(default_factory=time.time, repr=False)
    # the process group's own store connection (socket fds): released with the group's collectives
    # when the generation is over, so a rank forming it while a member died is not held until the
    # group's timeout waiting for that member's address
    _pg_store: Any = field(default=None, repr=False)
    _pg_store_fds: frozenset[int] = field(default=frozenset(), repr=False)

    @property
    def rank(self) -> int:
        return -1 if self.membership is None else self.membership.rank

    def emit(self, kind: str, **data: Any) -> None:
        self.events.put({"kind": kind, "uid": self.uid, "rank": self.rank, **data})


    def set_stage(self, stage: str) -> None:
        self.stage, self._stage_since = stage, time.time()

    def stopped(self) -> bool:
        return self.store.check(["stop"])

    def join(self, after: int, *, timeout_s: float | None = None) -> Membership | None:
        """The first generation newer than ``after`` that names this rank, once all its members are
        ready; None when the agent stops the job first (an idle spare at the end)."""
        with self._lock:
            self._joining = True
        self.set_stage(f"waiting for a generation after {after}")
        deadline = time.monotonic() + (self.rendezvous_timeout_s if timeout_s is None else timeout_s)
        missing: tuple[int, list[int]] | None = None
        while time.monotonic() < deadline:
            if self.stopped():
                return None
            latest = int(self.store.get("gen"))
            if latest > after:
                info = json.loads(self.store.get(f"members/{latest}"))
                if self.uid not in info["uids"]:
                    after = latest  # not needed in this generation: wait as a spare
                    continue
                self.store.set(f"ready/{latest}/{self.uid}", "1")
                self.set_stage(f"ready for generation {latest}")
                missing = (latest, info["uids"])
                if self._all_ready(latest, info["uids"], deadline):
                    with self._lock:
                        self.membership = Membership(latest, info["uids"].index(self.uid), len(info["uids"]),
                                                     Layout.parse(info["layout"]), info["active"], info["why"],
                                                     tuple(info["uids"]))
                        self._joining = False
                    return self.membership
                continue  # superseded while waiting (a failure during re-forming): the newer one is read next
            time.sleep(0.002)
        if missing is not None:
            raise RendezvousTimeout(f"process {self.uid}: generation {missing[0]} was not formed within "
                                    f"{self.rendezvous_timeout_s:g}s; {self._absent(*missing)}")
        raise RendezvousTimeout(f"process {self.uid}: no generation after {after} was formed within "
                                f"{self.rendezvous_timeout_s:g}s; the agent is gone or cannot place this rank")

    def _absent(self, generation: int, uids: list[int]) -> str:
        """Which members of ``generation`` never marked themselves ready, and where each last was."""
        out = []
        for u in uids:
            if self.store.check([f"ready/{generation}/{u}"]):
                continue
            where = "no stage reported"
            if self.store.check([f"stage/{u}"]):
                stage, since = json.loads(self.store.get(f"stage/{u}"))
                where = f"{stage} for {time.time() - since:.0f}s"
            out.append(f"process {u} ({where})")
        return "not ready: " + ", ".join(out) if out else "every member was ready, then a newer generation came"

    def _all_ready(self, generation: int, uids: list[int], deadline: float) -> bool:
        keys = [f"ready/{generation}/{u}" for u in uids]
        while time.monotonic() < deadline:
            if self.store.check(keys):
                return True
            if int(self.store.get("gen")) > generation:
                return False
            time.sleep(0.002)
        return False

    def form(self, tag: str = "all", *, world: int | None = None) -> None:
        """(Re)create the default process group for this membership over a fresh store prefix
        (``world``: the first ``world`` ranks only, e.g. the training ones)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self.leave()
        # torch gives every group made with new_group (a device mesh's, FSDP2's, a trainer's own) a
        # 30-minute default timeout, and gloo cannot abort a collective: a survivor blocked in one with
        # a live peer that has already left for the next generation waits until that timeout. Every
        # group of this process gets the collective timeout instead, which bounds that wait.
        c10d.default_pg_timeout = timedelta(seconds=self.collective_timeout_s)
        m = self.membership
        world_size = m.world if world is None else world
        # what torchrun sets, which some engines read (DeepSpeed asserts LOCAL_RANK); one host here
        os.environ.update(RANK=str(m.rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(m.rank),
                          LOCAL_WORLD_SIZE=str(world_size))
        prefix = f"pg/{m.generation}/{tag}"
        self.set_stage(f"forming the process group of generation {m.generation}")
        from ucp.integrations.collective_release import socket_fds

        with self._lock:  # the beat thread's release sees the new connection's fds or none of it
            before = socket_fds()
            self._pg_store = dist.TCPStore(self.store.host, self.store.port, is_master=False,
                                           timeout=timedelta(seconds=self.collective_timeout_s))
            self._pg_store_fds = frozenset(socket_fds() - before)
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, self._pg_store), rank=m.rank,
                                world_size=world_size,
                                timeout=timedelta(seconds=self.collective_timeout_s))
        self._formed = prefix
        self.set_stage(f"in generation {m.generation}")

    def leave(self) -> None:
        """Destroy the default process group, if any (gloo: its sockets to dead peers are closed already)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        with self._lock:  # forgotten before the connection may close: its fd numbers can be reused
            self._pg_store_fds, self._pg_store = frozenset(), None
        self._formed = None


BEAT_EVERY_S = 0.5


RELEASE_AFTER_S = 1.0


def _beat_forever(store, ctx: ElasticContext, port: int) -> None:
    """Beat every BEAT_EVERY_S; and once a newer generation is published while the main thread has
    not come to join it for RELEASE_AFTER_S (blocked in a collective with live peers that left),
    release that collective (:mod:`ucp.integrations.collective_release`)."""
    from ucp.integrations.collective_release import release_collectives

    behind_since, released_for = None, -1
    while True:
        try:
            store.set(f"beat/{ctx.uid}", repr(time.time()))
            store.set(f"stage/{ctx.uid}", json.dumps([ctx.stage, ctx._stage_since]))
            m = ctx.membership
            if m is None or ctx._joining or m.generation == released_for or int(store.get("gen")) <= m.generation:
                behind_since = None
            elif behind_since is None:
                behind_since = time.monotonic()
            elif time.monotonic() - behind_since > RELEASE_AFTER_S:
                with ctx._lock:
                    if not ctx._joining and ctx.membership is m:  # still in the old generation's code
                        released = release_collectives(keep_port=port, also=ctx._pg_store_fds)
                        ctx.emit("released", generation=m.generation, sockets=released)
                released_for, behind_since = m.generation, None
        except Exception:  # noqa: BLE001 - the agent is gone: nobody to tell
            return
        time.sleep(BEAT_EVERY_S)


def _elastic_worker(uid: int, port: int, timeouts: tuple[float, float], events, fn, args) -> None:
    import torch
    import torch.distributed as dist

    _die_with_parent()
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeouts[1]))
    ctx = ElasticContext(uid, store, events, *timeouts)
    # Liveness beats from a thread of their own, over a connection of their own: a rank waiting in a
    # collective still beats (the wait releases the GIL); a frozen or stopped process does not.
    beats = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeouts[1]))
    threading.Thread(target=_beat_forever, args=(beats, ctx, port), daemon=True).start()
    try:
        result = fn(ctx, *args)
        ctx.emit("done", result=result)
    except BaseException:  # noqa: BLE001 - reported to the agent, then the process exits non-zero
        ctx.emit("error", traceback=traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        ctx.leave()


class ElasticAgent:
    """Starts and watches an elastic job on this machine (see the module doc).

    ``check(layout)`` raises when the model cannot run under a layout (for the planner);
    ``override(choice_count) -> layout`` may impose layouts instead of the planner's choice.
    """

    def __init__(self, fn: Callable, *, args: tuple = (), layout: Layout | str, spares: int = 0,
                 check: Callable[[Layout], None] | None = None, override: str | None = None,
                 collective_timeout_s: float = 30.0, rendezvous_timeout_s: float = 60.0,
                 hang_timeout_s: float = 60.0, preload: tuple[str, ...] = PRELOAD) -> None:
        self.layout = Layout.parse(layout) if isinstance(layout, str) else layout
        self.check, self.override, self.hang_timeout_s = check, override, hang_timeout_s
        import torch.distributed as dist

        self.port = free_port()
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=rendezvous_timeout_s))
        self.generation = 0
        self.uids = list(range(self.layout.world_size))
        self.active = self.layout.world_size
        self.lost: set[int] = set()
        self.choices: list[LayoutChoice] = []
        self._publish(self.uids, LayoutChoice(self.layout, self.active, spares, "the job's layout"))
        ctx = start_fork_server(preload)
        self.events = ctx.Queue()
        timeouts = (collective_timeout_s, rendezvous_timeout_s)
        self.procs = [ctx.Process(target=_elastic_worker, args=(u, self.port, timeouts, self.events, fn, args),
                                  daemon=True) for u in range(self.layout.world_size + spares)]
        for proc in self.procs:
            proc.start()
        self.group = Group(self.procs, self.events)  # its poll() records done/error by "rank": we key by uid
        self.results: dict[int, Any] = {}

    # ---------------------------------------------------------------- membership
    def _publish(self, uids: list[int], choice: LayoutChoice) -> None:
        info = {"uids": uids, "layout": str(choice.layout), "active": choice.active, "why": choice.why}
        self.store.set(f"members/{self.generation}", json.dumps(info))
        self.store.set("gen", str(self.generation))
        self.published = time.time()  # a hang is counted from the latest generation at the earliest

    def _reform(self) -> dict:
        """Publish the next generation over the processes left."""
        alive = [u for u in range(len(self.procs)) if u not in self.lost]
        choice = plan_layout(self.layout, len(alive), check=self.check, override=self.override)
        survivors = [u for u in self.uids if u in alive]
        spares = [u for u in alive if u not in self.uids]
        if choice.layout == self.layout:  # same layout: survivors keep their ranks, spares fill the holes
            order = [u if u in alive else None for u in self.uids[:self.active]]
            fill = iter(spares + [u for u in survivors if u not in order])
            order = [u if u is not None else next(fill) for u in order]
            uids = order + [u for u in alive if u not in order]
        else:
            uids = survivors + spares
        self.generation += 1
        self.uids, self.active, self.layout = uids, choice.active, choice.layout
        self.choices.append(choice)
        self._publish(uids, choice)
        return {"kind": "reformed", "generation": self.generation, "layout": str(choice.layout), "why": choice.why,
                "uids": uids, "t": time.monotonic()}

    def kill(self, uid: int, sig: int = signal.SIGKILL) -> float:
        """SIGKILL process ``uid`` (an unannounced failure; ``SIGSTOP``: a hang); returns when it was sent
        (monotonic)."""
        os.kill(self.procs[uid].pid, sig)
        return time.monotonic()

    def _lost_now(self) -> list[int]:
        out = []
        now = time.time()
        for u, proc in enumerate(self.procs):
            if u in self.lost or u in self.results:
                continue
            if not proc.is_alive():
                if proc.exitcode != 0:  # 0: it finished, and its "done" is still in the queue
                    out.append(u)
                continue
            if u in self.uids[:self.active] and self.store.check([f"beat/{u}"]):
                if now - max(float(self.store.get(f"beat/{u}")), self.published) > self.hang_timeout_s:
                    os.kill(proc.pid, signal.SIGKILL)  # hung, not dead: make it dead, so its peers' collectives fail
                    out.append(u)
        return out

    # ---------------------------------------------------------------- running
    def run(self, *, timeout_s: float, on_event: Callable[[dict], Any] | None = None) -> dict[int, Any]:
        """Watch until every training rank of the last generation is done; returns results by uid."""
        deadline = time.monotonic() + timeout_s
        notify = on_event or (lambda e: None)
        last_check = 0.0
        try:
            while True:
                event = self.group.poll(timeout=0.002)
                if event is not None:
                    if event["kind"] == "error":
                        raise WorkerFailed(f"process {event['uid']} failed:\n{event['traceback']}")
                    if event["kind"] == "done":
                        self.results[event["uid"]] = event["result"]
                    notify(event)
                if time.monotonic() - last_check > 0.002:
                    last_check = time.monotonic()
                    lost = self._lost_now()
                    if lost:
                        detected = time.monotonic()
                        self.lost.update(lost)
                        notify({"kind": "detected", "uids": lost, "t": detected})
                        notify(self._reform())
                if all(u in self.results for u in self.uids[:self.active]):
                    return dict(self.results)
                if time.monotonic() > deadline:
                    raise WorkerFailed(f"the elastic job did not finish within {timeout_s:.0f}s "
                                       f"(generation {self.generation}, done: {sorted(self.results)})")
        finally:
            self.close()

    def close(self) -> None:
        """Stop the spares, end every process still running, and close the store."""
        self.store.set("stop", "1")
        end = time.monotonic() + 5
        for proc in self.procs:
            proc.join(timeout=max(0.0, end - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(timeout=5)
