"""A training job as plain data, and the worker that runs it on every rank of any stack.

A :class:`Job` says which stack, layout and model; where to resume from; how far
to train; where to save. :func:`run_job` is the function each rank runs (start it
with :func:`ucp.integrations.launch.run`); rank 0 returns the losses and, on request,
logical snapshots (whole tensors, as numpy arrays) taken right after the load and
right at the save, which the tests compare bit for bit with the checkpoint.

    job = Job(stack="megatron", layout="tp=2,pp=2", until_step=3, save_to="ckpt/3")
    result = run(run_job, world=job.world, args=(job,))
    result["losses"]                       # {1: 4.61, 2: 4.58, 3: 4.52}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.stacks.common import TrainSettings
from ucp.layout import Layout

__all__ = ["Job", "STACKS", "build_trainer", "run_job", "rng_digest"]

STACKS = ("native", "megatron", "deepspeed")


@dataclass(frozen=True)
class Job:
    """One run of one stack: ``resume_from`` (or start at step 0), train to ``until_step``, ``save_to``."""

    stack: str
    layout: str
    model: str = ""  # LlamaConfig string form ("" = defaults)
    settings: TrainSettings = field(default_factory=TrainSettings)
    until_step: int = 0
    resume_from: str | None = None
    save_to: str | None = None
    snapshots: bool = False
    native_save: bool = False  # DeepSpeed: save with the engine's own save_checkpoint instead of ucp

    @property
    def world(self) -> int:
        return Layout.parse(self.layout).world_size

    @property
    def config(self) -> LlamaConfig:
        return LlamaConfig.parse(self.model)


def build_trainer(stack: str, cfg: LlamaConfig, layout: Layout | str, settings: TrainSettings, *, rank: int,
                  **options):
    """The reference trainer of ``stack`` for this rank (imports only that stack); ``options`` go to
    its constructor (DeepSpeed: ``universal=True`` to load DeepSpeed universal checkpoints)."""
    if stack == "native":
        from ucp.integrations.native.trainer import NativeTrainer

        return NativeTrainer(cfg, layout, settings, rank=rank, **options)
    if stack == "megatron":
        from ucp.integrations.megatron.trainer import MegatronTrainer

        return MegatronTrainer(cfg, layout, settings, rank=rank, **options)
    if stack == "deepspeed":
        from ucp.integrations.deepspeed.trainer import DeepSpeedTrainer

        return DeepSpeedTrainer(cfg, layout, settings, rank=rank, **options)
    raise ValueError(f"unknown stack {stack!r}: expected one of {', '.join(STACKS)}")


def _numpy(snapshot: dict | None) -> dict | None:
    """Numpy copies in the tensors' storage dtype (bf16 as its uint16 bit pattern), so comparisons
    are bitwise and a bf16 tensor never equals an fp32 one."""
    if snapshot is None:
        return None
    from ucp.dtypes import to_numpy

    return {k: to_numpy(v.detach()).copy() for k, v in snapshot.items()}


def rng_digest() -> str:
    """A short digest of this process's torch RNG state (to compare a saved and a restored one)."""
    import hashlib

    import torch

    return hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


def run_job(ctx, job: Job) -> dict:
    """The body of every rank (see the module doc); emits a ``step`` event per step."""
    trainer = build_trainer(job.stack, job.config, job.layout, job.settings, rank=ctx.rank,
                            init=not job.resume_from)
    result: dict = {"losses": {}, "loaded": None, "saved": None}
    if job.resume_from:
        trainer.load(job.resume_from)
        result["rng_loaded"] = rng_digest()
        if job.snapshots:
            result["loaded"] = _numpy(trainer.logical_snapshot())
    result["start_step"] = trainer.progress.step
    while trainer.progress.step < job.until_step:
        loss = trainer.train_step()
        result["losses"][trainer.progress.step] = loss
        if ctx.rank == 0:
            ctx.emit("step", step=trainer.progress.step, loss=loss)
    if job.save_to:
        if job.native_save:
            import os

            from ucp.integrations.deepspeed.native import save_native

            save_native(trainer, os.path.dirname(job.save_to), tag=os.path.basename(job.save_to))
        else:
            trainer.save(job.save_to)
        result["rng_saved"] = rng_digest()  # what the save recorded: nothing draws from the RNG in between
        if job.snapshots:
            result["saved"] = _numpy(trainer.logical_snapshot())
    return result
