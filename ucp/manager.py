"""CheckpointManager: a directory of ``step_NNNNNNNN`` checkpoints with save and retention policies.

The training loop calls :meth:`CheckpointManager.maybe_save` every step; the
save policy is asked every time (never cached), so an adaptive policy can move
the interval. After each commit the retention policy prunes old checkpoints on
rank 0, never the newest committed one and never a save still in progress
(only committed checkpoints are candidates). :meth:`restore` resumes from the
newest checkpoint that is complete and readable, including committed checkpoints
saved into the directory under other names (``ucp.save(state, "ckpt/step_100")``),
ordered by the step their manifest records; one whose step cannot be read is
refused, never passed over (a job must not silently start over). Retention
prunes only the manager's own ``step_NNNNNNNN`` checkpoints.

Example::

    state = {"model": model, "optim": opt, "step": 0}   # objects: captured at each save, restored in place
    manager = CheckpointManager("ckpt", save_policy=EveryNSteps(100), retention=KeepLast(3), async_save=True)
    start = (manager.restore(into=state) or 0) + 1
    for step in range(start, steps + 1):
        train_one_step(state)
        manager.maybe_save(step, state)
    manager.wait()
"""

from __future__ import annotations

import os
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ucp.errors import (
    ChecksumError,
    CheckpointNotFoundError,
    FormatError,
    IncompleteCheckpointError,
    InvalidArgumentError,
    ManifestError,
    RestoreError,
    RestoreFallbackWarning,
    TensorTooLargeError,
    TruncatedDataError,
    UcpError,
)
from ucp.commit import delete_checkpoint
from ucp.coordination import coordinator_for, default_process_group
from ucp.policies import EveryNSteps, KeepLast, RetentionPolicy, SavePolicy

__all__ = ["CheckpointManager", "SaveRecord", "step_dirname"]

_STEP_DIR = re.compile(r"^step_(\d{8,})$")
# What a damaged checkpoint raises while it loads: restore falls back past these, and raises
# anything else (the caller's mistakes; a checkpoint from a newer format, which needs an upgrade).
_DAMAGE = (
    ChecksumError,
    TruncatedDataError,
    IncompleteCheckpointError,
    ManifestError,
    CheckpointNotFoundError,
    TensorTooLargeError,
    FormatError,
    OSError,
)


def step_dirname(step: int) -> str:
    """``step_00000100`` for step 100 (zero-padded so names sort like steps)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidArgumentError(f"step must be a non-negative integer, got {step!r}")
    return f"step_{step:08d}"


@dataclass(frozen=True)
class SaveRecord:
    """Cost of one committed save, as seen by the training loop.

    ``blocking_seconds``: the loop was stopped this long; ``background_seconds``:
    the write went on this long after the loop resumed (0 for synchronous saves).
    """

    step: int
    path: str
    blocking_seconds: float
    background_seconds: float
    asynchronous: bool


class CheckpointManager:
    """Saves, prunes and restores the checkpoints of one training run under ``directory``.

    ``rank``/``world_size``/``process_group`` are passed to every save (for an
    async save, prefer a dedicated group: see :mod:`ucp.async_saver`); given none of
    them, with torch.distributed initialized, the group is the world, as for ``ucp.save``.
    ``staging_budget`` bounds the host memory of async saves (bytes).
    ``verify`` makes :meth:`latest`/:meth:`restore` check checksums of the
    candidate first (reads it whole). ``save_options`` go to every save
    (e.g. ``{"checksums": False}`` or a ``spec``); their ``storage_options`` and
    ``store_options`` also open ``directory`` (``s3://`` credentials, endpoints).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        save_policy: SavePolicy = EveryNSteps(1000),
        retention: RetentionPolicy = KeepLast(3),
        async_save: bool = False,
        process_group: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        staging_budget: int | None = None,
        verify: bool = False,
        save_options: dict[str, Any] | None = None,
        replicas: Any = None,
    ) -> None:
        if not callable(getattr(save_policy, "should_save", None)):
            raise InvalidArgumentError(f"save_policy {save_policy!r} has no should_save method")
        if not callable(getattr(retention, "keep", None)):
            raise InvalidArgumentError(f"retention {retention!r} has no keep method")
        from ucp.stores import open_store

        if process_group is None and rank is None and world_size is None:
            # As ucp.save: with torch.distributed initialized, the manager of every rank is one job's
            # manager (one retention, one agreed restore), not one per rank.
            process_group = default_process_group()
        if world_size not in (None, 1) and process_group is None:
            raise InvalidArgumentError(
                f"world_size={world_size} needs a process_group to commit each save across ranks; "
                "pass one (e.g. torch.distributed.new_group(backend='gloo'))"
            )
        self.directory = os.fspath(directory)
        self._save_options = dict(save_options or {})
        self._storage_options = self._save_options.get("storage_options")
        # Local directories and fsspec URLs alike (listing, reading manifests, deleting).
        self._store = open_store(
            self.directory, storage_options=self._storage_options, options=self._save_options.get("store_options")
        )
        self.save_policy = save_policy
        self.retention = retention
        self.verify = verify
        self.process_group = process_group
        # How the ranks agree on what to restore (a save makes its own, from the same options).
        self._coord = coordinator_for(process_group=process_group)
        self._rank = rank
        self._world_size = world_size
        self._saver = None
        if async_save:
            from ucp.async_saver import AsyncSaver

            self._saver = AsyncSaver(staging_budget=staging_budget)
        self._pending: list[tuple[int, Any]] = []  # (step, handle) of async saves not yet finalized
        self.replicas = replicas
        self._unreplicated: list[str] = []  # committed async saves, replicated at the next collective point
        self._records: list[SaveRecord] = []
        self._last_save = time.monotonic()

    # ------------------------------------------------------------------ facts
    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self.process_group)
        return 0

    @property
    def records(self) -> tuple[SaveRecord, ...]:
        """Costs of the saves committed so far, oldest first."""
        self._finalize(block=False)
        return tuple(self._records)

    def path_for(self, step: int) -> str:
        """Where step ``step`` is (or would be) saved: a local path or an fsspec URL."""
        return self._store.display(step_dirname(step))

    def steps(self) -> list[int]:
        """Steps of the committed checkpoints this manager named (``step_NNNNNNNN``), ascending.

        Saves in progress are not listed. Retention prunes only these; :meth:`checkpoints`
        lists every committed checkpoint in the directory.
        """
        from ucp.manifest import MANIFEST_NAME

        found = []
        for name in self._store.listdir():
            match = _STEP_DIR.match(name)
            if match and self._store.exists(name, MANIFEST_NAME):
                found.append(int(match.group(1)))
        return sorted(found)

    def checkpoints(self) -> list[tuple[int, str]]:
        """``(step, path)`` of every committed checkpoint in the directory, oldest first.

        A checkpoint under another name than ``step_NNNNNNNN`` (one saved with ``ucp.save``)
        counts at the step its manifest records (the first ``step``, ``global_step`` or
        ``iteration`` in its state); at equal steps the manager's own comes last (newest), then
        the most recently created. One whose step cannot be read is refused with a
        :class:`~ucp.errors.RestoreError`: resuming without it could silently start over.
        """
        from ucp.manifest import MANIFEST_NAME

        own = dict.fromkeys(self.steps(), True)
        found: list[tuple[int, bool, str, str]] = [(step, True, "", step_dirname(step)) for step in own]
        for name in self._store.listdir():
            if name.startswith(".") or _STEP_DIR.match(name) or not self._store.exists(name, MANIFEST_NAME):
                continue
            found.append(self._foreign(name))
        return [(step, self._store.display(name)) for step, _, _, name in sorted(found)]

    def _foreign(self, name: str) -> tuple[int, bool, str, str]:
        """(step, False, created, name) of a committed checkpoint this manager did not name."""
        from ucp.summary import describe

        where = self._store.display(name)
        try:
            summary = describe(where, storage_options=self._storage_options)
        except (UcpError, OSError) as err:
            raise RestoreError(
                f"{where} holds a checkpoint whose manifest cannot be read ({type(err).__name__}: {err}), so its "
                "step is unknown and it may be the newest; repair it or move it out of the directory"
            ) from err
        if summary.step is None:
            raise RestoreError(
                f"{where} is a committed checkpoint without a step in its state (no 'step', 'global_step' or "
                f"'iteration'), so the manager cannot order it; rename it step_NNNNNNNN "
                "(zero-padded), save a 'step' in its state, or move it out of the directory"
            )
        return summary.step, False, summary.created or "", name

    def latest(self, *, verify: bool | None = None) -> str | None:
        """The newest checkpoint that is complete and not corrupt, or ``None``.

        Skips directories without a manifest and ones whose manifest does not
        parse; with ``verify`` (default: the manager's) also checks every
        fragment's checksum with :func:`ucp.verify`.
        """
        found = self.latest_checkpoint(verify=verify)
        return None if found is None else found[1]

    def latest_step(self, *, verify: bool | None = None) -> int | None:
        """Step of :meth:`latest`; rank 0 decides and broadcasts when a process group is in use."""
        found = self.latest_checkpoint(verify=verify)
        return None if found is None else found[0]

    def latest_checkpoint(self, *, verify: bool | None = None) -> tuple[int, str] | None:
        """``(step, path)`` of :meth:`latest`; rank 0 decides and broadcasts when a process group is in use."""
        verify = self.verify if verify is None else verify
        return self._coord.broadcast(self._find_latest(verify) if self._coord.rank == 0 else None)

    # ----------------------------------------------------------------- saving
    def maybe_save(self, step: int, state: Any) -> str | None:
        """Save if the save policy says so at this step; return the checkpoint path or ``None``."""
        self._finalize(block=False)
        since = time.monotonic() - self._last_save
        if not self.save_policy.should_save(step=step, seconds_since_save=since):
            return None
        return self.save(step, state)

    def save(self, step: int, state: Any) -> str:
        """Save now, whatever the policy says. With ``async_save`` it returns after the snapshot."""
        path = self.path_for(step)
        options = dict(self._save_options)
        options.setdefault("process_group", self.process_group)
        # The manager owns its directory: a step saved again (after resuming from an older
        # checkpoint because this one was damaged) replaces the old one, atomically.
        options.setdefault("overwrite", True)
        if self._rank is not None:
            options.setdefault("rank", self._rank)
        if self._world_size is not None:
            options.setdefault("world_size", self._world_size)
        if self.rank == 0:
            self._store.makedirs()
        self._last_save = time.monotonic()
        if self._saver is not None:
            self._finalize(block=True)  # one save in flight: the previous one commits first
            self._replicate_committed()
            handle = self._saver.save(state, path, **options)
            self._pending.append((step, handle))
            return path
        import ucp

        started = time.perf_counter()
        ucp.save(state, path, **options)
        self._unreplicated.append(path)
        self._replicate_committed()
        self._records.append(SaveRecord(step, path, time.perf_counter() - started, 0.0, False))
        self._apply_retention()
        return path

    def wait(self) -> None:
        """Wait for an async save in flight; raise :class:`~ucp.errors.AsyncSaveError` if it failed."""
        self._finalize(block=True)
        self._replicate_committed()

    # ---------------------------------------------------------------- restore
    def restore(self, *, into: Any, **load_options: Any) -> int | None:
        """Load the newest good checkpoint into ``into`` in place; return its step (``None``: nothing to resume).

        Tensors are filled with ``copy_``; non-tensor values in dicts and lists
        of ``into`` (a step counter, a learning rate) are replaced by the saved ones, and
        objects with ``state_dict()`` (a model, a fresh optimizer) get theirs back as
        :func:`ucp.load` describes. Every committed checkpoint of the directory is a
        candidate (:meth:`checkpoints`). ``load_options`` are those of :func:`ucp.load`
        (``strict``, ``verify``, ``spec``...).

        A checkpoint that turns out damaged while it loads (a checksum mismatch, a missing
        or truncated file, a manifest that does not parse) is skipped with a
        :class:`~ucp.errors.RestoreFallbackWarning` naming it and why, and the next older
        one is loaded; with a process group every rank falls back together. Errors of the
        caller (``into`` does not match) are raised, not skipped.

        Example::

            step = manager.restore(into=state)
            start = 0 if step is None else step + 1
        """
        from ucp.api import load_recording

        self._finalize(block=True)
        for option in ("storage_options", "store_options"):
            if self._save_options.get(option) is not None:
                load_options.setdefault(option, self._save_options[option])
        self._replicate_committed()
        if self.rank == 0:
            self.sweep_stale_saves()
        if self.replicas is not None:  # lost or damaged arrays come back from peers before anything is read
            self.replicas.recover_all(self.directory, lost="warn")  # unrecoverable: the fallback below skips it
        skipped: list[tuple[str, set[str]]] = []  # (path, keys its failed load may have filled)
        for step, path in self._broadcast(self._listing() if self.rank == 0 else None):
            filled: set[str] = set()
            try:
                if self.verify and self.rank == 0 and not _verified(path, self._storage_options):
                    raise ChecksumError(f"{path} does not verify (ucp verify {path})")
                load_recording(path, into, filled=filled, **load_options)  # fills ``into`` in place
                error: Exception | None = None
            except _DAMAGE as err:
                error = err
            except Exception as err:  # the caller's error: every rank raises it
                self._agree(f"{type(err).__name__}: {err}", fatal=True)
                raise
            damage = self._agree(None if error is None else f"{type(error).__name__}: {error}")
            if damage is not None:
                warnings.warn(f"skipped {path}: {damage}", RestoreFallbackWarning, stacklevel=2)
                skipped.append((path, filled))
                continue
            tainted = self._agree(_tainted(skipped, filled, path))
            if tainted is not None:
                raise RestoreError(tainted)
            return step  # the load filled tensors in place, and the rest (step, lr, ...) too
        if skipped:
            raise RestoreError(
                f"no checkpoint under {self.directory} could be restored (every one is damaged: "
                f"{', '.join(p for p, _ in skipped)}); repair or remove them to start over"
            )
        return None

    def sweep_stale_saves(self) -> list[str]:
        """Recover checkpoints an interrupted overwrite moved aside, then delete what dead saves left; return the names deleted.

        A job killed mid-save leaves ``.step_NNNNNNNN.ucp-staging-*`` beside the
        checkpoints (never a checkpoint: it has no committed manifest). A kill between the
        two renames of an overwrite leaves the previous checkpoint in
        ``.step_NNNNNNNN.ucp-staging-old-*`` and no step directory: that one is renamed
        back (with a :class:`~ucp.errors.RestoreFallbackWarning`), never deleted.
        :meth:`restore` calls this on rank 0, when no save of this job can be in flight;
        saves still pending in this manager are never touched, and neither is a save that
        another live process is writing into the same directory (each staging directory
        names its owner: :mod:`ucp.stores.staging_owner`).
        """
        in_flight = {os.path.basename(os.fspath(handle.path).rstrip("/")) for _, handle in self._pending}
        removed, recovered = self._store.sweep(child=lambda name: _STEP_DIR.match(name) is not None, skip=in_flight)
        for final, source in recovered:
            warnings.warn(
                f"recovered {final} from {source}, where an interrupted overwrite had moved it",
                RestoreFallbackWarning,
                stacklevel=2,
            )
        return removed

    # -------------------------------------------------------------- internals
    def _replicate_committed(self) -> None:
        """Replicate the saves committed since the last call; every rank calls it at the same points."""
        paths, self._unreplicated = self._unreplicated, []
        for path in paths if self.replicas is not None else ():
            self.replicas.replicate(path)

    def _listing(self) -> list[tuple[int, str]] | str:
        """:meth:`checkpoints`, or why they cannot be listed (every rank raises it)."""
        try:
            return self.checkpoints()
        except RestoreError as err:
            return str(err)

    def _broadcast(self, found: list[tuple[int, str]] | str | None) -> list[tuple[int, str]]:
        """Rank 0's committed checkpoints, newest first, on every rank."""
        found = self._coord.broadcast(found)
        if isinstance(found, str):
            raise RestoreError(found)
        return list(reversed(found or []))

    def _agree(self, problem: str | None, *, fatal: bool = False) -> str | None:
        """The first rank's problem (or None) on every rank, so that all ranks take the same branch.

        ``fatal`` marks a rank that is about to raise: the others raise too, naming it.
        """
        seen = self._coord.agree(problem, fatal=fatal)
        if seen.fatal is not None and not fatal:
            raise RestoreError(f"restore failed on rank {seen.fatal.rank}: {seen.fatal.message}")
        first = seen.first
        if first is None or first.rank == self._coord.rank:
            return None if first is None else first.message
        return f"{first.message} (on rank {first.rank})"

    def _find_latest(self, verify: bool) -> tuple[int, str] | None:
        from ucp.commit import find_manifest, read_manifest

        for step, path in reversed(self.checkpoints()):
            try:
                read_manifest(
                    find_manifest(
                        path, storage_options=self._storage_options, options=self._save_options.get("store_options")
                    )
                )
                if verify and not _verified(path, self._storage_options):
                    continue
            except (UcpError, OSError):
                continue  # damaged or vanished: fall back to the next older checkpoint
            return step, path
        return None

    def _finalize(self, *, block: bool) -> None:
        """Record finished async saves and prune after each commit; raise their failures."""
        while self._pending:
            step, handle = self._pending[0]
            if not block and not handle.done():
                return
            self._pending.pop(0)
            assert self._saver is not None, "pending saves are async saves"
            try:
                self._saver.wait()  # raises the failure (once) through the saver
            finally:
                if handle.exception() is None:
                    self._unreplicated.append(str(handle.path))
                    self._records.append(
                        SaveRecord(
                            step, str(handle.path), handle.blocking_seconds, handle.background_seconds or 0.0, True
                        )
                    )
                    self._apply_retention()

    def _apply_retention(self) -> None:
        if self.rank != 0:
            return
        committed = self.steps()
        if not committed:
            return
        keep = set(self.retention.keep(committed)) | {committed[-1]}  # never the newest
        in_flight = {step for step, _ in self._pending}
        for step in committed:
            if step not in keep and step not in in_flight:
                try:  # unmade first (manifest or name), so a failure part-way never leaves a half checkpoint
                    delete_checkpoint(self._store.display(step_dirname(step)), storage_options=self._storage_options)
                except OSError:
                    pass  # removed by someone else, or not removable now: retried after the next commit


def _tainted(skipped: list[tuple[str, set[str]]], filled: set[str], path: str) -> str | None:
    """Why restoring ``path`` would leave tensors a failed newer load filled in part, or None."""
    for failed, touched in skipped:
        left = sorted(touched - filled)
        if left:
            shown = ", ".join(map(repr, left[:10])) + (" ..." if len(left) > 10 else "")
            return (
                f"cannot restore consistently: {failed} failed part-way and {path} does not hold {shown}, "
                "which the failed load may have filled in part; re-initialize those tensors and restore with "
                "strict=True, or repair the newer checkpoint"
            )
    return None


def _verified(path: str, storage_options: dict | None) -> bool:
    """Whether every fragment of the checkpoint is readable and matches its checksum."""
    import ucp

    return ucp.verify(path, storage_options=storage_options).ok
