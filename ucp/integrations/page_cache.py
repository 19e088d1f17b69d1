"""Dropping a checkpoint's files from the page cache, so the next read comes from the disk.

Benchmarks of a restart must read the checkpoint cold, as a replacement node would; it was
just written, so its pages are still cached. ``echo 3 > /proc/sys/vm/drop_caches`` needs
privileges a container seldom has; :func:`evict` instead flushes each file of the
checkpoint and tells the kernel its pages are not needed (``POSIX_FADV_DONTNEED``), which
drops the clean cached pages of exactly those files. :func:`cached_fraction` measures the
result (``fincore``, where util-linux has it).

    evict("ckpt/step_00000003")
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["evict", "cached_fraction"]


def _files(path: str):
    if os.path.isfile(path):
        yield path
        return
    for root, _, names in os.walk(path):
        for name in names:
            yield os.path.join(root, name)


def evict(path: str | os.PathLike) -> int:
    """Flush and drop from the page cache every file under ``path``; returns the bytes concerned."""
    total = 0
    for file in _files(os.fspath(path)):
        try:
            fd = os.open(file, os.O_RDONLY)
        except FileNotFoundError:  # a temporary file renamed or removed meanwhile
            continue
        try:
            os.fsync(fd)  # dirty pages cannot be dropped: write them back first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def cached_fraction(path: str | os.PathLike) -> float | None:
    """The fraction of the bytes under ``path`` in the page cache (None without ``fincore``)."""
    tool = shutil.which("fincore")
    files = list(_files(os.fspath(path)))
    if tool is None or not files:
        return None
    out = subprocess.run([tool, "--bytes", "--noheadings", "--output", "RES,SIZE", *files],
                         capture_output=True, text=True, check=True).stdout
    resident = size = 0
    for line in out.splitlines():
        res, sz = line.split()
        resident, size = resident + int(res), size + int(sz)
    return resident / size if size else 0.0
