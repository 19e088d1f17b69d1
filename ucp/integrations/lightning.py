"""PyTorch Lightning: save through ucp, resume after a crash, log ETTR.

Two pieces, used together:

* :class:`UcpCheckpointIO` - a Lightning ``CheckpointIO`` plugin that writes
  and reads Lightning's checkpoint dict as a universal checkpoint (so
  ``trainer.fit(ckpt_path=...)`` restores model, optimizers, schedulers and
  loop progress from it);
* :class:`UcpCheckpoint` - a ``Callback`` that asks the save policy after every
  optimizer step, saves through the checkpoint manager, keeps an ETTR tracker
  beside the checkpoints and logs ``ettr`` as a metric.

Example::

    checkpoint = UcpCheckpoint("ckpt", save_policy=EveryNSteps(500))
    trainer = lightning.Trainer(max_steps=10_000, callbacks=[checkpoint],
                                plugins=[checkpoint.checkpoint_io], enable_checkpointing=False)
    trainer.fit(model, data, ckpt_path=checkpoint.latest_checkpoint())   # None on the first run

Needs the ``lightning`` package: ``pip install 'ucp-middleware[lightning]'``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ucp.integrations._optional import require

_lightning = require("lightning.pytorch", extra="lightning")
_CheckpointIO = require("lightning.pytorch.plugins.io", extra="lightning").CheckpointIO

from ucp.integrations.loop import DEFAULT_FAILURES_PER_NODE_DAY, TrainingSession  # noqa: E402

__all__ = ["UcpCheckpointIO", "UcpCheckpoint"]


class UcpCheckpointIO(_CheckpointIO):
    """Lightning checkpoints as universal checkpoints (a directory per checkpoint)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        from ucp.api import save

        # Lightning calls this on global rank 0 alone, with the whole state: a save of one rank.
        save(checkpoint, os.fspath(path), overwrite=True, storage_options=storage_options, rank=0, world_size=1)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        from ucp.api import load

        location = map_location if isinstance(map_location, (str, type(None))) else "cpu"
        return load(os.fspath(path), map_location=location or "cpu")

    def remove_checkpoint(self, path) -> None:
        shutil.rmtree(os.fspath(path), ignore_errors=True)


class UcpCheckpoint(_lightning.Callback):
    """Save per policy through ucp, resume with ``ckpt_path=latest_checkpoint()``, log ETTR.

    Options as for :class:`ucp.integrations.loop.TrainingSession`. ``log_ettr``
    logs the live ETTR as the metric ``ettr`` at every step; ``save_last``
    saves once more when training ends, unless the last step was just saved.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        save_policy: Any = None,
        retention: Any = None,
        nodes: int = 1,
        failures_per_node_day: float = DEFAULT_FAILURES_PER_NODE_DAY,
        restart_s: float = 300.0,
        flush_every_s: float = 1.0,
        log_ettr: bool = True,
        save_last: bool = True,
        verbose: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.checkpoint_io = UcpCheckpointIO()
        self._trainer = None
        self.session = TrainingSession(
            self.directory,
            state_fn=self._dump,
            restore_fn=lambda state: None,  # Lightning restores through ckpt_path
            save_policy=save_policy,
            retention=retention,
            nodes=nodes,
            failures_per_node_day=failures_per_node_day,
            restart_s=restart_s,
            flush_every_s=flush_every_s,
            log=print if verbose else None,
        )
        self._log_ettr = log_ettr
        self._save_last = save_last
        self._batch_began: float | None = None
        self._compute_s = 0.0  # compute of the micro-batches since the last optimizer step

    def latest_checkpoint(self) -> str | None:
        """Pass as ``trainer.fit(..., ckpt_path=...)``; None when there is nothing to resume."""
        return self.session.latest_checkpoint()

    def _dump(self, step: int) -> dict:
        # What trainer.save_checkpoint writes (model, optimizers, schedulers,
        # loops, callbacks), taken directly so the manager can own the save.
        return self._trainer._checkpoint_connector.dump_checkpoint(weights_only=False)

    # -- hooks --------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self._trainer = trainer
        # Loop progress is restored by now: global_step is the resumed step.
        self.session.begin(resumed_step=trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._batch_began = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._batch_began is None:
            return
        self._compute_s += time.perf_counter() - self._batch_began
        self._batch_began = None
        step = trainer.global_step
        if step == self.session.current_step:
            return  # gradient accumulation: no optimizer step yet, keep adding compute
        self.session.record_step(step, seconds=self._compute_s)
        self._compute_s = 0.0
        self.session.maybe_save(step)
        if self._log_ettr:
            ettr = self.session.summary().ettr
            pl_module.log("ettr", ettr, on_step=True, prog_bar=False, logger=bool(trainer.loggers))

    def on_train_end(self, trainer, pl_module) -> None:
        if self._save_last and self.session.last_saved_step != trainer.global_step and trainer.global_step:
            self.session.save(trainer.global_step)  # so a later fit with more steps loses nothing
        self.session.close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Leave the tracker "running": the next start counts this as a restart.
        with contextlib.suppress(Exception):
            self.session.manager.wait()
