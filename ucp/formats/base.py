"""The seam every checkpoint format plugs into: a lazy reader, a streaming writer, a registry entry.

A **reader** (:class:`FormatReader`) presents a checkpoint of any format as
*logical tensors* — whole, un-parallelised tensors — without reading their
bytes: each :class:`TensorInfo` has a name, dtype and shape, and ``read(region)``
fetches any region (a :class:`~ucp.geometry.Box` or a
:class:`~ucp.geometry.FlatRange` of the row-major flattening) on demand. The
non-tensor state comes apart as :class:`TrainingState`. So every conversion
streams, and ``inspect``/``verify``/``diff`` work on every format.

A **writer** (:class:`FormatWriter`) is opened with the list of every logical
tensor it will receive and the training state (``open_writer(path,
tensors=[LogicalTensor...], state=TrainingState(...), overwrite=False,
block_bytes=..., **options)``: a safetensors header, a torch.save pickle or a DCP
metadata file needs them up front), takes logical tensors one at a time
(``add``), then the non-tensor state (``set_state``), and makes the result
exist on ``close`` (or throws it away on ``abort``). A writer that can take a
tensor in parts also has ``add_region(name, region, tensor)``: a tensor larger
than ``block_bytes`` then arrives as the boxes of :func:`blocks`, in order, so
no tensor needs to be whole in memory.

Logical names are shared by every format (docs/CONVERT.md, "Logical names"):

* a model tensor is its fully qualified name without wrapper prefixes
  (``module.``, ``_orig_mod.``, ``_fsdp_wrapped_module.``):
  ``layers.0.attention.wq.weight``;
* an optimizer state of a parameter is ``<parameter>/<state>``: ``fp32`` for the
  master copy, ``exp_avg``/``exp_avg_sq`` for Adam, ``momentum_buffer`` for SGD;
  a per-parameter step counter that is a tensor is ``<parameter>/step``.

Example (a format registered elsewhere)::

    fmt = detect_format("ckpt/")            # or get_format("deepspeed")
    with fmt.open_reader("ckpt/") as reader:
        for info in reader.tensors():
            block = info.read(Box((0, 0), (2, info.shape[1])))   # only two rows
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import torch

from ucp.errors import FormatError, UcpError
from ucp.format_hook import register_recogniser
from ucp.geometry import Box, FlatRange, Region, region_pieces  # noqa: F401 - FlatRange: the docstring examples use it

__all__ = [
    "TensorInfo",
    "StoredBytes",
    "TrainingState",
    "FormatReader",
    "FormatWriter",
    "Format",
    "register_format",
    "get_format",
    "formats",
    "detect_format",
    "UnknownFormatError",
    "blocks",
    "region_reader",
    "slice_region",
    "parse_size",
    "expect_block",
]


class UnknownFormatError(UcpError, ValueError):
    """No registered format recognises the path, or the name given is not registered."""


@dataclass(frozen=True)
class TensorInfo:
    """One logical tensor of a checkpoint; ``read(region)`` reads it (whole when ``region`` is None).

    >>> t = torch.arange(6.0).view(2, 3)
    >>> info = TensorInfo("w", "float32", (2, 3), lambda region: t if region is None else t[region.slices()])
    >>> info.read(Box((1, 0), (1, 3)))
    tensor([[3., 4., 5.]])
    >>> info.nbytes
    24
    """

    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    shape: tuple[int, ...]
    reader: Callable[[Region | None], torch.Tensor] = field(repr=False, compare=False)
    # The bytes the file stores for it, where a reader knows them: fewer than ``nbytes`` for a view
    # that repeats its storage (expand()), which verify then checks instead of every repetition.
    stored: "StoredBytes | None" = field(default=None, repr=False, compare=False)

    def read(self, region: Region | None = None) -> torch.Tensor:
        """The whole tensor, or ``region`` of it (box-shaped for a Box, 1-d for a FlatRange)."""
        return self.reader(region)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True)
class StoredBytes:
    """The storage a tensor's elements come from: its size, and a reader of it (1-d, the tensor's dtype)."""

    nbytes: int
    read: Callable[[], torch.Tensor] = field(repr=False, compare=False)


@dataclass(frozen=True)
class TrainingState:
    """The non-tensor state of a checkpoint, as plain JSON values.

    ``param_groups``: one dict per optimizer group, its hyper-parameters plus
    ``"params"``, the logical names of its parameters. ``rng``: RNG states that are
    not tensors (tensor RNG states are logical tensors like any other).
    ``extra``: everything else the format records (its args, its version, ...).
    """

    step: int | None = None
    param_groups: tuple[dict, ...] = ()
    rng: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "param_groups": [dict(g) for g in self.param_groups],
            "rng": dict(self.rng),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingState":
        return cls(
            step=data.get("step"),
            param_groups=tuple(data.get("param_groups") or ()),
            rng=dict(data.get("rng") or {}),
            extra=dict(data.get("extra") or {}),
        )


@runtime_checkable
class FormatReader(Protocol):
    """An opened checkpoint of some format. Use as a context manager."""

    format: str
    path: str

    def tensors(self) -> Iterator[TensorInfo]:
        """Every logical tensor, lazily (no tensor bytes read), in a stable order."""
        ...

    def state(self) -> TrainingState: ...

    def close(self) -> None: ...

    def __enter__(self) -> "FormatReader": ...

    def __exit__(self, *exc: Any) -> None: ...


@runtime_checkable
class FormatWriter(Protocol):
    """A checkpoint being written; nothing exists at the path until ``close`` returns."""

    format: str
    path: str

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Write logical tensor ``name`` (the caller may drop ``tensor`` once this returns).

        Writers that take tensors in parts also have ``add_region(name, region, tensor)``,
        called instead with each box of ``blocks(shape, dtype, block_bytes)`` in order.
        """
        ...

    def set_state(self, state: TrainingState) -> None: ...

    def close(self) -> None:
        """Commit: after this the checkpoint exists, whole."""
        ...

    def abort(self) -> None:
        """Throw away everything written; never touches an existing checkpoint."""
        ...


@dataclass(frozen=True)
class Format:
    """A registry entry: how to recognise, read and (optionally) write one checkpoint format.

    ``detect(path)`` must be cheap (look at names, a few header bytes) and never
    unpickle anything. ``open_reader(path)`` validates what it can without reading
    tensor bytes (a :class:`~ucp.errors.FormatError` naming the file otherwise).
    ``open_writer(path, *, tensors, state=None, overwrite=False, block_bytes=None, **options)``
    refuses what it cannot represent before writing anything; it is None for
    formats that are read-only here.
    """

    name: str
    description: str
    detect: Callable[[str], bool]
    open_reader: Callable[..., FormatReader]
    open_writer: Callable[..., FormatWriter] | None = None


# The registry: name -> Format, filled by each format module when ucp.formats is imported.
# A dict owned by this module and changed only through register_format (like fsspec's registry).
_REGISTRY: dict[str, Format] = {}


def register_format(fmt: Format, *, replace: bool = False) -> Format:
    """Add a format to the registry (``replace=True`` to override one of the same name)."""
    if fmt.name in _REGISTRY and not replace:
        raise ValueError(f"a format named {fmt.name!r} is already registered; pass replace=True to override it")
    _REGISTRY[fmt.name] = fmt
    return fmt


def get_format(name: str) -> Format:
    """The registered format called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownFormatError(f"unknown checkpoint format {name!r}; known formats: {known}") from None


def formats() -> dict[str, Format]:
    """Every registered format, by name."""
    return dict(_REGISTRY)


def detect_format(path: str | os.PathLike) -> Format:
    """The format of the checkpoint at ``path``; an error that says what was looked for when none matches."""
    path = os.fspath(path)
    if not os.path.exists(path) and "://" not in path:
        raise FormatError(f"no file or directory at {path}")
    found = [fmt for fmt in _REGISTRY.values() if _safe_detect(fmt, path)]
    if not found:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownFormatError(
            f"{path} is not a checkpoint in any known format (looked for: {known}); "
            "name the format with --from if it is one of these"
        )
    return found[0]


def _recognise(url: str) -> Format | None:
    """The core's question (:mod:`ucp.format_hook`): which registered format is at ``url``, if any."""
    try:
        return detect_format(url)
    except UcpError:
        return None


register_recogniser(_recognise)


def _safe_detect(fmt: Format, path: str) -> bool:
    try:
        return bool(fmt.detect(path))
    except (OSError, ValueError):
        return False


def block_bytes_for(memory_budget: int) -> int:
    """The largest piece of a tensor read at once: a quarter of the budget (the writer may hold as much again)."""
    return max(1 << 20, memory_budget // 4)


def blocks(shape: tuple[int, ...], dtype: str, max_bytes: int) -> tuple[Box, ...]:
    """Boxes of at most ``max_bytes`` (or one row of one element) tiling a tensor in row-major order.

    Each box is one contiguous run of the row-major flattening, so a writer can
    put it at ``offset + first element * itemsize``. A tensor that fits is one box.

    >>> [str(b) for b in blocks((4, 3), "float32", 24)]
    ['[0:2, 0:3]', '[2:4, 0:3]']
    >>> [str(b) for b in blocks((2, 3), "float32", 8)]
    ['[0:1, 0:2]', '[0:1, 2:3]', '[1:2, 0:2]', '[1:2, 2:3]']
    """
    shape = tuple(int(s) for s in shape)
    itemsize = getattr(torch, dtype).itemsize
    whole = Box.full(shape)
    if not shape or whole.numel * itemsize <= max_bytes or whole.is_empty():
        return (whole,)
    # The outermost dim k whose trailing block (one index of dims <= k) fits, then as many as fit.
    k = 0
    inner = whole.numel // shape[0]
    while k < len(shape) - 1 and inner * itemsize > max_bytes:
        k += 1
        inner //= shape[k]
    step = max(1, max_bytes // max(1, inner * itemsize))
    out: list[Box] = []

    def walk(prefix: tuple[int, ...]) -> None:
        if len(prefix) == k:
            for start in range(0, shape[k], step):
                size = min(step, shape[k] - start)
                out.append(Box(prefix + (start,) + (0,) * (len(shape) - k - 1), (1,) * k + (size,) + shape[k + 1 :]))
            return
        for i in range(shape[len(prefix)]):
            walk(prefix + (i,))

    walk(())
    return tuple(out)


def slice_region(tensor: torch.Tensor, region: Region | None) -> torch.Tensor:
    """``region`` of an in-memory tensor: box-shaped for a Box, 1-d for a FlatRange (may be a view).

    >>> slice_region(torch.arange(6).view(2, 3), FlatRange(2, 5))
    tensor([2, 3, 4])
    """
    if region is None:
        return tensor
    if isinstance(region, Box):
        return tensor[region.slices()] if region.ndim else tensor
    return tensor.reshape(-1)[region.start : region.stop]


def region_reader(
    shape: tuple[int, ...], dtype: str, read_box: Callable[[Box], torch.Tensor]
) -> Callable[[Region | None], torch.Tensor]:
    """A ``TensorInfo.reader`` from a function that reads boxes: flat ranges become row-major boxes.

    >>> t = torch.arange(12).view(3, 4)
    >>> read = region_reader((3, 4), "int64", lambda box: t[box.slices()].clone())
    >>> read(FlatRange(3, 9))
    tensor([3, 4, 5, 6, 7, 8])
    """

    def read(region: Region | None) -> torch.Tensor:
        if region is None:
            return read_box(Box.full(shape))
        if isinstance(region, Box):
            return read_box(region)
        out = torch.empty(region.numel, dtype=getattr(torch, dtype))
        for piece in region_pieces(region, shape):
            assert piece.span is not None, "the pieces of a flat range have spans"
            out[piece.span.start : piece.span.stop] = read_box(piece.box).reshape(-1)
        return out

    return read


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(size: int | str) -> int:
    """Bytes from ``"2GiB"``, ``"500MB"``, ``"1.5g"`` or an int (binary units for ``*iB``, decimal otherwise).

    >>> parse_size("2GiB"), parse_size("5GB"), parse_size(4096)
    (2147483648, 5000000000, 4096)
    """
    if isinstance(size, int):
        value = size
    else:
        import re

        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(size))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"cannot read {size!r} as a size; write it like 2GiB, 500MB or 1048576")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a size must be positive, got {size!r}")
    return value


def expect_block(planned: dict, name: str, region: Box, tensor: torch.Tensor):
    """The planned ``LogicalTensor`` of ``name``, after checking ``tensor`` is its ``region`` (writers' guard)."""
    t = planned.get(name)
    if t is None:
        raise KeyError(f"tensor {name!r} was not in the list this writer was opened with")
    got = str(tensor.dtype).removeprefix("torch.")
    if got != t.dtype or tuple(tensor.shape) != tuple(region.sizes):
        raise ValueError(
            f"tensor {name!r}: got {got}{list(tensor.shape)} for region {region} of {t.dtype}{list(t.shape)}"
        )
    return t
