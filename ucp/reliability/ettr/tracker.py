"""Measure ETTR live in a training loop, across crashes and restarts.

An :class:`ETTRTracker` keeps a small JSON file beside the checkpoints
(``<directory>/ettr.json``) and rewrites it atomically
(:func:`ucp.file_io.write_atomic`), so a process killed with SIGKILL leaves the last complete
record. A restarted process opens the same file and calls :meth:`start` with
the step it resumed from; the tracker then counts the restart, the downtime
(from its last write before the kill to now) and the lost work (compute spent
on steps after the checkpoint it resumed from, which will be redone).

ETTR = (step compute - lost compute) / (wall-clock since the first start).

Example::

    >>> import tempfile
    >>> now = [0.0]                                  # a fake clock, in seconds
    >>> tracker = ETTRTracker(tempfile.mkdtemp(), clock=lambda: now[0])
    >>> tracker.start(resumed_step=0)
    >>> for step in (1, 2, 3):
    ...     now[0] += 10.0
    ...     tracker.record_step(step, seconds=8.0)
    >>> now[0] += 2.0
    >>> tracker.record_save(step=3, blocking_s=2.0)
    >>> str(tracker.summary())
    'ETTR 0.750 over 32s wall: 24s productive, 2s blocked on saves, 0s lost, 0 restarts'
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ucp.errors import UcpError
from ucp.file_io import write_atomic

__all__ = ["ETTRSummary", "ETTRTracker", "TrackerStateError", "format_seconds", "read_summary"]

STATE_FORMAT = "ucp-ettr/1"
# A tracker state is kilobytes (at most _MAX_REMEMBERED_CHECKPOINTS entries); refuse anything near this unread.
STATE_LIMIT = 16 << 20
# Keep the step -> compute map small: only recent checkpoints are resumed from.
_MAX_REMEMBERED_CHECKPOINTS = 256


class TrackerStateError(UcpError, ValueError):
    """The tracker's JSON file is unreadable or not one this version wrote."""


def format_seconds(seconds: float) -> str:
    """Short human duration: ``'45s'``, ``'12m05s'``, ``'3h02m'``.

    >>> format_seconds(3725.0)
    '1h02m'
    """
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


@dataclass(frozen=True)
class ETTRSummary:
    """One tracker reading. ``productive_s`` is compute that survived (net of ``lost_s``)."""

    ettr: float
    productive_s: float
    wall_s: float
    save_blocking_s: float
    save_background_s: float
    lost_s: float
    lost_steps: int
    restarts: int
    resumes: int
    downtime_s: float
    saves: int
    last_step: int | None

    def __str__(self) -> str:
        restarts = f"{self.restarts} restart" + ("" if self.restarts == 1 else "s")
        lost = f"{format_seconds(self.lost_s)} lost"
        if self.lost_steps:
            lost += f" ({self.lost_steps} steps redone)"
        return (
            f"ETTR {self.ettr:.3f} over {format_seconds(self.wall_s)} wall: "
            f"{format_seconds(self.productive_s)} productive, "
            f"{format_seconds(self.save_blocking_s)} blocked on saves, {lost}, {restarts}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _State:
    """What is persisted; gross_compute_s counts every step, lost or not."""

    first_start_unix: float | None = None
    last_seen_unix: float | None = None
    gross_compute_s: float = 0.0
    lost_s: float = 0.0
    lost_steps: int = 0
    save_blocking_s: float = 0.0
    save_background_s: float = 0.0
    saves: int = 0
    restarts: int = 0
    resumes: int = 0
    downtime_s: float = 0.0
    steps_recorded: int = 0
    last_step: int | None = None
    running: bool = False
    # step (as str, for JSON) -> gross_compute_s when that step's checkpoint was taken
    compute_at_checkpoint: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": STATE_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: object, path: Path) -> _State:
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise TrackerStateError(f"{path}: not an ETTR tracker file (expected format {STATE_FORMAT!r})")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        try:
            return cls(**known)
        except TypeError as err:
            raise TrackerStateError(f"{path}: {err}") from None


class ETTRTracker:
    """Records steps, saves, restarts and lost work; reports live ETTR.

    ``flush_every_s`` bounds how often step records are written (saves,
    starts and :meth:`close` always write). Steps after the last write are
    forgotten by a SIGKILL, but they were lost work anyway: the useful compute
    stays exact and only ``lost_s`` is under-counted, by at most that long.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        filename: str = "ettr.json",
        clock: Callable[[], float] = time.time,
        flush_every_s: float = 1.0,
    ) -> None:
        self.path = Path(directory) / filename
        self._clock = clock
        self._flush_every_s = float(flush_every_s)
        self._last_flush = -math.inf
        self._state = self._read() if self.path.exists() else _State()
        # step -> compute when its (asynchronous) save began; kept in memory only:
        # a save that never commits must not become a resume point.
        self._started_saves: dict[int, float] = {}

    # -- persistence -------------------------------------------------------
    def _read(self) -> _State:
        from ucp.confined import read_regular_file

        try:
            data = json.loads(read_regular_file(self.path, limit=STATE_LIMIT, what="a tracker state"))
        except (OSError, ValueError, RecursionError) as err:  # unreadable, not a regular file, not UTF-8 JSON
            raise TrackerStateError(f"{self.path}: cannot read tracker state: {err}") from None
        return _State.from_json(data, self.path)

    def flush(self) -> None:
        """Write the state now (atomically: a reader sees the old or the new file)."""
        now = self._clock()
        self._state.last_seen_unix = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # No fsync: the page cache survives SIGKILL, and losing a second of
        # records to a power cut is cheaper than a disk flush every step.
        write_atomic(self.path, json.dumps(self._state.to_json(), indent=1).encode("utf-8"), durable=False)
        self._last_flush = now

    def _maybe_flush(self) -> None:
        if self._clock() - self._last_flush >= self._flush_every_s:
            self.flush()

    # -- events --------------------------------------------------------------
    def start(self, *, resumed_step: int | None = None) -> None:
        """Call once per process, before training, with the step training resumes from.

        ``resumed_step`` is the step of the checkpoint that was loaded (None or
        0 when starting from scratch). If an earlier process left state here,
        this is a restart (it never called :meth:`close`) or a resume.
        """
        state, now = self._state, self._clock()
        resumed = 0 if resumed_step is None else int(resumed_step)
        if state.first_start_unix is None:
            state.first_start_unix = now
        else:
            if state.running:
                state.restarts += 1
            else:
                state.resumes += 1
            if state.last_seen_unix is not None:
                state.downtime_s += max(0.0, now - state.last_seen_unix)
            self._count_lost_work(resumed)
        # Steps after the resumed one belong to an abandoned timeline.
        state.compute_at_checkpoint = {
            k: v for k, v in state.compute_at_checkpoint.items() if int(k) < resumed
        }
        state.compute_at_checkpoint[str(resumed)] = state.gross_compute_s
        state.last_step = resumed
        state.running = True
        self.flush()

    def _count_lost_work(self, resumed: int) -> None:
        state = self._state
        if state.last_step is None or state.last_step <= resumed:
            return
        state.lost_steps += state.last_step - resumed
        at_checkpoint = state.compute_at_checkpoint.get(str(resumed))
        if at_checkpoint is None:
            # Killed after the checkpoint committed but before we recorded it:
            # estimate from the mean step time.
            mean_step = state.gross_compute_s / max(1, state.steps_recorded)
            lost = (state.last_step - resumed) * mean_step
        else:
            lost = state.gross_compute_s - at_checkpoint
        state.lost_s += max(0.0, lost)

    def record_step(self, step: int, *, seconds: float) -> None:
        """Count ``seconds`` of training compute for ``step``."""
        if not seconds >= 0:
            raise ValueError(f"record_step: seconds must be >= 0, got {seconds!r}")
        self._ensure_started()
        self._state.gross_compute_s += float(seconds)
        self._state.steps_recorded += 1
        self._state.last_step = int(step)
        self._maybe_flush()

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Time the block as the compute of ``step`` (not counted if it raises)."""
        began = time.perf_counter()
        yield
        self.record_step(step, seconds=time.perf_counter() - began)

    def checkpoint_started(self, step: int) -> None:
        """Note that a save of ``step`` began now; call :meth:`record_save` when it commits.

        Only needed for asynchronous saves, whose cost is known after training moved on.
        """
        self._started_saves[int(step)] = self._state.gross_compute_s

    def record_save(self, *, step: int, blocking_s: float, background_s: float = 0.0) -> None:
        """Count a committed checkpoint of ``step``: training stalled ``blocking_s``,
        then ``background_s`` more ran alongside training until it committed."""
        if not (blocking_s >= 0 and background_s >= 0):
            raise ValueError(f"record_save: times must be >= 0, got {blocking_s!r}, {background_s!r}")
        self._ensure_started()
        state = self._state
        state.save_blocking_s += float(blocking_s)
        state.save_background_s += float(background_s)
        state.saves += 1
        at_step = self._started_saves.pop(int(step), state.gross_compute_s)
        state.compute_at_checkpoint[str(int(step))] = at_step
        if len(state.compute_at_checkpoint) > _MAX_REMEMBERED_CHECKPOINTS:
            oldest = min(state.compute_at_checkpoint, key=int)
            del state.compute_at_checkpoint[oldest]
        self.flush()

    def record_background(self, *, seconds: float) -> None:
        """Add background save time learnt after :meth:`record_save` (async saves)."""
        self._state.save_background_s += float(seconds)
        self._maybe_flush()

    def close(self) -> None:
        """Mark a clean end: the next :meth:`start` is a resume, not a restart."""
        self._state.running = False
        self.flush()

    def _ensure_started(self) -> None:
        if not self._state.running:
            raise TrackerStateError("ETTRTracker: call start(resumed_step=...) before recording")

    # -- reading ---------------------------------------------------------------
    def summary(self) -> ETTRSummary:
        """The live reading: wall-clock runs from the first start to now (or to
        :meth:`close`, for a run that ended cleanly).

        >>> import tempfile
        >>> ETTRTracker(tempfile.mkdtemp()).summary().ettr
        0.0
        """
        state = self._state
        # A closed run ended at its last write; a running (or crashed) one runs until now.
        end = self._clock() if state.running or state.last_seen_unix is None else state.last_seen_unix
        wall = 0.0 if state.first_start_unix is None else max(0.0, end - state.first_start_unix)
        useful = max(0.0, state.gross_compute_s - state.lost_s)
        return ETTRSummary(
            ettr=useful / wall if wall > 0 else 0.0,
            productive_s=useful,
            wall_s=wall,
            save_blocking_s=state.save_blocking_s,
            save_background_s=state.save_background_s,
            lost_s=state.lost_s,
            lost_steps=state.lost_steps,
            restarts=state.restarts,
            resumes=state.resumes,
            downtime_s=state.downtime_s,
            saves=state.saves,
            last_step=state.last_step,
        )

    @property
    def ettr(self) -> float:
        return self.summary().ettr

    @property
    def mean_save_blocking_s(self) -> float | None:
        """Mean stall per save so far, or None before the first save."""
        return self._state.save_blocking_s / self._state.saves if self._state.saves else None


def read_summary(directory: str | os.PathLike, *, filename: str = "ettr.json") -> ETTRSummary:
    """The ETTR of the run whose tracker file is in ``directory`` (read-only).

    For reports after a run, e.g. a demo with an injected failure::

        print(read_summary("ckpt"))   # ETTR 0.912 over 3m10s wall: ..., 1 restart
    """
    path = Path(directory) / filename
    if not path.is_file():
        raise TrackerStateError(f"{path}: no ETTR tracker file (was the run started with an ETTRTracker?)")
    return ETTRTracker(directory, filename=filename).summary()
