"""Opening a checkpoint's local files safely: inside the checkpoint, regular, and read within bounds.

(And writing them: :func:`write_inside` never writes through a link that leads out of the checkpoint.)

A checkpoint directory may come from anyone. Every local file a reader opens
goes through :func:`open_inside`, which refuses (:class:`~ucp.errors.UnsafePathError`)

* a file that resolves outside the checkpoint root (a symlink such as
  ``data/r0/x -> /etc``), judged on the file actually opened, so a link swapped
  in between a check and the open cannot slip through;
* anything but a regular file: a FIFO would block a read forever, a device
  such as ``/dev/zero`` never ends, a directory has no bytes. The file is
  opened with ``O_NONBLOCK``, so opening a FIFO cannot hang either;

and :func:`read_inside` reads at most the number of bytes the caller expects,
refusing a larger file before reading it (an 8 GiB sparse file costs nothing)::

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> with open(os.path.join(root, "a"), "wb") as fh:
    ...     _ = fh.write(b"abc")
    >>> read_inside(root, "a", limit=10)
    (b'abc', 3)
    >>> os.symlink("/etc/passwd", os.path.join(root, "b"))
    >>> read_inside(root, "b", limit=10)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ucp.errors.UnsafePathError: .../b resolves to /etc/passwd, outside the checkpoint ...; refusing to read it - replace the link with the file itself
"""

from __future__ import annotations

import os
import stat

from ucp.errors import UnsafePathError

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
}


def real_root(root: str) -> str:
    """The resolved checkpoint root that files must stay inside (the root itself may be a link)."""
    return os.path.realpath(root)


def open_inside(root: str, rel: str, *, real: str | None = None, what: str | None = None) -> tuple[int, os.stat_result]:
    """Open ``root/rel`` read-only: ``(fd, stat)``; the caller closes ``fd``.

    ``real`` is :func:`real_root` of ``root`` when the caller has it already; ``what``
    (e.g. the tensor the file holds) starts refusals. Raises FileNotFoundError when there
    is no such file, UnsafePathError as above.
    """
    lead = f"{what}: " if what else ""
    path = os.path.join(root, rel)
    fd, info = _open_regular(path, lead, "the checkpoint is damaged (restore the file or load an older checkpoint)")
    try:
        _check_inside(fd, path, real if real is not None else real_root(root), lead)
        return fd, info
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | os.PathLike, *, limit: int, what: str = "the file") -> bytes:
    """A small file a user names (a report, a state file): regular, at most ``limit`` bytes, never blocking.

    The same refusals as for checkpoint files, without a root: a FIFO, a device or a
    directory, or a file larger than ``limit`` (``what`` names it in the message).
    """
    path = os.fspath(path)
    fd, info = _open_regular(path, "", f"give the path of {what}")
    with os.fdopen(fd, "rb", buffering=0) as fh:
        if info.st_size > limit:
            raise UnsafePathError(
                f"{path} holds {info.st_size} bytes, more than the {limit} that {what} may hold; refusing to read it"
            )
        return fh.read(limit + 1)[:limit]


def _open_regular(path: str, lead: str, advice: str) -> tuple[int, os.stat_result]:
    """Open read-only without blocking (O_NONBLOCK: a FIFO opens at once) and refuse all but regular files."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise UnsafePathError(f"{lead}{path} is {kind}, not a regular file; refusing to read it - {advice}")
        return fd, info
    except BaseException:
        os.close(fd)
        raise


def read_inside(
    root: str,
    rel: str,
    *,
    limit: int,
    start: int = 0,
    size_limit: int | None = None,
    real: str | None = None,
    what: str | None = None,
    allowed: str = "the manifest says it holds",
) -> tuple[bytes, int]:
    """Bytes ``[start, start + limit)`` of ``root/rel`` (fewer if the file is shorter), and the file's size.

    A file larger than ``size_limit`` is refused before anything is read (UnsafePathError
    saying it holds more than ``allowed``); ``what`` starts refusals as for :func:`open_inside`.
    """
    fd, info = open_inside(root, rel, real=real, what=what)
    try:
        if size_limit is not None and info.st_size > size_limit:
            raise UnsafePathError(
                f"{what + ': ' if what else ''}{os.path.join(root, rel)} holds {info.st_size} bytes, more than the "
                f"{size_limit} that {allowed}; refusing to read it - the checkpoint is damaged"
            )
        # Never ask for more than the file holds: os.pread allocates the whole request up front.
        want, parts, got = min(limit, max(0, info.st_size - start)), [], 0
        while got < want:  # one read returns at most ~2 GiB
            part = os.pread(fd, want - got, start + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return (parts[0] if len(parts) == 1 else b"".join(parts)), info.st_size
    finally:
        os.close(fd)


def read_exact_into(
    root: str, rel: str, view: memoryview, *, size: int, real: str | None = None, what: str | None = None
) -> tuple[int, int]:
    """Fill ``view`` from ``root/rel`` if the file holds exactly ``size`` bytes: ``(file size, bytes read)``.

    A file of any other size is not read at all (a chunk file is exactly its chunk's size).
    """
    from ucp.file_io import read_into

    fd, info = open_inside(root, rel, real=real, what=what)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        got = read_into(fh, view) if view.nbytes and info.st_size == size else 0
    return info.st_size, got


def read_range_into(
    root: str,
    rel: str,
    start: int,
    views: list[memoryview],
    *,
    real: str | None = None,
    what: str | None = None,
) -> tuple[int, int]:
    """Fill ``views`` (back to back) from the bytes of ``root/rel`` at ``start``: ``(file size, bytes read)``.

    A file too short to hold them all is not read at all (the caller reports it); one
    ``preadv`` fills several destinations, so adjacent ranges cost one read and no copy.
    """
    want = sum(v.nbytes for v in views)
    fd, info = open_inside(root, rel, real=real, what=what)
    try:
        if info.st_size < start + want:
            return info.st_size, 0
        got = 0
        views = [v for v in views if v.nbytes]
        while views:  # one read returns at most ~2 GiB
            n = os.preadv(fd, views[:512], start + got)  # below IOV_MAX (1024 on Linux)
            if not n:
                break
            got += n
            while views and n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            if views and n:
                views[0] = views[0][n:]
        return info.st_size, got
    finally:
        os.close(fd)


def relative_parts(rel: str, root: str, *, verb: str = "write") -> list[str]:
    """The names of a path a store may read or write: relative, no ``.`` or ``..`` segment.

    Anything else is an UnsafePathError naming ``root`` ("refusing to {verb} it").
    """
    parts = rel.replace(os.sep, "/").split("/")
    if rel.startswith(("/", os.sep)) or os.path.isabs(rel) or not parts[-1] or any(p in (".", "..") for p in parts):
        raise UnsafePathError(
            f"{rel!r} is not a relative path of plain names inside the checkpoint {root}; refusing to {verb} it"
        )
    return parts


def write_inside(root: str, rel: str, data: bytes | memoryview, *, real: str | None = None) -> None:
    """Write ``root/rel`` atomically (:func:`ucp.file_io.write_atomic`), making its directories, inside the root.

    Each directory on the way is opened and checked to be inside the (existing) root before
    anything is made in it or written to it, and the write goes through the opened directory:
    a directory that is a link out of the checkpoint (``data/r0 -> /home``) is refused
    (UnsafePathError) with nothing written or made outside, as is an absolute or ``..`` path.
    """
    from ucp.file_io import write_atomic

    parts = relative_parts(rel, root)
    real = real if real is not None else real_root(root)
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        for depth, part in enumerate(parts[:-1]):
            if not part:
                continue  # "a//b"
            try:
                os.mkdir(part, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0), dir_fd=fd)
            os.close(fd)
            fd = inner
            _check_inside(
                fd,
                os.path.join(root, *parts[: depth + 1]),
                real,
                "",
                refusal=("refusing to write into it - replace the link with a directory"),
            )
        write_atomic(parts[-1], data, dir_fd=fd)
    finally:
        os.close(fd)


def _check_inside(
    fd: int,
    path: str,
    real: str,
    lead: str,
    refusal: str = "refusing to read it - replace the link with the file itself",
) -> None:
    try:  # the path of the file actually opened (Linux); elsewhere the path resolved now
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        opened = os.path.realpath(path)
    if opened != real and not opened.startswith(real.rstrip(os.sep) + os.sep):
        raise UnsafePathError(f"{lead}{path} resolves to {opened}, outside the checkpoint {real}; {refusal}")
