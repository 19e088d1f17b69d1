"""Checkpointing, resumption and live ETTR for a plain PyTorch training loop.

A :class:`TrainingSession` ties together the checkpoint manager (saves through
ucp, retention, restore of the newest good checkpoint), an
:class:`~ucp.reliability.ettr.tracker.ETTRTracker` (kept beside the checkpoints, so
it survives SIGKILL) and a save policy - by default the adaptive, ETTR-optimal
interval, fed with each save's measured cost. The Lightning and Transformers
callbacks are thin adapters over it.

Example::

    with TrainingSession("ckpt", model=model, optimizer=optimizer) as session:
        for step in session.steps(10_000):       # resumes after the last checkpoint
            loss = model(batch(step)).loss
            loss.backward(); optimizer.step(); optimizer.zero_grad()
    print(session.summary())                      # ETTR 0.97 over 2h01m wall: ...

Or explicitly: ``start = session.resume()``, then per step ``with
session.step(step): ...`` and ``session.maybe_save(step)``, and ``session.close()``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ucp.integrations.training_state import capture, restore
from ucp.reliability.ettr.adaptive import AdaptiveIntervalPolicy
from ucp.reliability.ettr.tracker import ETTRSummary, ETTRTracker

__all__ = ["TrainingSession", "DEFAULT_FAILURES_PER_NODE_DAY"]

# Prior per-node failure rate when nothing better is known: 6.5 per 1000
# node-days, the rate Kokolis et al. (2024) report for a large A100 cluster.
DEFAULT_FAILURES_PER_NODE_DAY = 0.0065


class TrainingSession:
    """Save, resume and measure ETTR for one training run under ``directory``.

    ``save_policy`` is any object with ``should_save(*, step, seconds_since_save)``
    (``ucp.policies``); by default an :class:`AdaptiveIntervalPolicy` for
    ``nodes`` nodes failing at ``failures_per_node_day``. ``state_fn`` overrides
    what is saved (default: model, optimizer, scheduler, step, RNG) and
    ``restore_fn(state)`` how it is loaded back.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        save_policy: Any = None,
        retention: Any = None,
        async_save: bool = False,
        nodes: int = 1,
        failures_per_node_day: float = DEFAULT_FAILURES_PER_NODE_DAY,
        restart_s: float = 300.0,
        state_fn: Callable[[int], dict] | None = None,
        restore_fn: Callable[[dict], Any] | None = None,
        flush_every_s: float = 1.0,
        log: Callable[[str], Any] | None = None,
        report_every_steps: int = 0,
    ) -> None:
        from ucp.manager import CheckpointManager
        from ucp.policies import KeepLast

        if model is None and state_fn is None:
            raise TypeError("TrainingSession needs model= (or state_fn= and restore_fn=)")
        self.directory = Path(directory)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        if save_policy is None:
            save_policy = AdaptiveIntervalPolicy(
                nodes=nodes, failures_per_node_day=failures_per_node_day, restart_s=restart_s
            )
        self.save_policy = save_policy
        self.manager = CheckpointManager(
            self.directory, save_policy=save_policy, retention=retention or KeepLast(3), async_save=async_save
        )
        self.tracker = ETTRTracker(self.directory, flush_every_s=flush_every_s)
        self._state_fn = state_fn
        self._restore_fn = restore_fn
        self._log = log
        self._report_every = int(report_every_steps)
        self._records_seen = 0
        self._last_save = time.monotonic()
        self.resumed_step: int | None = None
        self.current_step = 0
        self.last_saved_step: int | None = None

    # -- state -------------------------------------------------------------------
    def _capture(self, step: int) -> dict:
        if self._state_fn is not None:
            return self._state_fn(step)
        return capture(model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, step=step)

    def resume(self) -> int:
        """Load the newest good checkpoint (if any) and start the tracker; return its step (0: none).

        Calling it again is a no-op that returns the same step.
        """
        if self.resumed_step is not None:
            return self.resumed_step
        from ucp.api import load

        found = self.manager.latest_checkpoint()
        step = None if found is None else found[0]
        if found is not None:
            state = load(found[1])
            if self._restore_fn is not None:
                self._restore_fn(state)
            else:
                restore(state, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        return self.begin(resumed_step=0 if step is None else step)

    def begin(self, *, resumed_step: int) -> int:
        """Start measuring from ``resumed_step`` when the framework restored the state itself."""
        if self.resumed_step is not None:
            return self.resumed_step
        self.resumed_step = self.current_step = int(resumed_step)
        self.tracker.start(resumed_step=self.resumed_step)
        self._feed_policy()
        self._last_save = time.monotonic()
        if self._log is not None and self.resumed_step:
            self._log(f"resumed from step {self.resumed_step}; {self.tracker.summary()}")
        return self.resumed_step

    def latest_checkpoint(self) -> str | None:
        """The newest good checkpoint (its path or URL), or None."""
        latest = self.manager.latest()
        return None if latest is None else str(latest)

    # -- the loop ------------------------------------------------------------------
    def steps(self, total: int) -> Iterator[int]:
        """Yield the steps still to run, ``resumed+1 .. total``; time each and save per policy."""
        start = self.resume()
        for step in range(start + 1, total + 1):
            began = time.perf_counter()
            yield step
            self.record_step(step, seconds=time.perf_counter() - began)
            self.maybe_save(step)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Time the block as the compute of ``step`` (then call :meth:`maybe_save`)."""
        began = time.perf_counter()
        yield
        self.record_step(step, seconds=time.perf_counter() - began)

    def record_step(self, step: int, *, seconds: float) -> None:
        if self.resumed_step is None:
            self.resume()
        self.current_step = step
        self.tracker.record_step(step, seconds=seconds)
        if self._log is not None and self._report_every and step % self._report_every == 0:
            self._log(f"step {step}: {self.tracker.summary()}")

    def maybe_save(self, step: int) -> str | None:
        """Save if the policy says so (it is asked every step); returns the path or None."""
        self._sync_records()
        since = time.monotonic() - self._last_save
        if not self.save_policy.should_save(step=step, seconds_since_save=since):
            return None
        return self.save(step)

    def save(self, step: int) -> str:
        """Save now through the checkpoint manager (blocking, or async if configured)."""
        self.tracker.checkpoint_started(step)
        path = str(self.manager.save(step, self._capture(step)))
        self._last_save = time.monotonic()
        self.last_saved_step = step
        self._sync_records()
        return path

    def close(self) -> ETTRSummary:
        """Wait for saves in flight, record them, mark a clean end; returns the final summary."""
        self.manager.wait()
        self._sync_records()
        self.tracker.close()
        summary = self.tracker.summary()
        if self._log is not None:
            self._log(str(summary))
        return summary

    def __enter__(self) -> TrainingSession:
        self.resume()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        # On an exception the tracker stays "running": the next start counts a restart.

    # -- measurements ------------------------------------------------------------------
    def _sync_records(self) -> None:
        records = self.manager.records
        for record in records[self._records_seen :]:
            self.tracker.record_save(
                step=record.step, blocking_s=record.blocking_seconds, background_s=record.background_seconds
            )
            observe = getattr(self.save_policy, "observe_save", None)
            if observe is not None:
                observe(blocking_s=record.blocking_seconds, background_s=record.background_seconds)
        if len(records) > self._records_seen:
            self._records_seen = len(records)
            self._feed_policy()

    def _feed_policy(self) -> None:
        observe = getattr(self.save_policy, "observe_tracker", None)
        if observe is not None:
            observe(self.tracker.summary())

    def summary(self) -> ETTRSummary:
        """The live ETTR reading (see :meth:`ETTRTracker.summary`)."""
        return self.tracker.summary()

    @property
    def interval_s(self) -> float | None:
        """The adaptive policy's current interval, or None for a fixed policy."""
        return getattr(self.save_policy, "interval_s", None)
