"""Hot recovery, timed: a rank is SIGKILLed and the survivors go on without restarting.

:func:`run_hot` runs the Megatron-style stack (TP/PP/DP, the distributed optimizer), the
torch-native one (FSDP2 + DTensor TP) or DeepSpeed ZeRO under an :class:`~ucp.integrations.elastic.ElasticAgent`. Every ``save_every`` steps the ranks save a
universal checkpoint and replicate its arrays into peers' memory
(:class:`~ucp.replication.replicas.ReplicaManager`: each rank keeps its own arrays and one
peer holds a copy). After step ``kill_after_step`` (a checkpoint committed) one process
is SIGKILLed. The survivors' next collective fails; the agent publishes a new generation
with the layout its planner chose; the survivors (and spares) re-form the process group
in-process, compute the new layout's fragment maps (the UCL program's, or the rebuilt
model's DTensor boxes: :mod:`~ucp.integrations.stacks.hot_stacks`), and fill
them from memory (:func:`ucp.replication.hot_reshard.reshard_from_memory`: own arrays, then
peers', storage only for what nobody holds). Training goes on from the checkpoint's step.

Recovery time is from the SIGKILL to the start of the first step after it (the first
step is reported on its own), split into *detect* (the agent sees the death), *re-form*
(new generation, ranks ready, process group, until every rank is in), *reshard* (plan,
peer transfers, storage reads, model built and filled, until every rank is through).

    report = run_hot(HotPlan(layout="tp=2,dp=2,zero=1", spares=1), "run/")
    report.recovery_s, report.bitwise
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ucp.integrations.elastic import ElasticAgent, ElasticContext, RendezvousTimeout
from ucp.integrations.stacks.common import TrainSettings

__all__ = ["GenerationWatch", "HotPlan", "HotReport", "HeldMemory", "Superseded", "run_hot", "hot_worker"]

MAX_TIMEOUT_S = 3600.0  # every wait of a hot recovery is bounded; an hour is past any sane setting


@dataclass(frozen=True)
class HotPlan:
    """What runs, where it fails, and the faults injected while it recovers."""

    layout: str
    stack: str = "megatron"  # "native" (FSDP2 + DTensor TP), "deepspeed" (ZeRO); see stacks/hot_stacks.py
    model: str = ""
    settings: TrainSettings = field(default_factory=TrainSettings)
    steps: int = 8
    save_every: int = 3
    snapshot_every: int | None = None   # in-memory snapshots (ucp.integrations.snapshots) between the saves
    kill_after_step: int = 4
    kill_uid: int = 1
    spares: int = 0
    override: str | None = None       # a layout instead of the planner's choice
    second_kill_uid: int | None = None  # SIGKILLed while the first new generation reshards (after it formed)
    corrupt_uid: int | None = None      # this process's held replicas are corrupted after the last save
    verify: bool = True                 # compare every logical tensor with the checkpoint (not timed)
    round_bytes: int = 64 << 20
    alone_bytes: int = 1 << 20  # a region this large moves alone: sent and received in place (hot_reshard)
    memory_bytes: int = 16 << 30
    collective_timeout_s: float = 30.0
    hang_timeout_s: float = 60.0
    # how long a process waits for the next generation that names it (a spare from the start, an
    # idle one while the others train, a survivor while the agent re-forms): past it, it fails
    # with RendezvousTimeout instead of waiting for ever. Raise it where building the model or a
    # step takes longer (the 1 GiB bench: ~60 s and ~30 s a step on 2 shared cores).
    rendezvous_timeout_s: float = 60.0
    cold_cache: bool = False  # drop the checkpoints from the page cache just before the kill
    hang: bool = False        # SIGSTOP instead of SIGKILL: the agent's heartbeat watchdog must find it

    def __post_init__(self) -> None:
        from ucp.integrations.stacks.hot_stacks import HOT_STACKS

        if self.stack not in HOT_STACKS:
            raise ValueError(f"hot recovery runs the {', '.join(HOT_STACKS)} stacks, not {self.stack!r}")
        for name in ("collective_timeout_s", "hang_timeout_s", "rendezvous_timeout_s"):
            value = getattr(self, name)
            if not 0 < value <= MAX_TIMEOUT_S:
                raise ValueError(f"HotPlan.{name} must be above 0 and at most {MAX_TIMEOUT_S:.0f} s "
                                 f"(a bound on a wait, never an endless one), got {value}")
        first = min(self.save_every, self.snapshot_every or self.save_every)
        if not first <= self.kill_after_step < self.steps:
            raise ValueError(f"kill_after_step ({self.kill_after_step}) must be at least save_every or "
                             f"snapshot_every ({first}) and below steps ({self.steps})")


@dataclass
class HotReport:
    plan: HotPlan
    losses: dict[int, float] = field(default_factory=dict)
    killed_at_step: int = 0
    resumed_from: int = 0
    resumed_position: int = 0  # the data position (samples) the training ranks went on from
    resumed_path: str = ""     # the checkpoint or snapshot the survivors resharded
    handed_bytes: int = 0      # arrays idle processes handed to training ranks before leaving (native)
    layout_after: str = ""
    why: str = ""
    generations: int = 0
    detect_s: float = 0.0
    reform_s: float = 0.0
    reshard_s: float = 0.0
    recovery_s: float = 0.0
    first_step_s: float = 0.0
    elements: dict[str, int] = field(default_factory=dict)  # own / peer / storage, summed over ranks
    # the reshard's phases (plan, transfer, storage, build, ...), seconds, the slowest training rank's
    phases: dict[str, float] = field(default_factory=dict)
    peer_bytes: int = 0
    in_place_bytes: int = 0    # of peer_bytes, received straight into the new state's tensors
    corrupt: list[str] = field(default_factory=list)
    verified_tensors: int = 0
    mismatches: list[str] = field(default_factory=list)
    rng_ok: bool = False

    @property
    def lost_steps(self) -> int:
        return self.killed_at_step - self.resumed_from

    @property
    def bitwise(self) -> bool:
        return self.verified_tensors > 0 and not self.mismatches and self.rng_ok


# --------------------------------------------------------------------------- one rank


def _verify(ctx: ElasticContext, trainer, path: str, tree_rng: str | None, rng_before: str) -> None:
    """Every logical tensor the new layout holds against the checkpoint's, bit for bit (rank 0 reports)."""
    import ucp
    from ucp.dtypes import to_numpy
    from ucp.integrations.stacks.transition import compare_snapshots

    import torch.distributed as dist

    snapshot = trainer.logical_snapshot()  # a collective
    flags: list = [None] * dist.get_world_size()
    dist.all_gather_object(flags, tree_rng is None or tree_rng == rng_before)
    if ctx.rank != 0:
        return
    # storage dtypes (bf16 as its bit pattern: numpy has no bfloat16), so the comparison is bitwise
    saved = {n: to_numpy(ucp.read_tensor(path, n)) for n in ucp.CheckpointReader(path).logical()}
    loaded = {n: to_numpy(t) for n, t in snapshot.items()}
    ctx.emit("verified", tensors=len(loaded), mismatches=compare_snapshots(saved, loaded), rng_ok=all(flags))


def _rng_digest_of(tree: dict, rank: int) -> str | None:
    """The digest of the RNG state the tree saved for ``rank`` (None: the tree is another rank's)."""
    import base64
    import hashlib

    rng = tree.get("rng") or {}
    if rng.get("rank") != rank:
        return None
    return hashlib.sha256(base64.b64decode(rng["torch"])).hexdigest()[:16]


@dataclass
class HeldMemory:
    """What a process keeps across every re-forming (the point of a hot recovery): the replica
    tiers of the checkpoints and of the snapshots, and the paths it saw replicated on every rank."""

    tiers: list
    snapshot_tiers: list
    complete: set[str] = field(default_factory=set)
    programs: dict = field(default_factory=dict)  # UCL program text -> parsed (ucl.BoundProgram)
    manifests: dict = field(default_factory=dict)  # complete path -> (manifest bytes, parsed Manifest)

    @property
    def all_tiers(self) -> list:
        return [*self.tiers, *self.snapshot_tiers]

    def prepare(self, path: str, *, keep: int = 4) -> None:
        """Parse the manifest of ``path`` (just replicated) in a background thread, so that a
        recovery from it finds it parsed (0.1-0.3 s here otherwise, on the recovery's critical
        path). Best effort: a parse that has not finished or failed is redone by the recovery."""
        import threading

        from ucp.replication.hot_reshard import held_manifest

        def parse() -> None:
            try:
                meta = next(m for tier in self.all_tiers for ck in tier.checkpoints()
                            if (m := tier.get_meta(ck)) is not None and m.path == path)
                self.manifests[path] = (meta.manifest, held_manifest(meta))
                for old in list(self.manifests)[:-keep]:
                    self.manifests.pop(old, None)
            except Exception:  # noqa: BLE001 - an optimisation only: the recovery parses it itself
                pass

        threading.Thread(target=parse, name="ucp-parse-manifest", daemon=True).start()

    def program(self, text):
        """``text`` (a UCL program reference) parsed once per process, then reused by every save and
        every re-forming: parsing the preset takes ~0.5 s, which a recovery would otherwise pay."""
        if not isinstance(text, str):
            return text
        if text not in self.programs:
            from ucp import ucl

            self.programs[text] = ucl.load_program(text)
        return self.programs[text]


class Superseded(RuntimeError):
    """A newer generation was published while this rank was computing a step: the step is left."""


class GenerationWatch:
    """The newest generation the agent has published, polled by a thread over a store connection of
    its own every ``every_s``; :meth:`stop_stale_steps` makes a trainer's step leave at the next
    module it enters once a newer generation than this rank's exists.

    Why: a survivor computing a step when a peer dies only learns of it at its next collective
    with the dead rank, or, blocked with live peers that have left, when the beat thread releases
    its sockets a second later. At 1 GiB a step's remaining compute alone is seconds; stopping at
    the next module (and shutting the old generation's sockets, so that a peer blocked on this rank
    fails at once too) starts the re-forming within one poll and one module's compute.
    """

    def __init__(self, ctx: ElasticContext, every_s: float = 0.02) -> None:
        import threading
        from datetime import timedelta

        import torch.distributed as dist

        self.ctx, self.latest = ctx, 0
        self._store = dist.TCPStore(ctx.store.host, ctx.store.port, is_master=False,
                                    timeout=timedelta(seconds=ctx.rendezvous_timeout_s))
        self._every_s, self._stop = every_s, threading.Event()
        self._thread = threading.Thread(target=self._poll, name="ucp-generation-watch", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while True:
            try:
                self.latest = max(self.latest, int(self._store.get("gen")))
            except Exception:  # noqa: BLE001 - the agent is gone; the beat thread and the timeouts handle it
                return
            if self._stop.wait(self._every_s):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        """Raise :class:`Superseded` (a RuntimeError: the worker re-forms) once a newer generation than
        this rank's is published; its old collectives are shut first (collective_release)."""
        m = self.ctx.membership
        if m is None or self.latest <= m.generation:
            return
        from ucp.integrations.collective_release import release_collectives

        sockets = release_collectives(keep_port=self.ctx.store.port)
        raise Superseded(f"generation {self.latest} was published while rank {m.rank} of generation "
                         f"{m.generation} computed a step ({sockets} socket(s) of its collectives shut)")

    def stop_stale_steps(self, trainer) -> None:
        """Check before every module of ``trainer``'s model runs forward (megatron ``stage``, native
        ``model``; a trainer with neither is left as it is)."""
        from torch import nn

        model = next((m for m in (getattr(trainer, "stage", None), getattr(trainer, "model", None))
                      if isinstance(m, nn.Module)), None)
        if model is not None:
            for module in model.modules():
                module.register_forward_pre_hook(lambda *_: self.check())


def _train(ctx: ElasticContext, plan: HotPlan, trainer, held: HeldMemory, directory: str, snapshot_dir: str,
           recovered_from: str | None, watch: GenerationWatch | None = None) -> dict:
    import torch.distributed as dist

    if watch is not None:
        watch.stop_stale_steps(trainer)

    from ucp.integrations.snapshots import SnapshotOptions, Snapshots
    from ucp.integrations.stacks.jobs import rng_digest
    from ucp.replication.replicas import ReplicaManager
    from ucp.manager import CheckpointManager
    from ucp.policies import EveryNSteps, KeepLast

    _, options = trainer.checkpoint_state()
    options.pop("process_group")
    if "program" in options:
        options["program"] = held.program(options["program"])
    manager = CheckpointManager(directory, save_policy=EveryNSteps(plan.save_every), retention=KeepLast(2),
                                process_group=dist.group.WORLD, save_options=options,
                                replicas=ReplicaManager(tiers=held.tiers, replicas=1, keep=1))
    snapshots = None
    if plan.snapshot_every:
        snapshots = Snapshots(SnapshotOptions(every=plan.snapshot_every, directory=snapshot_dir),
                              save_options=options, process_group=dist.group.WORLD, tiers=held.snapshot_tiers)
    if recovered_from and plan.verify:
        import ucp

        with ucp.CheckpointReader(recovered_from) as reader:
            tree = reader.manifest.states.get(ctx.rank, {})
        _verify(ctx, trainer, recovered_from, _rng_digest_of(tree, ctx.rank), rng_digest())
        dist.barrier()
        if ctx.rank == 0:
            ctx.emit("verify_done", t=time.monotonic())
    while trainer.progress.step < plan.steps:
        if ctx.rank == 0:
            ctx.emit("step_start", step=trainer.progress.step + 1, t=time.monotonic())
        began = time.perf_counter()
        loss = trainer.train_step()
        step = trainer.progress.step
        if ctx.rank == 0:
            ctx.emit("step", step=step, loss=loss, seconds=time.perf_counter() - began, t=time.monotonic())
        snapshot = step % plan.save_every != 0 and snapshots is not None and snapshots.due(step)
        if step % plan.save_every == 0 or snapshot:
            began = time.perf_counter()
            state = trainer.checkpoint_state()[0]
            # either returns once the copies are in peers' memory on every rank: complete
            path = snapshots.save(step, state) if snapshot else manager.save(step, state)
            held.complete.add(path)
            held.prepare(path)
            if ctx.uid == plan.corrupt_uid and not snapshot:
                for tier in held.tiers:
                    for ck in tier.checkpoints():
                        for key in tier.keys(ck):
                            tier.corrupt(ck, key)
            if ctx.rank == 0:
                ctx.emit("saved", step=step, snapshot=snapshot, t=time.monotonic(),
                         seconds=time.perf_counter() - began)
    return {"final_step": trainer.progress.step}


def hot_worker(ctx: ElasticContext, plan: HotPlan, directory: str, snapshot_dir: str = "") -> dict:
    """The body of every process (training rank or spare); see the module doc."""
    from ucp.integrations.llama.config import LlamaConfig
    from ucp.integrations.stacks.jobs import build_trainer
    from ucp.replication.errors import ReplicaError
    from ucp.integrations.stacks.hot_stacks import recover
    from ucp.replication.replica_tiers import MemoryTier

    held = HeldMemory([MemoryTier(capacity_bytes=plan.memory_bytes)], [MemoryTier(capacity_bytes=plan.memory_bytes)])
    if plan.stack == "megatron":  # parsed now (a spare too, while it waits), not while recovering
        from ucp.integrations.megatron.trainer import megatron_program, saved_states
        from ucp.layout import Layout

        held.program(megatron_program(LlamaConfig.parse(plan.model), saved_states(Layout.parse(plan.layout),
                                                                                  plan.settings)))
    watch = GenerationWatch(ctx)
    membership = ctx.join(after=-1)
    error = None
    while membership is not None:
        try:
            ctx.form("all")
            if membership.generation == 0:
                trainer = build_trainer(plan.stack, LlamaConfig.parse(plan.model), membership.layout, plan.settings,
                                        rank=membership.rank)
                return _train(ctx, plan, trainer, held, directory, snapshot_dir, None, watch)
            if membership.rank == 0:
                ctx.emit("formed", t=time.monotonic(), generation=membership.generation)
            trainer, path = recover(ctx, plan, held)
            if trainer is not None:
                return _train(ctx, plan, trainer, held, directory, snapshot_dir, path, watch)
        except (RuntimeError, ReplicaError) as err:  # a peer is gone (gloo raises RuntimeError subclasses)
            error = f"{type(err).__name__}: {str(err)[:300]}"
            ctx.emit("failure_seen", t=time.monotonic(), error=error)
            trainer = None
        ctx.leave()
        try:
            membership = ctx.join(after=membership.generation)
        except RendezvousTimeout as timeout:  # no failure the agent saw: the error was this job's own
            raise RendezvousTimeout(f"{timeout}; the error that sent it there: {error}") from None
    return {"idle": True}


# --------------------------------------------------------------------------- the agent's side


def run_hot(plan: HotPlan, directory: str | os.PathLike, *, on_event: Callable[[dict], Any] | None = None,
            timeout_s: float = 600.0) -> HotReport:
    """Run ``plan`` in ``directory`` (emptied first); see the module doc."""
    from ucp.integrations.launch import WITH_DEEPSPEED
    from ucp.integrations.stacks.hot_stacks import layout_check

    directory = os.fspath(directory)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    report = HotReport(plan)
    notify = on_event or (lambda e: None)
    from ucp.integrations.snapshots import default_snapshot_directory

    snapshot_dir = default_snapshot_directory() if plan.snapshot_every else ""
    agent = ElasticAgent(hot_worker, args=(plan, directory, snapshot_dir), layout=plan.layout, spares=plan.spares,
                         **({"preload": WITH_DEEPSPEED} if plan.stack == "deepspeed" else {}),
                         check=layout_check(plan.stack, plan.model, plan.settings), override=plan.override,
                         collective_timeout_s=plan.collective_timeout_s, hang_timeout_s=plan.hang_timeout_s,
                         rendezvous_timeout_s=plan.rendezvous_timeout_s)
    times: dict[str, float] = {}
    saved: list[int] = []
    verify_s = [0.0]

    def watch(event: dict) -> None:
        notify(event)
        kind = event["kind"]
        if kind == "saved":
            saved.append(event["step"])
        elif kind == "step":
            if "kill" in times and "recovered" in times:
                report.losses[event["step"]] = event["loss"]
                times.setdefault("first_step_end", event["t"])
            elif "kill" not in times:
                report.losses[event["step"]] = event["loss"]
                report.killed_at_step = event["step"]
        elif kind == "step_start" and "recovered" in times:
            times.setdefault("first_step_start", event["t"])
        elif kind == "detected" and "kill" in times:
            times.setdefault("detected", event["t"])
        elif kind == "reformed":
            report.generations = event["generation"]
            report.layout_after, report.why = event["layout"], event["why"]
        elif kind == "formed":
            times["formed"] = event["t"]  # the last generation's (a second failure re-forms again)
            if plan.second_kill_uid is not None and event["generation"] == 1:
                agent.kill(plan.second_kill_uid)  # a second failure while the survivors reshard
        elif kind == "recovered":
            times["recovered"] = event["t"]
            report.resumed_from, report.resumed_position = event["step"], event["position"]
            report.handed_bytes = sum(r.get("handed_bytes", 0) for r in event["ranks"])
            report.resumed_path = event["ranks"][0]["path"]
            report.elements = {k: sum(r["elements"][k] for r in event["ranks"]) for k in ("own", "peer", "storage")}
            report.peer_bytes = sum(r["peer_bytes"] for r in event["ranks"])
            report.in_place_bytes = sum(r["in_place_bytes"] for r in event["ranks"])
            report.phases = {k: max(r["seconds"][k] for r in event["ranks"]) for k in event["ranks"][0]["seconds"]}
            report.corrupt = sorted({c for r in event["ranks"] for c in r["corrupt"]})
        elif kind == "verified":
            report.verified_tensors, report.mismatches = event["tensors"], event["mismatches"]
            report.rng_ok = event["rng_ok"]
        elif kind == "verify_done":
            verify_s[0] = event["t"] - times["recovered"]
        if kind == "step" and "kill" not in times and event["step"] >= plan.kill_after_step and saved:
            if plan.cold_cache:  # before the kill: not part of the recovery time
                from ucp.integrations.page_cache import evict

                evict(directory)
            times["kill"] = agent.kill(plan.kill_uid, signal.SIGSTOP if plan.hang else signal.SIGKILL)
            notify({"kind": "killed", "uid": plan.kill_uid, "rank": plan.kill_uid, "step": event["step"],
                    "t": times["kill"]})

    try:
        agent.run(timeout_s=timeout_s, on_event=watch)
    finally:
        if snapshot_dir:
            shutil.rmtree(snapshot_dir, ignore_errors=True)
    report.detect_s = times["detected"] - times["kill"]
    report.reform_s = times["formed"] - times["detected"]
    report.reshard_s = times["recovered"] - times["formed"]
    report.recovery_s = times["first_step_start"] - times["kill"] - verify_s[0]
    report.first_step_s = times["first_step_end"] - times["first_step_start"]
    return report
