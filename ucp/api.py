"""The drop-in API: ``save``/``load`` of nested training state, and tensor-level reads.

::

    import ucp
    ucp.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 7}, "ckpt/7")
    state = ucp.load("ckpt/7")                       # a new state
    ucp.load("ckpt/7", into={"model": model.state_dict()}, strict=False)  # in place
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterator

import torch

from ucp.dtypes import allocate, check_supported, dtype_name
from ucp.errors import KeyMismatchError, ShapeMismatchError, UcpError
from ucp.geometry import Box, FlatRange, Region
from ucp.layout import Layout
from ucp.programs import compile_for_load, compile_for_save
from ucp.reader import CheckpointReader
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.state import FlatState, flatten_state, set_path, tensor_refs, unflatten_state
from ucp.writer import CheckpointWriter, SaveResult, finalize  # noqa: F401 - re-exported

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
    allow_objects: bool = False,
    storage_options: dict | None = None,
    logical: dict[str, LogicalTensor] | None = None,
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
    partitions).

    >>> import torch, ucp, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> ucp.save({"w": torch.ones(2), "step": 3}, os.path.join(d, "c")).committed
    True
    """
    flat, writer = open_writer(
        state, path, spec=spec, process_group=process_group, rank=rank, world_size=world_size, program=program,
        layout=layout, checksums=checksums, overwrite=overwrite, allow_objects=allow_objects,
        storage_options=storage_options, logical=logical,
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
    allow_objects: bool = False,
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
    try:  # validate before anything is written
        flat = flatten_state(state, allow_objects=allow_objects)
        for key, tensor in flat.tensors.items():
            check_supported(tensor.dtype, key=key)
        failure = None
    except UcpError as err:
        failure = err
    if process_group is not None:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        # Every rank must learn that one rank's state is invalid, or the others would hang.
        failures: list = [None] * world_size
        dist.all_gather_object(failures, None if failure is None else f"{type(failure).__name__}: {failure}",
                               group=process_group)
        bad = next(((r, f) for r, f in enumerate(failures) if f), None)
        if failure is None and bad is not None:
            raise UcpError(f"save failed on rank {bad[0]}: {bad[1]}")
    if failure is not None:
        raise failure
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    local = {k: (tuple(_local(t).shape), dtype_name(t.dtype)) for k, t in flat.tensors.items()}
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    record = None
    if program is not None:
        spec, record = compile_for_save(program, spec=spec, layout=lay, rank=rank, local=local, logical=logical)
    elif spec is not None and not isinstance(spec, FragmentMap):
        spec = spec(local)
    writer = CheckpointWriter(
        os.fspath(path), rank=rank, world_size=world_size, process_group=process_group, spec=spec,
        layout=lay, program=None if record is None else record.to_dict(), **writer_options,
    )
    return flat, writer


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
    allow_objects: bool = False,
    storage_options: dict | None = None,
) -> Any:
    """Load a checkpoint, optionally resharded to ``spec`` and/or in place into ``into``.

    Without a spec, logical tensors are assembled whole at the keys they were
    saved under. With one (a FragmentMap, a callable
    ``spec({name: LogicalTensor}) -> FragmentMap``, or ``layout`` + ``rank``
    with the UCL program the checkpoint was saved with, or with ``program``,
    which must agree with it on the model's parameters), exactly that rank's
    local tensors are returned, reading only the bytes that overlap them.
    ``into`` fills existing tensors with ``copy_`` (no second copy) and the
    returned state shares them.

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"w": torch.arange(3.0), "step": 3}, d)
    >>> ucp.load(d)
    {'w': tensor([0., 1., 2.]), 'step': 3}
    """
    reader = CheckpointReader(os.fspath(path), verify=verify, storage_options=storage_options)
    manifest = reader.manifest
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    spec = compile_for_load(reader.path, manifest.program, manifest.layout, reader.logical(), spec=spec,
                            program=program, layout=lay, rank=rank)
    if spec is not None and not isinstance(spec, FragmentMap):
        spec = spec(reader.logical())
    if rank is None and spec is not None:
        rank = spec.rank
    tree_rank = rank if rank in manifest.states else min(manifest.states, default=0)
    tree = manifest.states.get(tree_rank)
    into_tensors = flatten_state(into, allow_objects=True).tensors if into is not None else None
    if spec is None and into_tensors is not None and any(_is_dtensor(t) for t in into_tensors.values()):
        spec = _spec_for_into(reader, into_tensors, strict)
        strict = False  # checked just now, against the whole checkpoint

    targets = _targets(reader, spec, tree, into_tensors, strict)
    device = torch.device(map_location)
    tensors: dict[str, torch.Tensor] = {}
    with reader:
        for key, (tspec, shape, dtype) in targets.items():
            if into_tensors is not None:
                dest = into_tensors[key]
            elif sum(piece.local.numel for piece in tspec.pieces) == math.prod(shape):
                dest = allocate(shape, dtype, what=repr(key))
            else:  # padding no piece covers (vocab, ZeRO alignment) reads as zeros, not garbage
                dest = allocate(shape, dtype, zeros=True, what=repr(key))
            for piece in tspec.pieces:
                _fill(reader, piece.logical, piece.target, piece.local, _local(dest))
            if into_tensors is None and device.type != "cpu":
                dest = dest.to(device)
            tensors[key] = dest

    placed: set[str] = set()
    missing = object()

    def resolve(key: str) -> Any:
        if key in tensors:
            placed.add(key)
            return tensors[key]
        return missing

    state = unflatten_state(tree, resolve, allow_objects=allow_objects, missing=missing) if tree is not None else {}
    if isinstance(state, dict):
        for key, tensor in tensors.items():
            if key not in placed:
                set_path(state, key, tensor)
    return state


def _targets(reader: CheckpointReader, spec: FragmentMap | None, tree: Any,
             into: dict[str, torch.Tensor] | None, strict: bool) -> dict[str, tuple[TensorSpec, tuple, str]]:
    """key -> (spec of the local tensor, its shape, its dtype) for everything to load."""
    logical = reader.logical()
    out: dict[str, tuple[TensorSpec, tuple, str]] = {}
    if spec is None:
        wanted = list(into) if into is not None else _identity_keys(tree, logical)
        missing = [k for k in wanted if k not in logical]
        unexpected = [n for n in logical if into is not None and n not in into]
        if strict and (missing or unexpected):
            raise _key_error(reader.path, missing, unexpected)
        for key in wanted:
            if key in logical:
                lt = logical[key]
                box = Box.full(lt.shape)
                out[key] = (TensorSpec(key, (ShardPiece(key, box, box),)), lt.shape, lt.dtype)
    else:
        spec.validate()
        missing = sorted({p.logical for t in spec.tensors.values() for p in t.pieces if p.logical not in logical})
        unexpected = [k for k in (into or {}) if k not in spec.tensors]
        if strict and (missing or unexpected):
            raise _key_error(reader.path, missing, unexpected)
        for key, tspec in spec.tensors.items():
            if into is not None and key not in into:
                if strict:
                    raise _key_error(reader.path, [key], [])
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
            _check_fits(reader, key, tspec, _local(into[key]), shape, dtype, exact=spec is None)
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


def _check_fits(reader, key, tspec, tensor, shape, dtype, *, exact: bool) -> None:
    got = (list(tensor.shape), dtype_name(tensor.dtype))
    fits = tuple(tensor.shape) == tuple(shape) if exact else all(
        (isinstance(p.local, Box) and len(p.local.sizes) == tensor.dim() and Box.full(tuple(tensor.shape)).contains(p.local))
        or (isinstance(p.local, FlatRange) and p.local.stop <= tensor.numel())
        for p in tspec.pieces
    )
    if not fits or got[1] != dtype:
        raise ShapeMismatchError(
            f"cannot load {key!r}: the checkpoint has {dtype}{list(shape)} but the tensor to load into is "
            f"{got[1]}{got[0]}; pass a tensor of that shape and dtype, or load without into= and convert"
        )


def _key_error(path: str, missing: list[str], unexpected: list[str]) -> KeyMismatchError:
    lines = [f"keys do not match checkpoint {path}:"]
    if missing:
        lines.append(f"  missing from the checkpoint ({len(missing)}): {', '.join(missing[:20])}" + (" ..." if len(missing) > 20 else ""))
    if unexpected:
        lines.append(f"  not expected by the target ({len(unexpected)}): {', '.join(unexpected[:20])}" + (" ..." if len(unexpected) > 20 else ""))
    lines.append("  pass strict=False to load only the keys both have")
    return KeyMismatchError("\n".join(lines))


def _fill(reader: CheckpointReader, logical: str, target: Region, local: Region, dest: torch.Tensor) -> None:
    if isinstance(local, Box):
        view = dest[local.slices()] if local.ndim else dest
        reader.read_into(logical, target, view)
        return
    if dest.is_contiguous():
        reader.read_into(logical, target, dest.view(-1)[local.start : local.stop])
        return
    # A flat range of a non-contiguous tensor has no view: stage it, then scatter.
    flat = dest.reshape(-1).clone()
    reader.read_into(logical, target, flat[local.start : local.stop])
    dest.copy_(flat.view(dest.shape))


def iter_tensors(path: str | os.PathLike, names: list[str] | None = None, *, verify: bool = True,
                 storage_options: dict | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(logical_name, tensor)`` one whole logical tensor at a time (bounded memory).

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"a": torch.zeros(2), "b": torch.ones(1)}, d)
    >>> [name for name, _ in ucp.iter_tensors(d)]
    ['a', 'b']
    """
    with CheckpointReader(os.fspath(path), verify=verify, storage_options=storage_options) as reader:
        yield from reader.iter_tensors(names)


def read_tensor(path: str | os.PathLike, name: str, region: Region | None = None, *, verify: bool = True,
                storage_options: dict | None = None) -> torch.Tensor:
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


def _is_dtensor(tensor: Any) -> bool:
    return type(tensor).__name__ == "DTensor"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def _spec_for_into(reader: CheckpointReader, into: dict[str, torch.Tensor], strict: bool) -> FragmentMap:
    """A fragment map for an ``into`` state holding DTensors (plain tensors: whole logical tensors)."""
    from ucp.dtensor import dtensor_spec

    logical = reader.logical()
    missing = [k for k in into if k not in logical]
    unexpected = [n for n in logical if n not in into]
    if strict and (missing or unexpected):
        raise _key_error(reader.path, missing, unexpected)
    specs, rank = {}, 0
    for key, tensor in into.items():
        if key not in logical:
            continue
        if _is_dtensor(tensor):
            import torch.distributed as dist

            rank = dist.get_rank()
            lt, specs[key] = dtensor_spec(key, tensor)
            if (lt.shape, lt.dtype) != (logical[key].shape, logical[key].dtype):
                raise ShapeMismatchError(
                    f"cannot load {key!r}: the checkpoint has {logical[key].dtype}{list(logical[key].shape)} but the "
                    f"DTensor to load into is {lt.dtype}{list(lt.shape)}; pass a DTensor of that global shape and dtype"
                )
        else:
            _check_fits(reader, key, None, tensor, logical[key].shape, logical[key].dtype, exact=True)
            box = Box.full(tuple(tensor.shape))
            specs[key] = TensorSpec(key, (ShardPiece(key, box, box),))
    return FragmentMap(rank=rank, logical=logical, tensors=specs)

