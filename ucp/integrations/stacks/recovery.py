"""A real failure and its recovery, timed: train, SIGKILL a rank, resume under another layout.

:func:`run_with_failure` plays what an elastic launcher (torchrun's agent) does:

1. start the ranks of layout A; they train and checkpoint every ``save_every`` steps;
2. once a checkpoint is committed and step ``kill_after_step`` is done, SIGKILL one
   rank (an unannounced failure; the survivors are left blocked in a collective);
3. detect the death (the agent watches its children), stop the survivors;
4. run the checkpointer's offline step, if it has one (DeepSpeed: ``ds_to_universal``);
5. start the ranks of layout B, load the last committed checkpoint with resharding,
   train on to ``steps``.

Recovery time is from the SIGKILL to the end of the first step under B, the sum of:
detection, teardown, conversion (finding the checkpoint, and the peer's offline
step), restart (processes, groups, model, until every rank is built), load (until
every rank has loaded) and the first step. The checkpointer is ``ucp`` (any stack), or a peer's own path: ``dcp``
(torch-native stack: torch.distributed.checkpoint) or ``deepspeed`` (DeepSpeed
stack: native checkpoints, ``ds_to_universal``, universal load).

    report = run_with_failure(FailurePlan(stack="megatron", before="tp=2,pp=2,dp=2,zero=1",
                                          after="tp=2,dp=3,zero=1"), "run/")
    report.recovery_s, report.losses[report.final_step]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ucp.integrations.launch import WITH_DEEPSPEED, WorkerFailed, launch
from ucp.integrations.stacks.common import TrainSettings
from ucp.integrations.stacks.jobs import build_trainer
from ucp.layout import Layout

__all__ = ["FailurePlan", "RecoveryReport", "run_with_failure", "CHECKPOINTERS"]

CHECKPOINTERS = {"ucp": ("native", "megatron", "deepspeed"), "dcp": ("native",), "deepspeed": ("deepspeed",)}


@dataclass(frozen=True)
class FailurePlan:
    """What to run, where it fails and how it resumes (see the module doc)."""

    stack: str
    before: str
    after: str
    model: str = ""
    settings: TrainSettings = field(default_factory=TrainSettings)
    steps: int = 40
    save_every: int = 10
    kill_after_step: int = 25
    kill_rank: int = 1
    checkpointer: str = "ucp"
    track_ettr: bool = True
    verify_load: bool = False  # ucp: compare every logical tensor after the load with the checkpoint's
    keep_last: int | None = 2  # ucp retention (None: keep every checkpoint)
    cold_cache: bool = False  # drop the checkpoints from the page cache just before the kill (a cold restart)

    def __post_init__(self) -> None:
        if self.stack not in CHECKPOINTERS.get(self.checkpointer, ()):
            raise ValueError(f"checkpointer {self.checkpointer!r} does not run on the {self.stack} stack; "
                             f"it runs on {', '.join(CHECKPOINTERS.get(self.checkpointer, ())) or 'nothing'}")
        if not self.save_every <= self.kill_after_step < self.steps:
            raise ValueError(f"kill_after_step ({self.kill_after_step}) must be at least save_every "
                             f"({self.save_every}) and below steps ({self.steps})")
        if not 0 <= self.kill_rank < Layout.parse(self.before).world_size:
            raise ValueError(f"kill_rank {self.kill_rank} is not a rank of {self.before}")


@dataclass
class RecoveryReport:
    """What happened, with monotonic timestamps turned into durations (seconds)."""

    plan: FailurePlan
    losses: dict[int, float] = field(default_factory=dict)       # the run's timeline (redone steps: the rerun)
    first_losses: dict[int, float] = field(default_factory=dict)  # every step the first layout completed
    step_seconds: dict[int, float] = field(default_factory=dict)
    saves: list[dict] = field(default_factory=list)               # {"step", "seconds"}
    killed_at_step: int = 0
    resumed_from: int = 0
    checkpoint: str = ""
    checkpoint_bytes: int = 0
    detect_s: float = 0.0
    teardown_s: float = 0.0
    convert_s: float = 0.0
    restart_s: float = 0.0
    load_s: float = 0.0
    first_step_s: float = 0.0
    recovery_s: float = 0.0
    lost_compute_s: float = 0.0
    wall_s: float = 0.0
    verified_tensors: int = 0          # verify_load: logical tensors compared after the load
    verify_mismatches: list[str] = field(default_factory=list)
    verify_s: float = 0.0              # not counted in the recovery time

    @property
    def final_step(self) -> int:
        return max(self.losses)


# --------------------------------------------------------------------------- checkpointers, per rank


def _path(directory: str, step: int) -> str:
    return os.path.join(directory, f"step_{step:08d}")


def _saver(plan: FailurePlan, trainer, directory: str):
    """``save(step)`` for this rank, by the plan's checkpointer."""
    if plan.checkpointer == "dcp":
        from ucp.integrations.native.dcp import save_dcp

        return lambda step: save_dcp(trainer, _path(directory, step))
    if plan.checkpointer == "deepspeed":
        from ucp.integrations.deepspeed.native import save_native

        return lambda step: save_native(trainer, directory, tag=f"step_{step:08d}")
    import torch.distributed as dist

    from ucp.manager import CheckpointManager
    from ucp.policies import EveryNSteps, KeepAll, KeepLast

    _, options = trainer.checkpoint_state()
    options.pop("process_group")
    retention = KeepAll() if plan.keep_last is None else KeepLast(plan.keep_last)
    manager = CheckpointManager(directory, save_policy=EveryNSteps(plan.save_every), retention=retention,
                                process_group=dist.group.WORLD, save_options=options)
    return lambda step: manager.save(step, trainer.checkpoint_state()[0])


def _load(plan: FailurePlan, trainer, path: str) -> None:
    if plan.checkpointer == "dcp":
        from ucp.integrations.native.dcp import load_dcp

        load_dcp(trainer, path)
    elif plan.checkpointer == "deepspeed":
        from ucp.integrations.deepspeed.native import load_universal

        load_universal(trainer, path)
    else:
        trainer.load(path)


def train_worker(ctx, plan: FailurePlan, layout: str, directory: str, resume_from: str | None) -> dict:
    """One rank: build, (load), train to ``plan.steps``, checkpointing; events carry monotonic times."""
    import torch.distributed as dist

    from ucp.integrations.llama.config import LlamaConfig

    extra = {"universal": True} if plan.checkpointer == "deepspeed" and resume_from else {}
    if resume_from:
        extra["init"] = False  # every weight comes from the checkpoint: do not draw initial ones
    trainer = build_trainer(plan.stack, LlamaConfig.parse(plan.model), layout, plan.settings, rank=ctx.rank, **extra)
    dist.barrier()  # phase boundaries are when every rank is through
    if ctx.rank == 0:
        ctx.emit("built", t=time.monotonic())
    if resume_from:
        _load(plan, trainer, resume_from)
        dist.barrier()
        if ctx.rank == 0:
            ctx.emit("loaded", t=time.monotonic(), step=trainer.progress.step)
        if plan.verify_load:
            _verify_load(ctx, trainer, resume_from)
    tracker = None
    if plan.track_ettr and ctx.rank == 0:
        from ucp.reliability.ettr.tracker import ETTRTracker

        tracker = ETTRTracker(directory, flush_every_s=0.0)
        tracker.start(resumed_step=trainer.progress.step)
    save = _saver(plan, trainer, directory)
    while trainer.progress.step < plan.steps:
        began = time.perf_counter()
        loss = trainer.train_step()
        seconds, step = time.perf_counter() - began, trainer.progress.step
        if tracker:
            tracker.record_step(step, seconds=seconds)
        if ctx.rank == 0:
            ctx.emit("step", step=step, loss=loss, seconds=seconds, t=time.monotonic())
        if step % plan.save_every == 0:
            if tracker:
                tracker.checkpoint_started(step)
            began = time.perf_counter()
            save(step)
            seconds = time.perf_counter() - began
            if tracker:
                tracker.record_save(step=step, blocking_s=seconds)
            if ctx.rank == 0:
                ctx.emit("saved", step=step, seconds=seconds, t=time.monotonic())
    if tracker:
        tracker.close()
    return {"final_step": trainer.progress.step}


def _verify_load(ctx, trainer, path: str) -> None:
    """Rank 0: every logical tensor the new layout holds against the checkpoint's, bit for bit."""
    import ucp
    from ucp.dtypes import to_numpy
    from ucp.integrations.stacks.transition import compare_snapshots

    began = time.perf_counter()
    snapshot = trainer.logical_snapshot()  # a collective: every rank takes part
    if ctx.rank != 0:
        return
    with ucp.CheckpointReader(path) as reader:
        names = set(reader.logical())
    # storage dtypes (bf16 as its bit pattern: numpy has no bfloat16), so the comparison is bitwise
    saved = {n: to_numpy(ucp.read_tensor(path, n)) for n in names if n in snapshot or f"{n}/fp32" in snapshot}
    loaded = {n: to_numpy(t) for n, t in snapshot.items()}
    ctx.emit("verified", tensors=len(loaded), mismatches=compare_snapshots(saved, loaded),
             seconds=time.perf_counter() - began)


# --------------------------------------------------------------------------- the agent


def _committed(plan: FailurePlan, directory: str, step: int) -> bool:
    if plan.checkpointer == "dcp":  # DCP writes .metadata last (no torch import in the agent)
        return os.path.isfile(os.path.join(_path(directory, step), ".metadata"))
    if plan.checkpointer == "deepspeed":
        latest = os.path.join(directory, "latest")
        return os.path.isfile(latest) and open(latest).read().strip() == f"step_{step:08d}"
    return os.path.isfile(os.path.join(_path(directory, step), "manifest.json"))


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def _to_universal(directory: str, step: int) -> str:
    """DeepSpeed's converter as users run it: its own script, in a fresh process."""
    tag = f"step_{step:08d}"
    out = os.path.join(directory, f"{tag}_universal")
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                    os.path.join(directory, tag), "--output_folder", out, "--inject_missing_state",
                    "--num_extract_workers", "2", "--num_merge_workers", "2"],
                   check=True, capture_output=True, env=env)
    return out


def run_with_failure(plan: FailurePlan, directory: str | os.PathLike, *,
                     on_event: Callable[[dict], Any] | None = None, timeout_s: float = 600.0) -> RecoveryReport:
    """Run ``plan`` in ``directory`` (emptied first); see the module doc. ``on_event`` sees every
    event (``step``, ``saved``, ``killed``, ``detected``, ``restarting``, ``loaded``...)."""
    directory = os.fspath(directory)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    report = RecoveryReport(plan)
    notify = on_event or (lambda event: None)
    preload = WITH_DEEPSPEED if plan.stack == "deepspeed" else None
    began = time.monotonic()

    # 1-2. train under A until the failure
    first = launch(train_worker, world=Layout.parse(plan.before).world_size,
                   args=(plan, plan.before, directory, None), collective_timeout_s=timeout_s,
                   **({"preload": preload} if preload else {}))
    kill_time = None
    last_saved = 0
    deadline = time.monotonic() + timeout_s
    while kill_time is None:
        if time.monotonic() > deadline or first.errors or first._dead_silently():
            first.kill_all()
            raise RuntimeError(f"the first run failed before the injected failure: {first.errors or 'a rank died'}")
        event = first.poll()
        if event is None:
            continue
        notify(event)
        if event["kind"] == "step":
            report.first_losses[event["step"]] = event["loss"]
            report.step_seconds[event["step"]] = event["seconds"]
        elif event["kind"] == "saved":
            report.saves.append({"step": event["step"], "seconds": event["seconds"]})
            last_saved = event["step"]
        if event["kind"] == "step" and event["step"] >= plan.kill_after_step and last_saved:
            if plan.cold_cache:  # before the kill: not part of the recovery time
                from ucp.integrations.page_cache import evict

                evict(directory)
            first.kill(plan.kill_rank)
            kill_time = time.monotonic()
            report.killed_at_step = event["step"]
            notify({"kind": "killed", "rank": plan.kill_rank, "step": event["step"], "t": kill_time})

    # 3. detect (the agent's view: the child is gone), stop the survivors
    while first.procs[plan.kill_rank].is_alive():
        time.sleep(0.001)
    detected = time.monotonic()
    report.detect_s = detected - kill_time
    notify({"kind": "detected", "t": detected})
    first.kill_all()
    torn_down = time.monotonic()
    report.teardown_s = torn_down - detected

    # 4. the last committed checkpoint, and the checkpointer's offline step
    steps = sorted(s["step"] for s in report.saves if _committed(plan, directory, s["step"]))
    if not steps:  # seen once with DeepSpeed at load 35 (its "latest" not naming the save): a failed run, said so
        raise WorkerFailed(f"no committed {plan.checkpointer} checkpoint in {directory} among the saves at steps "
                           f"{[s['step'] for s in report.saves]}: nothing to restart from")
    report.resumed_from = steps[-1]
    report.checkpoint = _path(directory, report.resumed_from)
    report.checkpoint_bytes = _du(report.checkpoint)
    # the steps after the checkpoint, which the new layout computes again
    report.lost_compute_s = sum(t for s, t in report.step_seconds.items() if s > report.resumed_from)
    if plan.checkpointer == "deepspeed":
        report.checkpoint = _to_universal(directory, report.resumed_from)

    # 5. restart under B, load with resharding, train on
    notify({"kind": "restarting", "layout": plan.after, "step": report.resumed_from})
    restarted = time.monotonic()
    report.convert_s = restarted - torn_down  # finding the checkpoint, and the peer's conversion
    second = launch(train_worker, world=Layout.parse(plan.after).world_size,
                    args=(plan, plan.after, directory, report.checkpoint), collective_timeout_s=timeout_s,
                    **({"preload": preload} if preload else {}))
    times: dict[str, float] = {}

    def watch(event: dict) -> None:
        notify(event)
        if event["kind"] == "built":
            times["built"] = event["t"]
        elif event["kind"] == "loaded":
            times["loaded"] = event["t"]
        elif event["kind"] == "step":
            report.losses[event["step"]] = event["loss"]
            times.setdefault("first_step", event["t"])
        elif event["kind"] == "saved":
            report.saves.append({"step": event["step"], "seconds": event["seconds"]})
        elif event["kind"] == "verified":
            report.verified_tensors, report.verify_mismatches = event["tensors"], event["mismatches"]
            report.verify_s = event["seconds"]

    second.wait(timeout=timeout_s, on_event=watch)
    report.restart_s = times["built"] - restarted
    report.load_s = times["loaded"] - times["built"]
    report.first_step_s = times["first_step"] - times["loaded"] - report.verify_s
    report.recovery_s = times["first_step"] - kill_time - report.verify_s
    kept = {step: loss for step, loss in report.first_losses.items() if step <= report.resumed_from}
    report.losses = {**kept, **report.losses}
    report.wall_s = time.monotonic() - began
    return report
