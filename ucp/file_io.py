"""Small primitives of plain-file I/O that the storage layer builds on.

Whole writes and reads of a buffer (a single ``write``/``read`` may move less
than asked, and at most ~2 GiB), fsync of a path, digests of arrays, and a
future that is already done::

    >>> import io
    >>> view = memoryview(bytearray(3))
    >>> read_into(io.BytesIO(b"abcdef"), view), bytes(view)
    (3, b'abc')
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np


def read_into(fh: Any, view: memoryview) -> int:
    """Fill ``view`` from a file (one read returns at most ~2 GiB); the bytes read."""
    got = 0
    while got < view.nbytes:
        n = fh.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def hexdigests(hasher: Callable | None, arrays: list[np.ndarray]) -> list[str | None]:
    """The hex digest of each array by a fresh ``hasher()`` (Nones without one)."""
    found = []
    for array in arrays:
        digest = hasher() if hasher is not None else None
        if digest is not None:
            digest.update(array.reshape(-1).view(np.uint8))
        found.append(digest.hexdigest() if digest is not None else None)
    return found


def little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` as a C-contiguous little-endian array (itself when it is one)."""
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)


def write_all(fd: int, view: memoryview) -> None:
    """Write all of ``view`` to ``fd``."""
    while view.nbytes:
        view = view[os.write(fd, view):]


def done_future(value: Any) -> Future:
    """A future already resolved to ``value``."""
    future: Future = Future()
    future.set_result(value)
    return future


def fsync_path(path: str) -> None:
    """Make a file or directory durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
