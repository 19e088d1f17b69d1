"""Small primitives of plain-file I/O that the storage layer builds on.

Whole writes and reads of a buffer (a single ``write``/``read`` may move less
than asked, and at most ~2 GiB), fsync of a path, the one way ucp replaces a
file atomically (:func:`write_atomic`), digests of arrays, and a future that is
already done::

    >>> import io
    >>> view = memoryview(bytearray(3))
    >>> read_into(io.BytesIO(b"abcdef"), view), bytes(view)
    (3, b'abc')
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
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
        view = view[os.write(fd, view) :]


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


# Answers to open(O_TMPFILE) meaning "not on this kernel or file system" (an old kernel sees O_DIRECTORY).
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EISDIR, errno.EINVAL, errno.ENOENT}
# Answers to fsync of a directory meaning "this file system does not do that" (some network file systems).
_NO_DIR_FSYNC = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF}


def write_atomic(
    path: str | os.PathLike, data: bytes | memoryview, *, durable: bool = True, dir_fd: int | None = None
) -> None:
    """Replace the file ``path`` with ``data``: a reader sees the old bytes or the new, never a part.

    The bytes go into a file of the same directory that has no name yet (Linux ``O_TMPFILE``;
    elsewhere a hidden ``.<name>.<random>.tmp``), are fsynced, get a temporary name and are
    renamed onto ``path``; then the directory is fsynced, so the rename survives a power cut
    too. ``durable=False`` skips both fsyncs (a kill still leaves the old or the new file:
    the page cache survives the process). An exception removes the temporary file; a process
    killed while writing leaves none where ``O_TMPFILE`` works (it has no name until written).
    ``dir_fd``: ``path`` is relative to that open directory (:mod:`ucp.confined` writes that way,
    so no link swapped in on the way can lead the write out of a checkpoint).

    Example::

        write_atomic("ckpt/replicas.json", b"{}")
    """
    path = os.fspath(path)
    parent, name = os.path.split(path)
    tmp = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    view = memoryview(data).cast("B")
    try:
        if not _write_unnamed(parent, tmp, view, durable, dir_fd):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666, dir_fd=dir_fd)
            try:
                _fill(fd, view, durable)
            finally:
                os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if durable and os.name != "nt":  # Windows cannot open a directory to fsync it
        fd = os.open(parent or ".", os.O_RDONLY, dir_fd=dir_fd)
        try:
            os.fsync(fd)
        except OSError as err:
            if err.errno not in _NO_DIR_FSYNC:
                raise
        finally:
            os.close(fd)


def _write_unnamed(parent: str, tmp: str, view: memoryview, durable: bool, dir_fd: int | None) -> bool:
    """Write into an ``O_TMPFILE`` and link it as ``tmp``; False (nothing written) where there is none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return False
    try:  # an O_TMPFILE is named through /proc without privileges (open(2)); no /proc, no O_TMPFILE
        proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        try:
            fd = os.open(parent or ".", flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666, dir_fd=dir_fd)
        except OSError as err:
            if err.errno in _NO_TMPFILE:
                return False
            raise
        try:
            _fill(fd, view, durable)
            # src_dir_fd makes Python call linkat(AT_SYMLINK_FOLLOW): link(2) would link the /proc entry itself.
            os.link(str(fd), tmp, src_dir_fd=proc, dst_dir_fd=dir_fd, follow_symlinks=True)
            return True
        finally:
            os.close(fd)
    finally:
        os.close(proc)


def _fill(fd: int, view: memoryview, durable: bool) -> None:
    write_all(fd, view)
    if durable:
        os.fsync(fd)
