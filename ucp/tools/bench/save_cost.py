"""What a checkpoint costs the training loop: a synchronous save, and a background (async) save
with the slowdown of the steps that run while it writes.

The recovery bench runs this once per model size, on the same stack and layout as its ``ucp-hot``
and ``ucp-restart`` systems (Megatron-style, ``tp=2,dp=2,zero=1``), so the ETTR model learns
its save costs from the same run as its recovery costs. Each round, on every rank:

* ``step_s``: a training step with no save in flight;
* ``save_sync_s``: ``ucp.save`` of the full training state, the loop stopped throughout;
* ``save_blocking_s``: :class:`ucp.async_saver.AsyncSaver`'s snapshot (the loop waits for it);
* ``save_background_s``: the write after the loop resumed, until the commit;
* ``slowdown_s``: what the steps overlapping that write took beyond ``step_s`` (the background
  save shares the cores, the memory bandwidth and the disk with training).

Times are rank 0's, between barriers (so they are the whole group's). Every round's checkpoints
are deleted once measured.

    costs = measure_save_costs(model="", layout="tp=2,dp=2,zero=1", rounds=3, directory="/tmp/x")
    costs["save_blocking_s"], costs["slowdown_s"]
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

__all__ = ["measure_save_costs", "save_cost_worker"]


def _timed_step(trainer) -> float:
    import torch.distributed as dist

    dist.barrier()
    began = time.perf_counter()
    trainer.train_step()
    dist.barrier()
    return time.perf_counter() - began


def save_cost_worker(ctx, model: str, layout: str, settings, directory: str, rounds: int) -> list[dict]:
    """One rank; rank 0 returns one dict per round (see the module doc)."""
    import torch.distributed as dist

    import ucp
    from ucp.async_saver import AsyncSaver
    from ucp.integrations.llama.config import LlamaConfig
    from ucp.integrations.stacks.jobs import build_trainer

    trainer = build_trainer("megatron", LlamaConfig.parse(model), layout, settings, rank=ctx.rank)
    checkpoint_group = dist.new_group(backend="gloo")  # the background save's collectives stay off the loop's
    saver = AsyncSaver()
    _timed_step(trainer)  # warm-up: first-step allocations are not a save's cost
    out = []
    for index in range(rounds):
        plain = statistics.median(_timed_step(trainer) for _ in range(2))
        state, options = trainer.checkpoint_state()
        options.pop("process_group", None)
        sync_path, async_path = (os.path.join(directory, f"{kind}_{index}") for kind in ("sync", "async"))
        dist.barrier()
        began = time.perf_counter()
        ucp.save(state, sync_path, process_group=dist.group.WORLD, **options)
        dist.barrier()
        sync_s = time.perf_counter() - began
        state, _ = trainer.checkpoint_state()
        dist.barrier()
        began = time.perf_counter()
        handle = saver.save(state, async_path, process_group=checkpoint_group, **options)
        dist.barrier()
        blocking_s = time.perf_counter() - began
        overlapped = []
        while True:  # every rank steps until every rank's write has committed
            done = handle.done()
            flags = [None] * ctx.world
            dist.all_gather_object(flags, done)
            if all(flags):
                break
            overlapped.append(_timed_step(trainer))
        handle.wait()
        out.append({"step_s": plain, "save_sync_s": sync_s, "save_blocking_s": blocking_s,
                    "save_background_s": handle.background_seconds or 0.0,
                    "slowdown_s": sum(max(0.0, s - plain) for s in overlapped), "overlapped_steps": len(overlapped)})
        dist.barrier()
        if ctx.rank == 0:
            for path in (sync_path, async_path):
                shutil.rmtree(path, ignore_errors=True)
    return out


def measure_save_costs(*, model: str, layout: str, rounds: int, directory: str | os.PathLike,
                       settings=None, timeout_s: float = 1800.0) -> dict:
    """Medians over ``rounds`` of the costs in the module doc, plus ``state_bytes`` (the checkpoint's size)."""
    from ucp.integrations.launch import run
    from ucp.integrations.stacks.common import TrainSettings
    from ucp.layout import Layout

    directory = Path(directory)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    rows = run(save_cost_worker, world=Layout.parse(layout).world_size,
               args=(model, layout, settings or TrainSettings(), str(directory), rounds), timeout=timeout_s)
    shutil.rmtree(directory, ignore_errors=True)
    keys = ("step_s", "save_sync_s", "save_blocking_s", "save_background_s", "slowdown_s")
    return {k: statistics.median(r[k] for r in rows) for k in keys} | {"rounds": rounds, "layout": layout}
