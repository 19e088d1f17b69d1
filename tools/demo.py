"""The end-to-end demo behind ``ucp demo``: train, crash, resume under another layout.

1. Train the tensor-parallel MLP of :mod:`tools.demo_model` on 4 real
   processes (gloo) as ``tp=2,dp=2``, checkpointing with ucp every few steps;
   the UCL program tools/programs/demo-mlp.ucl maps its shards onto whole tensors.
2. SIGKILL every process mid-run (the injected failure).
3. Check the last committed checkpoint: ``ucp.verify``, and its logical tensors
   against the shards the 4 ranks held when they saved it.
4. Resume on 2 processes as ``tp=1,dp=2``: each rank loads only its shard of the
   4-rank checkpoint, compares it with step 3's reference, trains on.
5. Report the ETTR of the whole run, failure and restart included.

Example::

    report = run_demo("/tmp/ucp-demo")
    print(report.ettr)
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tools import demo_model as dm
from ucp.layout import Layout

FIRST_LAYOUT, SECOND_LAYOUT = "tp=2,dp=2", "tp=1,dp=2"
# The UCL program that maps the demo's local tensors onto whole ones, for every layout.
PROGRAM = str(Path(__file__).resolve().parent / "programs" / "demo-mlp.ucl")


@dataclass
class DemoReport:
    """What the demo did and measured."""

    directory: str
    killed_at_step: int = 0
    resumed_from_step: int = 0
    final_step: int = 0
    losses: dict[int, float] = field(default_factory=dict)
    checkpoints: list[int] = field(default_factory=list)
    verified_tensors: int = 0
    resharded_tensors: int = 0
    ettr: object = None  # reliability.ettr.tracker.ETTRSummary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _groups(layout, rank):
    """This rank's tp and dp groups (every rank creates every group, in one order)."""
    tp_group = dp_group = None
    for dp_rank in range(layout.dp):
        members = [layout.rank_of(tp=t, dp=dp_rank) for t in range(layout.tp)]
        group = dist.new_group(members)
        if rank in members:
            tp_group = group
    for tp_rank in range(layout.tp):
        members = [layout.rank_of(tp=tp_rank, dp=d) for d in range(layout.dp)]
        group = dist.new_group(members)
        if rank in members:
            dp_group = group
    return tp_group, dp_group


def _by_value(model) -> dict:
    """The parameters as numpy copies: torch tensors would cross the queue as shared-memory
    handles, which the parent cannot open once the SIGKILLed sender is gone."""
    return {name: model.param(name).detach().numpy().copy() for name in dm.PARAMS}


def _worker(rank: int, world: int, port: int, layout_text: str, directory: str, last_step: int,
            save_every: int, events) -> None:
    from reliability.ettr.tracker import ETTRTracker
    from ucp.manager import CheckpointManager
    from ucp.policies import EveryNSteps, KeepLast

    import ucp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        layout = Layout.parse(layout_text)
        tp_group, dp_group = _groups(layout, rank)
        model = dm.ParallelMLP(layout, rank, tp_group)
        optimizer = torch.optim.Adam(model.ordered_parameters(), lr=0.02)
        manager = CheckpointManager(directory, save_policy=EveryNSteps(save_every), retention=KeepLast(3),
                                    process_group=dist.group.WORLD,
                                    save_options={"program": PROGRAM, "layout": layout})
        tracker = ETTRTracker(directory, flush_every_s=0.0) if rank == 0 else None  # toy steps: record each

        step = manager.latest_step() or 0
        if step:
            # Each rank reads only the bytes of its own shard, whatever layout saved them.
            state = ucp.load(manager.path_for(step), program=PROGRAM, layout=layout, rank=rank)
            with torch.no_grad():
                for name in dm.PARAMS:
                    model.param(name).copy_(state["model"][name])
            optimizer.load_state_dict(state["optim"])
            events.put(("resumed", rank, step, _by_value(model)))
        if tracker:
            tracker.start(resumed_step=step)

        coords = layout.coords(rank)
        while step < last_step:
            step += 1
            began = time.perf_counter()
            tokens, targets = dm.batch(step, coords.dp)
            loss = torch.nn.functional.cross_entropy(model(tokens), targets)
            optimizer.zero_grad()
            loss.backward()
            for param in model.ordered_parameters():  # data-parallel gradient averaging
                dist.all_reduce(param.grad, group=dp_group)
                param.grad /= layout.dp
            optimizer.step()
            if tracker:
                tracker.record_step(step, seconds=time.perf_counter() - began)
            if manager.save_policy.should_save(step=step, seconds_since_save=0.0):
                began = time.perf_counter()
                manager.save(step, model.state(optimizer, step, data_position=step * 16))
                if tracker:
                    tracker.record_save(step=step, blocking_s=time.perf_counter() - began)
                events.put(("saved", rank, step, _by_value(model)))
            if rank == 0:
                events.put(("step", rank, step, loss.item()))
        if tracker:
            tracker.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_phase(layout_text: str, directory: str, last_step: int, save_every: int, *,
               kill_after_step: int | None, on_event) -> None:
    world = Layout.parse(layout_text).world_size
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, layout_text, directory, last_step, save_every, events))
             for r in range(world)]
    for proc in procs:
        proc.start()
    killed = False
    deadline = time.monotonic() + 300
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.2)
        except queue.Empty:
            continue
        on_event(event)
        if kill_after_step is not None and event[0] == "step" and event[2] >= kill_after_step and not killed:
            for proc in procs:  # the injected failure: every process dies at once
                os.kill(proc.pid, signal.SIGKILL)
            killed = True
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    while True:  # events sent just before the end
        try:
            event = events.get_nowait()
        except queue.Empty:
            break
        except Exception:  # noqa: BLE001 - a message cut short by the SIGKILL
            if killed:
                break
            raise
        on_event(event)
    if not killed and any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"demo phase {layout_text}: worker exit codes {[p.exitcode for p in procs]}")


def _assemble(shards: dict[int, dict[str, torch.Tensor]], layout_text: str) -> dict[str, torch.Tensor]:
    """Logical tensors from the ranks' local shards, by the demo's own layout rules."""
    layout = Layout.parse(layout_text)
    out = {name: torch.full(shape, float("nan")) for name, shape in dm.LOGICAL_SHAPES.items()}
    for rank, params in shards.items():
        for name, tensor in params.items():
            out[name][dm.local_box(name, layout, rank).slices()] = tensor
    return out


def run_demo(directory: str | os.PathLike, *, say=print, steps: int = 40, save_every: int = 10,
             kill_after_step: int = 25) -> DemoReport:
    """Run the whole demo in ``directory`` (emptied first); see the module doc."""
    import ucp
    from reliability.ettr.tracker import ETTRTracker

    directory = str(directory)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    report = DemoReport(directory)
    saved: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    resumed: dict[int, dict[str, torch.Tensor]] = {}

    def on_event(event) -> None:
        kind, rank, step, payload = event
        if kind == "step":
            report.losses[step] = payload
            report.killed_at_step = max(report.killed_at_step, step)
            if step % 5 == 0:
                say(f"  step {step:3d}  loss {payload:.3f}")
        elif kind == "saved":
            saved.setdefault(step, {})[rank] = {n: torch.from_numpy(a) for n, a in payload.items()}
            if rank == 0:
                say(f"  step {step:3d}  checkpoint saved by every rank (each writes only its own shards)")
        elif kind == "resumed":
            resumed[rank] = {n: torch.from_numpy(a) for n, a in payload.items()}
            report.resumed_from_step = step

    say(f"1. training on 4 processes as {FIRST_LAYOUT}, checkpoints mapped by the UCL program "
        f"{os.path.relpath(PROGRAM)}; a failure kills every process after step {kill_after_step}")
    _run_phase(FIRST_LAYOUT, directory, steps, save_every, kill_after_step=kill_after_step, on_event=on_event)
    last = max(saved)
    say(f"   killed at step {report.killed_at_step} (SIGKILL); the last committed checkpoint is step {last}")

    path = os.path.join(directory, f"step_{last:08d}")
    verify = ucp.verify(path)
    if not verify.ok:
        raise RuntimeError(f"demo: checkpoint {path} failed verification: {verify}")
    reference = _assemble(saved[last], FIRST_LAYOUT)
    whole = ucp.load(path)
    for name, tensor in reference.items():
        if not torch.equal(whole[name], tensor):  # a whole load is keyed by logical name
            raise RuntimeError(f"demo: logical tensor {name} differs from the shards that saved it")
        report.verified_tensors += 1
    say(f"2. verified: checksums clean; {report.verified_tensors} logical tensors equal the 4 ranks' shards bit for bit")

    say(f"3. resuming on 2 processes as {SECOND_LAYOUT} from the 4-process checkpoint")
    _run_phase(SECOND_LAYOUT, directory, steps, save_every, kill_after_step=None, on_event=on_event)
    second = Layout.parse(SECOND_LAYOUT)
    for rank, params in resumed.items():
        for name, tensor in params.items():
            if not torch.equal(tensor, reference[name][dm.local_box(name, second, rank).slices()]):
                raise RuntimeError(f"demo: rank {rank} of {SECOND_LAYOUT} loaded a wrong shard of {name}")
            report.resharded_tensors += 1
    say(f"   each of 2 ranks loaded its shards of step {report.resumed_from_step}: "
        f"{report.resharded_tensors} shard loads, all bit-exact")
    report.final_step = max(report.losses)
    report.checkpoints = sorted(int(p.name.split("_")[1]) for p in Path(directory).glob("step_*")
                                if (p / "manifest.json").exists())
    report.ettr = ETTRTracker(directory).summary()
    first_loss, final_loss = report.losses[min(report.losses)], report.losses[report.final_step]
    say(f"4. trained to step {report.final_step}: loss {first_loss:.3f} -> {final_loss:.3f}; "
        f"checkpoints kept: {report.checkpoints}")
    say(f"5. {report.ettr} (a toy model: process start-up dominates its wall clock)")
    say(f"   next: ucp inspect {path} ; ucp ucl check {os.path.relpath(PROGRAM)} --layout tp=4,dp=3 --against {path}")
    return report
