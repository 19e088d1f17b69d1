"""The streaming checkpoint writer: each rank writes only its own fragments.

``ucp.save`` is built on it, and so are async saves and format converters::

    with CheckpointWriter("ckpt/step_10") as w:
        w.add("model/fc.weight", weight)        # written right away
        w.set_state({"step": 10, "w": {"$tensor": "model/fc.weight"}})
    # leaving the block commits; an exception aborts instead

With a process group, every rank opens a writer with the group; ``close`` is
collective: metadata only (never tensor bytes) is gathered, checked (coverage,
replica equality) and committed by group rank 0. Without one, ranks given
``rank``/``world_size`` write parts into a shared staging area and
:func:`finalize` commits. Tensors passed to :meth:`CheckpointWriter.add` are
referenced, not copied, until the write completes: leave them unchanged until
``close()`` (or :meth:`CheckpointWriter.flush`) returns.
"""

from __future__ import annotations

import functools
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import torch

from ucp import checksum as _checksum
from ucp.commit import (PARTS_DIR, SHARED_TOKEN, SaveTarget, abort as _abort, begin_save, commit, existing,
                        new_token, open_target, write_part)
from ucp.dtypes import host_array, storage_dtype
from ucp.fragment_plan import array_key
from ucp.errors import CheckpointExistsError, InvalidArgumentError, LayoutError, NameConflictError, UcpError
from ucp.geometry import Box, Region, region_shape, region_to_dict
from ucp.manifest import Fragment, Manifest
from ucp.parts import json_safe, merge_parts, new_part
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.stores.chunking import chunk_rows_for
from ucp.zarr_array import chunk_count
from ucp.save_checks import check_average, check_pieces, check_tensor
from ucp.stores import DEFAULT_OPTIONS, StoreOptions
from ucp.write_units import average_replicas, local_region, write_units


@dataclass(frozen=True)
class SaveResult:
    """What a save did, on this rank; ``manifest`` once the checkpoint is committed, on the rank that
    committed it (with a process group: group rank 0 only, so that no other rank holds every fragment;
    None with sharded metadata, where no rank holds them - open the checkpoint to read it)."""

    path: str
    rank: int
    world_size: int
    committed: bool
    fragments: int
    bytes_written: int
    manifest: Manifest | None = None


class CheckpointWriter:
    """Write one checkpoint tensor by tensor; ``close()`` commits, ``abort()`` throws it away.

    >>> import torch, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "c")
    >>> with CheckpointWriter(path) as w:
    ...     w.add("w", torch.ones(2))
    ...     w.set_state({"w": {"$tensor": "w"}, "step": 1})
    >>> os.path.exists(os.path.join(path, "manifest.json"))
    True

    ``pack_max_bytes`` (default ``store_options.pack_max_bytes``, 256 KiB; 0 to disable) is the
    largest fragment packed with others into one file (docs/FORMAT.md, "Packs");
    ``store_options`` (:class:`~ucp.stores.options.StoreOptions`) tunes the I/O.
    """

    def __init__(
        self,
        path: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        process_group: Any = None,
        spec: FragmentMap | None = None,
        checksums: bool = True,
        overwrite: bool = False,
        storage_options: dict | None = None,
        layout: Any = None,
        program: str | None = None,
        pack_max_bytes: int | None = None,
        store_options: StoreOptions | None = None,
    ) -> None:
        self.path = str(path)
        self._options = store_options or DEFAULT_OPTIONS
        pack_max_bytes = self._options.pack_max_bytes if pack_max_bytes is None else pack_max_bytes
        self._pg = process_group
        if process_group is not None:
            import torch.distributed as dist

            rank, world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        if not 0 <= rank < world_size:
            raise LayoutError(f"rank {rank} must be in [0, world_size={world_size})")
        if spec is not None:
            if not isinstance(spec, FragmentMap):
                raise InvalidArgumentError(f"spec must be a FragmentMap, got {type(spec).__name__}")
            spec.validate()
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self._checksums = checksums
        self._target = self._open(storage_options, overwrite)
        self._part = new_part(rank=rank, world_size=world_size,
                              checksum_algorithm=_checksum.ALGORITHM if checksums else None)
        if layout is not None:
            self._part["layout"] = layout if isinstance(layout, dict) else layout.to_dict()
        self._part["program"] = program
        self._part["overwrite"] = bool(overwrite)  # finalize commits parts written without a process group
        self._keys: set[str] = set()
        self._pending: deque = deque()
        self._inflight_bytes = 0
        self._counter = 0
        self._bytes = 0
        self._closed = False
        self._pack_max = pack_max_bytes
        self._pack: list[tuple[Any, dict]] = []  # the open pack: (array, fragment entry), written on flush
        self._pack_len = 0
        self._pack_key: str | None = None

    # -- setup ---------------------------------------------------------------
    def _open(self, storage_options: dict | None, overwrite: bool) -> SaveTarget:
        if self._pg is not None:
            import torch.distributed as dist

            box: list[Any] = [None, None]
            if self.rank == 0:
                try:
                    box[0] = new_token()
                    begin_save(self.path, token=box[0], overwrite=overwrite, storage_options=storage_options,
                               options=self._options)
                except Exception as err:  # noqa: BLE001 - re-raised on every rank below
                    box[1] = err
            dist.broadcast_object_list(box, src=dist.get_global_rank(self._pg, 0), group=self._pg)
            if box[1] is not None:
                raise box[1]
            return open_target(self.path, token=box[0], overwrite=overwrite, storage_options=storage_options,
                               options=self._options)
        if self.world_size > 1:
            target = open_target(self.path, token=SHARED_TOKEN, overwrite=overwrite, storage_options=storage_options,
                                 options=self._options)
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
        return begin_save(self.path, token=new_token(), overwrite=overwrite, storage_options=storage_options,
                          options=self._options)

    # -- writing -------------------------------------------------------------
    def add(self, key: str, tensor: torch.Tensor) -> None:
        """Write this rank's fragments of local tensor ``key`` (queued to the store right away)."""
        self._check_open()
        if key in self._keys:
            raise NameConflictError(f"tensor {key!r} was already added to this checkpoint")
        name = check_tensor(tensor, key=key)
        self._keys.add(key)
        if _is_dtensor(tensor):
            from ucp.dtensor import dtensor_spec

            logical, tspec = dtensor_spec(key, tensor)
            self._add_pieces(key, tensor.to_local(), tspec, {logical.name: logical})
            return
        tspec = self.spec.tensors.get(key) if self.spec is not None else None
        if tspec is not None:
            self._add_pieces(key, tensor, tspec, self.spec.logical)
            return
        # No spec: the tensor is whole, and (like DCP) replicated over all ranks.
        shape = tuple(tensor.shape)
        box = Box.full(shape)
        tspec = TensorSpec(key=key, pieces=(ShardPiece(key, box, box),), replica=self.rank, replicas=self.world_size)
        self._add_pieces(key, tensor, tspec, {key: LogicalTensor(key, shape, name)})

    def _add_pieces(self, key: str, tensor: torch.Tensor, tspec: TensorSpec, logical: dict) -> None:
        check_pieces(key, tensor, tspec, logical)
        if self._pg is not None:
            check_average(key, tspec, self.world_size)
        name = check_tensor(tensor, key=key)
        for piece in tspec.pieces:
            lt = logical[piece.logical]
            self._part["logical"][lt.name] = {"dtype": lt.dtype, "shape": list(lt.shape)}
            data = local_region(tensor, piece.local)
            replicas = tspec.replicas
            if replicas > 1 and tspec.policy == "average" and self._pg is not None:
                data = average_replicas(data, replicas, self._pg)
            if replicas > 1 and tspec.policy == "check-equal" and self._pg is not None:
                self._part["replica_digests"].append(
                    [lt.name, region_to_dict(piece.target), _checksum.digest(host_array(data))]
                )
            for sub_local, sub_target in write_units(piece, data, tspec):
                self._write(lt.name, name, data, sub_local, sub_target)

    def _write(self, logical: str, dtype: str, data: torch.Tensor, local: Region, target: Region) -> None:
        # The fragment is the target region: a box target of a flat local run (a ZeRO buffer's
        # share of a shard) is that run, which holds the box in row-major order, reshaped.
        part = (data[local.slices()] if local.ndim else data) if isinstance(local, Box) else data[local.start : local.stop]
        shape = region_shape(target)
        array = host_array(part).reshape(shape)
        rows = chunk_rows_for(shape, array.itemsize, chunk_bytes=self._options.chunk_bytes)
        chunks = chunk_count(shape, rows)
        if self._pack_max and 0 < array.nbytes <= self._pack_max and chunks == 1:
            self._add_to_pack(logical, array, target, rows)
            return
        rel = "data/" + array_key(self.rank, self._counter, logical, prefix=self._target.key_prefix)
        self._counter += 1
        attributes = {"ucp": {"dtype": dtype, "logical": logical, "region": region_to_dict(target)}}
        frag = Fragment(key=rel.removeprefix("data/"), rank=self.rank, region=target,
                        nbytes=array.nbytes, chunk_rows=rows).to_dict()
        self._part["fragments"].setdefault(logical, []).append(frag)
        self._bytes += array.nbytes
        # Checksummed and written by the store's threads from the array itself.
        futures = self._target.storage.write_array(rel, array, dtype=storage_dtype(dtype), chunk_rows=rows,
                                                   attributes=attributes, hasher=self._hasher)
        frag["checksums"] = [""] * len(futures) if self._checksums else []
        row_bytes = array.nbytes // shape[0] if shape and shape[0] else array.nbytes
        for index, future in enumerate(futures):
            nbytes = min(rows, shape[0] - index * rows) * row_bytes if shape else array.nbytes
            self._queue(future, nbytes, functools.partial(_record_checksum, frag["checksums"], index))

    @property
    def _hasher(self):
        return _checksum.hasher if self._checksums else None

    def _add_to_pack(self, logical: str, array, target: Region, rows: int) -> None:
        """Add a small fragment to this rank's open pack (docs/FORMAT.md, "Packs").

        The pack is written straight from the fragments' memory when it is full (or flushed).
        """
        if self._pack_key is None:
            self._pack_key = f"{self._target.key_prefix}r{self.rank}/pack-{self._counter:06d}"
            self._counter += 1
        frag = Fragment(key=self._pack_key, rank=self.rank, region=target, nbytes=array.nbytes,
                        chunk_rows=rows, pack_offset=self._pack_len).to_dict()
        self._part["fragments"].setdefault(logical, []).append(frag)
        self._pack.append((array, frag))
        self._pack_len += array.nbytes + (-array.nbytes % self._options.pack_align)
        self._bytes += array.nbytes
        if self._pack_len >= self._options.pack_target_bytes:
            self._flush_pack()

    def _flush_pack(self) -> None:
        if self._pack_key is None:
            return
        arrays, frags = zip(*self._pack)
        future = self._target.storage.write_pack(f"data/{self._pack_key}", list(arrays), align=self._options.pack_align,
                                                 hasher=self._hasher)
        nbytes = self._pack_len
        self._pack_key, self._pack, self._pack_len = None, [], 0
        self._queue(future, nbytes, functools.partial(_record_pack_checksums, frags))

    def _queue(self, pending: Future, nbytes: int, on_done: Callable[[Any], None] | None = None) -> None:
        """Track one write in flight; every write counts against the in-flight bounds."""
        self._pending.append((pending, nbytes, on_done))
        self._inflight_bytes += nbytes
        self._pump()

    def _pump(self, *, drain: bool = False) -> None:
        opts = self._options
        while self._pending and (
            drain or len(self._pending) > opts.max_inflight or self._inflight_bytes > opts.max_inflight_bytes
        ):
            pending, nbytes, on_done = self._pending.popleft()
            self._inflight_bytes -= nbytes
            found = pending.result()
            if on_done is not None:
                on_done(found)

    def flush(self) -> None:
        """Wait until every write queued so far has finished.

        After it returns the writer references none of the tensors passed to :meth:`add`
        (the open pack of small tensors is written out too), so their memory may be reused::

            writer.add("w", staging_buffer)
            writer.flush()
            staging_buffer.copy_(next_tensor)   # safe now
        """
        self._check_open()
        self._flush_pack()
        self._pump(drain=True)

    def set_state(self, tree: Any) -> None:
        """Record this rank's non-tensor state: a JSON tree (tensors as ``{"$tensor": key}``)."""
        self._check_open()
        try:
            self._part["state"] = json_safe(tree)
        except (TypeError, ValueError) as err:
            raise UcpError(f"state tree is not JSON ({err}); encode it with ucp.state.flatten_state") from None

    # -- finishing -----------------------------------------------------------
    def close(self) -> SaveResult:
        """Finish the writes and commit (collective with a process group)."""
        self._check_open()
        self._closed = True
        try:
            return self._close()
        finally:
            self._release()

    def _close(self) -> SaveResult:
        try:
            self._flush_pack()
            self._pump(drain=True)
            self._target.storage.sync(under=f"data/{self._target.key_prefix}r{self.rank}")
        except Exception as err:  # noqa: BLE001
            if self._pg is None:
                self._give_up(f"{type(err).__name__}: {err}")
                raise
            self._part["error"] = f"{type(err).__name__}: {err}"
        if self._pg is not None:
            return self._close_collective()
        if self.world_size > 1:
            write_part(self._target, self.rank, self._part)
            return self._result(committed=False)
        try:
            manifest = merge_parts([self._part], created=utc_now())
            commit(self._target, manifest)
        except BaseException:
            self._cleanup()
            raise
        return self._result(committed=True, manifest=manifest)

    def _close_collective(self) -> SaveResult:
        """Gather the parts on rank 0, which merges and commits, then broadcast the outcome.

        Only group rank 0 receives the parts (one message from each rank, O(manifest) bytes in
        all) and holds the manifest; the others send their part and learn the outcome, so no
        rank but one ever holds every fragment (docs/FORMAT.md, section 9). :meth:`_abort`
        makes the same two collectives in the same order, so a rank that aborts and ranks that
        close always meet, and every rank learns why a save failed.
        """
        error, manifest = self._exchange_parts()
        if error is not None:
            if self._part["error"]:
                raise UcpError(f"save aborted on this rank: {self._part['error']}") from error
            raise error
        return self._result(committed=True, manifest=manifest)

    def _exchange_parts(self) -> tuple[Exception | None, Manifest | None]:
        """Every rank's part to the committer, the commit, and its outcome back to every rank (collective).

        Below ``StoreOptions.metadata_shard_min_ranks`` ranks, group rank 0 gathers the parts
        and commits one manifest; from there on, leaders of ~sqrt(W) ranks write metadata
        shards and rank 0 commits the root that indexes them (:mod:`ucp.metadata_shards`).
        """
        import torch.distributed as dist

        root = dist.get_global_rank(self._pg, 0)
        outcome: list[Any] = [None]
        manifest = None
        if self.world_size >= self._options.metadata_shard_min_ranks:
            outcome[0] = self._commit_sharded()
        else:
            parts: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object(self._part, parts, dst=root, group=self._pg)
            if self.rank == 0:
                try:
                    manifest = merge_parts(parts, created=utc_now())
                    commit(self._target, manifest)
                except Exception as err:  # noqa: BLE001 - reported to every rank
                    outcome[0] = err
                    self._cleanup()
                parts = None
        dist.broadcast_object_list(outcome, src=root, group=self._pg)
        return outcome[0], manifest

    def _commit_sharded(self) -> Exception | None:
        """Parts to group leaders, shards written, summaries to rank 0, which commits (its error, or None)."""
        import torch.distributed as dist

        from ucp.metadata_shards import GroupPlan, root_manifest, write_group_shard

        plan = GroupPlan(self.world_size)
        group = plan.group_of(self.rank)
        peer = lambda r: dist.get_global_rank(self._pg, r)  # noqa: E731
        if self.rank != plan.leader(group):
            dist.send_object_list([self._part], dst=peer(plan.leader(group)), group=self._pg)
            return None
        parts = [self._part]
        for member in plan.ranks(group)[1:]:
            box: list[Any] = [None]
            dist.recv_object_list(box, src=peer(member), group=self._pg)
            parts.append(box[0])
        summary = write_group_shard(parts, index=group, ranks=plan.ranks(group), seed=self._target.token,
                                    key_prefix=self._target.key_prefix, write=self._target.storage.write_bytes)
        parts = None
        if self.rank != 0:
            dist.send_object_list([summary], dst=peer(0), group=self._pg)
            return None
        summaries = [summary]
        for other in range(1, plan.count):
            box = [None]
            dist.recv_object_list(box, src=peer(plan.leader(other)), group=self._pg)
            summaries.append(box[0])
        try:
            commit(self._target, root_manifest(summaries, self._part, seed=self._target.token,
                                               world_size=self.world_size, created=utc_now()))
        except Exception as err:  # noqa: BLE001 - reported to every rank
            self._cleanup()
            return err
        return None

    def abort(self, reason: str | None = None) -> None:
        """Give up this save: nothing is committed (collective with a process group).

        ``reason`` is what the other ranks' ``close()`` reports (and, without a process
        group, what :func:`finalize` reports for this rank).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._abort(reason)
        finally:
            self._release()

    def _abort(self, reason: str | None) -> None:
        for pending, *_ in self._pending:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the save is being thrown away
                pass
        self._pending.clear()
        reason = self._part["error"] or reason or f"aborted by rank {self.rank}"
        if self._pg is not None:
            self._part["error"] = reason
            self._exchange_parts()  # fails (this rank's part has an error), and cleans up, on rank 0
        else:
            self._give_up(reason)

    def _give_up(self, reason: str) -> None:
        """Without a process group: remove this save, or, when ranks share the staging area, say why in a part.

        A rank never removes the shared staging area: the other ranks are still writing into it.
        """
        if self.world_size == 1:
            self._cleanup()
            return
        self._part["error"] = reason
        try:
            write_part(self._target, self.rank, self._part)
        except OSError:
            pass  # finalize then reports the part as missing

    def _cleanup(self) -> None:
        try:
            _abort(self._target)
        except OSError:
            pass

    def _release(self) -> None:
        self._target.storage.close()
        self._target.final.close()

    def _result(self, *, committed: bool, manifest: Manifest | None = None) -> SaveResult:
        nfrags = sum(len(v) for v in self._part["fragments"].values())
        return SaveResult(self.path, self.rank, self.world_size, committed, nfrags, self._bytes, manifest)

    def _check_open(self) -> None:
        if self._closed:
            raise UcpError(f"the writer for {self.path} is already closed")

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}")


def _record_checksum(checksums: list[str], index: int, found: str | None) -> None:
    if found is not None:
        checksums[index] = found


def _record_pack_checksums(frags: tuple[dict, ...], found: list[str | None]) -> None:
    for frag, digest in zip(frags, found):
        frag["checksums"] = [digest] if digest is not None else []


def _is_dtensor(tensor: Any) -> bool:
    return type(tensor).__name__ == "DTensor"


def utc_now() -> str:
    """The commit time a manifest records (ISO 8601, UTC, seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
