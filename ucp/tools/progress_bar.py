"""Progress on long CLI work, on standard error: a rich bar on a terminal, else a line every few seconds.

CI logs and ``nohup`` files are not terminals; a bar there is either nothing or a mess of
control codes, so long work would look hung. Off a terminal, progress is a plain line at most
every :data:`LINE_EVERY_S` seconds (and none for work shorter than that)::

    converting: 1.2 GiB of 4.0 GiB (30%), 12 s, model.layers.3.mlp.up_proj.weight

    with byte_progress("converting", enabled=not args.quiet) as update:
        ucp.convert(src, dst, progress=update)       # update(done, total, name) or None
    with count_progress("reading logs", "partitions", enabled=True) as update:
        analyze_logs(..., progress=update)           # update(done, total)
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator, TextIO

from ucp.tools.output import size_text

__all__ = ["byte_progress", "count_progress", "ProgressLines", "LINE_EVERY_S"]

LINE_EVERY_S = 5.0


class ProgressLines:
    """``update(done, total, item="")`` writing one line to ``stream`` at most every ``every`` seconds.

    >>> import io
    >>> ticks = iter([0.0, 1.0, 6.0])
    >>> out = io.StringIO()
    >>> p = ProgressLines("converting", stream=out, every=5.0, clock=lambda: next(ticks), unit="bytes")
    >>> p(1 << 20, 4 << 20, "w"); p(2 << 20, 4 << 20, "w")
    >>> out.getvalue()
    'converting: 2.0 MiB of 4.0 MiB (50%), 6 s, w\\n'
    """

    def __init__(self, label: str, *, stream: TextIO | None = None, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic, unit: str = "items") -> None:
        self.label, self.unit, self.clock = label, unit, clock
        self.every = LINE_EVERY_S if every is None else every
        self.stream = stream if stream is not None else sys.stderr
        self.started = clock()
        self.last = self.started

    def __call__(self, done: int, total: int | None = None, item: str = "") -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        fmt = partial(size_text, largest="TiB") if self.unit == "bytes" else (lambda n: f"{n:,}")
        text = f"{self.label}: {fmt(done)}"
        if total:
            text += f" of {fmt(total)} (" + f"{100 * done / total:.0f}%)"
        if self.unit not in ("bytes", "items"):
            text += f" {self.unit}"
        text += f", {now - self.started:.0f} s" + (f", {item}" if item else "")
        print(text, file=self.stream, flush=True)


@contextmanager
def byte_progress(label: str, *, enabled: bool) -> Iterator[Callable[[int, int, str], None] | None]:
    """Yield ``update(done_bytes, total_bytes, item)`` (a bar on a terminal, else lines), or None when off."""
    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        yield ProgressLines(label, unit="bytes")
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
               TextColumn("{task.fields[item]}", style="dim"))
    with Progress(*columns, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=None, item="")

        def update(done: int, total: int, item: str) -> None:
            bar.update(task, completed=done, total=total, item=item[-48:])

        yield update


@contextmanager
def count_progress(label: str, unit: str, *, enabled: bool) -> Iterator[Callable[..., None]]:
    """Yield ``update(done, total=None, item="")`` counting ``unit`` (a bar, lines, or nothing when off)."""
    if not enabled:
        yield lambda *args, **kwargs: None
        return
    if not sys.stderr.isatty():
        yield ProgressLines(label, unit=unit)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int | None = None, item: str = "") -> None:
            bar.update(task, completed=done, total=total, description=f"{label} {item}".strip())

        yield update
