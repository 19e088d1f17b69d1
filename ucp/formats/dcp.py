"""PyTorch Distributed Checkpoint (DCP) folders, in and out, through DCP's own storage layer.

**In.** A DCP folder holds ``.metadata`` (a pickle of DCP's ``Metadata``: per key
the global shape and the chunks each rank saved, plus where each chunk's bytes
are) and the data files. ``.metadata`` is unpickled by the restricted unpickler
allowing DCP's metadata classes only; a region read asks
``FileSystemReader.read_data`` for exactly the chunks that overlap it (each
chunk is one rank's shard: FSDP2's uneven shards included) with a
:class:`~torch.distributed.checkpoint.planner.ReadItem` per overlap, computed
with :mod:`ucp.geometry`. Non-tensor entries (param groups, step) are read once
on open, through the restricted unpickler too. DCP's ``planner_data`` gives the
nested state back, named by :func:`ucp.formats.naming.split_tree`
(``{"model": ..., "optim": ...}`` as ``get_state_dict`` + ``dcp.save`` write it).

**Out.** The nested state ``{"model": ..., "optim": {"state", "param_groups"},
"step": ...}`` flattened as DCP flattens it, written with DCP's
``FileSystemWriter``: tensors go out in batches as they arrive (a tensor larger
than the block size as several chunks), each batch through ``write_data``; the
metadata last (``finish``), then the folder is renamed into place. Anything that
calls ``dcp.load`` - any world size, FSDP2 or plain tensors - reads it.

>>> import os, tempfile, torch
>>> from ucp.spec import LogicalTensor
>>> path = os.path.join(tempfile.mkdtemp(), "dcp")
>>> w = DcpWriter(path, tensors=[LogicalTensor("w", (2,), "float32")])
>>> w.add("w", torch.ones(2)); w.set_state(TrainingState()); w.close()
>>> import torch.distributed.checkpoint as dcp
>>> sd = {"model": {"w": torch.zeros(2)}}
>>> dcp.load(sd, checkpoint_id=path, no_dist=True); sd["model"]["w"]
tensor([1., 1.])
"""

from __future__ import annotations

import io
import math
import os
import pickle
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ucp.dtypes import allocate, dtype_name
from ucp.errors import FormatError, UcpError, UnsafePickleError
from ucp.formats.base import Format, TensorInfo, TrainingState, expect_block, region_reader, register_format
from ucp.formats.naming import build_tree, split_tree, unplain
from ucp.formats.rawio import read_box
from ucp.formats.staged_output import StagedOutput
from ucp.formats.tensor_geometry import check_geometry, check_span
from ucp.geometry import Box, coverage_gaps
from ucp.spec import LogicalTensor

__all__ = ["DcpReader", "DcpWriter", "read_metadata", "FORMAT"]

METADATA_NAME = ".metadata"
# What a DCP .metadata pickle may name: DCP's plain dataclasses (and their older homes).
METADATA_CLASSES = tuple(
    f"torch.distributed.checkpoint.metadata.{n}"
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
) + (
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.distributed.checkpoint.filesystem._StoragePrefix",
    "torch.serialization._get_layout",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
)


def read_metadata(path: str) -> Any:
    """DCP's ``Metadata`` of the folder at ``path``, unpickled restricted to DCP's metadata classes."""
    from torch.distributed.checkpoint.metadata import Metadata

    from ucp import unpickle

    file = os.path.join(path, METADATA_NAME)
    try:
        with open(file, "rb") as fh:
            metadata = unpickle.load(fh, allow=METADATA_CLASSES, unknown="refuse")
    except FileNotFoundError:
        raise FormatError(f"{path} is not a DCP checkpoint: it has no {METADATA_NAME}") from None
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{file}: {err}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise FormatError(
            f"{file} cannot be read as DCP metadata ({type(err).__name__}: {err}); the file is damaged or truncated"
        ) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise FormatError(f"{file} does not hold DCP Metadata (found {type(metadata).__name__})")
    return metadata


@dataclass(frozen=True)
class _DcpTensor:
    """A tensor entry of the metadata (a leaf of the rebuilt nested state)."""

    fqn: str


class _Sink:
    """What ``FileSystemReader.read_data`` calls back: copy chunk overlaps into ``out``, unpickle bytes."""

    def __init__(self, out: torch.Tensor | None = None) -> None:
        self.out = out
        self.values: dict[str, Any] = {}

    def resolve_tensor(self, item: Any) -> torch.Tensor:
        view = self.out
        assert view is not None, "only a sink made with out= resolves tensors"
        for dim, (start, length) in enumerate(zip(item.dest_offsets, item.lengths, strict=True)):
            view = view.narrow(dim, start, length)
        return view

    def commit_tensor(self, item: Any, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor handed out a view of ``out``: the bytes are already in place

    def load_bytes(self, item: Any, value: io.BytesIO) -> None:
        from ucp.unpickle import torch_load

        self.values[item.dest_index.fqn] = torch_load(value, unknown="stand-in")


class DcpReader:
    """A DCP folder opened for region reads (metadata checked on open)."""

    format = "dcp"

    def __init__(self, path: str) -> None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

        self.path = os.fspath(path)
        self._metadata = read_metadata(self.path)
        self._storage = FileSystemReader(self.path)
        self._storage.set_up_storage_reader(self._metadata, True)
        entries = self._metadata.state_dict_metadata
        tensors = {k: v for k, v in entries.items() if isinstance(v, TensorStorageMetadata)}
        for fqn, md in tensors.items():
            self._check_tensor(fqn, md)
        byte_keys = [k for k, v in entries.items() if isinstance(v, BytesStorageMetadata)]
        unknown = [k for k in entries if k not in tensors and k not in byte_keys]
        if unknown:
            raise FormatError(f"{self.path}: entries {unknown[:5]} are neither tensors nor bytes in the metadata")
        paths = _planner_paths(os.path.join(self.path, METADATA_NAME), self._metadata.planner_data, entries)
        values = self._read_bytes(byte_keys)
        tree = _nest({paths[k]: _DcpTensor(k) if k in tensors else values[k] for k in entries})
        self._names, self._state = split_tree(tree, lambda v: isinstance(v, _DcpTensor))
        self._tensors = tensors
        self._dtypes = {fqn: dtype_name(md.properties.dtype) for fqn, md in tensors.items()}
        # Direct reads: where each chunk's bytes are, found on first use; open data files.
        self._records: dict[tuple, tuple[Any, int] | None] = {}
        self._files: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _check_tensor(self, fqn: str, md: Any) -> None:
        what = f"{os.path.join(self.path, METADATA_NAME)}: tensor {fqn!r}"
        properties = getattr(md, "properties", None)
        checked = check_geometry(what, dtype=getattr(properties, "dtype", None), shape=md.size, available=math.inf)
        shape, dtype = checked.shape, checked.dtype
        boxes = []
        if not isinstance(md.chunks, (list, tuple)):
            raise FormatError(f"{what} has chunks {md.chunks!r}, not a list (damaged or hostile file)")
        for chunk in md.chunks:
            box = Box(
                *(
                    check_geometry(f"{what}, a chunk", dtype="uint8", shape=value, available=math.inf).shape
                    for value in (getattr(chunk, "offsets", None), getattr(chunk, "sizes", None))
                )
            )
            if len(box.sizes) != len(shape) or not Box.full(shape).contains(box):
                raise FormatError(f"{self.path}: chunk {box} of {fqn!r} does not fit its shape {list(shape)}")
            if box.numel:
                info = self._storage.storage_data.get(_index(fqn, box.offsets))
                if info is None:
                    raise FormatError(f"{self.path}: chunk {box} of {fqn!r} has no storage entry in the metadata")
                self._check_file(fqn, info)
                if box.numel * getattr(torch, dtype).itemsize > info.length:  # a saved chunk holds its bytes
                    raise FormatError(
                        f"{what}: chunk {box} is {box.numel} elements, but its storage entry holds "
                        f"{info.length} bytes (damaged or hostile metadata)"
                    )
                boxes.append(box)
        if shape and coverage_gaps(boxes, shape) != (0, []) or not shape and len(boxes) < 1:
            raise FormatError(f"{self.path}: the chunks of {fqn!r} do not cover its shape {list(shape)} exactly once")

    def _check_file(self, fqn: str, info: Any) -> None:
        if not isinstance(getattr(info, "relative_path", None), str):
            raise FormatError(f"{self.path}: the storage entry of {fqn!r} names no file (damaged or hostile metadata)")
        file = os.path.join(self.path, info.relative_path)
        if os.path.isabs(info.relative_path) or ".." in info.relative_path.replace("\\", "/").split("/"):
            raise FormatError(f"{self.path}: {fqn!r} points outside the folder ({info.relative_path!r})")
        try:
            size = os.path.getsize(file)
        except OSError:
            raise FormatError(f"{self.path}: data file {info.relative_path!r} of {fqn!r} is missing") from None
        check_span(
            f"{self.path}: {fqn!r}",
            offset=info.offset,
            length=info.length,
            available=size,
            container=repr(info.relative_path),
        )

    def _read_bytes(self, keys: list[str]) -> dict[str, Any]:
        from torch.distributed.checkpoint.metadata import MetadataIndex
        from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

        items = []
        for key in keys:
            info = self._storage.storage_data.get(MetadataIndex(key))
            if info is None:
                raise FormatError(f"{self.path}: entry {key!r} has no storage entry in the metadata")
            self._check_file(key, info)
            index = MetadataIndex(key)
            items.append(
                ReadItem(LoadItemType.BYTE_IO, index, torch.Size([0]), index, torch.Size([0]), torch.Size([0]))
            )
        sink = _Sink()
        self._run(LoadPlan(items), sink, "non-tensor entries")
        return sink.values

    def _run(self, plan: Any, sink: _Sink, what: str) -> None:
        try:
            self._storage.read_data(plan, sink).wait()  # type: ignore[arg-type]  # _Sink has the LoadPlanner methods read_data calls
        except UcpError:
            raise
        except Exception as err:  # noqa: BLE001 - DCP's reader on damaged or hostile bytes can raise anything
            raise FormatError(
                f"{self.path}: reading {what} failed ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); the data files are damaged"
            ) from None

    def tensors(self) -> Iterator[TensorInfo]:
        for name, leaf in self._names.items():
            md = self._tensors[leaf.fqn]
            shape, dtype = tuple(md.size), dtype_name(md.properties.dtype)
            yield TensorInfo(name, dtype, shape, region_reader(shape, dtype, self._box_reader(leaf.fqn, md, dtype)))

    def _box_reader(self, fqn: str, md: Any, dtype: str):
        from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

        def read(box: Box) -> torch.Tensor:
            out = allocate(box.sizes, dtype, what=f"{self.path}: {fqn!r}")
            items = []
            for chunk in md.chunks:
                cbox = Box(tuple(chunk.offsets), tuple(chunk.sizes))
                overlap = cbox.intersect(box) if box.ndim else box
                if overlap is None or (box.ndim and overlap.is_empty()):
                    continue
                if box.ndim and self._read_direct(fqn, cbox, dtype, overlap, out, box):
                    continue
                items.append(
                    ReadItem(
                        LoadItemType.TENSOR,
                        _index(fqn, box.offsets),
                        torch.Size(overlap.relative_to(box).offsets),
                        _index(fqn, cbox.offsets),
                        torch.Size(overlap.relative_to(cbox).offsets),
                        torch.Size(overlap.sizes),
                    )
                )
                if not box.ndim:
                    break
            if items:
                self._run(LoadPlan(items), _Sink(out), f"tensor {fqn!r}")
            return out

        return read

    def _read_direct(self, fqn: str, cbox: Box, dtype: str, overlap: Box, out: torch.Tensor, box: Box) -> bool:
        """Copy ``overlap`` of chunk ``cbox`` into ``out`` (which holds ``box``) straight from its storage
        record; False where only DCP's own reader can (a stream transform such as compression, or a
        chunk that is not a plain contiguous tensor of the announced shape and dtype)."""
        where = self._chunk_record(fqn, cbox)
        if where is None:
            return False
        file, offset = where
        view = out
        for dim, (start, length) in enumerate(zip(overlap.relative_to(box).offsets, overlap.sizes, strict=True)):
            view = view.narrow(dim, start, length)
        read_box(
            file.fileno(),
            offset,
            cbox.sizes,
            dtype,
            overlap.relative_to(cbox),
            what=f"{self.path}: chunk {cbox} of {fqn!r}",
            into=view,
        )
        return True

    def _chunk_record(self, fqn: str, cbox: Box) -> tuple[Any, int] | None:
        key = (fqn, cbox.offsets)
        with self._lock:
            if key not in self._records:
                self._records[key] = self._locate(fqn, cbox)
            return self._records[key]

    def _locate(self, fqn: str, cbox: Box) -> tuple[Any, int] | None:
        # Imported here: importing the module registers the torch format, which must stay last in order.
        from ucp.formats.torch_file import saved_tensor_at

        info = self._storage.storage_data[_index(fqn, cbox.offsets)]
        if info.transform_descriptors:
            return None
        file = self._files.get(info.relative_path)
        if file is None:
            file = self._files[info.relative_path] = open(os.path.join(self.path, info.relative_path), "rb")  # noqa: SIM115 - kept for the next read; close() closes it
        try:
            lazy, offset = saved_tensor_at(file.name, info.offset, info.length, file)
        except FormatError:
            return None  # DCP's own reader decides (and names the damage)
        if lazy.shape != cbox.sizes or lazy.dtype != self._dtypes[fqn] or not lazy.contiguous():
            return None
        return file, offset

    def state(self) -> TrainingState:
        return self._state

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()

    def __enter__(self) -> "DcpReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _index(fqn: str, offsets: tuple[int, ...]) -> Any:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    return MetadataIndex(fqn, torch.Size(offsets))


def _planner_paths(file: str, planner_data: Any, entries: dict) -> dict[str, tuple]:
    """Each entry's path in the nested state, from DCP's ``planner_data`` (an entry it lacks is its own key).

    Refused, naming the entries: a path that is not a non-empty list of names and indices, two entries
    with the same path (one would be dropped), and a path that is a prefix of another (a value that
    would have to be a dict as well).
    """
    data = planner_data if isinstance(planner_data, dict) else {}
    paths: dict[str, tuple] = {}
    for key in entries:
        path = data.get(key, (key,))
        if (
            not isinstance(path, (tuple, list))
            or not path
            or not all(isinstance(p, str) or isinstance(p, int) and not isinstance(p, bool) for p in path)
        ):
            raise FormatError(
                f"{file}: planner_data gives entry {key!r} the path {path!r}; a path is a non-empty "
                "list of names and list indices (damaged or hostile metadata)"
            )
        paths[key] = tuple(path)
    owner: dict[tuple, str] = {}
    for key, path in sorted(paths.items(), key=lambda kv: len(kv[1])):
        for n in range(1, len(path) + 1):
            other = owner.get(path[:n])
            if other is not None:
                how = "the same path" if n == len(path) else f"a path inside {other!r}'s"
                raise FormatError(
                    f"{file}: planner_data gives entries {other!r} and {key!r} {how} "
                    f"({list(path[:n])!r}); one of them would be lost (damaged or hostile metadata)"
                )
        owner[path] = key
    return paths


def _nest(flat: dict[tuple, Any]) -> dict:
    """Nested dicts and lists from DCP's ``planner_data`` paths (ints index lists)."""
    root: dict = {}
    for path, value in flat.items():
        node = root
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value

    def lists(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        node = {k: lists(v) for k, v in node.items()}
        if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
            return [node[i] for i in range(len(node))]
        return node

    return lists(root)


def detect(path: str) -> bool:
    return os.path.isfile(os.path.join(path, METADATA_NAME))


def _flatten(tree: dict, is_tensor) -> dict[str, tuple[tuple, Any]]:
    """DCP's flattening: ``fqn -> (path, leaf)``; lists are walked only when they hold tensors or dicts.

    Unlike DCP's own, an empty dict is kept as a value: dropping it would lose it on the way back.
    """
    out: dict[str, tuple[tuple, Any]] = {}

    def terminal(value: Any) -> bool:
        if isinstance(value, dict):
            return not value
        if not isinstance(value, list):
            return True
        return all(not (isinstance(e, (dict, list)) and not terminal(e)) and not is_tensor(e) for e in value)

    def walk(path: tuple, value: Any) -> None:
        if isinstance(value, dict) and value:  # an empty dict is a value of its own (DCP would drop it)
            for k, v in value.items():
                walk(path + (str(k),), v)
        elif terminal(value):
            fqn = ".".join(map(str, path))
            if fqn in out:
                raise FormatError(f"two entries flatten to the DCP key {fqn!r}; rename one before converting")
            out[fqn] = (path, value)
        else:
            for i, v in enumerate(value):
                walk(path + (i,), v)

    for key, value in tree.items():
        walk((str(key),), value)
    return out


@dataclass(frozen=True)
class _Name:
    """A tensor leaf of the tree being written."""

    name: str


class _Source:
    """What ``FileSystemWriter.write_data`` calls back: the data of each write item of one batch."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def resolve_data(self, item: Any) -> Any:
        return self.data[(item.index.fqn, tuple(item.index.offset or ()))]


class DcpWriter:
    """Writes a DCP folder batch by batch with ``FileSystemWriter``; the metadata commits it."""

    format = "dcp"

    def __init__(
        self,
        path: str,
        *,
        tensors: Sequence[LogicalTensor],
        overwrite: bool = False,
        block_bytes: int | None = None,
        state: TrainingState | None = None,
    ) -> None:
        from torch.distributed.checkpoint import FileSystemWriter

        self.path = os.fspath(path)
        self._state = state if state is not None else TrainingState()
        self._tensors = {t.name: t for t in tensors}
        tree = unplain(build_tree(list(self._tensors), self._state, _Name))
        self._flat = _flatten(tree, lambda v: isinstance(v, _Name))
        self._fqn = {leaf.name: fqn for fqn, (_, leaf) in self._flat.items() if isinstance(leaf, _Name)}
        self._chunks: dict[str, list[Box]] = {n: [] for n in self._tensors}
        self._batch_bytes = block_bytes if block_bytes else 1 << 30
        self._pending: dict = {}
        self._pending_items: list = []
        self._pending_bytes = 0
        self._results: list = []
        self._batches = 0
        self._out = StagedOutput(self.path, directory=True, overwrite=overwrite)
        self._storage = FileSystemWriter(self._out.staging, single_file_per_rank=True, sync_files=True, thread_count=1)
        self._storage.set_up_storage_writer(True)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.add_region(name, Box.full(tuple(tensor.shape)), tensor)

    def add_region(self, name: str, region: Box, tensor: torch.Tensor) -> None:
        """Write ``region`` of ``name`` as one DCP chunk (queued; written with its batch of ``block_bytes``)."""
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        t = expect_block(self._tensors, name, region, tensor)
        fqn = self._fqn[name]
        self._chunks[name].append(region)
        item = WriteItem(
            index=_index(fqn, region.offsets),
            type=WriteItemType.TENSOR,
            tensor_data=TensorWriteData(
                chunk=ChunkStorageMetadata(torch.Size(region.offsets), torch.Size(region.sizes)),
                properties=TensorProperties(dtype=tensor.dtype),
                size=torch.Size(t.shape),
            ),
        )
        self._pending[(fqn, region.offsets)] = tensor.detach()
        self._pending_items.append(item)
        self._pending_bytes += tensor.numel() * tensor.element_size()
        if self._pending_bytes >= self._batch_bytes:
            self._flush()

    def _flush(self) -> None:
        from torch.distributed.checkpoint.planner import SavePlan

        if not self._pending_items:
            return
        plan = self._storage.prepare_local_plan(SavePlan(self._pending_items))
        # Each batch is written like one rank's plan, so its files get their own prefix (__<batch>_).
        plan = self._storage.prepare_global_plan([SavePlan([])] * self._batches + [plan])[self._batches]
        self._results.extend(self._storage.write_data(plan, _Source(self._pending)).wait())  # type: ignore[arg-type]  # as _Sink
        self._batches += 1
        self._pending, self._pending_items, self._pending_bytes = {}, [], 0

    def set_state(self, state: TrainingState) -> None:
        if state.to_dict() != self._state.to_dict():
            raise ValueError(
                "the DCP writer names its entries from the training state given when it is opened: "
                "pass the same state= to open_writer"
            )

    def close(self) -> None:
        from torch.distributed.checkpoint.metadata import (
            BytesStorageMetadata,
            ChunkStorageMetadata,
            Metadata,
            TensorProperties,
            TensorStorageMetadata,
        )
        from torch.distributed.checkpoint.metadata import MetadataIndex
        from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

        try:
            self._flush()
            missing = [
                n for n, t in self._tensors.items() if sum(b.numel for b in self._chunks[n]) != Box.full(t.shape).numel
            ]
            if missing:
                raise ValueError(f"tensors never written completely: {', '.join(missing[:10])}")
            entries: dict[str, Any] = {}
            for fqn, (_, leaf) in self._flat.items():
                if isinstance(leaf, _Name):
                    t = self._tensors[leaf.name]
                    chunks = [
                        ChunkStorageMetadata(torch.Size(b.offsets), torch.Size(b.sizes))
                        for b in self._chunks[leaf.name]
                    ]
                    entries[fqn] = TensorStorageMetadata(
                        TensorProperties(dtype=getattr(torch, t.dtype)), torch.Size(t.shape), chunks
                    )
                else:
                    entries[fqn] = BytesStorageMetadata()
                    buffer = io.BytesIO()
                    torch.save(leaf, buffer)
                    buffer.seek(0)
                    self._pending[(fqn, ())] = buffer
                    self._pending_items.append(WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO))
            self._flush()
            metadata = Metadata(
                state_dict_metadata=entries, planner_data={fqn: path for fqn, (path, _) in self._flat.items()}
            )
            self._storage.finish(metadata, [self._results])
            self._out.commit()
        except BaseException:
            self._out.abort()
            raise

    def abort(self) -> None:
        self._out.abort()


FORMAT = register_format(
    Format(
        name="dcp",
        description="PyTorch Distributed Checkpoint folder (.metadata + .distcp files), e.g. FSDP2",
        detect=detect,
        open_reader=DcpReader,
        open_writer=DcpWriter,
    )
)
