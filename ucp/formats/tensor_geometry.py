"""Every tensor geometry a foreign file states, checked in one place before any byte is read.

A checkpoint file says where each tensor's elements are: a dtype, sizes, strides,
an offset into a storage or a byte range of a file. A reader that trusts those
numbers reads another tensor's bytes (a negative offset), hands torch a view it
cannot build (a negative stride), or works for hours (a stride-0 view of eight
stored elements presented as 10^12). Every reader (torch.save archives, DCP
chunks, safetensors headers, DeepSpeed and Megatron ``.pt`` files) passes what it
found through :func:`check_geometry` (or :func:`check_span` for a plain byte
range, :func:`check_loaded` for tensors torch already built from a file), which
returns the checked :class:`Geometry` or raises a
:class:`~ucp.errors.FormatError` naming the file and the tensor.

>>> g = check_geometry("m.pt: tensor 'w'", dtype="float32", shape=(3, 4), stride=(0, 1), offset=2,
...                    available=24)
>>> g.nbytes, g.stored_nbytes, g.repeats
(48, 16, True)
>>> check_geometry("m.pt: tensor 'w'", dtype="float32", shape=(4,), offset=-4, available=32)
Traceback (most recent call last):
...
ucp.errors.FormatError: m.pt: tensor 'w' starts at storage offset -4; offsets are never negative (damaged or hostile file)
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ucp.dtypes import UnsupportedDtypeError, storage_dtype
from ucp.errors import FormatError

__all__ = ["Geometry", "check_geometry", "check_span", "check_loaded", "loaded_tensors", "tag_folder", "MAX_DIMS"]

# torch itself refuses tensors of more dimensions than this.
MAX_DIMS = 64


@dataclass(frozen=True)
class Geometry:
    """A checked tensor geometry: elements ``offset + sum(i_d * stride[d])`` of a storage, in ``dtype``."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def itemsize(self) -> int:
        return getattr(torch, self.dtype).itemsize

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor as presented (what reading it whole allocates)."""
        return self.numel * self.itemsize

    @property
    def span(self) -> int:
        """Storage elements from the first to the last one the tensor uses (0 when it is empty)."""
        if not self.numel:
            return 0
        return sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=True)) + 1

    @property
    def stored_nbytes(self) -> int:
        """Bytes of storage the tensor's elements come from (at most ``nbytes`` unless it repeats them)."""
        return self.span * self.itemsize

    @property
    def end(self) -> int:
        """One past the last storage byte used, counted from the storage's start."""
        return (self.offset + self.span) * self.itemsize if self.numel else 0

    @property
    def repeats(self) -> bool:
        """Whether the tensor presents more bytes than it stores (a stride-0 view such as ``expand()``)."""
        return self.nbytes > self.stored_nbytes

    def contiguous(self) -> bool:
        return self.stride == _row_major(self.shape) or all(
            st == e or size == 1 for st, e, size in zip(self.stride, _row_major(self.shape), self.shape, strict=True)
        )


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return tuple(reversed(out))


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _ints(what: str, field: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, (tuple, list, torch.Size)):
        raise FormatError(f"{what} has {field} {values!r}, not a list of integers (damaged or hostile file)")
    if len(values) > MAX_DIMS:
        raise FormatError(f"{what} has {len(values)} dimensions; torch allows at most {MAX_DIMS} (damaged file)")
    out = tuple(_int(v) for v in values)
    if None in out:
        raise FormatError(f"{what} has {field} {list(values)!r}, not a list of integers (damaged or hostile file)")
    return out  # type: ignore[return-value]


def _dtype(what: str, dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, (str, torch.dtype)) else None
    try:
        if name is not None:
            storage_dtype(name)
            return name
    except UnsupportedDtypeError:
        pass
    raise FormatError(
        f"{what} has dtype {dtype!r}, which is not one ucp reads (bool, integers, floats, bfloat16, float8, complex)"
    )


def check_geometry(
    what: str, *, dtype: Any, shape: Any, stride: Any = None, offset: Any = 0, available: float
) -> Geometry:
    """The checked geometry of a tensor whose storage holds ``available`` bytes (``what`` names file and tensor).

    ``stride`` None means row-major; ``offset`` counts elements of ``dtype`` from the storage's start.
    Refused: an unknown dtype, sizes or strides that are negative or not integers, more than
    :data:`MAX_DIMS` dimensions, a negative offset, and any element outside the storage.
    """
    name = _dtype(what, dtype)
    sizes = _ints(what, "sizes", shape)
    strides = _row_major(sizes) if stride is None else _ints(what, "strides", stride)
    start = _int(offset)
    if len(strides) != len(sizes):
        raise FormatError(f"{what} has {len(sizes)} sizes but {len(strides)} strides (damaged file)")
    if any(s < 0 for s in sizes):
        raise FormatError(f"{what} has negative sizes {list(sizes)} (damaged or hostile file)")
    if any(s < 0 for s in strides):
        raise FormatError(
            f"{what} has negative strides {list(strides)}; torch never saves those (damaged or hostile file)"
        )
    if start is None:
        raise FormatError(f"{what} has storage offset {offset!r}, not an integer (damaged or hostile file)")
    if start < 0:
        raise FormatError(
            f"{what} starts at storage offset {start}; offsets are never negative (damaged or hostile file)"
        )
    geometry = Geometry(name, sizes, strides, start)
    if geometry.end > available:
        raise FormatError(
            f"{what} needs bytes {start * geometry.itemsize}..{geometry.end} of its storage, which "
            f"holds {available} (damaged or truncated file)"
        )
    return geometry


def check_span(what: str, *, offset: Any, length: Any, available: int, container: str = "its file") -> tuple[int, int]:
    """``(offset, length)`` of a byte range that must lie inside the ``available`` bytes of ``container``."""
    start, size = _int(offset), _int(length)
    if start is None or size is None or start < 0 or size < 0:
        raise FormatError(
            f"{what} is at bytes {offset!r}+{length!r} of {container}, which is no byte range (damaged or hostile file)"
        )
    if start + size > available:
        raise FormatError(
            f"{what} needs bytes {start}..{start + size} of {container}, which holds {available} (truncated)"
        )
    return start, size


def loaded_tensors(obj: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in a loaded object (dicts, lists, tuples, stand-ins' state), once each."""
    from ucp.unpickle import InertObject

    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if id(value) in seen:
            continue
        if isinstance(value, torch.Tensor):
            seen.add(id(value))
            yield path or "<root>", value
        elif isinstance(value, dict):
            seen.add(id(value))
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            seen.add(id(value))
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, InertObject):
            seen.add(id(value))
            stack.extend(((f"{path}.args", value.args), (f"{path}.state", value.state)))


def check_loaded(file: str, obj: Any, *, file_bytes: int) -> None:
    """Check every tensor torch built from ``file``: its geometry (as :func:`check_geometry`), and that it
    presents no more bytes than the file could hold unless it stores them (a stride-0 view larger than
    the file would make a reader work for hours on a few bytes: refused, naming the tensor).
    """
    for path, tensor in loaded_tensors(obj):
        if tensor.device.type == "meta" or tensor.layout != torch.strided:
            continue
        what = f"{file}: tensor {path}"
        storage = tensor.untyped_storage().nbytes()
        geometry = check_geometry(
            what,
            dtype=tensor.dtype,
            shape=tuple(tensor.shape),
            stride=tensor.stride(),
            offset=tensor.storage_offset(),
            available=storage,
        )
        if geometry.repeats and geometry.nbytes > max(file_bytes, 1 << 20):
            raise FormatError(
                f"{what} is a view of {geometry.stored_nbytes} stored bytes presented as "
                f"{list(geometry.shape)} ({geometry.nbytes} bytes, strides {list(geometry.stride)}); "
                f"refusing to expand it (save tensor.contiguous() or tensor.clone() instead)"
            )


def tag_folder(root: str, tag_file: str) -> str:
    """The folder inside ``root`` that the tag file ``root/tag_file`` names (DeepSpeed's ``latest``).

    A tag is one folder name: empty, ``.``/``..``, a path with separators, an absolute path, or a
    link that resolves outside ``root`` is refused, so a doctored tag file cannot point a reader
    at a folder outside the checkpoint. The folder need not exist (callers say what they expected).

    >>> tag_folder("/ckpt", "latest")  # doctest: +SKIP
    '/ckpt/global_step3'
    """
    import os

    where = os.path.join(root, tag_file)
    with open(where, "rb") as fh:
        raw = fh.read(4097)
    try:
        tag = raw.decode().strip()
    except UnicodeDecodeError:
        tag = None
    if not tag or len(raw) > 4096 or tag in (".", "..") or "/" in tag or "\\" in tag or "\0" in tag:
        raise FormatError(
            f"{where} names tag {raw[:80]!r}, which is not one folder name inside {root} (damaged or hostile tag file)"
        )
    folder = os.path.join(root, tag)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(folder)]) != real_root:
        raise FormatError(
            f"{where} names tag {tag!r}, which resolves to {os.path.realpath(folder)}, outside "
            f"{root}; refusing to read it"
        )
    return folder
