"""Who opens, commits and aborts a save, and how ranks agree: one protocol, three implementations.

A save is written by every rank alone (its own fragments, no tensor bytes between ranks);
only the start (a staging area), the end (one manifest, committed once) and the agreement
on failures involve more than one rank. :class:`SaveCoordinator` is that part, so the writer
(:class:`~ucp.writer.CheckpointWriter`) and the manager carry no branches on how ranks meet:

* :class:`SingleProcess` - one rank: it commits its own part;
* :class:`SharedStaging` - ranks without a process group (``rank``/``world_size``): each
  writes a part into a shared staging area and :func:`ucp.shared_save.finalize` commits;
* :class:`ProcessGroup` - a ``torch.distributed`` group: ``close`` is collective; group rank 0
  opens the staging area, gathers metadata (never tensor bytes), checks and commits it, sharded
  over group leaders from ``StoreOptions.metadata_shard_min_ranks`` ranks on (:mod:`ucp.metadata_shards`).

:func:`coordinator_for` picks one::

    >>> coordinator_for(rank=0, world_size=1)
    SingleProcess(rank=0, world_size=1)
    >>> coordinator_for(rank=2, world_size=4)
    SharedStaging(rank=2, world_size=4)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ucp import checksum as _checksum
from ucp.agreement import Agreement, Failure, agree
from ucp.commit import (
    PARTS_DIR,
    SHARED_TOKEN,
    SaveTarget,
    abort as _abort,
    begin_save,
    commit,
    existing,
    new_token,
    open_target,
    write_part,
)
from ucp.dtypes import host_array
from ucp.errors import CheckpointExistsError, LayoutError, UcpError
from ucp.geometry import Region, region_to_dict
from ucp.manifest import Manifest
from ucp.metadata_shards import GroupPlan, root_manifest, write_group_shard
from ucp.parts import merge_parts
from ucp.save_checks import check_average
from ucp.spec import TensorSpec
from ucp.stores import StoreOptions
from ucp.write_units import average_replicas

__all__ = ["ProcessGroup", "SaveCoordinator", "SharedStaging", "SingleProcess", "coordinator_for", "utc_now"]


def utc_now() -> str:
    """The commit time a manifest records (ISO 8601, UTC, seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class SaveCoordinator(Protocol):
    """How the ranks of one save meet. ``part`` is this rank's metadata (:func:`ucp.parts.new_part`)."""

    @property
    def rank(self) -> int: ...  # read-only: the coordinators are frozen values
    @property
    def world_size(self) -> int: ...

    def begin(self, path: str, *, overwrite: bool, storage_options: dict | None, options: StoreOptions) -> SaveTarget:
        """Open the staging area this rank writes into (collective with a process group)."""

    def check_spec(self, key: str, tspec: TensorSpec) -> None:
        """Refuse a tensor's map this coordinator cannot carry out (before anything is written)."""

    def reconcile(
        self, data: torch.Tensor, logical: str, target: Region, tspec: TensorSpec, part: dict
    ) -> torch.Tensor:
        """The data one replica writes of a replicated piece: averaged, or its digest recorded for a check."""

    def close(self, target: SaveTarget, part: dict, *, failure: Exception | None) -> tuple[bool, Manifest | None]:
        """Commit (or hand over) this rank's part: (committed, the manifest where this rank holds it).

        ``failure``: this rank's writes failed; the save is aborted and the failure raised.
        """

    def abort(self, target: SaveTarget, part: dict, reason: str) -> None:
        """Throw the save away, saying why (collective with a process group: it meets the others' ``close``)."""

    def broadcast(self, value: Any) -> Any:
        """Group rank 0's ``value`` on every rank."""

    def agree(self, problem: str | None, *, fatal: bool = False) -> Agreement:
        """The first rank's problem and the first fatal one, on every rank (:func:`ucp.agreement.agree`)."""


def default_process_group() -> Any:
    """The world group when torch.distributed is initialized with more than one rank, else None.

    A save given neither ``process_group`` nor ``rank``/``world_size`` is a save of every rank
    of the job, as with ``torch.distributed.checkpoint``: without it each rank would commit its
    own shards alone. A save that only this rank makes passes ``world_size=1``.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def coordinator_for(*, process_group: Any = None, rank: int = 0, world_size: int = 1) -> SaveCoordinator:
    """The coordinator of a save by ``process_group``, or by rank ``rank`` of ``world_size`` without one."""
    if process_group is not None:
        return ProcessGroup(process_group)
    if not 0 <= rank < world_size:
        raise LayoutError(f"rank {rank} must be in [0, world_size={world_size})")
    return SharedStaging(rank, world_size) if world_size > 1 else SingleProcess(rank, world_size)


def _cleanup(target: SaveTarget) -> None:
    try:
        _abort(target)
    except OSError:
        pass


@dataclass(frozen=True)
class _Alone:
    """What every coordinator without a process group does alike: no collectives."""

    rank: int = 0
    world_size: int = 1

    def check_spec(self, key: str, tspec: TensorSpec) -> None:
        return None

    def reconcile(
        self, data: torch.Tensor, logical: str, target: Region, tspec: TensorSpec, part: dict
    ) -> torch.Tensor:
        return data  # replicas cannot be compared or averaged without a group: each writes its own share

    def broadcast(self, value: Any) -> Any:
        return value

    def agree(self, problem: str | None, *, fatal: bool = False) -> Agreement:
        mine = Failure(self.rank, problem)
        return Agreement(mine if problem else None, mine if fatal else None)


@dataclass(frozen=True)
class SingleProcess(_Alone):
    """One rank saves alone and commits its own part."""

    def begin(self, path: str, *, overwrite: bool, storage_options: dict | None, options: StoreOptions) -> SaveTarget:
        return begin_save(
            path, token=new_token(), overwrite=overwrite, storage_options=storage_options, options=options
        )

    def close(self, target: SaveTarget, part: dict, *, failure: Exception | None) -> tuple[bool, Manifest | None]:
        if failure is not None:
            _cleanup(target)
            raise failure
        try:
            manifest = merge_parts([part], created=utc_now())
            commit(target, manifest)
        except BaseException:
            _cleanup(target)
            raise
        return True, manifest

    def abort(self, target: SaveTarget, part: dict, reason: str) -> None:
        _cleanup(target)


@dataclass(frozen=True)
class SharedStaging(_Alone):
    """Ranks without a process group: each writes a part into one shared staging area; ``finalize`` commits.

    A rank never removes the shared staging area (the others are still writing into it): a
    rank that fails leaves a part that says why.
    """

    def begin(self, path: str, *, overwrite: bool, storage_options: dict | None, options: StoreOptions) -> SaveTarget:
        target = open_target(
            path, token=SHARED_TOKEN, overwrite=overwrite, storage_options=storage_options, options=options
        )
        if existing(target.final) == "checkpoint" and not overwrite:
            raise CheckpointExistsError(
                f"a checkpoint already exists at {target.final.display()}; pass overwrite=True to replace it "
                "or save to a new path"
            )
        target.final.prepare_staging(target.storage, shared=True, overwrite=overwrite)
        target.storage.reused = True  # a killed earlier attempt may have left arrays there
        # ... and its part: were this rank to die now, finalize must not merge that one.
        target.storage.remove(PARTS_DIR, f"rank-{self.rank:05d}.json")
        return target

    def close(self, target: SaveTarget, part: dict, *, failure: Exception | None) -> tuple[bool, Manifest | None]:
        if failure is not None:
            self.abort(target, part, f"{type(failure).__name__}: {failure}")
            raise failure
        write_part(target, self.rank, part)
        return False, None

    def abort(self, target: SaveTarget, part: dict, reason: str) -> None:
        part["error"] = reason
        try:
            write_part(target, self.rank, part)
        except OSError:
            pass  # finalize then reports the part as missing


class ProcessGroup:
    """The ranks of a ``torch.distributed`` group: collective open, commit and abort.

    Only group rank 0 receives the parts (one message from each rank, O(manifest) bytes in
    all) and holds the manifest; the others send their part and learn the outcome, so no rank
    but one ever holds every fragment (docs/FORMAT.md, section 9). ``abort`` makes the same
    collectives as ``close`` in the same order, so a rank that aborts and ranks that close
    always meet, and every rank learns why a save failed.
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    def __repr__(self) -> str:
        return f"ProcessGroup(rank={self.rank}, world_size={self.world_size})"

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    def begin(self, path: str, *, overwrite: bool, storage_options: dict | None, options: StoreOptions) -> SaveTarget:
        box: list[Any] = [None, None]
        if self.rank == 0:
            try:
                box[0] = new_token()
                begin_save(path, token=box[0], overwrite=overwrite, storage_options=storage_options, options=options)
            except Exception as err:  # noqa: BLE001 - re-raised on every rank below
                box[1] = err
        token, error = self.broadcast(box)
        if error is not None:
            raise error
        return open_target(path, token=token, overwrite=overwrite, storage_options=storage_options, options=options)

    def check_spec(self, key: str, tspec: TensorSpec) -> None:
        check_average(key, tspec, self.world_size)

    def reconcile(
        self, data: torch.Tensor, logical: str, target: Region, tspec: TensorSpec, part: dict
    ) -> torch.Tensor:
        if tspec.replicas > 1 and tspec.policy == "average":
            data = average_replicas(data, tspec.replicas, self.group)
        if tspec.replicas > 1 and tspec.policy == "check-equal":
            part["replica_digests"].append([logical, region_to_dict(target), _checksum.digest(host_array(data))])
        return data

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=self._global(0), group=self.group)
        return box[0]

    def agree(self, problem: str | None, *, fatal: bool = False) -> Agreement:
        return agree(problem, fatal=fatal, group=self.group)

    def close(self, target: SaveTarget, part: dict, *, failure: Exception | None) -> tuple[bool, Manifest | None]:
        if failure is not None:
            part["error"] = f"{type(failure).__name__}: {failure}"
        error, manifest = self._exchange(target, part)
        if error is not None:
            if part["error"]:
                raise UcpError(f"save aborted on this rank: {part['error']}") from error
            raise error
        return True, manifest

    def abort(self, target: SaveTarget, part: dict, reason: str) -> None:
        part["error"] = reason
        self._exchange(target, part)  # fails (this rank's part has an error), and cleans up, on rank 0

    def _exchange(self, target: SaveTarget, part: dict) -> tuple[Exception | None, Manifest | None]:
        """Every rank's part to the committer, the commit, and its outcome back to every rank (collective).

        Below ``StoreOptions.metadata_shard_min_ranks`` ranks, group rank 0 gathers the parts
        and commits one manifest; from there on, leaders of ~sqrt(W) ranks write metadata
        shards and rank 0 commits the root that indexes them (:mod:`ucp.metadata_shards`).
        """
        manifest = None
        if self.world_size >= target.storage.options.metadata_shard_min_ranks:
            error = self._commit_sharded(target, part)
        else:
            error = None
            parts: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object(part, parts, dst=self._global(0), group=self.group)
            if self.rank == 0:
                assert parts is not None, "rank 0 gathered the parts"
                try:
                    manifest = merge_parts(parts, created=utc_now())
                    commit(target, manifest)
                except Exception as err:  # noqa: BLE001 - reported to every rank
                    error = err
                    _cleanup(target)
                parts = None
        return self.broadcast(error), manifest

    def _commit_sharded(self, target: SaveTarget, part: dict) -> Exception | None:
        """Parts to group leaders, shards written, summaries to rank 0, which commits (its error, or None)."""
        plan = GroupPlan(self.world_size)
        group = plan.group_of(self.rank)
        if self.rank != plan.leader(group):
            dist.send_object_list([part], dst=self._global(plan.leader(group)), group=self.group)
            return None
        parts = [part]
        for member in plan.ranks(group)[1:]:
            box: list[Any] = [None]
            dist.recv_object_list(box, src=self._global(member), group=self.group)
            parts.append(box[0])
        summary = write_group_shard(
            parts,
            index=group,
            ranks=plan.ranks(group),
            seed=target.token,
            key_prefix=target.key_prefix,
            write=target.storage.write_bytes,
        )
        del parts  # the group's parts are in its shard now
        if self.rank != 0:
            dist.send_object_list([summary], dst=self._global(0), group=self.group)
            return None
        summaries = [summary]
        for other in range(1, plan.count):
            box = [None]
            dist.recv_object_list(box, src=self._global(plan.leader(other)), group=self.group)
            summaries.append(box[0])
        try:
            commit(
                target, root_manifest(summaries, part, seed=target.token, world_size=self.world_size, created=utc_now())
            )
        except Exception as err:  # noqa: BLE001 - reported to every rank
            _cleanup(target)
            return err
        return None
