"""Saves made without a process group: each rank writes a part, :func:`finalize` commits them all.

Every rank calls ``ucp.save(state, path, rank=r, world_size=N)`` (or closes a
:class:`~ucp.writer.CheckpointWriter` with ``rank``/``world_size``) and writes its
fragments plus ``parts/rank-NNNNN.json`` into the shared staging area; once all N parts are
there, one process calls :func:`finalize`. A rank that fails leaves a part that says why
(:func:`record_failure`), so finalize reports the cause instead of a missing part.

Example::

    # on every rank:  ucp.save(state, "ckpt/5", rank=r, world_size=4)
    # then, once:     ucp.finalize("ckpt/5", world_size=4)
"""

from __future__ import annotations

from ucp.commit import SHARED_TOKEN, commit, existing, open_target, read_parts, write_part
from ucp.errors import InvalidArgumentError
from ucp.parts import merge_parts, new_part
from ucp.coordination import utc_now
from ucp.writer import SaveResult

__all__ = ["finalize", "record_failure"]


def record_failure(
    path: str, *, rank: int, world_size: int, error: BaseException, storage_options: dict | None = None
) -> None:
    """Leave a part that says why rank ``rank`` failed, so :func:`finalize` reports the cause (no process group)."""
    part = new_part(rank=rank, world_size=world_size, checksum_algorithm=None)
    part["error"] = f"{type(error).__name__}: {error}"
    try:
        target = open_target(path, token=SHARED_TOKEN, storage_options=storage_options)
        if existing(target.final) != "checkpoint":
            write_part(target, rank, part)
    except OSError:
        pass  # the rank's own error is raised anyway; finalize then reports the part as missing


def finalize(path: str, *, world_size: int, storage_options: dict | None = None) -> SaveResult:
    """Commit a checkpoint whose ``world_size`` ranks each closed a writer without a process group.

    Example::

        # on every rank:  ucp.save(state, "ckpt/5", rank=r, world_size=4)
        # then, once:     ucp.finalize("ckpt/5", world_size=4)
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgumentError(
            f"world_size must be a positive integer (the number of ranks that saved), got {world_size!r}"
        )
    target = open_target(path, token=SHARED_TOKEN, storage_options=storage_options)
    parts = read_parts(target, world_size)
    target.overwrite = all(part["overwrite"] for part in parts)  # as the ranks were told
    manifest = merge_parts(parts, created=utc_now())
    commit(target, manifest)
    return SaveResult(
        str(path), 0, world_size, True, sum(len(t.fragments) for t in manifest.tensors.values()), 0, manifest
    )
