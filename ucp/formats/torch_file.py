"""One ``torch.save`` file, in and out, streaming.

**In.** A torch.save file (zip format, torch >= 1.6) is a pickle (``data.pkl``)
whose tensors point at raw storage records (``data/<key>``). The reader
unpickles ``data.pkl`` with the restricted unpickler (:mod:`ucp.unpickle`:
nothing in the file runs, foreign classes become inert stand-ins) but turns
every tensor into a :class:`LazyTensor` - storage key, offset, shape, stride -
so opening reads no tensor bytes and a region read reads only the rows it
spans, straight from the record. Old non-zip files are read whole (the
restricted unpickler, then regions of the tensors in memory). Names come from
:func:`ucp.formats.naming.split_tree`.

**Out.** The writer builds the nested state (:func:`ucp.formats.naming.build_tree`)
around empty tensors, lets ``torch.save`` write the pickle and reserve each
storage record (``torch.serialization.skip_data``), then writes each tensor's
bytes, or each block of them, into its record and fixes the records' CRC-32s:
the file is an ordinary torch.save file (``torch.load`` with or without mmap,
any zip tool), written without ever holding the state in memory.

>>> import os, tempfile, torch
>>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
>>> torch.save({"model": {"fc.weight": torch.eye(2)}, "step": 4}, path)
>>> with TorchFileReader(path) as r:
...     [(t.name, t.shape) for t in r.tensors()], r.state().step
([('fc.weight', (2, 2))], 4)
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Sequence

import torch

from ucp.dtypes import dtype_name
from ucp.errors import FormatError, UnsafePickleError
from ucp.formats.base import (
    Format,
    StoredBytes,
    TensorInfo,
    TrainingState,
    expect_block,
    region_reader,
    register_format,
    slice_region,
)
from ucp.formats.naming import build_tree, split_tree, unplain
from ucp.formats.rawio import flat_offset, read_box, write_at
from ucp.formats.staged_output import StagedOutput
from ucp.formats.tensor_geometry import Geometry, check_geometry, check_loaded
from ucp.geometry import Box, Region
from ucp.spec import LogicalTensor
from ucp.unpickle import RestrictedUnpickler, torch_load

__all__ = ["LazyTensor", "TorchFileReader", "TorchFileWriter", "FORMAT"]

# torch's legacy (non-zip) files start with this pickled magic number.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


@dataclass(frozen=True)
class LazyTensor:
    """A tensor of a torch.save file, not yet read: where its elements are in which storage record."""

    key: str
    storage_dtype: str
    storage_numel: int
    offset: int  # in elements of ``dtype``
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    @property
    def geometry(self) -> Geometry:
        """Its geometry (checked only once :func:`checked_tensor` made it)."""
        return Geometry(self.dtype, self.shape, self.stride, self.offset)

    def contiguous(self) -> bool:
        return self.geometry.contiguous()


class _LazyUnpickler(RestrictedUnpickler):
    """The restricted unpickler, with tensors rebuilt as :class:`LazyTensor` instead of being read."""

    def __init__(self, file: Any, source: str = "") -> None:
        super().__init__(file, unknown="stand-in", source=source)
        self.persistent_load = self._storage  # type: ignore[method-assign]  # as torch.load does

    def _storage(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsafePickleError(f"the pickle refers to an external object {pid!r}, which torch.save never writes")
        _, storage_type, key, _location, numel = pid
        with warnings.catch_warnings():  # legacy storage classes warn on any use; .dtype is all we need
            warnings.simplefilter("ignore")
            dtype = getattr(storage_type, "dtype", torch.uint8)
        if not isinstance(dtype, torch.dtype):
            raise FormatError(f"storage {key!r} has an unknown storage type {storage_type!r}")
        return ("storage", str(key), dtype_name(dtype), numel)

    def find_class(self, module: str, name: str) -> Any:
        rebuild = _REBUILDS.get(f"{module}.{name}")
        return rebuild if rebuild is not None else super().find_class(module, name)


def _rebuild(storage: Any, offset: int, size: Any, stride: Any, *_: Any, dtype: torch.dtype | None = None) -> Any:
    if not (isinstance(storage, tuple) and storage and storage[0] == "storage"):
        raise FormatError("a tensor in the pickle has no storage record; the file is damaged")
    _, key, storage_dtype, numel = storage
    name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else storage_dtype if dtype is None else dtype
    # Kept as the pickle states them: the reader checks them (tensor_geometry) once it knows the tensor's name.
    return LazyTensor(key, storage_dtype, numel, offset, size, stride, name)


def _rebuild_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    return _rebuild(storage, offset, size, stride, dtype=dtype)


_REBUILDS = {
    "torch._utils._rebuild_tensor": _rebuild,
    "torch._utils._rebuild_tensor_v2": _rebuild,
    "torch._utils._rebuild_tensor_v3": _rebuild_v3,
    "torch._utils._rebuild_parameter": lambda data, *rest: data,
    "torch._utils._rebuild_parameter_with_state": lambda data, *rest: data,
}


def _is_tensor(value: Any) -> bool:
    return isinstance(value, (LazyTensor, torch.Tensor))


class _Window(io.RawIOBase):
    """Bytes ``[start, start + length)`` of a file as a seekable file of their own (a zip stored inside
    another file, as DCP stores each tensor: zipfile then reads it without copying the whole blob)."""

    def __init__(self, fh: Any, start: int, length: int) -> None:
        self._fh, self._start, self._length, self._pos = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._length - self._pos)
        size = left if size is None or size < 0 else min(size, left)
        self._fh.seek(self._start + self._pos)
        data = self._fh.read(size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _record_offsets(
    path: str, fh: Any = None, base: int = 0
) -> tuple[str, dict[str, tuple[int, int, int]], zipfile.ZipFile]:
    """``(archive prefix, {record name: (data offset, size, compression)}, zip)``: where each record's bytes are.

    ``fh`` (a :class:`_Window`) reads a zip stored inside ``path`` from byte ``base`` on; offsets are
    then still offsets in ``path``.
    """
    try:
        archive = zipfile.ZipFile(fh if fh is not None else path)
    except (zipfile.BadZipFile, OSError) as err:
        raise FormatError(f"{path} is not a readable torch.save file: {err}") from None
    names = archive.namelist()
    pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        raise FormatError(f"{path}: a torch.save archive holds one data.pkl; found {len(pkl)}")
    prefix = pkl[0][: -len("data.pkl")]
    offsets = {}
    with open(path, "rb") if fh is None else contextlib.nullcontext(fh) as source:
        for info in archive.infolist():
            source.seek(info.header_offset)
            local = source.read(30)
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                raise FormatError(f"{path}: the zip entry {info.filename!r} has no local header (damaged file)")
            n, m = struct.unpack("<HH", local[26:30])
            offsets[info.filename] = (base + info.header_offset + 30 + n + m, info.file_size, info.compress_type)
    return prefix, offsets, archive


def saved_tensor_at(path: str, start: int, length: int, fh: Any) -> tuple[LazyTensor, int]:
    """The one tensor ``torch.save`` wrote into bytes ``[start, start + length)`` of ``path``, unread:
    its description and the file offset of its storage record (``fh``: ``path`` opened ``"rb"``).

    This is how DCP's ``FileSystemWriter`` stores each chunk; reading the record's bytes straight
    into place avoids ``torch.load`` allocating and copying the whole chunk. Anything else there
    (another object, a compressed or short record) is a :class:`FormatError`.
    """
    window = _Window(fh, start, length)
    # torch.save ends its archive with the end-of-directory record (no comment): a window that ends
    # anywhere else is not one archive, and zipfile would go looking for another one's directory
    # in front of it (the previous chunk's) and read that tensor instead.
    window.seek(max(0, length - 22))
    if length < 22 or window.read(22)[:4] != b"PK\x05\x06":
        raise FormatError(
            f"{path}: bytes {start}..{start + length} do not end where a torch.save archive ends "
            "(damaged metadata or data file)"
        )
    window.seek(0)
    prefix, offsets, archive = _record_offsets(path, window, start)
    try:
        value = _LazyUnpickler(io.BytesIO(archive.read(prefix + "data.pkl")), f"{path} (bytes {start}..)").load()
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, zlib.error) as err:
        if isinstance(err, FormatError):
            raise
        raise FormatError(
            f"{path}: the tensor saved at byte {start} cannot be read ({type(err).__name__}: {err})"
        ) from None
    finally:
        archive.close()
    if not isinstance(value, LazyTensor):
        raise FormatError(f"{path}: bytes {start}..{start + length} hold a {type(value).__name__}, not a tensor")
    record = offsets.get(prefix + "data/" + value.key)
    if record is None or record[2] != zipfile.ZIP_STORED:
        raise FormatError(f"{path}: the tensor saved at byte {start} has a missing or compressed storage record")
    value = checked_tensor(f"{path}: the tensor saved at byte {start}", value, record[1])
    return value, record[0] + value.offset * getattr(torch, value.dtype).itemsize


def checked_tensor(what: str, t: LazyTensor, record_bytes: int) -> LazyTensor:
    """``t`` with its geometry checked (:mod:`ucp.formats.tensor_geometry`) against its storage, which the
    pickle says holds ``storage_numel`` elements and whose record holds ``record_bytes``."""
    storage = check_geometry(
        f"{what} (its storage {t.key!r})", dtype=t.storage_dtype, shape=(t.storage_numel,), available=math.inf
    )
    if storage.nbytes != record_bytes:  # torch.load insists on it too: a record is its storage, no more, no less
        raise FormatError(
            f"{what} needs {storage.nbytes} bytes of storage record {t.key!r}, which holds "
            f"{record_bytes} (damaged file)"
        )
    g = check_geometry(what, dtype=t.dtype, shape=t.shape, stride=t.stride, offset=t.offset, available=storage.nbytes)
    return LazyTensor(t.key, t.storage_dtype, storage.numel, g.offset, g.shape, g.stride, g.dtype)


class TorchFileReader:
    """A torch.save file opened lazily (zip format) or read whole (legacy format)."""

    format = "torch"

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        self._records: dict[str, tuple[int, int, int]] = {}
        if _is_zip(self.path):
            prefix, offsets, archive = _record_offsets(self.path)
            if any(n.startswith(prefix + "code/") for n in offsets):
                raise FormatError(
                    f"{self.path} is a TorchScript archive (torch.jit.save), not a torch.save file; "
                    "load it with torch.jit.load and save its state_dict"
                )
            byteorder = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in offsets else "little"
            if byteorder != "little":
                raise FormatError(f"{self.path} was written on a {byteorder}-endian machine; load and re-save it there")
            self._records = {
                name[len(prefix) + 5 :]: value for name, value in offsets.items() if name.startswith(prefix + "data/")
            }
            try:
                tree = _LazyUnpickler(io.BytesIO(archive.read(prefix + "data.pkl")), self.path).load()
            except (zipfile.BadZipFile, EOFError, ValueError, zlib.error) as err:
                if isinstance(err, FormatError):
                    raise
                raise FormatError(f"{self.path}: data.pkl cannot be read ({type(err).__name__}: {err})") from None
            finally:
                archive.close()
        else:
            tree = torch_load(self.path, unknown="stand-in")
            check_loaded(self.path, tree, file_bytes=os.path.getsize(self.path))
        self._names, self._state = split_tree(tree, _is_tensor)
        self._names = {
            name: self._check_record(name, leaf) if isinstance(leaf, LazyTensor) else leaf
            for name, leaf in self._names.items()
        }

    def _check_record(self, name: str, t: LazyTensor) -> LazyTensor:
        record = self._records.get(t.key) if isinstance(t.key, str) else None
        if record is None:
            raise FormatError(
                f"{self.path}: tensor {name!r} refers to storage record {t.key!r}, which the archive "
                "lacks (damaged file)"
            )
        if record[2] != zipfile.ZIP_STORED:
            raise FormatError(f"{self.path}: storage record {t.key!r} is compressed; torch.save never does that")
        return checked_tensor(f"{self.path}: tensor {name!r}", t, record[1])

    def _fd_open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def tensors(self) -> Iterator[TensorInfo]:
        for name, leaf in self._names.items():
            if isinstance(leaf, LazyTensor):
                yield TensorInfo(
                    name,
                    leaf.dtype,
                    leaf.shape,
                    region_reader(leaf.shape, leaf.dtype, self._lazy_reader(name, leaf)),
                    stored=StoredBytes(leaf.geometry.stored_nbytes, self._stored_reader(name, leaf)),
                )
            else:
                if leaf.device.type == "meta":
                    raise FormatError(f"{self.path}: tensor {name!r} was saved on the meta device and has no data")
                yield TensorInfo(name, dtype_name(leaf.dtype), tuple(leaf.shape), partial(_copy_of, leaf))

    def _stored_reader(self, name: str, t: LazyTensor):
        """Reads the storage elements ``t`` uses, from its first to its last (1-d)."""
        what = f"{self.path}: tensor {name!r}"

        def stored() -> torch.Tensor:
            start = self._records[t.key][0] + t.offset * getattr(torch, t.dtype).itemsize
            span = t.geometry.span
            return read_box(self._fd_open(), start, (span,), t.dtype, Box((0,), (span,)), what=what)

        return stored

    def _lazy_reader(self, name: str, t: LazyTensor):
        what = f"{self.path}: tensor {name!r}"
        stored = self._stored_reader(name, t)

        def read(box: Box) -> torch.Tensor:
            if t.contiguous():
                start = self._records[t.key][0] + t.offset * getattr(torch, t.dtype).itemsize
                return read_box(self._fd_open(), start, t.shape, t.dtype, box, what=what)
            # A strided view (a transpose, an expand): read the storage span it uses, then view it.
            return torch.as_strided(stored(), t.shape, t.stride)[box.slices()].clone()

        return read

    def state(self) -> TrainingState:
        return self._state

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "TorchFileReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_zip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"PK\x03\x04"


def detect(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        head = fh.read(len(_LEGACY_MAGIC))
    if head.startswith(_LEGACY_MAGIC):
        return True
    if not head.startswith(b"PK\x03\x04"):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any(n.endswith("/data.pkl") for n in names) and not any("/code/" in n for n in names)


class TorchFileWriter:
    """Writes one torch.save file: pickle and reserved records first, then each tensor's bytes in place."""

    format = "torch"

    def __init__(
        self,
        path: str,
        *,
        tensors: Sequence[LogicalTensor],
        overwrite: bool = False,
        block_bytes: int | None = None,
        state: TrainingState | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._tensors = {t.name: t for t in tensors}
        state = state if state is not None else TrainingState()
        self._state = state
        names = list(self._tensors)
        flat = all("/" not in n for n in names) and state == TrainingState()
        tree = _int_ids(
            build_tree(
                names,
                state,
                lambda n: torch.empty(self._tensors[n].shape, dtype=getattr(torch, self._tensors[n].dtype)),
                model_root="" if flat else "model",
                optimizer_root="optimizer",
            )
        )
        self._out = StagedOutput(self.path, directory=False, overwrite=overwrite)
        try:
            with torch.serialization.skip_data():
                torch.save(unplain(tree), self._out.staging)
            del tree
            # Read the file back lazily: each name's record, and proof the names come back as written.
            prefix, offsets, archive = _record_offsets(self._out.staging)
            archive.close()
            back = TorchFileReader(self._out.staging)
            if set(back._names) != set(names):
                raise AssertionError(f"torch writer: names do not round-trip: {sorted(set(names) ^ set(back._names))}")
            self._where = {
                n: (
                    offsets[prefix + "data/" + t.key][0] + t.offset * getattr(torch, t.dtype).itemsize,
                    prefix + "data/" + t.key,
                )
                for n, t in back._names.items()
            }
            self._crc = {n: 0 for n in names}
            self._left = {n: math.prod(t.shape) * getattr(torch, t.dtype).itemsize for n, t in self._tensors.items()}
            self._fd = os.open(self._out.staging, os.O_RDWR)
        except BaseException:
            self._out.abort()
            raise

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.add_region(name, Box.full(tuple(tensor.shape)), tensor)

    def add_region(self, name: str, region: Box, tensor: torch.Tensor) -> None:
        """Write a contiguous row-major box of ``name`` (one of ``blocks(...)``, given in order)."""
        t = expect_block(self._tensors, name, region, tensor)
        start = flat_offset(t.shape, region.offsets) * tensor.element_size() if t.shape else 0
        data = tensor.detach().contiguous()
        self._left[name] -= write_at(self._fd, self._where[name][0] + start, data)
        from ucp.dtypes import to_numpy

        self._crc[name] = zlib.crc32(to_numpy(data).reshape(-1).view("uint8").data, self._crc[name])

    def set_state(self, state: TrainingState) -> None:
        if state.to_dict() != self._state.to_dict():
            raise ValueError(
                "the torch writer writes the training state when it is opened: pass the same state= to open_writer"
            )

    def close(self) -> None:
        try:
            unwritten = [n for n, left in self._left.items() if left]
            if unwritten:
                raise ValueError(f"tensors never written completely: {', '.join(unwritten[:10])}")
            _patch_crcs(self._fd, {record: self._crc[n] for n, (_, record) in self._where.items()})
            os.close(self._fd)
            self._fd = -1
            self._out.commit()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._out.abort()


def _int_ids(tree: dict) -> dict:
    """Optimizer parameters named only by their numbers go back to int ids, as torch optimizers keep them."""
    for opt in (v for v in tree.values() if isinstance(v, dict) and "state" in v and "param_groups" in v):
        params = [p for g in opt["param_groups"] for p in g.get("params", [])]
        if params and all(isinstance(p, str) and p.isdigit() for p in params):
            opt["state"] = {int(k) if k.isdigit() else k: v for k, v in opt["state"].items()}
            for group in opt["param_groups"]:
                group["params"] = [int(p) for p in group["params"]]
    return tree


def _patch_crcs(fd: int, crcs: dict[str, int]) -> None:
    """Put each record's CRC-32 in its central directory entry and its data descriptor (or local header)."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, min(size, 65536 + 22), max(0, size - 65536 - 22))
    at = tail.rfind(b"PK\x05\x06")
    if at < 0:
        raise FormatError("torch writer: the archive torch.save wrote has no end of central directory")
    (count,) = struct.unpack("<H", tail[at + 10 : at + 12])
    cd_size, cd_offset = struct.unpack("<II", tail[at + 12 : at + 20])
    if cd_offset == 0xFFFFFFFF or count == 0xFFFF:  # zip64: the locator sits just before the record
        loc = tail.rfind(b"PK\x06\x07", 0, at)
        (eocd64,) = struct.unpack("<Q", tail[loc + 8 : loc + 16])
        count, cd_size, cd_offset = struct.unpack("<QQQ", os.pread(fd, 56, eocd64)[32:56])
    directory = os.pread(fd, cd_size, cd_offset)
    pos = 0
    for _ in range(count):
        if directory[pos : pos + 4] != b"PK\x01\x02":
            raise FormatError("torch writer: unexpected central directory layout")
        (flags,) = struct.unpack("<H", directory[pos + 8 : pos + 10])
        n, m, k = struct.unpack("<HHH", directory[pos + 28 : pos + 34])
        name = directory[pos + 46 : pos + 46 + n].decode()
        if name in crcs:
            value = struct.pack("<I", crcs[name] & 0xFFFFFFFF)
            os.pwrite(fd, value, cd_offset + pos + 16)
            (local,) = struct.unpack("<I", directory[pos + 42 : pos + 46])
            if local == 0xFFFFFFFF:
                local = _zip64_local_offset(directory[pos + 46 + n : pos + 46 + n + m], directory[pos : pos + 46])
            if flags & 0x08:  # the CRC follows the data, in a descriptor (what torch.save writes)
                head = os.pread(fd, 30, local)
                ln, lm = struct.unpack("<HH", head[26:30])
                (csize,) = struct.unpack("<I", directory[pos + 20 : pos + 24])
                if csize == 0xFFFFFFFF:
                    csize = _zip64_sizes(directory[pos + 46 + n : pos + 46 + n + m])
                end = local + 30 + ln + lm + csize
                os.pwrite(fd, value, end + (4 if os.pread(fd, 4, end) == b"PK\x07\x08" else 0))
            else:
                os.pwrite(fd, value, local + 14)
        pos += 46 + n + m + k


def _zip64_sizes(extra: bytes) -> int:
    """The compressed size from a zip64 extra field whose sizes are both present (stored records)."""
    i = 0
    while i + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[i : i + 4])
        if tag == 1:
            return struct.unpack("<Q", extra[i + 12 : i + 20])[0]
        i += 4 + length
    raise FormatError("torch writer: a zip64 entry lacks its sizes")


def _zip64_local_offset(extra: bytes, header: bytes) -> int:
    """The local header offset from a central entry's zip64 extra field."""
    fields = [v == 0xFFFFFFFF for v in struct.unpack("<II", header[20:28])][::-1]  # uncompressed, compressed
    i = 0
    while i + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[i : i + 4])
        if tag == 1:
            skip = 8 * sum(fields)
            return struct.unpack("<Q", extra[i + 4 + skip : i + 12 + skip])[0]
        i += 4 + length
    raise FormatError("torch writer: a zip64 entry lacks its local header offset")


FORMAT = register_format(
    Format(
        name="torch",
        description="one torch.save file (.pt/.pth/.bin), read through the restricted unpickler",
        detect=detect,
        open_reader=TorchFileReader,
        open_writer=TorchFileWriter,
    )
)


def _copy_of(tensor: torch.Tensor, region: Region | None) -> torch.Tensor:
    """``region`` of an in-memory tensor, copied (the loaded file's tensor stays untouched)."""
    return slice_region(tensor, region).clone()
