"""Iterate in a background thread, a bounded number of items ahead: reading overlaps writing.

A conversion reads a piece, then writes it; with the next piece read while the
current one is written, the two costs overlap instead of adding up. The queue
holds at most ``depth`` items, so memory grows by exactly that many pieces.
An exception in the thread is raised in the consumer; a consumer that stops
early (an error while writing) stops the thread too.

>>> list(read_ahead(iter(range(5))))
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")


def read_ahead(items: Iterator[T], *, depth: int = 1) -> Iterator[T]:
    """Yield ``items`` as produced by a background thread that runs at most ``depth`` ahead."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(("item", item)):
                    return
            put(("end", None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            put(("error", err))

    worker = threading.Thread(target=produce, name="ucp-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = slots.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
            del value
    finally:
        stop.set()
        while worker.is_alive():
            try:
                slots.get(timeout=0.05)
            except queue.Empty:
                pass
        worker.join()
