"""Who is writing into a staging directory, so that a sweep deletes only dead saves' leftovers.

A save writes ``.<name>.ucp-staging-<token>`` before its commit. A restore sweeps such
directories, but one of them may belong to a save that is *still running* in another
process (another job, or a second manager, saving into the same directory). Each process
that prepares a staging directory therefore leaves an owner marker in it
(``.ucp-owner.<random>``: host, pid and the process's start time); the commit removes the
markers before the rename, so a checkpoint never carries one.

:func:`owner_state` decides from the markers:

* ``"alive"``: some owner runs on this host (same pid *and* same start time, so a reused
  pid does not count) — never deleted;
* ``"foreign"``: some owner is on another host, which this process cannot check — kept
  until the directory has not changed for ``foreign_stale_after_s``;
* ``"dead"``: every owner is on this host and gone, or there is no marker (a save from
  a version without markers; an *empty* unmarked directory younger than
  ``_UNMARKED_GRACE_S`` is kept, since a save writes its marker right after creating it)
  — safe to delete.

    write_marker("/ckpt/.step_5.ucp-staging-1a2b")
    owner_state("/ckpt/.step_5.ucp-staging-1a2b")    # "alive" while this process runs
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

__all__ = ["MARKER_PREFIX", "write_marker", "remove_markers", "owner_state", "FOREIGN_STALE_AFTER_S"]

MARKER_PREFIX = ".ucp-owner."
_MARKER_LIMIT = 4096  # bytes: a marker is one small JSON object; anything larger is not ours
FOREIGN_STALE_AFTER_S = 24 * 3600.0  # a save on another host untouched this long is taken as dead
_UNMARKED_GRACE_S = 2.0  # a directory without a marker younger than this may be a save about to write one


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ")".
    fields = raw.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _me() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _start_time(pid)}


def write_marker(staging: str) -> str:
    """Mark ``staging`` as written by this process; returns the marker's path."""
    path = os.path.join(staging, f"{MARKER_PREFIX}{uuid.uuid4().hex[:12]}")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_me(), f)
    return path


def remove_markers(staging: str) -> None:
    """Delete every owner marker in ``staging`` (right before its commit)."""
    for entry in os.listdir(staging):
        if entry.startswith(MARKER_PREFIX):
            try:
                os.unlink(os.path.join(staging, entry))
            except FileNotFoundError:
                pass


def _owners(staging: str) -> list[dict | None]:
    """The markers' contents; None for a marker that cannot be read (counted as foreign)."""
    owners: list[dict | None] = []
    try:
        entries = os.listdir(staging)
    except OSError:
        return owners
    for entry in entries:
        if not entry.startswith(MARKER_PREFIX):
            continue
        try:
            with open(os.path.join(staging, entry), "rb") as f:
                value = json.loads(f.read(_MARKER_LIMIT + 1)[:_MARKER_LIMIT])
            ok = isinstance(value, dict) and isinstance(value.get("host"), str) and isinstance(value.get("pid"), int)
            owners.append(value if ok else None)
        except (OSError, ValueError):
            owners.append(None)
    return owners


def _runs_here(owner: dict) -> bool:
    pid = owner["pid"]
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    started = _start_time(pid)
    return started is None or owner.get("start") is None or started == owner.get("start")


def _newest_change(staging: str) -> float:
    """The newest mtime of the directory and its direct entries (a running save keeps adding files)."""
    newest = os.stat(staging).st_mtime
    with os.scandir(staging) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except OSError:
                pass
    return newest


def owner_state(staging: str, *, foreign_stale_after_s: float = FOREIGN_STALE_AFTER_S) -> str:
    """``"alive"``, ``"foreign"`` or ``"dead"`` (see the module's docstring)."""
    host = socket.gethostname()
    owners = _owners(staging)
    if any(o is not None and o["host"] == host and _runs_here(o) for o in owners):
        return "alive"
    foreign = any(o is None or o["host"] != host for o in owners)
    try:
        if foreign:
            return "foreign" if time.time() - _newest_change(staging) < foreign_stale_after_s else "dead"
        if not owners and not os.listdir(staging):
            # A save writes its marker right after creating the directory, before any data:
            # only an empty, unmarked directory can be a save in between.
            return "foreign" if time.time() - os.stat(staging).st_mtime < _UNMARKED_GRACE_S else "dead"
    except OSError:
        return "dead"  # it went away meanwhile
    return "dead"
