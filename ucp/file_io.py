"""Small primitives of plain-file I/O that the storage layer builds on.

Whole writes and reads of a buffer (a single ``write``/``read`` may move less
than asked, and at most ~2 GiB), fsync of a path, the one way ucp replaces a
file atomically (:func:`write_atomic`), writes that bypass the page cache
(:func:`write_hashed`, :class:`BounceBuffers`), digests of arrays, and a future that is
already done::

    >>> import io
    >>> view = memoryview(bytearray(3))
    >>> read_into(io.BytesIO(b"abcdef"), view), bytes(view)
    (3, b'abc')
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
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


# -- writes that bypass the page cache -------------------------------------------------------
# O_DIRECT moves bytes from user memory to the device without the kernel's copy into the page
# cache (measured: half the CPU of a buffered write of 1 GiB on ext4 over virtio, docs/BENCHMARKS.md).
# Offsets, lengths and buffer addresses must be multiples of the device's block; this covers
# 512-byte and 4 KiB blocks, and being at least a page keeps O_DIRECT ranges and the buffered
# edges of a write on different pages of the cache (their bytes never share a page).
DIRECT_ALIGN = max(4096, mmap.PAGESIZE)

# statfs(2) f_type of file systems whose files are memory: there is no device to write to directly.
_MEMORY_FS = {0x01021994, 0x858458F6, 0x958458F6}  # tmpfs, ramfs, hugetlbfs


def on_memory_fs(path: str) -> bool:
    """Whether ``path`` (an existing directory or file) lives on tmpfs/ramfs; False where unknown."""
    if not os.uname().sysname == "Linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
        if libc.statfs(os.fsencode(path), buf) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return ctypes.c_long.from_buffer(buf).value in _MEMORY_FS  # f_type is the first field (a long)


def open_direct(path: str) -> int | None:
    """A second, ``O_DIRECT`` write descriptor of the existing file ``path``; None where there is none.

    None on systems without ``O_DIRECT`` and where the file system refuses it (``EINVAL``).
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise


class BounceBuffers:
    """A few page-aligned buffers of ``nbytes`` (a multiple of :data:`DIRECT_ALIGN`), one per
    thread writing at a time; made on first use and reused, since fresh pages cost a fault each."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = -(-nbytes // DIRECT_ALIGN) * DIRECT_ALIGN
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self) -> Any:
        """One buffer (a writable memoryview) for the duration of the block."""
        with self._lock:
            buf = self._free.pop() if self._free else mmap.mmap(-1, self.nbytes)  # anonymous maps are page-aligned
        try:
            yield memoryview(buf)
        finally:
            with self._lock:
                self._free.append(buf)

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for buf in free:
            with contextlib.suppress(BufferError):  # a view of it still alive: the map goes with it
                buf.close()


def write_hashed(
    fd: int,
    offset: int,
    view: memoryview,
    *,
    digest: Any = None,
    piece_bytes: int = 1 << 20,
    direct_fd: int | None = None,
    bounce: BounceBuffers | None = None,
) -> bool:
    """Write ``view`` at ``offset`` of ``fd``, each piece fed to ``digest.update`` right before it is written.

    With ``direct_fd`` (:func:`open_direct` of the same file) and ``bounce``, the whole aligned
    blocks go through ``direct_fd``: each piece is copied into a page-aligned bounce buffer,
    hashed there (from cache) and written from it, bypassing the page cache; the unaligned edges
    go through ``fd``. A file system that refuses an ``O_DIRECT`` write (``EINVAL``) gets the
    same bytes through ``fd`` instead. Returns False once ``O_DIRECT`` was refused (the caller
    stops trying it), else True. The file is not made durable here: fsync it once afterwards.
    """
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    end = offset + view.nbytes
    first = min(end, -(-offset // DIRECT_ALIGN) * DIRECT_ALIGN)
    last = max(first, end // DIRECT_ALIGN * DIRECT_ALIGN)
    if direct_fd is None or bounce is None or last == first:
        _pwrite_hashed(fd, offset, view, digest, piece_bytes)
        return True
    _pwrite_hashed(fd, offset, view[: first - offset], digest, piece_bytes)
    accepted = True
    with bounce.take() as buf:
        at = first
        while at < last:
            n = min(bounce.nbytes, last - at)
            piece = buf[:n]
            piece[:] = view[at - offset : at - offset + n]
            if digest is not None:
                digest.update(piece)  # from the bounce buffer, in cache right after the copy
            try:
                written = os.pwrite(direct_fd, piece, at)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                accepted, written = False, 0
            if written < n:  # refused, or a short direct write: the rest of the piece, buffered
                _pwrite_all(fd, piece[written:], at + written)
            at += n
            if not accepted:
                break
    _pwrite_hashed(fd, at, view[at - offset :], digest, piece_bytes)
    return accepted


def _pwrite_hashed(fd: int, offset: int, view: memoryview, digest: Any, piece_bytes: int) -> None:
    for start in range(0, view.nbytes, piece_bytes):
        piece = view[start : start + piece_bytes]
        if digest is not None:
            digest.update(piece)  # right before the write: the write then reads it from cache
        _pwrite_all(fd, piece, offset + start)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
