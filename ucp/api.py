"""The drop-in API: ``save``/``load`` of nested training state, and tensor-level reads.

::

    import ucp
    ucp.save({"model": model, "optim": opt, "step": 7}, "ckpt/7")   # their state_dict() now
    state = ucp.load("ckpt/7")                                      # a new state (plain dicts)
    ucp.load("ckpt/7", into={"model": model, "optim": opt, "step": 0})  # in place, fresh objects too
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterator

import torch

from ucp.dtypes import allocate, dtype_name
from ucp.errors import InvalidArgumentError, UcpError
from ucp.geometry import Box, FlatRange, Region, region_shape
from ucp.coordination import default_process_group
from ucp.layout import Layout
from ucp.programs import compile_for_load, compile_for_save
from ucp.into_checks import check_fits, is_dtensor, key_error, saved_extras, spec_for_into
from ucp.reader import CheckpointReader
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.save_checks import check_spec_fit, check_tensors, local_tensor as _local
from ucp.stores import StoreOptions
from ucp.state import FlatState, assemble_state, flatten_state, state_tensors, tensor_places, tensor_refs
from ucp.stateful import LoadTargets, skeleton
from ucp.shared_save import finalize, record_failure  # noqa: F401 - re-exported
from ucp.writer import CheckpointWriter, SaveResult  # re-exported

SpecLike = FragmentMap | Callable[[dict], FragmentMap] | None


def save(
    state: Any,
    path: str | os.PathLike,
    *,
    spec: SpecLike = None,
    process_group: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    program: Any = None,
    layout: Layout | str | None = None,
    checksums: bool = True,
    overwrite: bool = False,
    allow_objects: Any = False,
    storage_options: dict | None = None,
    logical: dict[str, LogicalTensor] | None = None,
    store_options: StoreOptions | None = None,
) -> SaveResult:
    """Save a nested state (what you would pass to ``torch.save``) as a universal checkpoint.

    Each rank saves only its own tensors: with ``spec`` (a FragmentMap, or a
    callable ``spec({key: (shape, dtype)}) -> FragmentMap``), with
    ``program`` + ``layout`` (a UCL program: text, a ``.ucl`` path, a preset
    reference or a ``ucl.BoundProgram``; the manifest records its full text and
    parameters), from DTensor placements, or - for
    plain tensors under a process group - as replicas of the whole group.
    ``logical`` (name -> LogicalTensor) tells a UCL program the whole shapes it
    cannot infer from local tensors (ZeRO-3: parameters exist only inside flat
    partitions). Values that are not JSON are refused unless ``allow_objects``
    (pickled; loads need ``allow_objects`` too, see :func:`load`).
    ``store_options`` (:class:`~ucp.stores.StoreOptions`) tunes the I/O, never the format.
    Objects with ``state_dict()`` (modules, optimizers, schedulers) are saved as their state
    dict at the time of the call (:mod:`ucp.stateful`). When torch.distributed is initialized
    and none of ``process_group``, ``rank``, ``world_size`` is given, every rank of the world
    saves together (``process_group`` defaults to the world group, as in DCP); pass
    ``world_size=1`` for a save that only this rank makes.

    >>> import torch, ucp, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> ucp.save({"w": torch.ones(2), "step": 3}, os.path.join(d, "c")).committed
    True
    """
    flat, writer = open_writer(
        state,
        path,
        spec=spec,
        process_group=process_group,
        rank=rank,
        world_size=world_size,
        program=program,
        layout=layout,
        checksums=checksums,
        overwrite=overwrite,
        allow_objects=allow_objects,
        storage_options=storage_options,
        logical=logical,
        store_options=store_options,
    )
    try:
        for key, tensor in flat.tensors.items():
            writer.add(key, tensor)
        writer.set_state(flat.tree)
    except BaseException as err:
        writer.abort(f"{type(err).__name__}: {err}")
        raise
    return writer.close()


def open_writer(
    state: Any,
    path: str | os.PathLike,
    *,
    spec: SpecLike = None,
    process_group: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    program: Any = None,
    layout: Layout | str | None = None,
    allow_objects: Any = False,
    logical: dict[str, LogicalTensor] | None = None,
    **writer_options: Any,
) -> tuple[FlatState, CheckpointWriter]:
    """Validate ``state`` and open its writer: everything :func:`save` does before the first write.

    Takes :func:`save`'s arguments (``checksums``, ``overwrite``, ``storage_options`` and the
    other :class:`~ucp.writer.CheckpointWriter` options pass through). Returns the flattened
    state (``.tensors``: key -> tensor, ``.tree``: the JSON tree) and the open writer; the
    caller adds the tensors, sets the tree and closes (or aborts) the writer. Bad input on
    any rank is refused on every rank, before anything is written. Async saves and
    converters use it to write the same checkpoints as ``save``.

    >>> import torch, tempfile, os
    >>> flat, writer = open_writer({"w": torch.ones(2), "step": 1}, os.path.join(tempfile.mkdtemp(), "c"))
    >>> for key, tensor in flat.tensors.items():
    ...     writer.add(key, tensor)
    >>> writer.set_state(flat.tree)
    >>> writer.close().committed
    True
    """
    record = lay = None
    if process_group is None and rank is None and world_size is None:
        process_group = default_process_group()
    if process_group is not None:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    try:  # everything that can fail on one rank fails here, before the first collective
        lay = Layout.parse(layout) if isinstance(layout, str) else layout
        flat = flatten_state(state, allow_objects=allow_objects)
        check_tensors(flat.tensors)
        local = _local_shapes(flat)
        if program is not None:
            spec, record = compile_for_save(program, spec=spec, layout=lay, rank=rank, local=local, logical=logical)
        elif spec is not None and not isinstance(spec, FragmentMap):
            spec = spec(local)
        if spec is not None and not isinstance(spec, FragmentMap):
            raise InvalidArgumentError(
                f"spec must be a FragmentMap (or a callable returning one), got {type(spec).__name__}"
            )
        if spec is not None and flat.ties:
            flat = _untie(state, flat, spec, allow_objects)
        check_spec_fit(flat.tensors, spec, world_size=world_size, distributed=process_group is not None)
        failure = None
    except Exception as err:  # noqa: BLE001 - re-raised below, after every rank has heard of it
        failure = err
    if process_group is not None:
        from ucp.agreement import first_failure

        # Every rank must learn that one rank's state is invalid, or the others would hang.
        bad = first_failure(None if failure is None else f"{type(failure).__name__}: {failure}", group=process_group)
        if failure is None and bad is not None:
            raise UcpError(f"save failed on rank {bad.rank}: {bad.message}")
    elif failure is not None and world_size > 1:
        record_failure(
            os.fspath(path),
            rank=rank,
            world_size=world_size,
            error=failure,
            storage_options=writer_options.get("storage_options"),
        )
    if failure is not None:
        raise failure
    assert spec is None or isinstance(spec, FragmentMap), "resolved above, or the save failed"
    writer = CheckpointWriter(
        os.fspath(path),
        rank=rank,
        world_size=world_size,
        process_group=process_group,
        spec=spec,
        layout=lay,
        program=None if record is None else record.to_dict(),
        **writer_options,
    )
    return flat, writer


def _local_shapes(flat: FlatState) -> dict[str, tuple[tuple[int, ...], str]]:
    """key -> (local shape, dtype) of every tensor, tied keys included: a map may treat them apart."""
    local = {k: (tuple(_local(t).shape), dtype_name(t.dtype)) for k, t in flat.tensors.items()}
    for key, first in flat.ties.items():
        local[key] = local[first]
    return local


def _untie(state: Any, flat: FlatState, spec: FragmentMap, allow_objects: Any) -> FlatState:
    """Flatten again so that tied keys the map sends to different places are each written.

    A tie is folded into one key only when both keys map onto the same pieces; otherwise
    folding would remove a logical tensor from the checkpoint.
    """

    def mapping(key: str) -> Any:
        tspec = spec.tensors.get(key)
        return None if tspec is None else (tspec.pieces, tspec.replica, tspec.replicas, tspec.policy)

    if all(mapping(key) == mapping(first) for key, first in flat.ties.items()):
        return flat
    return flatten_state(state, allow_objects=allow_objects, tie_group=mapping)


def load(
    path: str | os.PathLike,
    into: Any = None,
    *,
    spec: SpecLike = None,
    program: Any = None,
    layout: Layout | str | None = None,
    rank: int | None = None,
    map_location: str | torch.device = "cpu",
    strict: bool = True,
    verify: bool = True,
    allow_objects: Any = False,
    storage_options: dict | None = None,
    store_options: StoreOptions | None = None,
) -> Any:
    """Load a checkpoint, optionally resharded to ``spec`` and/or in place into ``into``.

    Without a spec, logical tensors are assembled whole at the keys they were
    saved under. With one (a FragmentMap, a callable
    ``spec({name: LogicalTensor}) -> FragmentMap``, or ``layout`` + ``rank``
    with the UCL program the checkpoint was saved with, or with ``program``,
    which must agree with it on the model's parameters), exactly that rank's
    local tensors are returned, reading only the bytes that overlap them.
    ``into`` fills existing tensors with ``copy_`` (no second copy) and the
    returned state shares them; its non-tensor values (a step, a learning rate)
    are replaced by the saved ones in place, and objects with ``state_dict()``
    in it get theirs back through ``load_state_dict`` (a fresh optimizer's
    per-parameter state is created first: :mod:`ucp.stateful`). ``into`` may be
    the tree a load without it returned (positions are matched through the
    saved tree). ``strict`` refuses keys on either side that the other lacks;
    ``strict=False`` fills what both have, adds saved entries ``into`` lacks
    under its own top-level keys, and skips the other top-level entries with a
    :class:`~ucp.errors.PartialLoadWarning` naming them: saved data is never
    dropped silently.

    A whole load returns every logical tensor: the saved tree's references
    resolved, plus the logical tensors the tree does not place, at the top
    level under their full names (``w`` and ``w/fp32`` side by side;
    docs/FORMAT.md, "Loading a whole checkpoint"). Pickled objects in the
    state load only with ``allow_objects``: ``True`` for plain data types
    (restricted unpickler, :mod:`ucp.unpickle`), or an iterable of
    ``"module.Class"`` names or classes to allow those as well.

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"w": torch.arange(3.0), "step": 3}, d)
    >>> ucp.load(d)
    {'w': tensor([0., 1., 2.]), 'step': 3}
    """
    return load_recording(
        path,
        into,
        spec=spec,
        program=program,
        layout=layout,
        rank=rank,
        map_location=map_location,
        strict=strict,
        verify=verify,
        allow_objects=allow_objects,
        storage_options=storage_options,
        store_options=store_options,
    )


def load_recording(path: str | os.PathLike, into: Any = None, *, filled: set[str] | None = None, **options: Any) -> Any:
    """:func:`load`, adding to ``filled`` each key before its tensor is written.

    After a load that failed part-way, ``filled`` names the tensors of ``into`` it may
    have changed (CheckpointManager.restore uses it to fall back safely).

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"w": torch.ones(2)}, d)
    >>> filled = set()
    >>> _ = load_recording(d, {"w": torch.zeros(2)}, filled=filled)
    >>> filled
    {'w'}
    """
    return _load(os.fspath(path), into, filled, **options)


def _load(
    path: str,
    into: Any,
    filled: set[str] | None,
    *,
    spec: SpecLike = None,
    program: str | None = None,
    layout: Layout | str | None = None,
    rank: int | None = None,
    map_location: str | torch.device = "cpu",
    strict: bool = True,
    verify: bool = True,
    allow_objects: Any = False,
    storage_options: dict | None = None,
    store_options: StoreOptions | None = None,
) -> Any:
    reader = CheckpointReader(path, verify=verify, storage_options=storage_options, store_options=store_options)
    manifest = reader.manifest
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    spec = compile_for_load(
        reader.path,
        manifest.program,
        manifest.layout,
        reader.logical(),
        spec=spec,
        program=program,
        layout=lay,
        rank=rank,
    )
    if spec is not None and not isinstance(spec, FragmentMap):
        spec = spec(reader.logical())
    if spec is not None and not isinstance(spec, FragmentMap):
        raise InvalidArgumentError(
            f"spec must be a FragmentMap (or a callable returning one), got {type(spec).__name__}"
        )
    if rank is None and spec is not None:
        rank = spec.rank
    tree_rank = rank if rank is not None and rank in manifest.states else min(manifest.states, default=0)
    tree = manifest.states.get(tree_rank)
    targets_of = LoadTargets(into, skeleton(tree)) if into is not None else None
    into_tensors = state_tensors(targets_of.tree) if targets_of is not None else None
    if spec is None and into_tensors is not None and any(is_dtensor(t) for t in into_tensors.values()):
        spec = spec_for_into(reader, into_tensors, strict)
        strict = False  # checked just now, against the whole checkpoint

    skipped: set[str] = set()  # top-level keys of the saved state that a non-strict load leaves out
    targets = _targets(reader, spec, tree, into_tensors, strict, top=_top_keys(into), skipped=skipped)
    whole = spec is None and into_tensors is None
    # Everything that can refuse the tree (malformed tags, objects not allowed, names that
    # cannot be placed) refuses it now, before any tensor is read.
    assemble_state(tree, dict.fromkeys(targets, _PLACEHOLDER), whole=whole, allow_objects=allow_objects, source=path)
    device = torch.device(map_location)
    tensors: dict[str, torch.Tensor] = {}
    # Reads go to the reader in batches (adjacent bytes of a pack become one read straight into
    # the tensors); a batch is bounded, so a load to a device holds a bounded amount on the host.
    batch: list[tuple[str, Region, torch.Tensor]] = []
    done: list[tuple[str, torch.Tensor]] = []
    batched = 0

    def flush() -> None:
        reader.read_many(batch)
        batch.clear()
        for key, dest in done:
            tensors[key] = dest.to(device) if into_tensors is None and device.type != "cpu" else dest
        done.clear()

    with reader:
        for key, (tspec, shape, dtype) in targets.items():
            if into_tensors is not None and key in into_tensors:
                dest = into_tensors[key]
            elif sum(piece.local.numel for piece in tspec.pieces) == math.prod(shape):
                dest = allocate(shape, dtype, what=repr(key))
            else:  # padding no piece covers (vocab, ZeRO alignment) reads as zeros, not garbage
                dest = allocate(shape, dtype, zeros=True, what=repr(key))
            if filled is not None:
                filled.add(key)
            for piece in tspec.pieces:
                _fill(reader, piece.logical, piece.target, piece.local, _local(dest), batch)
            done.append((key, dest))
            batched += dest.nbytes
            if batched >= _BATCH_BYTES:
                flush()
                batched = 0
        flush()
    state = assemble_state(tree, tensors, whole=whole, allow_objects=allow_objects, source=path)
    for key in skipped if isinstance(state, dict) else ():  # left out whole: a part would mislead
        state.pop(key, None)
    if targets_of is not None:  # non-tensor values (step, lr) in place too; then load_state_dict
        targets_of.finish(state)
    return state


def _top_keys(into: Any) -> set | None:
    return set(map(str, into)) if isinstance(into, dict) else None


_PLACEHOLDER = torch.empty(0)


def _targets(
    reader: CheckpointReader,
    spec: FragmentMap | None,
    tree: Any,
    into: dict[str, torch.Tensor] | None,
    strict: bool,
    *,
    top: set | None = None,
    skipped: set | None = None,
) -> dict[str, tuple[TensorSpec, tuple, str]]:
    """key -> (spec of the local tensor, its shape, its dtype) for everything to load.

    A non-strict whole load into ``into`` also loads the saved tensors ``into`` has no tensor
    for, under its top-level keys ``top`` (keyed by logical name: the tree places them).
    """
    logical = reader.logical()
    out: dict[str, tuple[TensorSpec, tuple, str]] = {}
    if spec is None:
        places = tensor_places(tree)
        if into is None:
            wanted = {k: k for k in _identity_keys(tree, logical)}
        else:  # a key of ``into`` is a position in the state; the tree says which logical tensor is there
            wanted = {k: places[k] if places.get(k) in logical else k for k in into}
        missing = [k for k, name in wanted.items() if name not in logical]
        loaded = set(wanted.values())
        unexpected = [n for n in logical if into is not None and n not in loaded]
        if strict and (missing or unexpected):
            raise key_error(reader.path, missing, unexpected)
        if unexpected:
            wanted.update(saved_extras(reader.path, unexpected, places, top, skipped))
        for key, name in wanted.items():
            if name in logical:
                lt = logical[name]
                box = Box.full(lt.shape)
                out[key] = (TensorSpec(key, (ShardPiece(name, box, box),)), lt.shape, lt.dtype)
    else:
        spec.validate()
        missing = sorted({p.logical for t in spec.tensors.values() for p in t.pieces if p.logical not in logical})
        unexpected = [k for k in (into or {}) if k not in spec.tensors]
        if strict and (missing or unexpected):
            raise key_error(reader.path, missing, unexpected)
        for key, tspec in spec.tensors.items():
            if into is not None and key not in into:
                if strict:
                    raise key_error(reader.path, [key], [])
                continue
            pieces = tuple(p for p in tspec.pieces if p.logical in logical)
            # A compiled UCL map knows each local shape and dtype, padding included; else the pieces bound it.
            known = spec.local.get(key)
            if not pieces and known is None:
                continue
            tspec = TensorSpec(key, pieces, tspec.replica, tspec.replicas, tspec.policy)
            shape = tuple(known.shape) if known is not None else _local_shape(pieces)
            dtype = known.dtype if known is not None else logical[pieces[0].logical].dtype
            out[key] = (tspec, shape, dtype)
    if into is not None:
        for key, (tspec, shape, dtype) in out.items():
            if key not in into:
                continue
            check_fits(reader, key, tspec, _local(into[key]), shape, dtype, exact=spec is None)
    return out


def _identity_keys(tree: Any, logical: dict[str, LogicalTensor]) -> list[str]:
    keys = list(dict.fromkeys(k for k in tensor_refs(tree) if k in logical))
    seen = set(keys)
    return keys + [n for n in logical if n not in seen]


def _local_shape(pieces) -> tuple[int, ...]:
    """The smallest local tensor that holds every piece (box stops, or the flat stop)."""
    if all(isinstance(p.local, FlatRange) for p in pieces):
        return (max(p.local.stop for p in pieces),)
    boxes = [p.local for p in pieces if isinstance(p.local, Box)]
    return tuple(max(b.stops[d] for b in boxes) for d in range(boxes[0].ndim))


# A load reads this many bytes of destinations at a time (see load: one plan, coalesced reads).
_BATCH_BYTES = 256 << 20


def _fill(
    reader: CheckpointReader,
    logical: str,
    target: Region,
    local: Region,
    dest: torch.Tensor,
    batch: list[tuple[str, Region, torch.Tensor]],
) -> None:
    """Add the read of ``target`` into ``local`` of ``dest`` to ``batch`` (read at once when it needs staging)."""
    if isinstance(local, Box):
        batch.append((logical, target, dest[local.slices()] if local.ndim else dest))
        return
    # A flat run of the destination, viewed as the target's storage: 1-d for a flat range, the
    # box's sizes for a box (the run holds the box in row-major order).
    shape = region_shape(target)
    if dest.is_contiguous():
        batch.append((logical, target, dest.view(-1)[local.start : local.stop].view(shape)))
        return
    # A flat range of a non-contiguous tensor has no view: stage it, then scatter.
    flat = dest.reshape(-1).clone()
    reader.read_into(logical, target, flat[local.start : local.stop].view(shape))
    dest.copy_(flat.view(dest.shape))


def iter_tensors(
    path: str | os.PathLike, names: list[str] | None = None, *, verify: bool = True, storage_options: dict | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(logical_name, tensor)`` one whole logical tensor at a time (bounded memory).

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"a": torch.zeros(2), "b": torch.ones(1)}, d)
    >>> [name for name, _ in ucp.iter_tensors(d)]
    ['a', 'b']
    """
    with CheckpointReader(os.fspath(path), verify=verify, storage_options=storage_options) as reader:
        yield from reader.iter_tensors(names)


def read_tensor(
    path: str | os.PathLike,
    name: str,
    region: Region | None = None,
    *,
    verify: bool = True,
    storage_options: dict | None = None,
) -> torch.Tensor:
    """Read one logical tensor, or just ``region`` of it (a Box or a FlatRange).

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"w": torch.arange(12.).view(3, 4)}, d)
    >>> ucp.read_tensor(d, "w", ucp.Box((1, 1), (2, 2)))
    tensor([[ 5.,  6.],
            [ 9., 10.]])
    """
    with CheckpointReader(os.fspath(path), verify=verify, storage_options=storage_options) as reader:
        return reader.read_tensor(name, region)
