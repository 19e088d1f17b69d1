"""Atomic output for writers of foreign formats: write aside, then rename into place.

A writer writes into a staging path next to the destination
(``.<name>.ucp-staging-<token>``, a file or a directory) and :meth:`StagedOutput.commit`
renames it onto the destination, so a crash or an error at any instant leaves
the destination as it was (absent, or the previous checkpoint when overwriting).

>>> import os, tempfile
>>> dst = os.path.join(tempfile.mkdtemp(), "out.bin")
>>> out = StagedOutput(dst, directory=False)
>>> with open(out.staging, "wb") as fh:
...     _ = fh.write(b"x")
>>> os.path.exists(dst)
False
>>> out.commit(); os.path.exists(dst)
True
"""

from __future__ import annotations

import os
import shutil
import uuid

from ucp.errors import CheckpointExistsError, FormatError

__all__ = ["StagedOutput", "check_destination"]


def check_destination(path: str, *, overwrite: bool) -> str:
    """The local destination path, refused when it exists (unless ``overwrite``) or is remote."""
    path = os.fspath(path)
    if "://" in path and not path.startswith("file://"):
        raise FormatError(f"{path}: this format is written to local paths only; write it locally, then copy it")
    path = path.removeprefix("file://").rstrip("/") or "/"
    if os.path.lexists(path) and not overwrite:
        raise CheckpointExistsError(
            f"{path} already exists; choose another destination or pass overwrite=True (--overwrite)"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FormatError(f"{path}: the parent directory {parent} does not exist")
    return path


class StagedOutput:
    """A destination written through a staging path next to it (see the module doc)."""

    def __init__(self, path: str, *, directory: bool, overwrite: bool = False) -> None:
        self.path = check_destination(path, overwrite=overwrite)
        head, name = os.path.split(os.path.abspath(self.path))
        self.staging = os.path.join(head, f".{name}.ucp-staging-{uuid.uuid4().hex[:12]}")
        self._directory = directory
        self._done = False
        if directory:
            os.mkdir(self.staging)

    def join(self, *parts: str) -> str:
        """A path inside the staging directory."""
        return os.path.join(self.staging, *parts)

    def commit(self) -> None:
        """Make the staged output the destination (replacing an old one only after the new one is whole)."""
        if self._done:
            return
        _fsync_tree(self.staging)
        old = None
        if os.path.lexists(self.path):
            old = f"{self.staging}-old"
            os.rename(self.path, old)
        os.rename(self.staging, self.path)
        _fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._done = True
        if old is not None:
            _remove(old)

    def abort(self) -> None:
        """Throw the staged output away; the destination is untouched."""
        if not self._done:
            self._done = True
            _remove(self.staging)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fsync_tree(path: str) -> None:
    if os.path.isdir(path):
        for name in os.listdir(path):
            _fsync_tree(os.path.join(path, name))
        _fsync_dir(path)
    elif os.path.exists(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
