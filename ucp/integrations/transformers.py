"""Hugging Face Transformers: a TrainerCallback that saves through ucp, resumes, and reports ETTR.

The Trainer keeps its own checkpointing off (``save_strategy="no"``); this
callback asks the save policy after every optimizer step and saves model,
optimizer, LR scheduler, step and RNG as a universal checkpoint. At
``on_train_begin`` it loads the newest good checkpoint into the live model,
optimizer and scheduler and sets ``state.global_step``, so the run goes on to
``max_steps`` from there. The live ETTR goes into the Trainer's logs as
``ettr`` (and is printed at the end).

Example::

    callback = UcpTrainerCallback("ckpt", save_policy=EveryNSteps(500))
    args = TrainingArguments("out", max_steps=10_000, save_strategy="no")
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()

Needs ``transformers``: ``pip install 'ucp-middleware[transformers]'``. The
data order after a resume is the Trainer's own (it restarts the epoch); the
model, optimizer and scheduler state are exactly the checkpoint's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ucp.integrations._optional import require

_TrainerCallback = require("transformers", extra="transformers").TrainerCallback

from ucp.integrations.loop import DEFAULT_FAILURES_PER_NODE_DAY, TrainingSession  # noqa: E402
from ucp.integrations.training_state import capture, restore  # noqa: E402

__all__ = ["UcpTrainerCallback"]


class UcpTrainerCallback(_TrainerCallback):
    """Checkpoint through ucp per save policy; resume after a crash; log ``ettr``.

    Options as for :class:`ucp.integrations.loop.TrainingSession`.
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
        save_last: bool = True,
        verbose: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self._live: dict[str, Any] = {}
        self._save_last = save_last
        self.session = TrainingSession(
            self.directory,
            state_fn=self._capture,
            restore_fn=self._restore,
            save_policy=save_policy,
            retention=retention,
            nodes=nodes,
            failures_per_node_day=failures_per_node_day,
            restart_s=restart_s,
            flush_every_s=flush_every_s,
            log=print if verbose else None,
        )
        self._step_began: float | None = None

    def _capture(self, step: int) -> dict:
        return capture(model=self._live["model"], optimizer=self._live["optimizer"],
                       scheduler=self._live["lr_scheduler"], step=step)

    def _restore(self, state: dict) -> None:
        restore(state, model=self._live["model"], optimizer=self._live["optimizer"],
                scheduler=self._live["lr_scheduler"])

    def _remember(self, kwargs: dict) -> None:
        for name in ("model", "optimizer", "lr_scheduler"):
            if kwargs.get(name) is not None:
                self._live[name] = kwargs[name]

    # -- events ----------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._remember(kwargs)
        resumed = self.session.resume()
        if resumed:
            state.global_step = resumed  # the Trainer counts on from here to max_steps

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._remember(kwargs)
        if self._step_began is not None:
            self.session.record_step(state.global_step, seconds=time.perf_counter() - self._step_began)
            self._step_began = None
        self.session.maybe_save(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            logs["ettr"] = round(self.session.summary().ettr, 6)

    def on_train_end(self, args, state, control, **kwargs):
        self._remember(kwargs)
        if self._save_last and state.global_step and self.session.last_saved_step != state.global_step:
            self.session.save(state.global_step)
        self.session.close()
