"""The DeepSpeed peer path: native checkpoints, ``ds_to_universal``, universal load.

What a DeepSpeed user does today to resume under another dp or ZeRO stage: the
engine's ``save_checkpoint`` (per-rank ZeRO shards of the current layout); after a
failure, DeepSpeed's offline converter ``ds_to_universal`` turns them into one file
per parameter and state; the new engine, configured with
``checkpoint.load_universal``, loads that. The recovery benchmark runs this next to
ucp on the same trainer.

    save_native(trainer, "ds", tag="step_10")
    universal = to_universal("ds", tag="step_10")              # offline, between the runs
    load_universal(new_trainer, universal)                      # new trainer built with universal=True

And the way out of DeepSpeed: :func:`to_ucp` reads a native checkpoint with ucp's own
DeepSpeed reader (``ucp.formats``: restricted unpickling, no DeepSpeed import) and writes
it as a universal checkpoint, tensor by tensor, which every stack here loads::

    to_ucp("ds/step_10", "ckpt/step_10")
    MegatronTrainer(cfg, "tp=2,pp=2", settings, rank=rank).load("ckpt/step_10")
"""

from __future__ import annotations

import os
from argparse import Namespace

import torch

from ucp.file_io import write_atomic
from ucp.integrations.stacks.common import Progress

__all__ = ["save_native", "native_committed", "to_universal", "load_universal", "to_ucp"]


def save_native(trainer, directory: str, *, tag: str) -> None:
    progress = {"step": trainer.progress.step, "position": trainer.progress.position}
    trainer.engine.save_checkpoint(directory, tag=tag, client_state={"progress": progress})


def native_committed(directory: str, tag: str) -> bool:
    """DeepSpeed writes ``latest`` (naming the tag) after every rank saved."""
    latest = os.path.join(directory, "latest")
    return os.path.isfile(latest) and open(latest).read().strip() == tag


def to_universal(directory: str, *, tag: str, workers: int = 2) -> str:
    """Run DeepSpeed's ``ds_to_universal`` on checkpoint ``tag``; returns the universal folder."""
    from deepspeed.checkpoint.ds_to_universal import main

    out = os.path.join(directory, f"{tag}_universal")
    main(Namespace(input_folder=os.path.join(directory, tag), output_folder=out, num_extract_workers=workers,
                   num_merge_workers=workers, keep_temp_folder=False, strict=True, inject_missing_state=True))
    write_atomic(os.path.join(directory, "latest_universal"), f"{tag}_universal".encode())
    return out


def load_universal(trainer, universal: str) -> Progress:
    """Load a universal checkpoint into a trainer built with ``universal=True``."""
    directory, tag = os.path.split(universal.rstrip("/"))
    _, client = trainer.engine.load_checkpoint(directory, tag=tag, load_module_strict=True)
    progress = (client or {}).get("progress") or {"step": 0, "position": 0}
    trainer.progress = Progress(int(progress["step"]), int(progress["position"]))
    for state in trainer._adam.state.values():
        state["step"] = torch.tensor(float(trainer.progress.step))
    return trainer.progress


def to_ucp(native: str, out: str) -> str:
    """Convert the native DeepSpeed checkpoint ``native`` (a tag folder, or a folder with ``latest``)
    into a ucp checkpoint at ``out``; returns ``out``.

    Streams one logical tensor at a time (``<name>``, ``<name>/fp32``, ``<name>/exp_avg``,
    ``<name>/exp_avg_sq``, ``<name>/step``: the reader's names are the trainers' names); the step
    and data position come from the engine's step and the trainer's client state.
    """
    import ucp.formats  # noqa: F401 - registers the readers
    from ucp.formats.base import get_format
    from ucp.writer import CheckpointWriter

    with get_format("deepspeed-zero").open_reader(native) as reader:
        state = reader.state()
        files = (state.extra.get("deepspeed") or {}).get("model_states") or {}
        client = next(iter(files.values()), {}) if files else {}
        progress = client.get("progress") or {"step": state.step or 0, "position": 0}
        writer = CheckpointWriter(out)
        try:
            for info in reader.tensors():
                writer.add(info.name, info.read())
            writer.set_state({"step": int(progress["step"]), "data": {"position": int(progress["position"])},
                              "run": {"stack": "deepspeed", "converted_from": "deepspeed-zero",
                                      "zero_stage": state.extra.get("zero_stage"), "dp": state.extra.get("dp")}})
        except BaseException as err:
            writer.abort(f"{type(err).__name__}: {err}")
            raise
        writer.close()
    return out
