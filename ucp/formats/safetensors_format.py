"""Hugging Face safetensors: one file, or shards with ``model.safetensors.index.json``; in and out.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``name -> {"dtype", "shape", "data_offsets"}`` plus ``__metadata__``) and the
tensors' raw bytes. The reader checks the header against the file (known
dtypes, offsets that tile the data exactly, sizes that match shapes) before
anything else, then reads any region of a tensor with plain reads of the rows
it spans. The writer plans every shard's header up front from the tensor
list, so tensors (or row blocks of them) go straight to their offsets: memory
holds one block at a time. Shards are ``model-0000i-of-0000n.safetensors``
with the index ``from_pretrained`` reads (a folder is read as its index says,
else as ``model.safetensors``, else as all its ``.safetensors`` files); a destination ending in
``.safetensors`` is one file. The training state (step, param groups...)
travels as JSON in the index's ``metadata`` (one file: in ``__metadata__``)
under ``ucp_training_state``.

>>> import os, tempfile, torch
>>> from ucp.spec import LogicalTensor
>>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
>>> w = SafetensorsWriter(path, tensors=[LogicalTensor("w", (2,), "float32")])
>>> w.add("w", torch.ones(2)); w.set_state(TrainingState()); w.close()
>>> with SafetensorsReader(path) as r:
...     [(t.name, t.read()) for t in r.tensors()]
[('w', tensor([1., 1.]))]
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from typing import Any, Iterator, Sequence

import torch

from ucp.dtypes import UnsupportedDtypeError
from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, TrainingState, expect_block, parse_size, region_reader, register_format
from ucp.formats.rawio import flat_offset, read_box, write_at
from ucp.formats.tensor_geometry import check_geometry, check_span
from ucp.formats.staged_output import StagedOutput
from ucp.geometry import Box
from ucp.spec import LogicalTensor

__all__ = ["SafetensorsReader", "SafetensorsWriter", "read_header", "FORMAT"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
STATE_KEY = "ucp_training_state"
MAX_HEADER_BYTES = 100_000_000  # what the safetensors library accepts
DEFAULT_SHARD_BYTES = 5 << 30

# safetensors dtype name <-> torch dtype name (those both sides define).
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "C64": "complex64",
}
_TO_SAFETENSORS = {v: k for k, v in DTYPES.items()}


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


def read_header(path: str) -> tuple[dict, dict[str, tuple[str, tuple[int, ...], int]], int]:
    """``(metadata, {name: (torch dtype, shape, absolute byte offset)}, file size)`` of one file, checked.

    Raises :class:`~ucp.errors.FormatError` naming the file and the entry for a
    header that does not describe the file exactly.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise FormatError(f"{path} is not a safetensors file: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or n + 8 > size:
            raise FormatError(
                f"{path}: header length {n} does not fit in the file's {size} bytes "
                "(truncated or not a safetensors file)"
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{path}: the safetensors header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError(f"{path}: __metadata__ must map strings to strings")
    data_start, data_len = 8 + n, size - 8 - n
    entries: dict[str, tuple[str, tuple[int, ...], int]] = {}
    spans = []
    for name, entry in header.items():
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except KeyError as err:
            raise FormatError(f"{path}: tensor {name!r} has an unknown dtype or lacks {err} in the header") from None
        except (TypeError, ValueError):
            raise FormatError(f"{path}: tensor {name!r} has a malformed header entry {entry!r}") from None
        if any(s < 0 for s in shape) or not 0 <= begin <= end:
            raise FormatError(f"{path}: tensor {name!r} has negative sizes or offsets in the header")
        if end - begin != math.prod(shape) * _itemsize(dtype):
            raise FormatError(
                f"{path}: tensor {name!r} is {dtype}{list(shape)} "
                f"({math.prod(shape) * _itemsize(dtype)} bytes) but its data_offsets span {end - begin}"
            )
        if end > data_len:
            raise FormatError(
                f"{path}: tensor {name!r} ends at byte {end} of the data, but the file holds only "
                f"{data_len} bytes of data (truncated)"
            )
        # The checks every reader shares (the ones above word this format's own mistakes).
        check_geometry(f"{path}: tensor {name!r}", dtype=dtype, shape=shape, available=end - begin)
        check_span(
            f"{path}: tensor {name!r}", offset=begin, length=end - begin, available=data_len, container="the data"
        )
        spans.append((begin, end, name))
        entries[name] = (dtype, shape, data_start + begin)
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes before it"
            raise FormatError(f"{path}: tensor {name!r} at data bytes {begin}..{end} {what}")
        pos = end
    if pos != data_len:
        raise FormatError(f"{path}: {data_len - pos} bytes after the last tensor are not described by the header")
    return metadata, entries, size


class SafetensorsReader:
    """A safetensors file or sharded folder, opened for region reads (headers checked on open)."""

    format = "safetensors"

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self._files = _shard_files(self.path)
        self._fds: dict[str, int] = {}
        self._tensors: dict[str, tuple[str, str, tuple[int, ...], int]] = {}
        self._state = TrainingState()
        metadata: dict = {}
        for file in self._files:
            meta, entries, _ = read_header(file)
            metadata = metadata or meta
            for name, (dtype, shape, offset) in sorted(entries.items(), key=lambda kv: kv[1][2]):
                if name in self._tensors:
                    raise FormatError(f"{self.path}: tensor {name!r} is in both {self._tensors[name][0]} and {file}")
                self._tensors[name] = (file, dtype, shape, offset)
        index = self._index()
        if index is not None:
            for name, file in (index.get("weight_map") or {}).items():
                where = self._tensors.get(name)
                if where is None or os.path.basename(where[0]) != file:
                    raise FormatError(
                        f"{self._index_path()}: weight_map puts {name!r} in {file}, but that file "
                        "does not hold it; the index does not match the shards"
                    )
            metadata = index.get("metadata") or {}
        self._state = _state_from(metadata, self.path)

    def _index_path(self) -> str:
        return os.path.join(self.path, _index_name(self.path) or INDEX_NAME)

    def _index(self) -> dict | None:
        if not os.path.isdir(self.path) or _index_name(self.path) is None:
            return None
        return _load_index(self._index_path())

    def tensors(self) -> Iterator[TensorInfo]:
        for name, (file, dtype, shape, offset) in self._tensors.items():
            yield TensorInfo(
                name, dtype, shape, region_reader(shape, dtype, self._box_reader(name, file, dtype, shape, offset))
            )

    def _box_reader(self, name: str, file: str, dtype: str, shape: tuple[int, ...], offset: int):
        def read(box: Box) -> torch.Tensor:
            return read_box(self._fd(file), offset, shape, dtype, box, what=f"{file}: tensor {name!r}")

        return read

    def _fd(self, file: str) -> int:
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = os.open(file, os.O_RDONLY)
        return fd

    def state(self) -> TrainingState:
        return self._state

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "SafetensorsReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _index_name(folder: str) -> str | None:
    if os.path.isfile(os.path.join(folder, INDEX_NAME)):
        return INDEX_NAME
    found = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors.index.json"))
    return found[0] if len(found) == 1 else None


def _load_index(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            index = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise FormatError(f"{path} has no weight_map object; it is not a safetensors index")
    return index


def _shard_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FormatError(f"no file or directory at {path}")
    name = _index_name(path)
    if name is not None:
        files = sorted(set(_load_index(os.path.join(path, name))["weight_map"].values()))
        for file in files:
            if os.path.basename(file) != file or not os.path.isfile(os.path.join(path, file)):
                raise FormatError(f"{os.path.join(path, name)} names shard {file!r}, which is not in {path}")
        return [os.path.join(path, f) for f in files]
    if os.path.isfile(os.path.join(path, SINGLE_NAME)):  # a Hugging Face folder: the model is this file
        return [os.path.join(path, SINGLE_NAME)]
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise FormatError(f"{path} holds no .safetensors file")
    return [os.path.join(path, f) for f in files]


def _state_from(metadata: dict, path: str) -> TrainingState:
    raw = metadata.get(STATE_KEY)
    extra = {k: v for k, v in metadata.items() if k not in (STATE_KEY, "format", "total_size")}
    if raw is None:
        return TrainingState(extra={"safetensors_metadata": extra} if extra else {})
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        return TrainingState.from_dict(data)
    except (json.JSONDecodeError, AttributeError, TypeError) as err:
        raise FormatError(f"{path}: {STATE_KEY} in the metadata is not a training state ({err})") from None


def detect(path: str) -> bool:
    if os.path.isdir(path):
        names = os.listdir(path)
        return any(n.endswith(".safetensors.index.json") for n in names) or SINGLE_NAME in names
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        head = fh.read(9)
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return head[8:9] == b"{" and n + 8 <= os.path.getsize(path) and n <= MAX_HEADER_BYTES


class SafetensorsWriter:
    """Writes shards whose headers are planned up front; tensors go straight to their offsets."""

    format = "safetensors"

    def __init__(
        self,
        path: str,
        *,
        tensors: Sequence[LogicalTensor],
        overwrite: bool = False,
        block_bytes: int | None = None,
        state: TrainingState | None = None,
        shard_size: int | str = DEFAULT_SHARD_BYTES,
    ) -> None:
        for t in tensors:
            if t.dtype not in _TO_SAFETENSORS:
                raise UnsupportedDtypeError(
                    f"tensor {t.name!r} has dtype {t.dtype}, which safetensors cannot store "
                    f"(it stores {', '.join(sorted(_TO_SAFETENSORS))}); convert to another format"
                )
        self.path = os.fspath(path)
        self._single = self.path.endswith(".safetensors")
        self.takes_files = not self._single  # a folder: config.json and tokenizer files go beside the shards
        self._state = state
        self._planned = {t.name: t for t in tensors}
        shards = _plan_shards(tensors, 1 << 62 if self._single else parse_size(shard_size))
        self._out = StagedOutput(self.path, directory=not self._single, overwrite=overwrite)
        self._files: list[str] = []
        self._where: dict[str, tuple[int, int, LogicalTensor]] = {}  # name -> (file index, data offset, tensor)
        self._left: dict[str, int] = {}
        try:
            for i, shard in enumerate(shards):
                name = (
                    os.path.basename(self.path)
                    if self._single
                    else SINGLE_NAME
                    if len(shards) == 1
                    else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                )
                self._files.append(self._out.staging if self._single else self._out.join(name))
                self._write_header(i, shard)
        except BaseException:
            self._out.abort()
            raise
        self._names = [os.path.basename(f) if not self._single else "" for f in self._files]
        self._fd: tuple[int, int] | None = None

    def _write_header(self, index: int, shard: list[LogicalTensor]) -> None:
        metadata = {"format": "pt"}
        if self._single and self._state is not None:
            metadata[STATE_KEY] = json.dumps(self._state.to_dict())
        header: dict[str, Any] = {"__metadata__": metadata}
        pos = 0
        for t in shard:
            nbytes = math.prod(t.shape) * _itemsize(t.dtype)
            header[t.name] = {
                "dtype": _TO_SAFETENSORS[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [pos, pos + nbytes],
            }
            self._where[t.name] = (index, pos, t)
            self._left[t.name] = nbytes
            pos += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the safetensors library writes it
        for t in shard:
            i, offset, _ = self._where[t.name]
            self._where[t.name] = (i, 8 + len(raw) + offset, t)
        with open(self._files[index], "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(8 + len(raw) + pos)

    def _file(self, index: int) -> int:
        if self._fd is None or self._fd[0] != index:
            self._close_fd()
            self._fd = (index, os.open(self._files[index], os.O_WRONLY))
        return self._fd[1]

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd[1])
            self._fd = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.add_region(name, Box.full(tuple(tensor.shape)), tensor)

    def add_region(self, name: str, region: Box, tensor: torch.Tensor) -> None:
        """Write a contiguous row-major box of ``name`` (one of ``blocks(...)``) at its place."""
        t = expect_block(self._planned, name, region, tensor)
        index, offset, _ = self._where[name]
        start = flat_offset(t.shape, region.offsets) * _itemsize(t.dtype) if t.shape else 0
        self._left[name] -= write_at(self._file(index), offset + start, tensor)

    def add_file(self, name: str, source: str) -> None:
        """Copy ``source`` into the folder as ``name`` (config.json, tokenizer files), committed with the shards."""
        if self._single:
            raise ValueError(f"{self.path} is one .safetensors file; {name} needs a folder destination")
        if name in self._names or name == INDEX_NAME or os.path.basename(name) != name:
            raise ValueError(f"{name!r} is not a side file this writer can add (it names one of the weight files)")
        shutil.copyfile(source, self._out.join(name))

    def set_state(self, state: TrainingState) -> None:
        if self._single and self._state is not None and state.to_dict() != self._state.to_dict():
            raise ValueError(
                "a single safetensors file stores the training state in its header, written when the "
                "writer was opened: pass the same state= to open_writer"
            )
        self._state = state

    def close(self) -> None:
        try:
            self._close_fd()
            unwritten = [n for n, left in self._left.items() if left]
            if unwritten:
                raise ValueError(f"tensors never written completely: {', '.join(unwritten[:10])}")
            has_state = self._state is not None and self._state != TrainingState()
            if not self._single and (len(self._files) > 1 or has_state):
                self._write_index(self._state if has_state else None)
            self._out.commit()
        except BaseException:
            self._out.abort()
            raise

    def _write_index(self, state: TrainingState | None) -> None:
        """The index ``from_pretrained`` reads for shards (also beside one shard, to carry the state)."""
        total = sum(math.prod(t.shape) * _itemsize(t.dtype) for _, _, t in self._where.values())
        metadata: dict[str, Any] = {"total_size": total}
        if state is not None:
            metadata[STATE_KEY] = json.dumps(state.to_dict())
        index = {
            "metadata": metadata,
            "weight_map": {n: self._names[i] for n, (i, _, _) in sorted(self._where.items())},
        }
        with open(self._out.join(INDEX_NAME), "w", encoding="utf-8") as fh:
            json.dump(index, fh, indent=2)

    def abort(self) -> None:
        self._close_fd()
        self._out.abort()


def _plan_shards(tensors: Sequence[LogicalTensor], shard_bytes: int) -> list[list[LogicalTensor]]:
    """Shards in the given order, each under ``shard_bytes`` unless one tensor is larger.

    Within a shard, tensors are ordered by item size (largest first) so every
    offset is a multiple of its item size, as in files the safetensors library writes.
    """
    shards: list[list[LogicalTensor]] = [[]]
    size = 0
    for t in tensors:
        nbytes = math.prod(t.shape) * _itemsize(t.dtype)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    return [sorted(s, key=lambda t: -_itemsize(t.dtype)) for s in shards]


FORMAT = register_format(
    Format(
        name="safetensors",
        description="Hugging Face safetensors: a .safetensors file, or a folder of shards with model.safetensors.index.json",
        detect=detect,
        open_reader=SafetensorsReader,
        open_writer=SafetensorsWriter,
    )
)
