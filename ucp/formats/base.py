"""The seam every checkpoint format plugs into: a lazy reader, a streaming writer, a registry entry.

A **reader** (:class:`FormatReader`) presents a checkpoint of any format as
*logical tensors* — whole, un-parallelised tensors — without reading their
bytes: each :class:`TensorInfo` has a name, dtype and shape, and ``read(region)``
fetches any region (a :class:`~ucp.geometry.Box` or a
:class:`~ucp.geometry.FlatRange` of the row-major flattening) on demand. The
non-tensor state comes apart as :class:`TrainingState`. So every conversion
streams, and ``inspect``/``verify``/``diff`` work on every format.

A **writer** (:class:`FormatWriter`) takes logical tensors one at a time
(``add``), then the non-tensor state (``set_state``), and makes the result
exist on ``close`` (or throws it away on ``abort``).

Logical names are shared by every format (docs/FORMAT.md, "Logical names"):

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
from ucp.geometry import Box, Region

__all__ = [
    "TensorInfo", "TrainingState", "FormatReader", "FormatWriter", "Format", "register_format", "get_format",
    "formats", "detect_format", "UnknownFormatError",
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
        return {"step": self.step, "param_groups": [dict(g) for g in self.param_groups], "rng": dict(self.rng),
                "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingState":
        return cls(step=data.get("step"), param_groups=tuple(data.get("param_groups") or ()),
                   rng=dict(data.get("rng") or {}), extra=dict(data.get("extra") or {}))


@runtime_checkable
class FormatReader(Protocol):
    """An opened checkpoint of some format. Use as a context manager."""

    format: str
    path: str

    def tensors(self) -> Iterator[TensorInfo]:
        """Every logical tensor, lazily (no tensor bytes read), in a stable order."""
        ...

    def state(self) -> TrainingState:
        ...

    def close(self) -> None:
        ...

    def __enter__(self) -> "FormatReader":
        ...

    def __exit__(self, *exc: Any) -> None:
        ...


@runtime_checkable
class FormatWriter(Protocol):
    """A checkpoint being written; nothing exists at the path until ``close`` returns."""

    format: str
    path: str

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Write logical tensor ``name`` (the caller may drop ``tensor`` once this returns)."""
        ...

    def set_state(self, state: TrainingState) -> None:
        ...

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
    unpickle anything. ``open_writer`` is None for formats that are read-only here.
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


def _safe_detect(fmt: Format, path: str) -> bool:
    try:
        return bool(fmt.detect(path))
    except (OSError, ValueError):
        return False
