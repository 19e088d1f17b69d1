"""The streaming checkpoint writer: each rank writes only its own fragments.

``ucp.save`` is built on it, and so are async saves and format converters::

    with CheckpointWriter("ckpt/step_10") as w:
        w.add("model/fc.weight", weight)        # written right away
        w.set_state({"step": 10, "w": {"$tensor": "model/fc.weight"}})
    # leaving the block commits; an exception aborts instead

How the ranks meet is a :class:`~ucp.coordination.SaveCoordinator`'s business. With a
process group, every rank opens a writer with the group; ``close`` is collective: metadata only (never tensor bytes) is gathered, checked (coverage,
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
from typing import Any, Callable

import torch

from ucp import checksum as _checksum
from ucp.coordination import coordinator_for, utc_now  # noqa: F401 - utc_now re-exported
from ucp.dtypes import host_array, storage_dtype
from ucp.errors import InvalidArgumentError, NameConflictError, UcpError
from ucp.geometry import Box, region_shape, region_to_dict
from ucp.manifest import Manifest
from ucp.parts import json_safe, new_part
from ucp.save_plan import ClosePack, SaveCursor, SaveRules, WriteItem, close_pack, plan_tensor
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.save_checks import check_pieces, check_tensor
from ucp.stores import DEFAULT_OPTIONS, StoreOptions
from ucp.write_units import local_region


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

    ``pack_max_bytes`` (default ``store_options.pack_max_bytes``: every fragment; 0 to disable) is the
    largest fragment written into the rank's few pack files (docs/FORMAT.md, "Packs");
    ``store_options`` (:class:`~ucp.stores.options.StoreOptions`) tunes the I/O.
    What each tensor writes is planned by :func:`ucp.save_plan.plan_tensor`; how the ranks
    open and commit the save is their :class:`~ucp.coordination.SaveCoordinator`'s business.
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
        program: dict | None = None,  # the program's record (ucp.programs.ProgramRecord.to_dict())
        pack_max_bytes: int | None = None,
        store_options: StoreOptions | None = None,
    ) -> None:
        self.path = str(path)
        self._options = store_options or DEFAULT_OPTIONS
        self._rules = SaveRules.of(self._options, pack_max_bytes=pack_max_bytes)
        self._coord = coordinator_for(process_group=process_group, rank=rank, world_size=world_size)
        rank, world_size = self._coord.rank, self._coord.world_size
        if spec is not None:
            if not isinstance(spec, FragmentMap):
                raise InvalidArgumentError(f"spec must be a FragmentMap, got {type(spec).__name__}")
            spec.validate()
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self._checksums = checksums
        self._target = self._coord.begin(
            self.path, overwrite=overwrite, storage_options=storage_options, options=self._options
        )
        self._part = new_part(
            rank=rank, world_size=world_size, checksum_algorithm=_checksum.ALGORITHM if checksums else None
        )
        if layout is not None:
            self._part["layout"] = layout if isinstance(layout, dict) else layout.to_dict()
        self._part["program"] = program
        self._part["overwrite"] = bool(overwrite)  # finalize commits parts written without a process group
        self._keys: set[str] = set()
        self._pending: deque = deque()
        self._inflight_bytes = 0
        self._bytes = 0
        self._closed = False
        self._cursor = SaveCursor(rank, self._target.key_prefix)
        self._pack: Any = None  # the open pack's writer (ucp.stores.pack_files), once a fragment went in

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

            logical, dspec = dtensor_spec(key, tensor)
            self._add_pieces(key, tensor.to_local(), dspec, {logical.name: logical})  # type: ignore[attr-defined]  # a DTensor
            return
        if self.spec is not None and (tspec := self.spec.tensors.get(key)) is not None:
            self._add_pieces(key, tensor, tspec, self.spec.logical)
            return
        # No spec: the tensor is whole, and (like DCP) replicated over all ranks.
        shape = tuple(tensor.shape)
        box = Box.full(shape)
        tspec = TensorSpec(key=key, pieces=(ShardPiece(key, box, box),), replica=self.rank, replicas=self.world_size)
        self._add_pieces(key, tensor, tspec, {key: LogicalTensor(key, shape, name)})

    def _add_pieces(self, key: str, tensor: torch.Tensor, tspec: TensorSpec, logical: dict) -> None:
        check_pieces(key, tensor, tspec, logical)
        self._coord.check_spec(key, tspec)
        check_tensor(tensor, key=key)
        steps, self._cursor = plan_tensor(self._cursor, key, tspec, logical, self._rules)
        # Pieces are prepared in order, each before its writes: replicas reconcile in the same
        # order on every rank, and only one piece's reconciled copy is held at a time.
        prepared, data = -1, None
        for step in steps:
            if isinstance(step, ClosePack):
                self._close_pack(step)
                continue
            while prepared < step.piece:
                prepared += 1
                data = self._prepare(tensor, tspec, prepared, logical)
            assert data is not None, "the step's piece was prepared"
            self._write(step, data)
        while prepared < len(tspec.pieces) - 1:
            prepared += 1
            self._prepare(tensor, tspec, prepared, logical)

    def _prepare(self, tensor: torch.Tensor, tspec: TensorSpec, index: int, logical: dict) -> torch.Tensor:
        """The data of piece ``index`` this replica writes from, its logical tensor recorded."""
        piece = tspec.pieces[index]
        lt = logical[piece.logical]
        self._part["logical"][lt.name] = {"dtype": lt.dtype, "shape": list(lt.shape)}
        return self._coord.reconcile(local_region(tensor, piece.local), lt.name, piece.target, tspec, self._part)

    def _write(self, item: WriteItem, data: torch.Tensor) -> None:
        # The fragment is the target region: a box target of a flat local run (a ZeRO buffer's
        # share of a shard) is that run, which holds the box in row-major order, reshaped.
        local = item.local
        part = (
            (data[local.slices()] if local.ndim else data) if isinstance(local, Box) else data[local.start : local.stop]
        )
        shape = region_shape(item.target)
        array = host_array(part).reshape(shape)
        assert array.nbytes == item.nbytes, (item, array.nbytes)  # the plan sized it from the logical dtype
        frag = item.fragment(self.rank).to_dict()
        self._part["fragments"].setdefault(item.logical, []).append(frag)
        self._bytes += array.nbytes
        # Checksummed and written by the store's threads from the array itself.
        if item.pack_offset is not None:
            if self._pack is None:
                self._pack = self._target.storage.open_pack(f"data/{item.key}")
            futures = self._pack.write(item.pack_offset, array, chunk_rows=item.chunk_rows, hasher=self._hasher)
        else:
            attributes = {"ucp": {"dtype": item.dtype, "logical": item.logical, "region": region_to_dict(item.target)}}
            futures = self._target.storage.write_array(
                f"data/{item.key}",
                array,
                dtype=storage_dtype(item.dtype),
                chunk_rows=item.chunk_rows,
                attributes=attributes,
                hasher=self._hasher,
            )
        frag["checksums"] = [""] * len(futures) if self._checksums else []
        rows = item.chunk_rows
        row_bytes = array.nbytes // shape[0] if shape and shape[0] else array.nbytes
        for index, future in enumerate(futures):
            nbytes = min(rows, shape[0] - index * rows) * row_bytes if shape else array.nbytes
            self._queue(future, nbytes, functools.partial(_record_checksum, frag["checksums"], index))

    @property
    def _hasher(self):
        return _checksum.hasher if self._checksums else None

    def _flush_pack(self) -> None:
        steps, self._cursor = close_pack(self._cursor)
        for step in steps:
            self._close_pack(step)

    def _close_pack(self, step: ClosePack) -> None:
        assert self._pack is not None, "a pack closes after its fragments went in"
        pack, self._pack = self._pack, None
        self._queue(pack.close(step.nbytes), 0)

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
        (their bytes are in the open pack's file already; the pack stays open for the next), so
        their memory may be reused::

            writer.add("w", staging_buffer)
            writer.flush()
            staging_buffer.copy_(next_tensor)   # safe now
        """
        self._check_open()
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
        failure = None
        try:
            self._flush_pack()
            self._pump(drain=True)
            self._target.storage.sync(under=f"data/{self._target.key_prefix}r{self.rank}")
        except Exception as err:  # noqa: BLE001 - the coordinator aborts the save and raises it
            failure = err
        committed, manifest = self._coord.close(self._target, self._part, failure=failure)
        return self._result(committed=committed, manifest=manifest)

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
        if self._pack is not None:
            self._pack.abandon()
            self._pack = None
        self._coord.abort(self._target, self._part, self._part["error"] or reason or f"aborted by rank {self.rank}")

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


def _is_dtensor(tensor: Any) -> bool:
    return type(tensor).__name__ == "DTensor"
