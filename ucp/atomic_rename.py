"""Rename a directory onto a path only if nothing is there: the commit's guard against a concurrent commit.

A plain ``rename(2)`` of a directory silently replaces an empty directory at the
target, and the check-then-rename a caller might write around it races with
another process doing the same. Linux's ``renameat2(RENAME_NOREPLACE)`` makes
"fail if the target exists" part of the rename itself (ext4, xfs, btrfs, tmpfs,
overlayfs...). Where it is missing (another OS, an old kernel, a file system
such as NFS that answers ``EINVAL``), the check and the rename run under an
exclusive ``flock`` on a lock file beside the target, which every ucp commit of
that path takes: as safe against other ucp processes, not against other
programs. The lock file (``.<name>.ucp-commit-lock``) is left in place: removing
a lock file others may hold open would let two of them lock different files.

Example::

    rename_noreplace("ckpt/.step_5.ucp-staging-1a2b", "ckpt/step_5")  # FileExistsError if step_5 exists
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

__all__ = ["rename_noreplace", "lock_path"]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
# Answers meaning "this kernel or file system cannot do it", not "the target exists".
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def lock_path(dst: str) -> str:
    """The lock file the fallback takes for commits to ``dst``."""
    parent, name = os.path.split(os.path.normpath(dst))
    return os.path.join(parent, f".{name}.ucp-commit-lock")


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; ``FileExistsError`` (nothing renamed) if ``dst`` exists, even as an empty dir."""
    if _renameat2(src, dst):
        return
    _locked_rename(src, dst)


def _renameat2(src: str, dst: str) -> bool:
    """True once renamed; False when the system cannot rename without replacing (use the fallback)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):  # no libc symbol (glibc < 2.28, musl without it)
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise (
        OSError(code, os.strerror(code), dst)
        if code != errno.EEXIST
        else FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    )


def _locked_rename(src: str, dst: str) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: its rename never replaces an existing target
        os.rename(src, dst)
        return
    fd = os.open(lock_path(dst), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        os.rename(src, dst)
    finally:
        os.close(fd)  # releases the lock
