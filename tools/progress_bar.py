"""A rich progress bar in bytes for long CLI work (convert, diff), shown only on a terminal.

    with byte_progress("converting", enabled=not args.json) as update:
        ucp.convert(src, dst, progress=update)       # update(done, total, name) or None
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["byte_progress"]


@contextmanager
def byte_progress(label: str, *, enabled: bool) -> Iterator[Callable[[int, int, str], None] | None]:
    """Yield ``update(done_bytes, total_bytes, item)`` drawing a bar on stderr, or None when not shown."""
    if not enabled or not sys.stderr.isatty():
        yield None
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
