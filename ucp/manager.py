"""CheckpointManager: a directory of ``step_NNNNNNNN`` checkpoints with save and retention policies.

The training loop calls :meth:`CheckpointManager.maybe_save` every step; the
save policy is asked every time (never cached), so an adaptive policy can move
the interval. After each commit the retention policy prunes old checkpoints on
rank 0, never the newest committed one and never a save still in progress
(only committed checkpoints are candidates). :meth:`restore` resumes from the
newest checkpoint that is complete and readable.

Example::

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
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ucp.errors import UcpError
from ucp.policies import EveryNSteps, KeepLast, RetentionPolicy, SavePolicy

__all__ = ["CheckpointManager", "SaveRecord", "step_dirname"]

_STEP_DIR = re.compile(r"^step_(\d{8,})$")
# What a save killed before its commit leaves behind (ucp.commit.staging_path of a step directory).
_STALE_STAGING = re.compile(r"^\.step_\d{8,}\.ucp-staging-.+$")


def step_dirname(step: int) -> str:
    """``step_00000100`` for step 100 (zero-padded so names sort like steps)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
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
    async save, prefer a dedicated group: see :mod:`ucp.async_save`).
    ``staging_budget`` bounds the host memory of async saves (bytes).
    ``verify`` makes :meth:`latest`/:meth:`restore` check checksums of the
    candidate first (reads it whole). ``save_options`` go to every save
    (e.g. ``{"checksums": False}`` or a ``spec``).
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
    ) -> None:
        if not callable(getattr(save_policy, "should_save", None)):
            raise TypeError(f"save_policy {save_policy!r} has no should_save method")
        if not callable(getattr(retention, "keep", None)):
            raise TypeError(f"retention {retention!r} has no keep method")
        from ucp.storage import Storage

        if world_size not in (None, 1) and process_group is None:
            raise ValueError(
                f"world_size={world_size} needs a process_group to commit each save across ranks; "
                "pass one (e.g. torch.distributed.new_group(backend='gloo'))"
            )
        self.directory = os.fspath(directory)
        # Local directories and fsspec URLs alike (listing, reading manifests, deleting).
        self._store = Storage(self.directory)
        self.save_policy = save_policy
        self.retention = retention
        self.verify = verify
        self.process_group = process_group
        self._rank = rank
        self._world_size = world_size
        self._save_options = dict(save_options or {})
        self._saver = None
        if async_save:
            from ucp.async_save import AsyncSaver

            self._saver = AsyncSaver(staging_budget=staging_budget)
        self._pending: list[tuple[int, Any]] = []  # (step, handle) of async saves not yet finalized
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
        """Committed steps (a manifest exists), ascending. Saves in progress are not listed."""
        from ucp.manifest import MANIFEST_NAME

        found = []
        for name in self._store.listdir():
            match = _STEP_DIR.match(name)
            if match and self._store.exists(name, MANIFEST_NAME):
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self, *, verify: bool | None = None) -> str | None:
        """The newest checkpoint that is complete and not corrupt, or ``None``.

        Skips directories without a manifest and ones whose manifest does not
        parse; with ``verify`` (default: the manager's) also checks every
        fragment's checksum with :func:`ucp.verify`.
        """
        step = self.latest_step(verify=verify)
        return None if step is None else self.path_for(step)

    def latest_step(self, *, verify: bool | None = None) -> int | None:
        """Step of :meth:`latest`; rank 0 decides and broadcasts when a process group is in use."""
        verify = self.verify if verify is None else verify
        step = self._find_latest(verify) if self.rank == 0 or not self._distributed() else None
        if self._distributed():
            import torch.distributed as dist

            box = [step]
            dist.broadcast_object_list(box, src=dist.get_global_rank(self.process_group, 0)
                                       if self.process_group is not None else 0, group=self.process_group)
            step = box[0]
        return step

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
        if self.rank == 0 and self._store.local:
            os.makedirs(self.directory, exist_ok=True)
        self._last_save = time.monotonic()
        if self._saver is not None:
            self._finalize(block=True)  # one save in flight: the previous one commits first
            handle = self._saver.save(state, path, **options)
            self._pending.append((step, handle))
            return path
        import ucp

        started = time.perf_counter()
        ucp.save(state, path, **options)
        self._records.append(SaveRecord(step, path, time.perf_counter() - started, 0.0, False))
        self._apply_retention()
        return path

    def wait(self) -> None:
        """Wait for an async save in flight; raise :class:`~ucp.errors.AsyncSaveError` if it failed."""
        self._finalize(block=True)

    # ---------------------------------------------------------------- restore
    def restore(self, *, into: Any, **load_options: Any) -> int | None:
        """Load the newest good checkpoint into ``into`` in place; return its step (``None``: nothing to resume).

        Tensors are filled with ``copy_``; non-tensor values in dicts and lists
        of ``into`` (a step counter, a learning rate) are replaced by the saved ones.
        ``load_options`` are those of :func:`ucp.load` (``strict``, ``verify``, ``spec``...).

        Example::

            step = manager.restore(into=state)
            start = 0 if step is None else step + 1
        """
        import ucp

        self._finalize(block=True)
        if self.rank == 0:
            self.sweep_stale_saves()
        step = self.latest_step()
        if step is None:
            return None
        loaded = ucp.load(self.path_for(step), into=into, **load_options)
        _merge_in_place(into, loaded)  # tensors were filled in place; the rest (step, lr, ...) too
        return step

    def sweep_stale_saves(self) -> list[str]:
        """Delete the staging directories of saves that died before committing; return their names.

        A job killed mid-save leaves ``.step_NNNNNNNN.ucp-staging-*`` beside the
        checkpoints (never a checkpoint: it has no committed manifest). :meth:`restore`
        calls this on rank 0, when no save of this job can be in flight; saves
        still pending in this manager are never touched.
        """
        if not self._store.local or not os.path.isdir(self.directory):
            return []  # other stores commit by manifest marker: no staging directories
        in_flight = {os.path.basename(os.fspath(handle.path).rstrip("/")) for _, handle in self._pending}
        removed = []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if _STALE_STAGING.match(name) and os.path.isdir(path) and not any(
                name.startswith(f".{step_dir}.") for step_dir in in_flight
            ):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
        return removed

    # -------------------------------------------------------------- internals
    def _distributed(self) -> bool:
        import torch.distributed as dist

        return (
            self._world_size not in (None, 1) or self.process_group is not None
        ) and dist.is_available() and dist.is_initialized()

    def _find_latest(self, verify: bool) -> int | None:
        from ucp.manifest import MANIFEST_NAME, Manifest

        for step in reversed(self.steps()):
            path = self.path_for(step)
            try:
                name = step_dirname(step)
                Manifest.from_json(self._store.read_bytes(name, MANIFEST_NAME),
                                   source=self._store.display(name, MANIFEST_NAME))
                if verify and not _verified(path):
                    continue
            except (UcpError, OSError):
                continue  # damaged or vanished: fall back to the next older checkpoint
            return step
        return None

    def _finalize(self, *, block: bool) -> None:
        """Record finished async saves and prune after each commit; raise their failures."""
        while self._pending:
            step, handle = self._pending[0]
            if not block and not handle.done():
                return
            self._pending.pop(0)
            try:
                self._saver.wait()  # raises the failure (once) through the saver
            finally:
                if handle.exception() is None:
                    self._records.append(
                        SaveRecord(step, str(handle.path), handle.blocking_seconds,
                                   handle.background_seconds or 0.0, True)
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
                try:
                    self._store.remove(step_dirname(step))
                except OSError:
                    pass  # removed by someone else, or not removable now: retried after the next commit


def _verified(path: str) -> bool:
    """Whether every fragment of the checkpoint is readable and matches its checksum."""
    import ucp

    return ucp.verify(path).ok


def _merge_in_place(into: Any, loaded: Any) -> None:
    """Copy the non-tensor values of ``loaded`` into the containers of ``into``."""
    import torch

    if isinstance(into, dict) and isinstance(loaded, dict):
        for key, value in loaded.items():
            current = into.get(key)
            if isinstance(current, (dict, list)) and isinstance(value, type(current)):
                _merge_in_place(current, value)
            elif not isinstance(current, torch.Tensor):
                into[key] = value
    elif isinstance(into, list) and isinstance(loaded, list) and len(into) == len(loaded):
        for i, value in enumerate(loaded):
            current = into[i]
            if isinstance(current, (dict, list)) and isinstance(value, type(current)):
                _merge_in_place(current, value)
            elif not isinstance(current, torch.Tensor):
                into[i] = value
